//! The `commands` and `browser` facets: which commands $PATH resolves,
//! what they are built for, which libraries they would miss, and the first
//! line of their `--version` (run in parallel, each under a timeout, killed
//! whole when it hangs or floods).

use std::collections::{HashMap, VecDeque};
use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::elf::LibSearch;
use super::util::{cut, io_name};
use crate::env::Facet;

/// The commands every snapshot looks for.
#[rustfmt::skip]
pub const DEFAULT_COMMANDS: &[&str] = &[
    "sh", "bash", "dash", "zsh", // shells
    "python3", "python", "pip", "pip3", "node", "npm", "npx", "deno", "bun", "ruby", "perl",
    "php", "java", "go", "rustc", "cargo", // languages
    "gcc", "cc", "g++", "clang", "make", "cmake", "ld", // building
    "git", "tar", "gzip", "unzip", "zip", "xz", // sources and archives
    "apt", "dpkg", "apk", "dnf", // package managers
    "curl", "wget", // the network
    "chromium", "chromium-browser", "google-chrome", // browsers (never run)
    "ps", "top", "sed", "grep", "awk", "find", "sort", "ls", "cat", "timeout", "env",
];

/// Browsers: their files are read, never run.
pub const BROWSERS: &[&str] = &[
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
    "headless_shell",
];

/// Where distributions put the real browser binary behind a PATH wrapper.
const BROWSER_ELVES: &[&str] = &[
    "/usr/lib/chromium/chromium",
    "/usr/lib/chromium-browser/chromium-browser",
    "/usr/lib64/chromium-browser/chromium-browser",
    "/opt/google/chrome/chrome",
];

/// PATH directories searched at most.
pub const MAX_PATH_DIRS: usize = 256;
/// Versions probed at once.
const WORKERS: usize = 8;
/// A version line is cut to this many characters.
const MAX_LINE: usize = 200;
/// Output read from one version probe before it counts as a flood.
const MAX_OUTPUT: usize = 64 * 1024;

/// $PATH's directories: distinct, existing, at most [`MAX_PATH_DIRS`];
/// and what was left out, when anything was.
pub fn path_dirs(path: &str) -> (Vec<PathBuf>, Option<String>) {
    let entries: Vec<&str> = path.split(':').collect();
    let mut distinct: Vec<&str> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for e in &entries {
        // a relative entry (empty is the current directory) is the
        // workload's directory: its scripts are not run for a version
        if !e.starts_with('/') {
            continue;
        }
        if seen.insert(e) {
            distinct.push(e);
        }
    }
    let note = (distinct.len() > MAX_PATH_DIRS).then(|| {
        format!(
            "PATH has {} entries ({} distinct directories): only the first {MAX_PATH_DIRS} \
             were searched",
            entries.len(),
            distinct.len()
        )
    });
    let dirs = distinct
        .into_iter()
        .take(MAX_PATH_DIRS)
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .collect();
    (dirs, note)
}

/// The first executable regular file named `name` in `dirs`, as `which`.
pub fn which(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return executable(&p).then_some(p);
    }
    dirs.iter().map(|d| d.join(name)).find(|p| executable(p))
}

fn executable(p: &Path) -> bool {
    use nix::unistd::{AccessFlags, faccessat};
    p.is_file()
        && faccessat(
            nix::fcntl::AT_FDCWD,
            p,
            AccessFlags::X_OK,
            nix::fcntl::AtFlags::AT_EACCESS,
        )
        .is_ok()
}

/// The arguments that make `name` print its version.
fn version_args(name: &str) -> &'static [&'static str] {
    match name {
        // (no perf-data file in /tmp: the probe leaves nothing behind)
        "java" => &["-XX:-UsePerfData", "-version"],
        "go" => &["version"],
        "unzip" => &["-v"],
        "awk" | "mawk" => &["-W", "version"],
        _ => &["--version"],
    }
}

/// A command being measured: resolved at once, its version probed in the
/// background while the rest of the snapshot is taken.
pub struct Commands {
    names: Vec<String>,
    found: HashMap<String, PathBuf>,
    path_note: Option<String>,
    probes: VersionProbes,
}

impl Commands {
    /// Resolves `names` through `dirs` and starts their version probes.
    pub fn start(
        names: Vec<String>,
        dirs: &[PathBuf],
        path_note: Option<String>,
        timeout: Duration,
    ) -> Commands {
        let found: HashMap<String, PathBuf> = names
            .iter()
            .filter_map(|n| which(n, dirs).map(|p| (n.clone(), p)))
            .collect();
        let jobs = names
            .iter()
            .filter(|n| !BROWSERS.contains(&n.as_str()))
            .filter_map(|n| found.get(n).map(|p| (n.clone(), p.clone())))
            .collect();
        Commands {
            names,
            found,
            path_note,
            probes: VersionProbes::start(jobs, timeout),
        }
    }

    /// The facet, once every version probe has answered or been killed.
    pub fn finish(self, libs: &mut LibSearch) -> Facet {
        let mut f = Facet::new(
            "Resolved through $PATH like `which`; machine and missing libraries from the \
             ELF headers (DT_NEEDED, RUNPATH, ld.so.conf, multiarch dirs); version: the \
             first line of `CMD --version` (browsers are not run).",
        );
        if let Some(note) = &self.path_note {
            f.cannot("PATH", note);
        }
        let mut values: HashMap<String, Value> = HashMap::new();
        for name in &self.names {
            let Some(path) = self.found.get(name) else {
                values.insert(name.clone(), json!({"path": null}));
                continue;
            };
            let mut v = json!({"path": path.display().to_string(), "version": null,
                               "machine": null, "missing_libs": []});
            match libs.inspect(path) {
                Ok(i) => {
                    v["machine"] = json!(i.machine);
                    v["missing_libs"] = json!(i.missing);
                }
                Err(why) => f.cannot(format!("{name}.elf"), why),
            }
            values.insert(name.clone(), v);
        }
        for (name, outcome) in self.probes.finish() {
            match outcome {
                Ok(line) => {
                    if let Some(v) = values.get_mut(&name) {
                        v["version"] = json!(line);
                    }
                }
                Err(why) => f.cannot(format!("{name}.version"), why),
            }
        }
        for (name, v) in values {
            f.set(name, v);
        }
        f
    }
}

/// Version probes on a few worker threads.
struct VersionProbes {
    rx: mpsc::Receiver<(String, Result<String, String>)>,
    workers: Vec<std::thread::JoinHandle<()>>,
    queue: Arc<Mutex<VecDeque<(String, PathBuf)>>>,
    run: Arc<Run>,
}

/// How each version probe runs: its timeout, and the TMPDIR it gets.
struct Run {
    timeout: Duration,
    scratch: Option<Scratch>,
}

/// A private temporary directory for the probed commands (their TMPDIR),
/// removed with whatever they left in it.
struct Scratch(PathBuf);

impl Scratch {
    fn create() -> Option<Scratch> {
        use std::os::unix::fs::DirBuilderExt as _;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("probe-env-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .ok()
            .map(|()| Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl VersionProbes {
    fn start(jobs: Vec<(String, PathBuf)>, timeout: Duration) -> VersionProbes {
        let run = Arc::new(Run {
            timeout,
            scratch: if jobs.is_empty() {
                None
            } else {
                Scratch::create()
            },
        });
        let (tx, rx) = mpsc::channel();
        let n = jobs.len().min(WORKERS);
        let queue = Arc::new(Mutex::new(VecDeque::from(jobs)));
        let mut workers = Vec::new();
        for i in 0..n {
            let (queue, tx, run) = (queue.clone(), tx.clone(), run.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("env-version-{i}"))
                .spawn(move || work(&queue, &tx, &run, true));
            // no thread (a tight pids limit): what is left runs in finish()
            match spawned {
                Ok(h) => workers.push(h),
                Err(_) => break,
            }
        }
        VersionProbes {
            rx,
            workers,
            queue,
            run,
        }
    }

    fn finish(self) -> Vec<(String, Result<String, String>)> {
        // what no worker took (none could start, or one ran short of pids)
        // runs here, once every worker is done
        let (inline_tx, inline_rx) = mpsc::channel();
        for h in self.workers {
            let _ = h.join();
        }
        work(&self.queue, &inline_tx, &self.run, false);
        drop(inline_tx);
        let mut out: Vec<_> = inline_rx.into_iter().collect();
        out.extend(self.rx.try_iter());
        // the scratch directory goes with the last reference to it
        drop(self.run);
        out
    }
}

type Queue = Mutex<VecDeque<(String, PathBuf)>>;

/// Takes jobs until none is left. A worker thread (`yield_on_eagain`)
/// that cannot start a process for want of pids puts the job back and
/// ends, its own pid freed for the ones left (finish() runs them).
fn work(
    queue: &Queue,
    tx: &mpsc::Sender<(String, Result<String, String>)>,
    run: &Run,
    yield_on_eagain: bool,
) {
    loop {
        let job = match queue.lock() {
            Ok(mut q) => q.pop_front(),
            Err(_) => None,
        };
        let Some((name, path)) = job else {
            return;
        };
        let tmp = run.scratch.as_ref().map(|s| s.0.as_path());
        let outcome = match start(&name, &path, version_args(&name), tmp) {
            Err(e) if yield_on_eagain && e.raw_os_error() == Some(libc::EAGAIN) => {
                if let Ok(mut q) = queue.lock() {
                    q.push_front((name, path));
                }
                return;
            }
            Err(e) => Err(format!("cannot run: {}", io_name(&e))),
            Ok((child, reader)) => first_line_of(child, reader, run.timeout),
        };
        let _ = tx.send((name, outcome));
    }
}

/// The first non-empty line `NAME ARGS` (run from `path`) prints (stdout and stderr
/// together, stdin empty), cut to [`MAX_LINE`] characters. The command
/// runs in its own process group, killed whole when it is done, hangs
/// past `timeout` or floods.
#[cfg(test)]
fn version_of(
    name: &str,
    path: &Path,
    args: &[&str],
    timeout: Duration,
    tmp: Option<&Path>,
) -> Result<String, String> {
    let (child, reader) =
        start(name, path, args, tmp).map_err(|e| format!("cannot run: {}", io_name(&e)))?;
    first_line_of(child, reader, timeout)
}

/// `NAME ARGS` started in its own process group, stdout and stderr into
/// one pipe.
fn start(
    name: &str,
    path: &Path,
    args: &[&str],
    tmp: Option<&Path>,
) -> std::io::Result<(std::process::Child, std::io::PipeReader)> {
    let (reader, writer) = std::io::pipe()?;
    let writer2 = writer.try_clone()?;
    let mut cmd = Command::new(path);
    // argv[0] as a shell would give it (multi-call binaries and shims
    // dispatch on it; tools print it)
    cmd.arg0(name)
        .args(args)
        .env("LC_ALL", "C") // the same words whatever the locale, for diffs
        // no tool fetches anything to answer: no toolchain download, no
        // update check (a snapshot sends no packet)
        .env("GOTOOLCHAIN", "local")
        .env("RUSTUP_AUTO_INSTALL", "0")
        .env("COREPACK_ENABLE_NETWORK", "0")
        .env("NO_UPDATE_NOTIFIER", "1")
        .env("npm_config_update_notifier", "false")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(writer2)
        .process_group(0);
    if let Some(tmp) = tmp {
        // what a tool writes to its temporary directory is removed with it;
        // run there too: a project file in the workload's directory (a
        // rust-toolchain.toml, a .nvmrc) could make a tool fetch something
        cmd.env("TMPDIR", tmp)
            .env("TMP", tmp)
            .env("TEMP", tmp)
            .env("npm_config_logs_max", "0")
            .current_dir(tmp);
    }
    let spawned = cmd.spawn();
    drop(cmd); // our copies of the pipe's write end: EOF once the command's close
    Ok((spawned?, reader))
}

/// Reads what a started probe prints until it ends, floods or times out,
/// then kills its process group; its first line, or why there is none.
fn first_line_of(
    mut child: std::process::Child,
    mut reader: std::io::PipeReader,
    timeout: Duration,
) -> Result<String, String> {
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let deadline = Instant::now() + timeout;
    let mut kept: Vec<u8> = Vec::new();
    let mut total = 0usize;
    let mut eof = false;
    let mut buf = [0u8; 4096];
    while total < MAX_OUTPUT {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !readable(&reader, left) {
            break;
        }
        match reader.read(&mut buf) {
            Ok(0) => {
                eof = true;
                break;
            }
            Ok(n) => {
                total += n;
                let room = 4096usize.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    // done reading: let it exit by itself until the deadline, then kill
    // the whole group (a hung child, or what it left running)
    let mut status = None;
    if eof {
        while status.is_none() && Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(s)) => status = Some(s),
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(_) => break,
            }
        }
    }
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let line = first_line(&kept);
    use std::os::unix::process::ExitStatusExt as _;
    match (status, line) {
        (Some(s), line) if s.success() => line.ok_or_else(|| "printed nothing".into()),
        (Some(s), line) => {
            let how = match (s.code(), s.signal()) {
                (Some(c), _) => format!("exit status {c}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                _ => "failed".into(),
            };
            Err(match line {
                Some(l) => format!("{how}: {l}"),
                None => how,
            })
        }
        // killed by us: a flood, or a hang that said something first
        (None, Some(line)) => Ok(line),
        (None, None) if total >= MAX_OUTPUT => Err("flooded without a line".into()),
        (None, None) => Err(format!(
            "no answer within {} ms (killed)",
            timeout.as_millis()
        )),
    }
}

/// Whether the pipe has data (or EOF) within `wait`.
fn readable(reader: &std::io::PipeReader, wait: Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd as _;
    let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
    let mut fds = [PollFd::new(reader.as_fd(), PollFlags::POLLIN)];
    loop {
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) => return false,
            Ok(_) => return true,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}

/// `text` with every value of this process's environment variables (of 6
/// bytes or more, not a path) cut out: a tool that echoes its options or
/// its environment in its version line leaks no secret into the snapshot.
fn scrub(text: &str) -> String {
    let mut out = text.to_string();
    for (name, value) in std::env::vars_os() {
        let Some(value) = value.to_str() else {
            continue;
        };
        if value.len() >= 6 && !value.starts_with('/') && out.contains(value) {
            out = out.replace(value, &format!("${}", name.to_string_lossy()));
        }
    }
    out
}

/// The first non-empty line, skipping copyright notices (zip's comes
/// before its version) and the JVM's notes on option variables, at most
/// [`MAX_LINE`] characters.
fn first_line(out: &[u8]) -> Option<String> {
    scrub(&String::from_utf8_lossy(out))
        .lines()
        .map(str::trim)
        .find(|l| {
            !l.is_empty()
                && !l.starts_with("Copyright")
                && !l.starts_with("Picked up ")
                && !l.starts_with("NOTE: Picked up ")
        })
        .map(|l| cut(l, MAX_LINE))
}

/// The `browser` facet. `userns`: the user-namespace trial's outcome (a
/// browser's sandbox needs one, or a setuid helper).
pub fn browser_facet(dirs: &[PathBuf], libs: &mut LibSearch, userns: &str) -> Facet {
    let mut f = Facet::new(
        "Browsers on $PATH (and /usr/lib/chromium/chromium) read, never run: missing \
         libraries of the real ELF behind a wrapper script, font files under the fontconfig \
         dirs, and the user-namespace trial.",
    );
    let fonts = count_fonts();
    let mut used: Vec<PathBuf> = Vec::new();
    let on_path: Vec<(String, PathBuf)> = BROWSERS
        .iter()
        .filter_map(|n| which(n, dirs).map(|p| (n.to_string(), p)))
        .collect();
    for (name, path) in &on_path {
        let v = browser(name, path, libs, &mut f, &mut used);
        f.set(name, json!({"fonts": fonts, "userns": userns}).merged(v));
    }
    // Debian's binary, when no PATH entry led to it
    let lib_chromium = Path::new(BROWSER_ELVES[0]);
    match std::fs::canonicalize(lib_chromium) {
        Ok(c) if !used.contains(&c) => {
            let v = browser(BROWSER_ELVES[0], lib_chromium, libs, &mut f, &mut used);
            f.set(
                BROWSER_ELVES[0],
                json!({"fonts": fonts, "userns": userns}).merged(v),
            );
        }
        _ if on_path.is_empty() => f.set("chromium", json!({"path": null})),
        _ => {}
    }
    f
}

/// One browser's path, real ELF and missing libraries (the wrapper's and
/// the ELF's); the ELF is added to `used`.
fn browser(
    name: &str,
    path: &Path,
    libs: &mut LibSearch,
    f: &mut Facet,
    used: &mut Vec<PathBuf>,
) -> Value {
    let mut missing: Vec<String> = Vec::new();
    let elf = match libs.inspect(path) {
        Ok(i) if i.script => real_elf(path),
        Ok(i) => {
            missing = i.missing;
            Some(path.to_path_buf())
        }
        Err(why) => {
            f.cannot(format!("{name}.elf"), why);
            None
        }
    };
    if let Some(e) = &elf {
        if e != path {
            match libs.inspect(e) {
                Ok(i) => {
                    for m in i.missing {
                        if !missing.contains(&m) {
                            missing.push(m);
                        }
                    }
                }
                Err(why) => f.cannot(format!("{name}.elf"), why),
            }
        }
        used.push(std::fs::canonicalize(e).unwrap_or_else(|_| e.clone()));
    }
    json!({"path": path.display().to_string(), "elf": elf.map(|e| e.display().to_string()),
           "version": null, "missing_libs": missing})
}

/// Joining two JSON objects.
trait Merged {
    fn merged(self, other: Value) -> Value;
}

impl Merged for Value {
    fn merged(mut self, other: Value) -> Value {
        if let (Some(a), Value::Object(b)) = (self.as_object_mut(), other) {
            a.extend(b);
        }
        self
    }
}

/// The binary a browser wrapper script starts: a known place, or a
/// browser-named ELF beside the script's real file.
fn real_elf(script: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(script).ok()?;
    let beside = real
        .parent()
        .map(|d| ["chrome", "chromium", "chromium-browser"].map(|n| d.join(n)))
        .into_iter()
        .flatten();
    beside
        .chain(BROWSER_ELVES.iter().map(PathBuf::from))
        .find(|p| p != &real && matches!(super::elf::read(p), Ok(Some(_))))
}

/// Font files under the directories fontconfig reads by default.
fn count_fonts() -> u64 {
    let mut dirs: Vec<PathBuf> = vec!["/usr/share/fonts".into(), "/usr/local/share/fonts".into()];
    if let Some(h) = super::util::home() {
        dirs.push(Path::new(&h).join(".fonts"));
        dirs.push(Path::new(&h).join(".local/share/fonts"));
    }
    let mut n = 0u64;
    let mut budget = 50_000usize; // directory entries looked at, at most
    let mut stack = dirs;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if budget == 0 {
                return n;
            }
            budget -= 1;
            let Ok(t) = e.file_type() else { continue };
            let name = e.file_name().to_string_lossy().to_lowercase();
            if t.is_dir() {
                stack.push(e.path());
            } else if [
                ".ttf", ".otf", ".ttc", ".otc", ".pfb", ".pfa", ".pcf", ".pcf.gz", ".woff",
                ".woff2", ".bdf",
            ]
            .iter()
            .any(|x| name.ends_with(x))
            {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn path_is_deduped_and_capped() {
        let (dirs, note) = path_dirs("/usr/bin:/usr/bin:/bin:/nonexistent-xyz");
        assert_eq!(note, None);
        assert_eq!(dirs, [PathBuf::from("/usr/bin"), PathBuf::from("/bin")]);
        let long: Vec<String> = (0..1000).map(|i| format!("/nonexistent-{i}")).collect();
        let (dirs, note) = path_dirs(&long.join(":"));
        assert!(dirs.is_empty());
        assert!(note.unwrap().contains("1000 distinct"));
        assert!(which("sh", &[PathBuf::from("/bin"), PathBuf::from("/usr/bin")]).is_some());
        assert_eq!(
            which("no-such-tool-xyz", &[PathBuf::from("/usr/bin")]),
            None
        );
    }

    #[test]
    fn versions_are_cut_and_hangs_killed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ok = script(d, "ok", "echo; echo 'Tool 1.2.3'; echo more");
        assert_eq!(
            version_of("ok", &ok, &["--version"], Duration::from_secs(2), None).unwrap(),
            "Tool 1.2.3"
        );
        let fails = script(d, "fails", "echo 'bad option' >&2; exit 2");
        assert_eq!(
            version_of(
                "fails",
                &fails,
                &["--version"],
                Duration::from_secs(2),
                None
            )
            .unwrap_err(),
            "exit status 2: bad option"
        );
        let hangs = script(d, "hangs", "sleep 100");
        let e = version_of(
            "hangs",
            &hangs,
            &["--version"],
            Duration::from_millis(300),
            None,
        )
        .unwrap_err();
        assert!(e.starts_with("no answer"), "{e}");
        let floods = script(d, "floods", "yes 0123456789abcdefghij | tr -d '\\n'");
        let line = version_of(
            "floods",
            &floods,
            &["--version"],
            Duration::from_secs(2),
            None,
        )
        .unwrap();
        assert_eq!(line.chars().count(), MAX_LINE, "{line}");
    }
}
