//! gVisor through its runtime monitoring: `probe trace --gvisor -- runsc …`
//! starts real sandboxes (Debian's runsc, `do` and `run` with an OCI
//! bundle), is their monitor, and attributes what happens inside. Each
//! case runs twice in a row and asserts the primitive, the decisive
//! syscall and errno, the explanation and that the evidence says it came
//! from gVisor. The monitor itself meets a garbage datagram, a connection
//! without a handshake and a sandbox killed mid-stream.
//!
//! They need root and runsc (`cargo xtask setup` installs it); under
//! CI=true a missing one is a failure.

use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, connect, recv, send, socket,
};
use probe::gvisor::monitor::{Delivery, Monitor};
use prost::Message as _;

mod common;

use common::{FAULT, PROBE, Traced, ci, parse, root};

fn runsc_available() -> bool {
    if !root() {
        return false;
    }
    let found = Command::new("runsc").arg("--version").output().is_ok();
    assert!(
        found || !ci(),
        "runsc is missing (cargo xtask setup installs it); CI=true forbids skipping"
    );
    if !found {
        eprintln!("SKIPPED: runsc is not installed");
    }
    found
}

/// A scratch directory of this test process, removed at the end of a case.
struct Scratch(PathBuf);

impl Scratch {
    /// A directory of its own: cases of this binary may run at once.
    fn new(name: &str) -> Scratch {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "probe-gvisor-test-{}-{n}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `probe trace --gvisor --json -- runsc --root STATE --network=none`,
/// to be followed by `do CMD` or `run …`. Its stdin is an empty pipe:
/// runsc chowns the stdio it gets to its sandbox's user, and `output()`'s
/// default stdin is /dev/null, the whole host's (stdout and stderr are
/// `output()`'s pipes or the caller's own).
fn probe_runsc(state: &Path) -> Command {
    probe_runsc_with(state, &[])
}

/// [`probe_runsc`] with more flags for `probe trace`.
fn probe_runsc_with(state: &Path, flags: &[&str]) -> Command {
    let mut c = Command::new(PROBE);
    c.arg("trace")
        .args(flags)
        .args(["--gvisor", "--json", "--timeout", "60", "--", "runsc"])
        .arg(format!("--root={}", state.display()))
        .arg("--network=none")
        .stdin(Stdio::piped());
    c
}

/// `probe trace --gvisor --json -- runsc … do CMD`.
fn gvisor_do(cmd: &[&str]) -> Traced {
    let scratch = Scratch::new("do");
    let out = probe_runsc(&scratch.0.join("state"))
        .arg("do")
        .args(cmd)
        .output()
        .expect("run probe");
    parse(out)
}

/// The same under `runsc run` with an OCI bundle: the host's root
/// filesystem read-only, `ro_dir` bind-mounted read-only at /ro.
fn gvisor_run(cmd: &[&str], ro_dir: &Path) -> Traced {
    gvisor_run_limited(cmd, ro_dir, None)
}

/// [`gvisor_run`] with the sandbox's memory limited (bytes).
fn gvisor_run_limited(cmd: &[&str], ro_dir: &Path, memory: Option<u64>) -> Traced {
    let scratch = Scratch::new("run");
    let bundle = oci_bundle(&scratch.0, cmd, |config| {
        if let Some(limit) = memory {
            config["linux"]["resources"]["memory"] = serde_json::json!({"limit": limit});
        }
        config["mounts"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "destination": "/ro", "type": "bind", "source": ro_dir, "options": ["rbind", "ro"],
            }));
    });
    // the scratch directory's name is unique to this case
    let id = scratch
        .0
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let out = probe_runsc(&scratch.0.join("state"))
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(&id)
        .output()
        .expect("run probe");
    parse(out)
}

/// An OCI bundle under `dir` running `cmd` on the host's root filesystem,
/// read-only, without a terminal; `edit` changes its config.json further.
fn oci_bundle(dir: &Path, cmd: &[&str], edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    let spec = Command::new("runsc")
        .arg("spec")
        .arg("--bundle")
        .arg(&bundle)
        .arg("--")
        .args(cmd)
        .output()
        .unwrap();
    assert!(spec.status.success(), "runsc spec: {spec:?}");
    let path = bundle.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["root"] = serde_json::json!({"path": "/", "readonly": true});
    config["process"]["terminal"] = false.into();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    bundle
}

fn twice(case: impl Fn() -> Traced, check: impl Fn(&Traced)) {
    for _ in 0..2 {
        let t = case();
        assert_eq!(t.json["source"], "gvisor", "{}", t.context());
        check(&t);
    }
}

fn expect_failure(t: &Traced, primitive: &str, syscall: &str, errno: &str, says: &str) {
    t.expect(primitive, Some(syscall));
    assert_eq!(t.decisive("errno"), Some(errno), "{}", t.context());
    assert_ne!(t.code, Some(0), "{}", t.context());
    let explanation = t.json["explanation"].as_str().unwrap_or("");
    assert!(
        explanation.contains(says),
        "the explanation should say {says:?}: {}",
        t.context()
    );
}

#[test]
fn a_missing_file_is_fs_missing_with_its_path() {
    if !runsc_available() {
        return;
    }
    twice(
        || gvisor_do(&["cat", "/nonexistent/input.csv"]),
        |t| {
            expect_failure(
                t,
                "fs.missing",
                "openat",
                "ENOENT",
                "/nonexistent/input.csv",
            );
            assert_eq!(t.decisive("path"), Some("/nonexistent/input.csv"));
            // the sandbox's pids, not the host's: cat is the container's init
            assert_eq!(t.json["decisive"]["pid"], 1, "{}", t.context());
        },
    );
}

#[test]
fn a_missing_command_is_exec_missing() {
    if !runsc_available() {
        return;
    }
    twice(
        || gvisor_do(&["env", "no-such-tool-xyz", "--version"]),
        |t| expect_failure(t, "exec.missing", "execve", "ENOENT", "no-such-tool-xyz"),
    );
    // a shell's PATH search is stat(2), whose raw points carry no path:
    // its own "not found" names the command, its failed stats and 127 back it
    for shell in ["sh", "bash"] {
        twice(
            || gvisor_do(&[shell, "-c", "no-such-tool-xyz --version"]),
            |t| {
                expect_failure(
                    t,
                    "exec.missing",
                    "newfstatat",
                    "ENOENT",
                    "`no-such-tool-xyz`",
                );
                assert_eq!(t.code, Some(127), "{}", t.context());
            },
        );
    }
    // a 127 the shell's words do not explain is no missing command
    twice(
        || gvisor_do(&["sh", "-c", "exit 127"]),
        |t| t.expect("none", None),
    );
}

#[test]
fn a_read_only_root_and_a_read_only_bind_mount_are_fs_readonly() {
    if !runsc_available() {
        return;
    }
    let ro = Scratch::new("ro-source");
    twice(
        || gvisor_run(&["touch", "/etc/probe-gvisor-test"], &ro.0),
        |t| {
            expect_failure(
                t,
                "fs.readonly",
                "openat",
                "EROFS",
                "/etc/probe-gvisor-test",
            )
        },
    );
    twice(
        || gvisor_run(&["sh", "-c", "echo hi > /ro/out.txt"], &ro.0),
        |t| {
            expect_failure(t, "fs.readonly", "openat", "EROFS", "/ro/out.txt");
            assert!(!ro.0.join("out.txt").exists());
        },
    );
}

#[test]
fn a_sandbox_over_its_memory_limit_is_mem_oom_read_from_its_host_cgroup() {
    if !runsc_available() {
        return;
    }
    let ro = Scratch::new("oom-ro");
    let script = "x = bytearray(10**9); print(len(x))";
    twice(
        || gvisor_run_limited(&["python3", "-c", script], &ro.0, Some(64 << 20)),
        |t| {
            t.expect("mem.oom", None);
            // the whole sandbox went: runsc says 128 + SIGKILL
            assert_eq!(t.code, Some(137), "{}", t.context());
            assert_eq!(t.json["decisive"]["kind"], "oom_victim", "{}", t.context());
            assert_eq!(
                t.json["decisive"]["memory_max_kb"],
                64 * 1024,
                "{}",
                t.context()
            );
            let explanation = t.json["explanation"].as_str().unwrap();
            assert!(
                explanation.contains("64 MiB") && explanation.contains("host cgroup"),
                "{}",
                t.context()
            );
        },
    );
}

#[test]
fn a_permission_refusal_is_fs_permission() {
    if !runsc_available() {
        return;
    }
    twice(
        || {
            gvisor_do(&[
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "cat",
                "/etc/shadow",
            ])
        },
        |t| expect_failure(t, "fs.permission", "openat", "EACCES", "/etc/shadow"),
    );
}

#[test]
fn a_refused_connect_is_net_egress_with_its_address() {
    if !runsc_available() {
        return;
    }
    // --network=none: the sandbox's own loopback, where nothing listens
    let blocking = "import socket; socket.create_connection(('127.0.0.1', 9))";
    twice(
        || gvisor_do(&["python3", "-c", blocking]),
        |t| {
            expect_failure(t, "net.egress", "connect", "ECONNREFUSED", "127.0.0.1:9");
            assert_eq!(t.decisive("addr"), Some("127.0.0.1:9"));
        },
    );
    // with a timeout the connect is non-blocking: gVisor shows its
    // EINPROGRESS, not how it ended, and the sentence says so
    let non_blocking = "import socket; socket.create_connection(('127.0.0.1', 9), timeout=5)";
    twice(
        || gvisor_do(&["python3", "-c", non_blocking]),
        |t| {
            expect_failure(
                t,
                "net.egress",
                "connect",
                "EINPROGRESS",
                "do not say which",
            )
        },
    );
}

#[test]
fn a_failed_clone_and_an_fd_limit_are_proc_limit() {
    if !runsc_available() {
        return;
    }
    twice(
        || {
            gvisor_do(&[
                FAULT,
                "--rlimit",
                "nproc=3",
                "--",
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
                "for i in 1 2 3 4 5 6; do sleep 1 & done; wait",
            ])
        },
        |t| {
            expect_failure(
                t,
                "proc.limit",
                "clone",
                "EAGAIN",
                "clone failed with EAGAIN",
            )
        },
    );
    let script = "files = [open('/dev/null') for _ in range(64)]";
    twice(
        || {
            gvisor_do(&[
                FAULT,
                "--rlimit",
                "nofile=16",
                "--",
                "python3",
                "-c",
                script,
            ])
        },
        |t| expect_failure(t, "proc.limit", "openat", "EMFILE", "/dev/null"),
    );
}

#[test]
fn a_seccomp_kill_inside_is_seccomp_and_says_the_exit_is_its_only_trace() {
    if !runsc_available() {
        return;
    }
    twice(
        || {
            gvisor_do(&[
                FAULT,
                "--seccomp",
                "kill:mkdir",
                "--",
                "mkdir",
                "/tmp/probe-x",
            ])
        },
        |t| {
            t.expect("seccomp", None);
            // runsc passes the container's death by SIGSYS on as 128 + 31
            assert_eq!(t.code, Some(159), "{}", t.context());
            let explanation = t.json["explanation"].as_str().unwrap();
            assert!(explanation.contains("SIGSYS"), "{}", t.context());
            assert!(explanation.contains("only trace"), "{}", t.context());
        },
    );
}

#[test]
fn a_clean_run_and_a_program_failing_by_its_own_logic_are_none() {
    if !runsc_available() {
        return;
    }
    twice(
        || gvisor_do(&["sh", "-c", "cat /etc/hostname >/dev/null; true"]),
        |t| {
            assert_eq!(t.code, Some(0), "{}", t.context());
            t.expect("none", None);
            assert_eq!(t.json["failed"], false);
        },
    );
    // python looks up many files it does without, then fails by its own logic
    twice(
        || {
            gvisor_do(&[
                "python3",
                "-c",
                "import json; raise ValueError('bad input')",
            ])
        },
        |t| {
            assert_eq!(t.code, Some(1), "{}", t.context());
            t.expect("none", None);
            assert!(
                t.json["counts"]["syscall_failed"].as_u64().unwrap_or(0) > 10,
                "the lookups it got past were seen: {}",
                t.json["counts"]
            );
            let explanation = t.json["explanation"].as_str().unwrap();
            assert!(
                explanation.contains("seccomp ERRNO denial") && explanation.contains("gVisor"),
                "what gVisor cannot show is said: {}",
                t.context()
            );
        },
    );
}

#[test]
fn a_write_to_a_full_device_is_fs_space_only_when_the_session_asks_for_writes() {
    if !runsc_available() {
        return;
    }
    let full = |io: &[&str]| {
        let scratch = Scratch::new("io");
        let out = probe_runsc_with(&scratch.0.join("state"), io)
            .args(["do", "sh", "-c", "echo data > /dev/full"])
            .output()
            .expect("run probe");
        parse(out)
    };
    // writes are asked for by default
    for io in [&[][..], &["--io-points", "all"]] {
        twice(
            || full(io),
            |t| {
                expect_failure(t, "fs.space", "write", "ENOSPC", "/dev/full");
                assert_eq!(t.decisive("path"), Some("/dev/full"));
            },
        );
    }
    // without them the write is not seen, and the explanation says so
    twice(
        || full(&["--io-points", "none"]),
        |t| {
            assert_ne!(t.code, Some(0), "{}", t.context());
            t.expect("none", None);
            let explanation = t.json["explanation"].as_str().unwrap();
            assert!(
                explanation.contains("a failed write under a session made with `--io-points none`"),
                "{}",
                t.context()
            );
        },
    );
}

#[test]
fn a_call_the_sandbox_kernel_does_not_accept_is_sandbox_kernel() {
    if !runsc_available() {
        return;
    }
    // this runsc answers coreutils' statx(…, AT_NO_AUTOMOUNT, …) with
    // EINVAL, so ls of a missing path says "Invalid argument"
    twice(
        || gvisor_do(&["ls", "/nonexistent-probe-path"]),
        |t| {
            expect_failure(t, "sandbox.kernel", "statx", "EINVAL", "not Linux");
            assert_eq!(t.json["decisive"]["flags"], 0x800, "{}", t.context());
        },
    );
}

#[test]
fn a_sandbox_killed_mid_stream_still_gets_its_attribution() {
    if !runsc_available() {
        return;
    }
    let scratch = Scratch::new("killed");
    let state = scratch.0.join("state");
    // with --json the workload's output comes on the probe's stderr: its
    // "ready" says the failed open is behind it (gVisor sends a point
    // before the syscall returns)
    // every event in the report, not only the evidence of its verdict
    let mut child = probe_runsc_with(&state, &["--events"])
        .arg("do")
        .args([
            "sh",
            "-c",
            "cat /nonexistent/before; echo ready >&2; sleep 30",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    // its report (every event: can be more than a pipe holds) is read on
    // a thread of its own, or the probe blocks writing it while this one
    // waits for its stderr to end
    let mut stdout = child.stdout.take().unwrap();
    let report = std::thread::spawn(move || {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut out).map(|_| out)
    });
    let mut said = String::new();
    loop {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
        assert!(n > 0, "the workload never got ready: {said}");
        said.push_str(&line);
        if line.trim() == "ready" {
            break;
        }
    }
    let sandbox =
        probe::gvisor::memory::sandbox_process(child.id()).expect("the runsc sandbox process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sandbox as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let started = Instant::now();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the probe did not hang on a dead sandbox"
    );
    let t = parse(std::process::Output {
        status,
        stdout: report.join().unwrap().unwrap(),
        stderr: rest.clone().into_bytes(),
    });
    assert_eq!(t.json["source"], "gvisor");
    assert_eq!(t.json["failed"], true, "{}", t.context());
    assert_ne!(t.code, Some(0), "{rest}");
    let kept = t.json["events"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e["path"] == "/nonexistent/before" && e["errno"] == "ENOENT");
    assert!(
        kept,
        "the failed open the sandbox reported before it died was kept: {}",
        t.json["events"]
    );
}

/// A SEQPACKET client of `path`.
fn client(path: &Path) -> std::os::fd::OwnedFd {
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    connect(fd.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
    fd
}

fn datagram(message_type: u16, dropped: u32, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    d.write_all(&8u16.to_le_bytes()).unwrap();
    d.write_all(&message_type.to_le_bytes()).unwrap();
    d.write_all(&dropped.to_le_bytes()).unwrap();
    d.extend_from_slice(payload);
    d
}

/// No root needed: the monitor over a real SEQPACKET socket, spoken to as
/// runsc speaks, then with garbage.
#[test]
fn the_monitor_survives_garbage_and_a_peer_without_handshake() {
    use probe::gvisor::wire::{ContextData, Exit, RawSyscall};
    let scratch = Scratch::new("monitor");
    let path = scratch.0.join("m.sock");
    let (tx, rx) = channel();
    let monitor = Monitor::listen(&path, tx).unwrap();
    let wait = || rx.recv_timeout(Duration::from_secs(5)).expect("a delivery");

    // a peer that never shakes hands is closed, and the next is served
    let rude = client(&path);
    send(rude.as_raw_fd(), b"hello, monitor", MsgFlags::empty()).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(
        recv(rude.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap(),
        0
    );

    let sandbox = client(&path);
    send(sandbox.as_raw_fd(), &[0x08, 0x01], MsgFlags::empty()).unwrap();
    let n = recv(sandbox.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
    assert_eq!(&buf[..n], &[0x08, 0x01], "the handshake is answered");
    assert!(matches!(wait(), Delivery::Connected { .. }));

    // garbage: a short datagram, a header pointing past the end, a payload
    // that is no protobuf
    for junk in [
        vec![1u8, 2, 3],
        vec![200, 0, 6, 0, 0, 0, 0, 0, 1],
        datagram(6, 0, &[0xff; 40]),
    ] {
        send(sandbox.as_raw_fd(), &junk, MsgFlags::empty()).unwrap();
    }
    // then a real point: mkdir failed with EROFS, 3 points dropped so far
    let point = RawSyscall {
        context_data: Some(ContextData {
            time_ns: 1,
            thread_id: 7,
            thread_group_id: 7,
            container_id: "c1".into(),
            cwd: "/".into(),
            process_name: "mkdir".into(),
        }),
        exit: Some(Exit {
            result: 0,
            errorno: 30,
        }),
        sysno: 83,
        ..Default::default()
    };
    send(
        sandbox.as_raw_fd(),
        &datagram(6, 3, &point.encode_to_vec()),
        MsgFlags::empty(),
    )
    .unwrap();
    // each unreadable datagram is a point lost, counted
    for _ in 0..3 {
        assert!(matches!(wait(), Delivery::Dropped { dropped: 1, .. }));
    }
    // the sandbox's container, said with its first point
    match wait() {
        Delivery::Container { container, .. } => assert_eq!(container, "c1"),
        other => panic!("expected the container, got {other:?}"),
    }
    match wait() {
        Delivery::Point {
            converted, dropped, ..
        } => {
            assert_eq!(dropped, 3);
            assert_eq!(converted.container, "c1");
            let ev = &converted.events[0];
            assert_eq!(
                (ev.syscall.as_deref(), ev.errno.as_deref(), ev.pid),
                (Some("mkdir"), Some("EROFS"), 7)
            );
        }
        other => panic!("expected the point, got {other:?}"),
    }
    assert_eq!(
        monitor
            .stats
            .malformed
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    assert_eq!(
        monitor
            .stats
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    drop(sandbox);
    assert!(matches!(wait(), Delivery::Closed { .. }));
}

/// A daemon of this test's own: `probe run` with its sockets and DB in
/// `dir`, killed on drop.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An empty file at `path`, open to read.
fn empty_file(path: &Path) -> std::fs::File {
    std::fs::write(path, "").unwrap();
    std::fs::File::open(path).unwrap()
}

/// A host daemon of the test's own in `dir` (killed on drop), and a
/// sandbox started detached with its session (`run --detach`, as
/// containerd does), running `sleep 120`; `edit` changes its OCI config.
struct DetachedSandbox {
    _daemon: Daemon,
    dir: PathBuf,
    socket: PathBuf,
    /// The container's id.
    id: String,
}

impl DetachedSandbox {
    fn start(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> DetachedSandbox {
        let socket = dir.join("probe.sock");
        let daemon = Daemon(
            Command::new(PROBE)
                .args(["run", "--socket"])
                .arg(&socket)
                .arg("--db")
                .arg(dir.join("evidence.db"))
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        probe::client::wait_until_ready(&socket, Duration::from_secs(30)).unwrap();
        let session = Command::new(PROBE)
            .args(["gvisor-session", "--socket"])
            .arg(socket.with_extension("gvisor.sock"))
            .output()
            .unwrap();
        assert!(session.status.success(), "{session:?}");
        let config = dir.join("gvisor.json");
        std::fs::write(&config, &session.stdout).unwrap();
        let bundle = oci_bundle(dir, &["sleep", "120"], edit);
        let d = DetachedSandbox {
            _daemon: daemon,
            dir: dir.to_path_buf(),
            socket,
            id: dir.file_name().unwrap().to_string_lossy().into_owned(),
        };
        let started = d
            .runsc(&["--host-uds=open", "--network=none"])
            .arg(format!("--pod-init-config={}", config.display()))
            .args(["run", "--detach", "--bundle"])
            .arg(&bundle)
            .arg(&d.id)
            // the sandbox keeps what it inherits, so pipes would never
            // close, and runsc chowns it to the sandbox's user: files of
            // its own, never /dev/null
            .stdin(empty_file(&dir.join("sandbox.in")))
            .stdout(std::fs::File::create(dir.join("sandbox.out")).unwrap())
            .stderr(std::fs::File::create(dir.join("sandbox.err")).unwrap())
            .status()
            .unwrap();
        assert!(started.success(), "runsc run --detach: {started}");
        d
    }

    /// runsc with this sandbox's state directory, and an empty pipe for
    /// stdin (`exec` chowns its stdio, see [`probe_runsc`]).
    fn runsc(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("runsc");
        cmd.arg(format!("--root={}", self.dir.join("state").display()));
        cmd.args(args).stdin(Stdio::piped());
        cmd
    }
}

/// A sandbox started detached (`run --detach`, as containerd does): its
/// runsc has exited, so the daemon finds the sandbox behind a client by
/// the gofer's bundle; a command `runsc exec`s inside gets its span.
#[test]
fn a_detached_sandbox_gets_spans_from_the_host_daemon() {
    if !runsc_available() {
        return;
    }
    let scratch = Scratch::new("detached");
    let d = DetachedSandbox::start(&scratch.0, |_| {});
    let (socket, id, runsc) = (&d.socket, d.id.as_str(), |a: &[&str]| d.runsc(a));
    let out = runsc(&["exec", id, PROBE, "span", "--json", "--socket"])
        .arg(socket)
        .args(["--", "cat", "/nonexistent/detached.csv"])
        .output()
        .unwrap();
    let _ = runsc(&["kill", id, "KILL"]).output();
    let _ = runsc(&["delete", "-force", id]).output();
    let t = parse(out);
    assert_eq!(t.json["source"], "gvisor", "{}", t.context());
    expect_failure(
        &t,
        "fs.missing",
        "openat",
        "ENOENT",
        "/nonexistent/detached.csv",
    );
}

/// The daemon watches a gVisor sandbox's memory from the host, as `probe
/// trace --gvisor` does: a detached sandbox over its memory limit is
/// killed whole by the host's OOM killer (gVisor sends no point for it),
/// the `probe span` inside dies with it, and the span its connection
/// leaves open is ended and stored as `mem.oom`.
#[test]
fn a_detached_sandbox_over_its_memory_limit_is_mem_oom_from_the_host_daemon() {
    if !runsc_available() {
        return;
    }
    let scratch = Scratch::new("detached-oom");
    let d = DetachedSandbox::start(&scratch.0, |config| {
        config["linux"]["resources"]["memory"] = serde_json::json!({"limit": 64u64 << 20});
    });
    let (socket, id, runsc) = (&d.socket, d.id.as_str(), |a: &[&str]| d.runsc(a));
    let db = scratch.0.join("evidence.db");
    let script = "x = bytearray(10**9); print(len(x))";
    let out = runsc(&["exec", id, PROBE, "span", "--json", "--socket"])
        .arg(socket)
        .args(["--", "python3", "-c", script])
        .output()
        .unwrap();
    let _ = runsc(&["kill", id, "KILL"]).output();
    let _ = runsc(&["delete", "-force", id]).output();
    // the span is stored once the daemon saw the connection close
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let span = loop {
        let listed = Command::new(PROBE)
            .args(["spans", "--json", "--db"])
            .arg(&db)
            .output()
            .unwrap();
        let rows: serde_json::Value =
            serde_json::from_slice(&listed.stdout).unwrap_or(serde_json::Value::Null);
        if let Some(row) = rows.as_array().and_then(|r| r.first()) {
            break row.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no span stored; runsc exec said: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let id = span["span"].as_u64().expect("a span id");
    let shown = Command::new(PROBE)
        .args(["show", &id.to_string(), "--json", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let a: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let context = format!(
        "{a:#}\nspan inside said: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(a["source"], "gvisor", "{context}");
    assert_eq!(a["primitive"], "mem.oom", "{context}");
    assert_eq!(a["decisive"]["kind"], "oom_victim", "{context}");
    assert_eq!(a["decisive"]["memory_max_kb"], 64 * 1024, "{context}");
}
