//! The static release executables of `cargo xtask dist` (`DIST_DIR`): static
//! by their own ELF headers, and working in an empty root — a directory
//! holding only them, the workload's files and /proc, /sys, /dev — where
//! there is no libc, no loader and no /bin/sh.
//!
//! Run by `cargo xtask test` (after `dist::build()`), as root: the probe
//! loads eBPF programs, and the empty root is a chroot in a mount
//! namespace of its own (`unshare --mount`). Without DIST_DIR or root they
//! are skipped with a message, except under CI=true, where that fails.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

const BINARIES: [&str; 3] = ["probe", "probe-fault", "agent-bridge"];

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The dist directory, when the test can run; panics under CI when it cannot.
fn dist() -> Option<PathBuf> {
    dist_in("DIST_DIR")
}

/// The dist directory `var` names (DIST_DIR: this machine's x86_64 set;
/// DIST_DIR_AARCH64: the aarch64 one, cross-built).
fn dist_in(var: &str) -> Option<PathBuf> {
    let missing = if !nix::unistd::geteuid().is_root() {
        "root (eBPF and chroot)".to_string()
    } else if let Some(dir) = std::env::var_os(var) {
        return Some(PathBuf::from(dir));
    } else {
        format!("{var} (`cargo xtask test` builds it with `cargo xtask dist` and sets it)")
    };
    assert!(
        !ci(),
        "the dist tests need {missing}; CI=true forbids skipping"
    );
    eprintln!("SKIPPED: the dist tests need {missing}");
    None
}

/// Runs a tool that the test needs; a missing one fails the test.
fn tool(program: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}): `cargo xtask setup` installs it"))
}

#[test]
fn executables_are_static_and_match_their_sums() {
    for (var, machine) in [
        ("DIST_DIR", "Advanced Micro Devices X86-64"),
        ("DIST_DIR_AARCH64", "AArch64"),
    ] {
        let Some(dist) = dist_in(var) else { return };
        static_with_sums(&dist, machine);
    }
}

/// Each executable of `dist` is an ELF for `machine`, asks for no loader
/// and no library, and matches SHA256SUMS.
fn static_with_sums(dist: &Path, machine: &str) {
    let dist = dist.to_path_buf();
    for bin in BINARIES {
        let header = tool("readelf", &["-hW", bin], &dist);
        let header = String::from_utf8_lossy(&header.stdout);
        let for_machine = |l: &str| {
            l.split_once(':')
                .is_some_and(|(k, v)| k.trim() == "Machine" && v.trim() == machine)
        };
        assert!(
            header.lines().any(for_machine),
            "{bin} in {} is not built for {machine}:\n{header}",
            dist.display()
        );
        // readelf, independently of xtask's own reading of the headers
        let headers = tool("readelf", &["-lW", bin], &dist);
        assert!(headers.status.success(), "readelf -l {bin}: {headers:?}");
        let headers = String::from_utf8_lossy(&headers.stdout);
        assert!(
            headers.contains("Program Headers:") && !headers.contains("INTERP"),
            "{bin} asks for a program interpreter:\n{headers}"
        );
        let dynamic = tool("readelf", &["-dW", bin], &dist);
        assert!(dynamic.status.success(), "readelf -d {bin}: {dynamic:?}");
        let dynamic = String::from_utf8_lossy(&dynamic.stdout);
        assert!(
            !dynamic.contains("(NEEDED)"),
            "{bin} needs shared libraries:\n{dynamic}"
        );
    }
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS")).expect("SHA256SUMS");
    let names: Vec<&str> = sums
        .lines()
        .filter_map(|l| l.split_once("  ").map(|(_, name)| name))
        .collect();
    assert_eq!(names, BINARIES, "SHA256SUMS:\n{sums}");
    let check = tool("sha256sum", &["--check", "--strict", "SHA256SUMS"], &dist);
    assert!(check.status.success(), "sha256sum --check: {check:?}");
}

/// The aarch64 set, on this x86_64 machine: each CLI answers under user-mode
/// emulation (`qemu-aarch64`, no kernel needed: eBPF is checked in the
/// arm64 guests of the kernel matrix), says which syscalls arm64 lacks,
/// and started natively gets the kernel's refusal, not a half-start.
#[test]
fn the_aarch64_executables_answer_under_emulation_and_are_refused_natively() {
    let Some(dist) = dist_in("DIST_DIR_AARCH64") else {
        return;
    };
    let qemu = "qemu-aarch64-static";
    for bin in BINARIES {
        let out = tool(qemu, &[bin, "--version"], &dist);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.starts_with(&format!("{bin} ")),
            "{qemu} {bin} --version: {out:?}"
        );
    }
    // arm64 has no mkdir(2): the fault tool says what to name instead
    let out = tool(
        qemu,
        &["probe-fault", "--seccomp", "errno:mkdir", "--", "true"],
        &dist,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("no syscall `mkdir` on aarch64") && err.contains("mkdirat"),
        "{err}"
    );
    let binfmt = Path::new("/proc/sys/fs/binfmt_misc/qemu-aarch64");
    if binfmt.exists() {
        eprintln!(
            "binfmt_misc runs aarch64 executables here through qemu: no native refusal to see"
        );
        return;
    }
    for bin in BINARIES {
        let err = Command::new(dist.join(bin))
            .arg("--version")
            .output()
            .expect_err("an aarch64 executable started on x86_64");
        assert_eq!(err.raw_os_error(), Some(libc::ENOEXEC), "{bin}: {err}");
    }
}

/// A directory that becomes `/` for the commands run in it: the given dist
/// executables, empty /proc, /sys and /dev (bound there in the namespace).
struct EmptyRoot {
    dir: tempfile::TempDir,
}

impl EmptyRoot {
    fn new(dist: &Path, binaries: &[&str]) -> EmptyRoot {
        let dir = tempfile::Builder::new()
            .prefix("dist-root-")
            .tempdir()
            .unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let root = EmptyRoot { dir };
        for d in ["proc", "sys", "dev"] {
            std::fs::create_dir(root.path().join(d)).unwrap();
        }
        for bin in binaries {
            std::fs::copy(dist.join(bin), root.path().join(bin)).unwrap();
        }
        root
    }

    /// The root directory (the temporary directory holds it and the logs).
    fn path(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// `sh -c SCRIPT` in a new mount namespace where /proc, /sys and /dev
    /// are bound into the root; `$R` is the root, `$@` the arguments. The
    /// script runs outside the root: it enters it with `chroot "$R" …`.
    fn namespace(&self, script: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "--fork",
            "--kill-child",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "set -e; for d in proc sys dev; do mount --rbind /$d \"$R/$d\"; done\n{script}"
        ))
        .arg("sh")
        .args(args)
        .env("R", self.path());
        cmd
    }

    /// ARGV run as root's `/`, with nothing else in it.
    fn run(&self, argv: &[&str]) -> Output {
        self.namespace("exec chroot \"$R\" \"$@\"", argv)
            .output()
            .expect("run unshare (util-linux)")
    }
}

/// A static workload: `fail mkdir PATH` or `fail open PATH`, exit 1 with the
/// errno's message when the call fails.
const FAIL_C: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int r = strcmp(argv[1], "mkdir") == 0 ? mkdir(argv[2], 0755)
                                          : openat(AT_FDCWD, argv[2], O_RDONLY);
    if (r < 0) {
        fprintf(stderr, "fail: %s %s: %s\n", argv[1], argv[2], strerror(errno));
        return 1;
    }
    return 0;
}
"#;

fn json_report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "probe trace --json printed no JSON object ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn probe_attributes_failures_of_a_static_workload_in_an_empty_root() {
    let Some(dist) = dist() else { return };
    let root = EmptyRoot::new(&dist, &["probe", "probe-fault"]);
    let src = root.dir.path().join("fail.c");
    std::fs::write(&src, FAIL_C).unwrap();
    let cc = tool(
        "musl-gcc",
        &["-static", "-O2", "-o", "root/fail", "fail.c"],
        root.dir.path(),
    );
    assert!(cc.status.success(), "musl-gcc -static: {cc:?}");
    std::fs::create_dir(root.path().join("data")).unwrap();

    // a seccomp denial injected by probe-fault, which execs the workload
    let out = root.run(&[
        "/probe",
        "trace",
        "--json",
        "--",
        "/probe-fault",
        "--seccomp",
        "errno:mkdir",
        "--",
        "/fail",
        "mkdir",
        "/data/out",
    ]);
    let report = json_report(&out);
    let context = format!(
        "{report:#}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report["primitive"], "seccomp", "{context}");
    assert_eq!(report["layer"], "sandbox", "{context}");
    assert_eq!(report["decisive"]["kind"], "seccomp_denied", "{context}");
    assert_eq!(report["decisive"]["syscall"], "mkdir", "{context}");
    assert_eq!(report["decisive"]["errno"], "EPERM", "{context}");
    assert_eq!(report["decisive"]["path"], "/data/out", "{context}");
    assert_eq!(report["decisive"]["comm"], "fail", "{context}");
    assert_eq!(out.status.code(), Some(1), "{context}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("fail: mkdir /data/out: Operation not permitted"),
        "the workload's stderr passes through: {context}"
    );

    // a missing input file, in the human-readable report
    let out = root.run(&["/probe", "trace", "--", "/fail", "open", "/data/input.csv"]);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{all}");
    let line = |label: &str| {
        all.lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` line in:\n{all}"))
            .to_owned()
    };
    assert!(line("primitive").contains("fs.missing"), "{all}");
    assert!(
        line("decisive").contains("openat(\"/data/input.csv\") ENOENT"),
        "{all}"
    );

    // and the empty root has no shell: exec.missing, exit 127
    let out = root.run(&["/probe", "trace", "--json", "--", "/bin/sh", "-c", "true"]);
    let report = json_report(&out);
    assert_eq!(report["primitive"], "exec.missing", "{report:#}");
    assert_eq!(report["decisive"]["syscall"], "execve", "{report:#}");
    assert_eq!(report["decisive"]["path"], "/bin/sh", "{report:#}");
    assert_eq!(out.status.code(), Some(127));
}

/// A newline-delimited JSON-RPC client on a child's stdin and stdout.
struct Client {
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<String>,
    child: std::process::Child,
    next_id: u64,
    /// `probe run`'s output, for the failure message.
    daemon_log: PathBuf,
}

impl Client {
    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").expect("the bridge closed its stdin");
        stdin.flush().unwrap();
    }

    /// Sends a request and returns its answer (skipping notifications).
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|e| {
                    let log = std::fs::read_to_string(&self.daemon_log).unwrap_or_default();
                    panic!("no answer to {method} ({e}); probe run said:\n{log}")
                });
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout carries only JSON-RPC ({e}): {line}"));
            if v["id"] == id {
                return v;
            }
        }
    }

    /// A tools/call's result (a JSON-RPC error fails the test).
    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        assert!(answer.get("error").is_none(), "{tool}: {answer}");
        answer["result"].clone()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // end of input ends the bridge; the script then stops the daemon
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `agent-bridge serve --stdio` with `probe run` beside it, both in the
/// empty root at their default paths, as a sandbox image would start them.
fn bridge_in(root: &EmptyRoot) -> Client {
    let daemon_log = root.dir.path().join("daemon.log");
    let script = "chroot \"$R\" /probe run </dev/null >\"$LOG\" 2>&1 &
daemon=$!
n=0
until [ -S \"$R/run/probe/probe.sock\" ]; do
    n=$((n + 1)); [ $n -lt 300 ] || { echo 'probe run did not start' >&2; exit 1; }
    sleep 0.1
done
status=0
chroot \"$R\" /agent-bridge serve --stdio || status=$?
kill -TERM $daemon; wait $daemon || true
exit $status";
    let mut child = root
        .namespace(script, &[])
        .env("LOG", &daemon_log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run unshare (util-linux)");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Client {
        stdin: child.stdin.take(),
        lines,
        child,
        next_id: 0,
        daemon_log,
    }
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A tools/call result's `structuredContent`, and whether it is a tool error.
fn structured(result: &Value) -> (&Value, bool) {
    (&result["structuredContent"], result["isError"] == true)
}

#[test]
fn bridge_serves_mcp_in_an_empty_root() {
    let Some(dist) = dist() else { return };
    let root = EmptyRoot::new(&dist, &["probe", "agent-bridge"]);
    // what a sandbox image would make for the daemon, and the agent's files
    for d in ["run/probe", "var/lib/probe", "work"] {
        std::fs::create_dir_all(root.path().join(d)).unwrap();
    }
    let mut client = bridge_in(&root);

    let init = client.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "dist-test", "version": "0"}}),
    );
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(
        init["result"]["serverInfo"]["name"], "agent-bridge",
        "{init}"
    );
    client.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    let list = client.request("tools/list", json!({}));
    let tools: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for name in [
        "exec",
        "read_file",
        "write_file",
        "list_dir",
        "kernel_evidence",
    ] {
        assert!(tools.contains(&name), "no {name} in {tools:?}");
    }

    // a missing file: a tool error with errno, and the probe daemon's word
    let r = client.call("read_file", json!({"path": "/work/input.csv"}));
    let (s, error) = structured(&r);
    assert!(error, "{r}");
    assert_eq!(s["errno"], "ENOENT", "{r}");
    assert_eq!(s["kernel"]["primitive"], "fs.missing", "{r}");
    assert_eq!(s["kernel"]["decisive"]["path"], "/work/input.csv", "{r}");

    // exact bytes both ways, through the bridge's own file worker
    let data: &[u8] = b"static\x00bytes \xff\xfe in an empty root\n";
    let sha = contract::bytes::sha256_hex(data);
    let w = client.call(
        "write_file",
        json!({"path": "/work/out.bin", "content_base64": b64(data), "sha256": sha}),
    );
    let (s, error) = structured(&w);
    assert!(!error, "{w}");
    assert_eq!(s["size"], data.len(), "{w}");
    assert_eq!(s["sha256"], sha, "{w}");
    assert_eq!(
        std::fs::read(root.path().join("work/out.bin")).unwrap(),
        data,
        "the file is in the root"
    );
    let r = client.call("read_file", json!({"path": "/work/out.bin"}));
    let (s, error) = structured(&r);
    assert!(!error, "{r}");
    assert_eq!(s["sha256"], sha, "{r}");
    let blob = r["content"]
        .as_array()
        .and_then(|c| c.iter().find_map(|c| c["resource"]["blob"].as_str()))
        .unwrap_or_else(|| panic!("no blob in {r}"));
    let back = base64::engine::general_purpose::STANDARD
        .decode(blob)
        .unwrap();
    assert_eq!(back, data, "{r}");

    // `/` is the empty root: what the test put there, and the bridge's workdir
    let l = client.call("list_dir", json!({"path": "/"}));
    let mut names: Vec<&str> = structured(&l).0["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("{l}"))
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "agent-bridge",
            "dev",
            "probe",
            "proc",
            "run",
            "sys",
            "tmp",
            "var",
            "work"
        ],
        "{l}"
    );

    // a static program runs; a shell command cannot, and says why
    let e = client.call("exec", json!({"argv": ["/agent-bridge", "--version"]}));
    let (s, error) = structured(&e);
    assert!(!error, "{e}");
    assert_eq!(s["exit_code"], 0, "{e}");
    assert!(
        s["stdout"]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("agent-bridge ")),
        "{e}"
    );
    let e = client.call("exec", json!({"command": "echo hi"}));
    let (s, error) = structured(&e);
    assert!(error, "{e}");
    let message = s["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot run `/bin/sh`: No such file or directory")
            && message.contains("kernel: exec.missing"),
        "{e}"
    );

    // the daemon stored the spans in its SQLite database (compiled in)
    let k = client.call("kernel_evidence", json!({}));
    let (s, error) = structured(&k);
    assert!(!error, "{k}");
    let spans = s["spans"].as_array().unwrap_or_else(|| panic!("{k}"));
    assert!(
        spans
            .iter()
            .any(|span| span["label"] == "read_file: /work/input.csv"
                && span["primitive"] == "fs.missing"),
        "{k}"
    );
    drop(client);
    assert!(root.path().join("var/lib/probe/evidence.db").exists());
}

/// What ships beside the two sets (`dist/`): a tarball and a Debian package
/// per architecture, all in dist/SHA256SUMS; each package says its
/// architecture and holds the three executables, the daemon's unit and its
/// config file (the image test installs the amd64 one under systemd).
#[test]
fn the_tarballs_and_packages_match_their_sums_and_architectures() {
    let Some(dist) = dist() else { return };
    let top = dist
        .parent()
        .expect("dist/x86_64 has a parent")
        .to_path_buf();
    let check = tool("sha256sum", &["--check", "--strict", "SHA256SUMS"], &top);
    assert!(
        check.status.success(),
        "sha256sum --check in {}: {check:?}",
        top.display()
    );
    let sums = std::fs::read_to_string(top.join("SHA256SUMS")).unwrap();
    for (arch, debian) in [("x86_64", "amd64"), ("aarch64", "arm64")] {
        let tarball = sums
            .lines()
            .filter_map(|l| l.split_once("  ").map(|(_, n)| n))
            .find(|n| n.ends_with(&format!("-{arch}.tar.gz")))
            .unwrap_or_else(|| panic!("no {arch} tarball in SHA256SUMS:\n{sums}"));
        let listed = tool("tar", &["-tzf", tarball], &top);
        let listed = String::from_utf8_lossy(&listed.stdout);
        for bin in BINARIES.iter().chain(&["SHA256SUMS"]) {
            assert!(
                listed
                    .lines()
                    .any(|l| l.ends_with(&format!("-{arch}/{bin}"))),
                "{tarball} lacks {bin}:\n{listed}"
            );
        }
        let deb = sums
            .lines()
            .filter_map(|l| l.split_once("  ").map(|(_, n)| n))
            .find(|n| n.ends_with(&format!("_{debian}.deb")))
            .unwrap_or_else(|| panic!("no {debian} package in SHA256SUMS:\n{sums}"));
        let field = tool("dpkg-deb", &["--field", deb, "Architecture"], &top);
        assert_eq!(
            String::from_utf8_lossy(&field.stdout).trim(),
            debian,
            "{deb}"
        );
        let contents = tool("dpkg-deb", &["--contents", deb], &top);
        let contents = String::from_utf8_lossy(&contents.stdout);
        for path in [
            "./usr/bin/probe",
            "./usr/bin/probe-fault",
            "./usr/bin/agent-bridge",
            "./lib/systemd/system/probe.service",
            "./etc/probe/probe.toml",
        ] {
            assert!(
                contents.lines().any(|l| l.ends_with(path)),
                "{deb} lacks {path}:\n{contents}"
            );
        }
    }
}
