//! The sandbox image: `cargo xtask image` builds a Debian bookworm root
//! filesystem with mmdebstrap and installs probe and agent-bridge into it as
//! a user would (binaries in /usr/local/bin, systemd units, an init script);
//! [`Sandbox::boot`] boots it under bubblewrap; `cargo xtask image-demo`
//! runs the campaign against the bridge inside and inspects the sandbox over
//! ssh; [`test`] is the image's part of `cargo xtask test`. docs/IMAGE.md.
//!
//! Layout under target/image/:
//! - `base-KEY/`: the Debian root filesystem, cached. KEY hashes the recipe
//!   (suite, mirrors, packages, hooks), so a changed recipe builds anew and
//!   an unchanged one never does. Never modified once built.
//! - `apt-cache/`: the .deb files mmdebstrap downloaded, so a rebuild
//!   downloads only what changed.
//! - `layer/`: what is installed on top (binaries, units, sandbox-init, ssh
//!   keys), rebuilt by every `cargo xtask image` (it takes a second).
//! - `ssh/`: the client key pair, the sandbox's host key, known_hosts.
//! - `boots/N/`: one booted sandbox's overlay (upper, work, root), removed
//!   at teardown.
//!
//! The root a sandbox sees is an overlay of `layer` over `base` with a fresh
//! upper directory, mounted in a private mount namespace, so the cached image
//! is never written and no mount outlives the sandbox.

use std::fmt::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::campaign::campaign_cli as campaign;
use crate::{ensure_debian, run};

const SUITE: &str = "bookworm";
const MIRRORS: [&str; 3] = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];

/// The Debian packages on top of the essential set (which brings sh, bash,
/// coreutils, findutils, grep, sed, tar, gzip, util-linux, perl-base), and
/// what needs each: the default campaign's tests run sh, python3, gcc and
/// Chromium inside the sandbox (agent-bridge/src/campaign/generate.rs).
pub const PACKAGES: [(&str, &str); 11] = [
    ("coreutils", "every exec step (head, sha256sum, seq, wc, …)"),
    (
        "python3",
        "run_code python: network, memory, compute, documents",
    ),
    ("tzdata", "documents: zoneinfo time zones"),
    (
        "mount",
        "sandbox-init's mounts; process: unshare -m … mount",
    ),
    ("procps", "ps and friends, for inspection over ssh"),
    ("openssh-server", "inspection over ssh"),
    ("openssh-sftp-server", "scp (OpenSSH 9's scp speaks SFTP)"),
    ("gcc", "packages: compile a C program and run it"),
    ("libc6-dev", "packages: gcc's headers and crt files"),
    (
        "chromium",
        "browser: headless Chromium, as `cargo xtask setup` installs",
    ),
    (
        "fonts-liberation",
        "browser: fonts for screenshots and PDFs",
    ),
];

/// Changes to the base after the packages are installed (mmdebstrap
/// customize hooks, run on the host with the root filesystem as $1).
const HOOKS: [&str; 4] = [
    // host keys come with the layer, one pair per image directory
    r#"rm -f "$1"/etc/ssh/ssh_host_*"#,
    r#"printf 'sandbox\n' > "$1/etc/hostname""#,
    r#"printf '127.0.0.1 localhost\n127.0.1.1 sandbox\n::1 localhost ip6-localhost ip6-loopback\n' > "$1/etc/hosts""#,
    // not the build machine's resolver: a name lookup in the sandbox must
    // not send a packet off this machine
    r#"printf '# no resolver: names resolve from /etc/hosts, nothing leaves the machine\nnameserver 127.0.0.1\n' > "$1/etc/resolv.conf""#,
];

/// Bumped when the recipe changes in a way the text above does not show.
const RECIPE_VERSION: u32 = 1;

/// The files the layer takes from dist/: (source, path in the image, mode).
const DIST_FILES: [(&str, &str, u32); 5] = [
    ("dist/sandbox-init", "usr/sbin/sandbox-init", 0o755),
    ("dist/sandbox.conf", "etc/sandbox/sandbox.conf", 0o644),
    (
        "dist/sandbox-sshd.conf",
        "etc/ssh/sshd_config.d/sandbox.conf",
        0o644,
    ),
    (
        "dist/probe.service",
        "etc/systemd/system/probe.service",
        0o644,
    ),
    (
        "dist/agent-bridge.service",
        "etc/systemd/system/agent-bridge.service",
        0o644,
    ),
];

/// The binaries installed into /usr/local/bin.
const BINARIES: [&str; 2] = ["probe", "agent-bridge"];

/// What booting needs on the host (package, check).
const BOOT_TOOLS: [(&str, &str); 4] = [
    ("bubblewrap", "command -v bwrap"),
    ("openssh-client", "command -v ssh && command -v scp"),
    ("util-linux", "command -v unshare"),
    ("iproute2", "command -v ss"),
];

fn say(msg: impl std::fmt::Display) {
    eprintln!("xtask: {msg}");
}

/// Fails unless this process runs as root.
pub fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "`cargo xtask {what}` needs root: mmdebstrap installs packages as root, and the \
             sandbox keeps root's capabilities for the probe (CAP_BPF, CAP_PERFMON). \
             Run `sudo -E cargo xtask {what}`"
        );
    }
    Ok(())
}

/// Fails when a loopback port is taken, naming it, what holds it and what
/// to do.
pub fn require_free_port(port: u16, what: &str, flag: &str) -> anyhow::Result<()> {
    match TcpListener::bind(("127.0.0.1", port)) {
        Ok(_) => Ok(()),
        Err(e) => {
            let holder = Command::new("ss")
                .args(["-Hltnp", &format!("sport = :{port}")])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default();
            let holder = holder
                .split("users:")
                .nth(1)
                .map(|u| format!(", held by {u}"))
                .unwrap_or_default();
            bail!(
                "port {port} on 127.0.0.1 ({what}) is not free: {e}{holder}. Stop what holds it, \
                 or give the sandbox another port with {flag} N"
            )
        }
    }
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    Ok(sha256_hex(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    ))
}

/// Bytes in a tree (du -sb).
fn tree_bytes(path: &Path) -> u64 {
    Command::new("du")
        .arg("-sb")
        .arg(path)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}

/// A built image: the cached Debian base and the layer on top.
#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    pub base: PathBuf,
    pub layer: PathBuf,
    pub ssh: PathBuf,
}

/// Where `cargo xtask image` keeps everything.
pub fn image_dir() -> PathBuf {
    crate::workspace_root().join("target/image")
}

/// The recipe's text: everything that decides the base's contents.
fn recipe() -> String {
    let mut r = format!("recipe {RECIPE_VERSION}\nsuite {SUITE}\nvariant apt\n");
    for m in MIRRORS {
        let _ = writeln!(r, "mirror {m}");
    }
    for (p, _) in PACKAGES {
        let _ = writeln!(r, "package {p}");
    }
    for h in HOOKS {
        let _ = writeln!(r, "hook {h}");
    }
    r
}

/// Checks a directory of binaries to install: both there, executable, and
/// matching its SHA256SUMS when it has one (as `cargo xtask dist` writes).
fn check_bin_dir(bin_dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for b in BINARIES {
        let path = bin_dir.join(b);
        let meta = std::fs::metadata(&path).map_err(|e| {
            anyhow::anyhow!(
                "no `{b}` in {} ({e}): the image needs probe and agent-bridge there \
                 (build them with `cargo build --release -p probe -p agent-bridge`, or \
                 `cargo xtask dist`)",
                bin_dir.display()
            )
        })?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            bail!("{} is not an executable file", path.display());
        }
    }
    let sums = bin_dir.join("SHA256SUMS");
    if let Ok(text) = std::fs::read_to_string(&sums) {
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let (Some(want), Some(name)) = (f.next(), f.next()) else {
                continue;
            };
            let name = name.trim_start_matches('*');
            if BINARIES.contains(&name) {
                let got = sha256_file(&bin_dir.join(name))?;
                if got != want {
                    bail!(
                        "{}: sha256 {got}, but {} says {want}: rebuild the binaries",
                        bin_dir.join(name).display(),
                        sums.display()
                    );
                }
            }
        }
    }
    Ok(())
}

/// `cargo xtask image`: the base (cached, or built with mmdebstrap) and the
/// layer with the binaries of `bin_dir`. `rebuild` builds the base anew.
pub fn build(bin_dir: &Path, rebuild: bool) -> anyhow::Result<Image> {
    require_root("image")?;
    let dir = image_dir();
    let key = sha256_hex(recipe().as_bytes())[..16].to_string();
    let base = dir.join(format!("base-{key}"));
    let cached = !rebuild && base.join(".complete").exists();
    let mut tools = vec![("openssh-client", "command -v ssh-keygen")];
    if !cached {
        tools.push(("mmdebstrap", "command -v mmdebstrap"));
    }
    ensure_debian(&tools)?;
    check_bin_dir(bin_dir)?;
    std::fs::create_dir_all(&dir)?;
    if cached {
        say(format!(
            "image base {} (cached; --rebuild builds it anew)",
            base.display()
        ));
    } else {
        build_base(&dir, &base)?;
        // other recipes' bases are stale now; each is a GiB
        for e in std::fs::read_dir(&dir)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("base-") && e.path() != base {
                say(format!("removing the stale base {}", e.path().display()));
                std::fs::remove_dir_all(e.path())?;
            }
        }
    }
    let ssh = ssh_keys(&dir)?;
    let layer = build_layer(&dir, bin_dir, &ssh, &base)?;
    let image = Image {
        dir,
        base,
        layer,
        ssh,
    };
    image.check()?;
    say(format!(
        "image ready: base {} ({}), layer {} ({})",
        image.base.display(),
        mib(tree_bytes(&image.base)),
        image.layer.display(),
        mib(tree_bytes(&image.layer))
    ));
    Ok(image)
}

fn build_base(dir: &Path, base: &Path) -> anyhow::Result<()> {
    let cache = dir.join("apt-cache");
    std::fs::create_dir_all(&cache)?;
    let tmp = base.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    let log = dir.join("mmdebstrap.log");
    say(format!(
        "building the image base with mmdebstrap ({SUITE}, {} packages; about 3 minutes, \
         less with the .deb cache in {}); log: {}",
        PACKAGES.len(),
        cache.display(),
        log.display()
    ));
    let started = Instant::now();
    let packages: Vec<&str> = PACKAGES.iter().map(|(p, _)| *p).collect();
    let mut cmd = Command::new("mmdebstrap");
    cmd.args([
        "--mode=root",
        "--variant=apt",
        "--format=directory",
        // the downloaded .debs stay for sync-out to keep
        "--skip=essential/unlink",
        "--aptopt=Acquire::Retries \"3\"",
    ])
    .arg(format!("--include={}", packages.join(",")))
    .arg(r#"--setup-hook=mkdir -p "$1"/var/cache/apt/archives/"#)
    .arg(format!(
        "--setup-hook=sync-in {} /var/cache/apt/archives/",
        cache.display()
    ))
    .arg(format!(
        "--customize-hook=sync-out /var/cache/apt/archives {}",
        cache.display()
    ));
    for h in HOOKS {
        cmd.arg(format!("--customize-hook={h}"));
    }
    cmd.arg(SUITE).arg(&tmp).args(MIRRORS);
    let out = std::fs::File::create(&log)?;
    let mut child = cmd
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting mmdebstrap")?;
    // a line every 30 s: the longest step says nothing for minutes
    let status = loop {
        if let Some(s) = child.wait_timeout(Duration::from_secs(30))? {
            break s;
        }
        let last = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|l| l.starts_with("I: "))
            .unwrap_or("")
            .to_string();
        say(format!(
            "mmdebstrap: {:.0} s, {last}",
            started.elapsed().as_secs_f64()
        ));
    };
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let _ = std::fs::remove_dir_all(&tmp);
        bail!(
            "mmdebstrap failed ({status}); the end of {}:\n{}",
            log.display(),
            tail.join("\n")
        );
    }
    std::fs::write(tmp.join(".complete"), recipe())?;
    let _ = std::fs::remove_dir_all(base);
    std::fs::rename(&tmp, base)?;
    say(format!(
        "image base built in {:.0} s: {} ({})",
        started.elapsed().as_secs_f64(),
        base.display(),
        mib(tree_bytes(base))
    ));
    Ok(())
}

/// `Child::wait` with a timeout (polling).
trait WaitTimeout {
    fn wait_timeout(&mut self, d: Duration) -> std::io::Result<Option<std::process::ExitStatus>>;
}

impl WaitTimeout for Child {
    fn wait_timeout(&mut self, d: Duration) -> std::io::Result<Option<std::process::ExitStatus>> {
        let deadline = Instant::now() + d;
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(Some(s));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The test's key pair (the client's) and the sandbox's host key, made
/// once per image directory; known_hosts names the host `sandbox`.
fn ssh_keys(dir: &Path) -> anyhow::Result<PathBuf> {
    let ssh = dir.join("ssh");
    std::fs::create_dir_all(&ssh)?;
    for (file, comment) in [
        ("id_ed25519", "xtask-image-client"),
        ("ssh_host_ed25519_key", "sandbox-host"),
    ] {
        if !ssh.join(file).exists() {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
                .arg(ssh.join(file)))?;
        }
    }
    let host = std::fs::read_to_string(ssh.join("ssh_host_ed25519_key.pub"))?;
    let host: Vec<&str> = host.split_whitespace().take(2).collect();
    std::fs::write(
        ssh.join("known_hosts"),
        format!("sandbox {}\n", host.join(" ")),
    )?;
    Ok(ssh)
}

/// Writes `data` at `rel` under `root` with `mode`, creating directories
/// with the mode the base gives them (an overlay's upper directory decides
/// a directory's mode).
fn install(root: &Path, base: &Path, rel: &str, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = root.join(rel);
    let mut parents: Vec<&Path> = Path::new(rel).ancestors().skip(1).collect();
    parents.reverse();
    for p in parents.into_iter().filter(|p| !p.as_os_str().is_empty()) {
        let dir = root.join(p);
        if dir.exists() {
            continue;
        }
        std::fs::create_dir(&dir)?;
        let m = std::fs::metadata(base.join(p)).map_or(0o755, |m| m.permissions().mode() & 0o7777);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(m))?;
    }
    std::fs::write(&path, data)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The layer: the binaries, units (enabled), sandbox-init, sshd's config
/// and host key, root's authorized_keys; then a manifest.
fn build_layer(dir: &Path, bin_dir: &Path, ssh: &Path, base: &Path) -> anyhow::Result<PathBuf> {
    let layer = dir.join("layer");
    let tmp = dir.join("layer.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let root = crate::workspace_root();
    let mut manifest = serde_json::Map::new();
    for b in BINARIES {
        let data = std::fs::read(bin_dir.join(b))?;
        manifest.insert(
            format!("/usr/local/bin/{b}"),
            serde_json::json!({"from": bin_dir.join(b), "sha256": sha256_hex(&data), "bytes": data.len()}),
        );
        install(&tmp, base, &format!("usr/local/bin/{b}"), &data, 0o755)?;
    }
    for (src, dst, mode) in DIST_FILES {
        let data = std::fs::read(root.join(src)).with_context(|| format!("reading {src}"))?;
        install(&tmp, base, dst, &data, mode)?;
    }
    // `systemctl enable` for both units
    let wants = tmp.join("etc/systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants)?;
    for unit in ["probe.service", "agent-bridge.service"] {
        std::os::unix::fs::symlink(format!("/etc/systemd/system/{unit}"), wants.join(unit))?;
    }
    for (file, mode) in [
        ("ssh_host_ed25519_key", 0o600),
        ("ssh_host_ed25519_key.pub", 0o644),
    ] {
        install(
            &tmp,
            base,
            &format!("etc/ssh/{file}"),
            &std::fs::read(ssh.join(file))?,
            mode,
        )?;
    }
    install(
        &tmp,
        base,
        "root/.ssh/authorized_keys",
        &std::fs::read(ssh.join("id_ed25519.pub"))?,
        0o600,
    )?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            tmp.join("root/.ssh"),
            std::fs::Permissions::from_mode(0o700),
        )?;
    }
    manifest.insert("base".into(), Value::String(base.display().to_string()));
    install(
        &tmp,
        base,
        "etc/sandbox/image.json",
        serde_json::to_string_pretty(&manifest)?.as_bytes(),
        0o644,
    )?;
    let _ = std::fs::remove_dir_all(&layer);
    std::fs::rename(&tmp, &layer)?;
    Ok(layer)
}

impl Image {
    /// Fails when the image lacks what booting needs.
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.base.join(".complete").exists() {
            bail!(
                "{} is not a complete image base: run `cargo xtask image`",
                self.base.display()
            );
        }
        for (path, what) in [
            ("usr/local/bin/probe", "the probe binary"),
            ("usr/local/bin/agent-bridge", "the agent-bridge binary"),
            ("usr/sbin/sandbox-init", "the init script"),
            ("usr/sbin/sshd", "sshd"),
        ] {
            if !self.layer.join(path).is_file() && !self.base.join(path).is_file() {
                bail!(
                    "the image ({} over {}) has no /{path} ({what}): rebuild it with \
                     `cargo xtask image`",
                    self.layer.display(),
                    self.base.display()
                );
            }
        }
        Ok(())
    }

    /// Sizes: (base, layer) in bytes.
    pub fn sizes(&self) -> (u64, u64) {
        (tree_bytes(&self.base), tree_bytes(&self.layer))
    }
}

/// Loopback ports of a booted sandbox.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub ssh: u16,
    pub bridge: u16,
}

impl Ports {
    /// Fails, before anything boots, when one is taken.
    pub fn require_free(&self) -> anyhow::Result<()> {
        require_free_port(self.ssh, "the sandbox's sshd", "--ssh-port")?;
        require_free_port(self.bridge, "the sandbox's agent-bridge", "--bridge-port")
    }

    /// Two ports free now (the kernel's choice).
    pub fn pick() -> anyhow::Result<Ports> {
        let a = TcpListener::bind("127.0.0.1:0")?;
        let b = TcpListener::bind("127.0.0.1:0")?;
        Ok(Ports {
            ssh: a.local_addr()?.port(),
            bridge: b.local_addr()?.port(),
        })
    }
}

/// Quotes for sh.
fn shq(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What teardown found.
#[derive(Debug)]
pub struct Teardown {
    pub stopped_in: Duration,
    /// Stopped by SIGTERM to its init (false: killed).
    pub clean_stop: bool,
    /// Processes or mounts that outlived the sandbox (killed, unmounted).
    pub leftovers: Vec<String>,
}

/// A booted sandbox: bubblewrap running sandbox-init as PID 1.
pub struct Sandbox {
    bwrap: Option<Child>,
    boot: PathBuf,
    root: PathBuf,
    cgroups: Vec<PathBuf>,
    pub ports: Ports,
    pub run_dir: PathBuf,
    pub logs: PathBuf,
    pub ssh_config: PathBuf,
    pub booted_in: Duration,
}

/// The cgroups (cgroup2, v1 memory and pids) this process is in.
fn own_cgroup_dirs() -> anyhow::Result<Vec<PathBuf>> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    let mounts: Vec<(&str, &str, Vec<&str>)> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 3 && f[1].starts_with("/sys/fs/cgroup"))
                .then(|| (f[1], f[2], f[3].split(',').collect()))
        })
        .collect();
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let mut dirs = Vec::new();
    for line in own.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let mount = if id == "0" {
            mounts.iter().find(|m| m.1 == "cgroup2")
        } else if ctl.split(',').any(|c| c == "memory" || c == "pids") {
            mounts
                .iter()
                .find(|m| m.1 == "cgroup" && ctl.split(',').all(|c| m.2.contains(&c)))
        } else {
            None
        };
        if let Some(m) = mount {
            dirs.push(Path::new(m.0).join(path.trim_start_matches('/')));
        }
    }
    Ok(dirs)
}

/// Removes what sandboxes of processes that died without a teardown (a
/// killed xtask: bubblewrap's --die-with-parent took the sandbox with it)
/// left: their overlay directories and their empty cgroups.
fn sweep_stale(boots: &Path) -> anyhow::Result<()> {
    let dead = |name: &str| {
        name.split('-')
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    for e in std::fs::read_dir(boots)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if dead(&name) {
            say(format!(
                "removing {}, left by a sandbox whose runner died",
                e.path().display()
            ));
            std::fs::remove_dir_all(e.path())?;
        }
    }
    for parent in own_cgroup_dirs()? {
        for e in std::fs::read_dir(&parent)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.strip_prefix("probe-sandbox-").is_some_and(dead)
                && cgroup_pids(&e.path()).is_empty()
            {
                remove_cgroup(&e.path());
            }
        }
    }
    Ok(())
}

/// Pids in a cgroup and every cgroup below it.
fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            pids.extend(cgroup_pids(&e.path()));
        }
    }
    pids
}

/// Removes a cgroup and the cgroups below it (they must be empty).
fn remove_cgroup(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            remove_cgroup(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .map(|c| c.replace('\0', " ").trim().to_string())
        .unwrap_or_default()
}

fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Sandbox {
    /// Boots `image` under bubblewrap: its own PID, mount, IPC, UTS and
    /// cgroup namespaces, the host's network (loopback ports), root's
    /// capabilities, /sys from the host, /proc of its PID namespace, a
    /// minimal /dev. `run_dir` gets the logs and an ssh config. Returns
    /// when sshd, the probe (`probe status` over ssh) and the bridge answer.
    pub fn boot(image: &Image, ports: Ports, run_dir: &Path) -> anyhow::Result<Sandbox> {
        require_root("image-demo")?;
        image.check()?;
        ports.require_free()?;
        ensure_debian(&BOOT_TOOLS)?;
        let started = Instant::now();
        let boots = image.dir.join("boots");
        std::fs::create_dir_all(&boots)?;
        sweep_stale(&boots)?;
        let boot = (0..)
            .map(|i| boots.join(format!("{}-{i}", std::process::id())))
            .find(|p| !p.exists())
            .expect("a free name");
        let root = boot.join("root");
        for d in ["upper", "work", "root"] {
            std::fs::create_dir_all(boot.join(d))?;
        }
        for p in [&image.layer, &image.base, &boot] {
            let s = p.display().to_string();
            if s.contains([':', ',', '\'', ' ']) {
                bail!("{s}: the overlay cannot take a path with ':', ',', quotes or spaces");
            }
        }
        std::fs::create_dir_all(run_dir)?;
        let logs = run_dir.join("logs");
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs)?;
        // a cgroup of its own in every hierarchy the bridge uses: teardown
        // finds every process of the sandbox there, and the sandbox's
        // cgroup namespace is rooted at it
        let name = boot.file_name().unwrap().to_string_lossy().into_owned();
        let mut cgroups = Vec::new();
        for d in own_cgroup_dirs()? {
            let cg = d.join(format!("probe-sandbox-{name}"));
            std::fs::create_dir(&cg).with_context(|| format!("creating {}", cg.display()))?;
            cgroups.push(cg);
        }
        let mut script = String::from("set -e\n");
        for cg in &cgroups {
            let _ = writeln!(
                script,
                "echo $$ > {}",
                shq(&cg.join("cgroup.procs").display().to_string())
            );
        }
        let _ = writeln!(
            script,
            "mount -t overlay overlay -o lowerdir={}:{},upperdir={},workdir={} {}",
            image.layer.display(),
            image.base.display(),
            boot.join("upper").display(),
            boot.join("work").display(),
            root.display()
        );
        let env = [
            (
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            ),
            ("HOME", "/root".into()),
            ("LANG", "C.UTF-8".into()),
            ("SANDBOX_SSH_PORT", ports.ssh.to_string()),
            ("SANDBOX_BRIDGE_PORT", ports.bridge.to_string()),
            ("SANDBOX_CGROUPS", "remount".into()),
            ("SANDBOX_STOP_TIMEOUT", "10".into()),
        ];
        let mut bwrap = vec![
            "exec bwrap".to_string(),
            format!("--bind {} /", shq(&root.display().to_string())),
            "--proc /proc --dev /dev --bind /sys /sys".into(),
            format!(
                "--bind {} /var/log/sandbox",
                shq(&logs.display().to_string())
            ),
            "--unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup --hostname sandbox".into(),
            "--die-with-parent --as-pid-1 --cap-add ALL --clearenv".into(),
        ];
        for (k, v) in env {
            bwrap.push(format!("--setenv {k} {}", shq(&v)));
        }
        bwrap.push("--chdir / /usr/sbin/sandbox-init".into());
        script.push_str(&bwrap.join(" \\\n  "));
        script.push('\n');
        std::fs::write(run_dir.join("boot.sh"), &script)?;
        say(format!(
            "booting the sandbox (bubblewrap, sandbox-init as PID 1; ssh on 127.0.0.1:{}, bridge on 127.0.0.1:{})",
            ports.ssh, ports.bridge
        ));
        let console = std::fs::File::create(logs.join("console.log"))?;
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh"])
            .arg(run_dir.join("boot.sh"))
            .stdin(Stdio::null())
            .stdout(console.try_clone()?)
            .stderr(console)
            .spawn()
            .context("starting unshare + bwrap")?;
        let ssh_config = run_dir.join("ssh_config");
        std::fs::write(
            &ssh_config,
            format!(
                "Host sandbox\n  HostName 127.0.0.1\n  Port {}\n  User root\n  IdentityFile {}\n  \
                 IdentitiesOnly yes\n  UserKnownHostsFile {}\n  HostKeyAlias sandbox\n  \
                 StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 10\n",
                ports.ssh,
                image.ssh.join("id_ed25519").display(),
                image.ssh.join("known_hosts").display()
            ),
        )?;
        let mut sb = Sandbox {
            bwrap: Some(child),
            boot,
            root,
            cgroups,
            ports,
            run_dir: run_dir.to_path_buf(),
            logs,
            ssh_config,
            booted_in: Duration::ZERO,
        };
        sb.wait_ready(started)?;
        sb.booted_in = started.elapsed();
        say(format!(
            "sandbox up in {:.1} s; ssh -F {} sandbox",
            sb.booted_in.as_secs_f64(),
            sb.ssh_config.display()
        ));
        Ok(sb)
    }

    fn wait_ready(&mut self, started: Instant) -> anyhow::Result<()> {
        let deadline = started + Duration::from_secs(120);
        let mut stage = 0;
        while stage < 3 {
            if let Some(s) = self.bwrap.as_mut().unwrap().try_wait()? {
                bail!(
                    "the sandbox exited during boot ({s}); its console ({}):\n{}",
                    self.logs.join("console.log").display(),
                    tail(&self.logs.join("console.log"), 20)
                );
            }
            if Instant::now() > deadline {
                let what = ["sshd", "the probe", "the bridge"][stage];
                bail!(
                    "{what} did not come up in the sandbox within 120 s; logs in {}:\n{}",
                    self.logs.display(),
                    tail(&self.logs.join("init.log"), 20)
                );
            }
            let up = match stage {
                0 => port_open(self.ports.ssh),
                1 => self
                    .ssh_quiet("probe status >/dev/null")
                    .map(|o| o.status.success())
                    .unwrap_or(false),
                _ => port_open(self.ports.bridge),
            };
            if up {
                say(format!(
                    "  {} up after {:.1} s",
                    ["sshd", "probe (`probe status` over ssh)", "agent-bridge"][stage],
                    started.elapsed().as_secs_f64()
                ));
                stage += 1;
            } else {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The host pid of the sandbox's PID 1 (bwrap's child).
    fn init_pid(&self) -> Option<u32> {
        let b = self.bwrap.as_ref()?.id();
        std::fs::read_to_string(format!("/proc/{b}/task/{b}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn ssh_quiet(&self, command: &str) -> std::io::Result<std::process::Output> {
        Command::new("ssh")
            .arg("-F")
            .arg(&self.ssh_config)
            .args(["sandbox", command])
            .stdin(Stdio::null())
            .output()
    }

    /// Runs `command` in the sandbox over ssh; fails with its stderr.
    pub fn ssh(&self, command: &str) -> anyhow::Result<String> {
        let out = self.ssh_quiet(command)?;
        if !out.status.success() {
            bail!(
                "ssh sandbox {command:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Copies a file out of the sandbox with scp.
    pub fn scp_from(&self, remote: &str, local: &Path) -> anyhow::Result<()> {
        run(Command::new("scp")
            .arg("-F")
            .arg(&self.ssh_config)
            .arg(format!("sandbox:{remote}"))
            .arg(local))
    }

    /// Stops the sandbox (SIGTERM to its init; SIGKILL after 30 s), then
    /// checks that nothing outlived it: no process in its cgroups, none
    /// whose root is its root, no mount below its directory. Leftovers are
    /// killed and reported. The overlay's directories are removed.
    pub fn shutdown(mut self) -> anyhow::Result<Teardown> {
        let t = self.stop();
        self.bwrap = None;
        if !t.leftovers.is_empty() {
            bail!(
                "the sandbox left {} behind (now killed): {}",
                t.leftovers.len(),
                t.leftovers.join("; ")
            );
        }
        Ok(t)
    }

    fn stop(&mut self) -> Teardown {
        let started = Instant::now();
        let mut clean_stop = false;
        let init = self.init_pid();
        if let Some(mut child) = self.bwrap.take() {
            if let Some(init) = init {
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(init as i32, libc::SIGTERM) };
            }
            // bwrap exits when its child (init) does
            clean_stop = matches!(child.wait_timeout(Duration::from_secs(30)), Ok(Some(_)));
            if !clean_stop {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        let stopped_in = started.elapsed();
        let mut leftovers = Vec::new();
        // the kernel empties a dying PID namespace quickly, not at once
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut pids: Vec<u32> = self.cgroups.iter().flat_map(|c| cgroup_pids(c)).collect();
        while !pids.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            pids = self.cgroups.iter().flat_map(|c| cgroup_pids(c)).collect();
        }
        let root = self.root.display().to_string();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let r = std::fs::read_link(e.path().join("root")).unwrap_or_default();
            if r.starts_with(&root) && !pids.contains(&pid) {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            leftovers.push(format!("process {pid} ({})", comm(pid)));
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let boot = self.boot.display().to_string();
        for line in std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
        {
            if let Some(point) = line.split(' ').nth(4)
                && point.starts_with(&boot)
            {
                leftovers.push(format!("mount {point}"));
                let _ = Command::new("umount").args(["-l", point]).status();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        for cg in &self.cgroups {
            remove_cgroup(cg);
            if cg.exists() {
                leftovers.push(format!("cgroup {}", cg.display()));
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.boot) {
            leftovers.push(format!("{}: {e}", self.boot.display()));
        }
        Teardown {
            stopped_in,
            clean_stop,
            leftovers,
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.bwrap.is_some() {
            let t = self.stop();
            if !t.leftovers.is_empty() {
                eprintln!("xtask: the sandbox left behind: {}", t.leftovers.join("; "));
            }
        }
    }
}

/// How the kernel evidence joined the campaign's steps after the import.
#[derive(Debug, Default)]
pub struct Joined {
    pub steps: i64,
    pub steps_with_span: i64,
    pub steps_with_events: i64,
    pub events: i64,
    pub table: String,
}

/// Steps joined to their spans (session = mcp_session, id = span_id) and
/// the spans' events, per domain, with an example.
pub fn joined(db: &Path, run_name: &str) -> anyhow::Result<Joined> {
    let conn = rusqlite::Connection::open(db)?;
    let mut j = Joined::default();
    let mut t = format!(
        "{:<12} {:>6} {:>10} {:>12} {:>8}\n",
        "DOMAIN", "STEPS", "WITH SPAN", "WITH EVENTS", "EVENTS"
    );
    let mut stmt = conn.prepare(
        "SELECT t.domain, COUNT(*), COUNT(p.id),
                SUM((SELECT COUNT(*) FROM events e WHERE e.probe_id = p.probe_id AND e.span_id = p.id) > 0),
                COALESCE(SUM((SELECT COUNT(*) FROM events e WHERE e.probe_id = p.probe_id AND e.span_id = p.id)), 0)
         FROM campaign_steps s JOIN campaign_tests t USING (run, test_id)
         LEFT JOIN spans p ON p.session = t.mcp_session AND p.id = s.span_id
         WHERE s.run = ?1 AND s.verdict != 'not-run'
         GROUP BY t.domain ORDER BY t.domain",
    )?;
    let rows = stmt.query_map([run_name], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, Option<i64>>(3)?.unwrap_or(0),
            r.get::<_, i64>(4)?,
        ))
    })?;
    for row in rows {
        let (domain, steps, spans, with_events, events) = row?;
        let _ = writeln!(
            t,
            "{domain:<12} {steps:>6} {spans:>10} {with_events:>12} {events:>8}"
        );
        j.steps += steps;
        j.steps_with_span += spans;
        j.steps_with_events += with_events;
        j.events += events;
    }
    let _ = writeln!(
        t,
        "{:<12} {:>6} {:>10} {:>12} {:>8}",
        "total", j.steps, j.steps_with_span, j.steps_with_events, j.events
    );
    // one step's events, as an example: a failed one when there is one
    let example: Option<(String, i64, String, i64)> = conn
        .query_row(
            "SELECT t.test_id, s.step, s.tool, p.id
             FROM campaign_steps s JOIN campaign_tests t USING (run, test_id)
             JOIN spans p ON p.session = t.mcp_session AND p.id = s.span_id
             WHERE s.run = ?1 AND EXISTS (SELECT 1 FROM events e WHERE e.probe_id = p.probe_id AND e.span_id = p.id)
             ORDER BY s.verdict = 'fail' DESC, t.test_id, s.step LIMIT 1",
            [run_name],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .ok();
    if let Some((test, step, tool, span)) = example {
        let _ = writeln!(
            t,
            "\n{test} step {step} ({tool}), span {span}: its first events"
        );
        let mut stmt = conn.prepare(
            "SELECT e.kind, e.pid, e.comm, COALESCE(e.syscall, ''), COALESCE(e.errno, ''), COALESCE(e.path, '')
             FROM events e JOIN spans p ON e.probe_id = p.probe_id AND e.span_id = p.id
             JOIN campaign_tests t ON p.session = t.mcp_session
             WHERE t.run = ?1 AND t.test_id = ?2 AND p.id = ?3 ORDER BY e.seq LIMIT 8",
        )?;
        let rows = stmt.query_map(rusqlite::params![run_name, test, span], |r| {
            Ok(format!(
                "  {:<8} {}[{}] {} {} {}",
                r.get::<_, String>(0)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?
            ))
        })?;
        for row in rows {
            let _ = writeln!(t, "{}", row?.trim_end());
        }
    }
    j.table = t;
    Ok(j)
}

/// What a campaign in a booted sandbox produced.
pub struct Outcome {
    pub summary: Value,
    pub status: String,
    pub failed_spans: String,
    pub export: PathBuf,
    pub import: String,
    pub joined: Joined,
    pub report: String,
    pub db: PathBuf,
    pub html: PathBuf,
    pub zombies: usize,
}

/// Generates `count` tests, runs them from the host against the bridge in
/// the sandbox, inspects the sandbox over ssh (`probe status`, `probe spans
/// --failed`, `probe export --format sqlite`), copies the export out with
/// scp and imports it into the results DB.
pub fn campaign_in(
    sb: &Sandbox,
    bridge: &Path,
    count: usize,
    workers: usize,
) -> anyhow::Result<Outcome> {
    let dir = &sb.run_dir;
    let suite = dir.join("suite");
    let db = dir.join("results.db");
    let export = dir.join("evidence.sqlite");
    for f in [&db, &export] {
        let _ = std::fs::remove_file(f);
        let _ = std::fs::remove_file(f.with_extension("db-wal"));
        let _ = std::fs::remove_file(f.with_extension("db-shm"));
    }
    let _ = std::fs::remove_dir_all(&suite);
    let s = |p: &Path| p.display().to_string();
    crate::campaign::generate(bridge, count, &suite)?;
    let url = format!("http://127.0.0.1:{}/mcp", sb.ports.bridge);
    say(format!(
        "running {count} tests from the host against {url} ({workers} workers)"
    ));
    let out = campaign(
        bridge,
        &[
            "run",
            "--suite",
            &s(&suite),
            "--target",
            &url,
            "--db",
            &s(&db),
            "--run",
            "sandbox",
            "--label",
            "sandbox",
            "--workers",
            &workers.to_string(),
            "--json",
            "--no-bar",
        ],
    )?;
    let summary: Value = serde_json::from_str(&out).context("the runner's summary")?;
    say("inspecting the sandbox over ssh: probe status, probe spans --failed, probe export");
    let status = sb.ssh("probe status")?;
    let failed_spans = sb.ssh("probe spans --failed --limit 20")?;
    // an orphan (its parent shell exits at once) is reparented to init,
    // which must reap it when it exits
    let zombies = sb
        .ssh("sh -c 'sleep 0.3 & exit 0'; sleep 3; ps -eo stat= | grep -c '^Z' || true")?
        .trim()
        .parse()
        .unwrap_or(0);
    sb.ssh(
        "rm -f /var/lib/probe/export.sqlite && \
         probe export --format sqlite --out /var/lib/probe/export.sqlite",
    )?;
    sb.scp_from("/var/lib/probe/export.sqlite", &export)?;
    let import = campaign(bridge, &["import", "--db", &s(&db), &s(&export)])?;
    let html = dir.join("report.html");
    let report = campaign(
        bridge,
        &[
            "report",
            "--db",
            &s(&db),
            "--run",
            "sandbox",
            "--html",
            &s(&html),
        ],
    )?;
    let joined = joined(&db, "sandbox")?;
    Ok(Outcome {
        summary,
        status,
        failed_spans,
        export,
        import,
        joined,
        report,
        db,
        html,
        zombies,
    })
}

/// The binaries to install: `bin_dir`, or a release build.
pub fn binaries(bin_dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(d) = bin_dir {
        return Ok(std::path::absolute(d)?);
    }
    crate::setup()?;
    // the static executables, installed as a user would install a release
    crate::dist::build()
}

/// `cargo xtask image-demo`.
pub fn demo(
    count: usize,
    workers: usize,
    ports: Ports,
    bin_dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    require_root("image-demo")?;
    ports.require_free()?;
    let started = Instant::now();
    let bin = binaries(bin_dir)?;
    let image = build(&bin, false)?;
    let run_dir = crate::workspace_root().join("target/image-demo");
    let sb = Sandbox::boot(&image, ports, &run_dir)?;
    let booted = sb.booted_in;
    let o = campaign_in(&sb, &bin.join("agent-bridge"), count, workers)?;
    let logs = sb.logs.clone();
    let ssh_config = sb.ssh_config.clone();
    say("stopping the sandbox");
    let t = sb.shutdown()?;
    println!("\n== the campaign, run from the host against the bridge in the sandbox\n");
    println!("{}", o.report);
    println!("== probe status (over ssh)\n\n{}", o.status);
    println!("== probe spans --failed (over ssh)\n\n{}", o.failed_spans);
    println!(
        "== the export, imported into the results DB\n\n{}",
        o.import
    );
    println!(
        "== kernel events joined to the steps (spans.session = campaign_tests.mcp_session, \
         spans.id = campaign_steps.span_id)\n\n{}",
        o.joined.table
    );
    if o.joined.events == 0 {
        println!(
            "no kernel events joined: the probe in the sandbox recorded spans without events \
             (the bridge names its workloads by their pids in the sandbox's PID namespace, \
             the kernel reports host pids; see docs/IMAGE.md)\n"
        );
    }
    let (base, layer) = image.sizes();
    println!(
        "image:    {} ({}) + {} ({})\n\
         results:  {}\nHTML:     {}\nexport:   {}\nlogs:     {} (init, sshd, probe, agent-bridge, console)\n\
         ssh:      ssh -F {} sandbox   (while a sandbox runs)\n\
         times:    boot {:.1} s, campaign {:.1} s, stop {:.1} s ({}), all {:.0} s; nothing left running",
        image.base.display(),
        mib(base),
        image.layer.display(),
        mib(layer),
        o.db.display(),
        o.html.display(),
        o.export.display(),
        logs.display(),
        ssh_config.display(),
        booted.as_secs_f64(),
        o.summary["wall_s"].as_f64().unwrap_or(0.0),
        t.stopped_in.as_secs_f64(),
        if t.clean_stop { "SIGTERM" } else { "killed" },
        started.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// One check of the test: its name and its failure, if any.
struct Checks(Vec<(String, Option<String>)>);

impl Checks {
    fn check(&mut self, name: &str, result: anyhow::Result<()>) {
        match &result {
            Ok(()) => say(format!("ok: {name}")),
            Err(e) => say(format!("FAILED: {name}: {e:#}")),
        }
        self.0
            .push((name.to_string(), result.err().map(|e| format!("{e:#}"))));
    }

    fn ensure(&mut self, name: &str, ok: bool, why: impl std::fmt::Display) {
        self.check(
            name,
            if ok {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{why}"))
            },
        );
    }
}

/// Runs this binary (`cargo xtask …`) with `args`; `prefix` goes before it
/// (e.g. setpriv to drop root). Returns (success, stderr).
fn xtask(
    prefix: &[&str],
    args: &[&str],
    env_path: Option<&Path>,
) -> anyhow::Result<(bool, String)> {
    let mut exe = std::env::current_exe()?;
    if !prefix.is_empty() {
        // another user runs a copy: the tree may be closed to it
        let dir = std::env::temp_dir().join(format!("xtask-image-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(&exe, dir.join("xtask"))?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        }
        exe = dir.join("xtask");
    }
    let mut cmd = if let Some((first, rest)) = prefix.split_first() {
        let mut c = Command::new(first);
        c.args(rest).arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    cmd.args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if let Some(p) = env_path {
        cmd.env("PATH", p);
    }
    let out = cmd.output()?;
    if !prefix.is_empty()
        && let Some(dir) = exe.parent()
    {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Expects a failure whose message contains every one of `words`.
fn refused(r: anyhow::Result<(bool, String)>, words: &[&str]) -> anyhow::Result<()> {
    let (ok, err) = r?;
    if ok {
        bail!("it succeeded");
    }
    for w in words {
        if !err.contains(w) {
            bail!("the message does not say `{w}`: {}", err.trim());
        }
    }
    say(format!(
        "  said: {}",
        err.trim().lines().last().unwrap_or("")
    ));
    Ok(())
}

/// The image's part of `cargo xtask test` (root): bad input first, then
/// the image (cached), a boot, a campaign of `count` tests against the
/// bridge inside, inspection over ssh, the import, and a teardown that
/// leaves nothing behind. Every check runs; the failures are listed at
/// the end.
pub fn test(bin: &Path, count: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = crate::workspace_root().join("target/image-test");
    std::fs::create_dir_all(&dir)?;
    let mut c = Checks(Vec::new());

    // bad input: each refused with a message that says what to do
    c.check(
        "not root: refused",
        refused(
            xtask(
                &[
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "--",
                ],
                &["image"],
                None,
            ),
            &["needs root", "sudo"],
        ),
    );
    let fake = dir.join("no-mmdebstrap");
    let _ = std::fs::remove_dir_all(&fake);
    std::fs::create_dir_all(&fake)?;
    std::os::unix::fs::symlink("/bin/sh", fake.join("sh"))?;
    std::fs::write(
        fake.join("apt-get"),
        "#!/bin/sh\necho \"E: Unable to locate package (apt-get $*, a stand-in that fails)\" >&2\nexit 100\n",
    )?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(fake.join("apt-get"), std::fs::Permissions::from_mode(0o755))?;
    }
    c.check(
        "mmdebstrap missing and not installable: refused",
        refused(
            xtask(
                &[],
                &[
                    "image",
                    "--rebuild",
                    "--bin-dir",
                    &bin.display().to_string(),
                ],
                Some(&fake),
            ),
            &["mmdebstrap", "not installed", "apt-get install"],
        ),
    );
    let held = TcpListener::bind("127.0.0.1:0")?;
    let held_port = held.local_addr()?.port().to_string();
    let free = Ports::pick()?;
    for (which, ssh, bridge) in [
        ("bridge's", free.ssh.to_string(), held_port.clone()),
        ("ssh", held_port.clone(), free.bridge.to_string()),
    ] {
        let flag = if which == "ssh" {
            "--ssh-port"
        } else {
            "--bridge-port"
        };
        c.check(
            &format!("the {which} port taken: refused before booting"),
            refused(
                xtask(
                    &[],
                    &[
                        "image-demo",
                        "--count",
                        "1",
                        "--ssh-port",
                        &ssh,
                        "--bridge-port",
                        &bridge,
                    ],
                    None,
                ),
                &[&format!("port {held_port}"), flag],
            ),
        );
    }
    drop(held);
    let no_probe = dir.join("bin-without-probe");
    let _ = std::fs::remove_dir_all(&no_probe);
    std::fs::create_dir_all(&no_probe)?;
    std::fs::copy(bin.join("agent-bridge"), no_probe.join("agent-bridge"))?;
    c.check(
        "binaries without probe: refused",
        refused(
            xtask(
                &[],
                &["image", "--bin-dir", &no_probe.display().to_string()],
                None,
            ),
            &["no `probe`", "cargo build --release -p probe"],
        ),
    );

    // the image (cached after the first build)
    let t = Instant::now();
    let image = build(bin, false)?;
    let build_s = t.elapsed().as_secs_f64();
    let broken = Image {
        layer: no_probe.clone(),
        ..image.clone()
    };
    c.check(
        "an image without the probe binary does not boot",
        match Sandbox::boot(&broken, Ports::pick()?, &dir.join("broken")) {
            Ok(_) => Err(anyhow::anyhow!("it booted")),
            Err(e) if e.to_string().contains("/usr/local/bin/probe") => {
                say(format!("  said: {e}"));
                Ok(())
            }
            Err(e) => Err(e),
        },
    );

    let sb = Sandbox::boot(&image, Ports::pick()?, &dir)?;
    let booted = sb.booted_in;
    let run = campaign_in(&sb, &bin.join("agent-bridge"), count, 4);
    let hostname = sb.ssh("hostname; ps -o pid= -p 1; cat /proc/1/cmdline | tr '\\0' ' '");
    let units = sb.ssh(
        "systemd-analyze verify /etc/systemd/system/probe.service \
         /etc/systemd/system/agent-bridge.service 2>&1",
    );
    let t = sb.shutdown();
    c.check(
        "teardown: nothing left running, no mounts, cgroups removed",
        t.as_ref().map(|_| ()).map_err(|e| anyhow::anyhow!("{e:#}")),
    );
    if let Ok(t) = &t {
        c.ensure(
            "teardown: stopped by SIGTERM",
            t.clean_stop,
            "it had to be killed",
        );
    }
    c.check(
        "inside: hostname sandbox, sandbox-init is PID 1",
        hostname.and_then(|h| {
            let mut l = h.lines();
            if l.next() == Some("sandbox")
                && l.next().map(str::trim) == Some("1")
                && l.next().is_some_and(|c| c.contains("sandbox-init"))
            {
                Ok(())
            } else {
                Err(anyhow::anyhow!("got {h:?}"))
            }
        }),
    );
    c.check(
        "inside: the systemd units verify (systemd-analyze verify)",
        units.map(|_| ()),
    );
    match run {
        Err(e) => c.check("the campaign in the sandbox", Err(e)),
        Ok(o) => {
            let n = |k: &str| o.summary[k].as_i64().unwrap_or(-1);
            c.ensure(
                &format!("campaign: {count} tests recorded"),
                n("recorded") == count as i64,
                format!("{} recorded", n("recorded")),
            );
            c.ensure(
                "campaign: every test passed (as on the host)",
                n("passed") + n("degraded") == count as i64,
                format!(
                    "{} passed, {} degraded, {} failed:\n{}",
                    n("passed"),
                    n("degraded"),
                    n("failed"),
                    o.report
                ),
            );
            c.ensure(
                "ssh: probe status",
                o.status.contains("programs"),
                format!("{:?}", o.status),
            );
            c.ensure(
                "ssh: probe spans --failed",
                o.failed_spans.contains("SPAN"),
                format!("{:?}", o.failed_spans),
            );
            c.ensure(
                "scp: the export came out",
                std::fs::metadata(&o.export).is_ok_and(|m| m.len() > 0),
                o.export.display(),
            );
            c.ensure(
                "no zombies in the sandbox (init reaps orphans)",
                o.zombies == 0,
                format!("{} zombies", o.zombies),
            );
            print!("{}", o.joined.table);
            c.ensure(
                "import: steps joined to their spans",
                o.joined.steps_with_span > 0,
                format!("none of {} steps:\n{}", o.joined.steps, o.import),
            );
            c.ensure(
                "import: kernel events joined to steps",
                o.joined.events > 0,
                format!(
                    "{} steps, {} with a span, but no span has events: the probe in the sandbox \
                     traced nothing (pids in the sandbox's PID namespace?); see {}",
                    o.joined.steps,
                    o.joined.steps_with_span,
                    o.db.display()
                ),
            );
        }
    }
    let failed: Vec<&(String, Option<String>)> = c.0.iter().filter(|(_, e)| e.is_some()).collect();
    say(format!(
        "image test: {} checks, {} failed; image build {build_s:.1} s, boot {:.1} s, all {:.0} s",
        c.0.len(),
        failed.len(),
        booted.as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
    if !failed.is_empty() {
        bail!(
            "the image test failed:\n{}",
            failed
                .iter()
                .map(|(n, e)| format!("- {n}: {}", e.as_deref().unwrap_or("")))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(())
}
