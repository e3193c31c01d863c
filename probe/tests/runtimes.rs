//! The probe under the sandbox runtimes platforms ship: Anthropic's
//! sandbox-runtime (`srt`, bubblewrap with its own PID, user and network
//! namespaces, socat relays it kills on exit, a seccomp filter refusing
//! AF_UNIX sockets), podman with runc, bubblewrap with its own PID namespace
//! and a leftover background process, firejail and systemd-nspawn. Each case runs twice in a row under
//! `probe trace --json` and asserts the primitive, the decisive syscall and
//! errno, and that no runtime's cleanup kill or the kernel's SIGKILL at
//! PID-namespace teardown is named as the cause of a failure recorded
//! before it.
//!
//! They need root, the runtimes' Debian packages, for srt the pinned npm
//! package that `cargo xtask test` installs (`SRT` names its binary), and for
//! podman and nspawn the root filesystem it builds (`RUNTIMES_ROOTFS`).
//! Under CI=true a missing one is a failure.

use std::net::TcpListener;
use std::path::{Path, PathBuf};

mod common;

use common::{FAULT, Traced, ci, root, trace_in, trace_with};

/// Runs `case` twice in a row: a verdict must not depend on timing.
fn twice(case: impl Fn() -> Traced, check: impl Fn(&Traced)) {
    for _ in 0..2 {
        check(&case());
    }
}

fn expect_failure(t: &Traced, primitive: &str, syscall: &str, errno: &str) {
    t.expect(primitive, Some(syscall));
    assert_eq!(t.decisive("errno"), Some(errno), "{}", t.context());
    assert_ne!(t.code, Some(0), "{}", t.context());
}

fn expect_clean(t: &Traced) {
    assert_eq!(t.code, Some(0), "{}", t.context());
    t.expect("none", None);
    assert!(
        t.json.get("hidden_failure").is_none(),
        "a clean run hides no failure: {}",
        t.json["hidden_failure"]
    );
}

fn expect_hidden(t: &Traced, primitive: &str) {
    assert_eq!(t.code, Some(0), "{}", t.context());
    t.expect("none", None);
    assert_eq!(
        t.json["hidden_failure"]["primitive"], primitive,
        "{}",
        t.json
    );
}

/// A closed loopback port: bound and dropped, so nothing listens there.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn python_connect(port: u16) -> String {
    format!("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))'")
}

const THREADS: &str =
    "python3 -c 'import threading; t = threading.Thread(target=print); t.start(); t.join()'";

/// `cmd` found on PATH, or None (a failure under CI).
fn installed(cmd: &str) -> Option<PathBuf> {
    let found = which::which(cmd).ok();
    if found.is_none() {
        assert!(
            !ci(),
            "{cmd} is not installed, and CI=true forbids skipping"
        );
        eprintln!("SKIPPED: {cmd} is not installed (cargo xtask setup installs it)");
    }
    found
}

// ------------------------------------------------------------------ bubblewrap

/// `bwrap` with its own PID namespace, dying with its parent, the host's
/// root read-only, a private /tmp and a background `sleep` left running
/// when `script` ends (killed by the kernel when the namespace's init exits).
fn bwrap(extra: &[&str], script: &str) -> Traced {
    let script = format!("sleep 30 & {script}");
    let mut cmd = vec![
        "bwrap",
        "--unshare-pid",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        // probe-fault, which may live under the /tmp just hidden (a clone
        // of the project in /tmp, as CI's may be)
        "--ro-bind",
        FAULT,
        FAULT,
    ];
    cmd.extend(extra);
    cmd.extend(["sh", "-c", &script]);
    trace_with(&[], &cmd)
}

fn bwrap_ready() -> bool {
    root() && installed("bwrap").is_some()
}

#[test]
fn bwrap_write_outside_the_writable_paths_is_fs_readonly_not_the_teardown_kill() {
    if !bwrap_ready() {
        return;
    }
    twice(
        || bwrap(&[], "touch /etc/probe-runtime-test"),
        |t| {
            expect_failure(t, "fs.readonly", "openat", "EROFS");
            // the leftover sleep was killed at teardown, and that is evidence
            assert!(
                t.json["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["kind"] == "signal" && e["signal"] == "SIGKILL"),
                "{}",
                t.json["events"]
            );
        },
    );
}

#[test]
fn bwrap_denied_read_of_a_hidden_directory_is_fs_missing() {
    if !bwrap_ready() {
        return;
    }
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("key"), "x").unwrap();
    let dir = secret.path().to_str().unwrap();
    let script = format!("cat {dir}/key");
    twice(
        || bwrap(&["--tmpfs", dir], &script),
        |t| expect_failure(t, "fs.missing", "openat", "ENOENT"),
    );
}

#[test]
fn bwrap_connect_from_its_own_network_namespace_is_net_egress() {
    if !bwrap_ready() {
        return;
    }
    let script = python_connect(closed_port());
    twice(
        || bwrap(&["--unshare-net"], &script),
        |t| expect_failure(t, "net.egress", "connect", "ECONNREFUSED"),
    );
}

#[test]
fn bwrap_seccomp_refused_syscall_is_seccomp() {
    if !bwrap_ready() {
        return;
    }
    let script = format!("{FAULT} --seccomp errno:mkdir -- mkdir /tmp/x");
    twice(
        || bwrap(&[], &script),
        |t| expect_failure(t, "seccomp", "mkdir", "EPERM"),
    );
}

#[test]
fn bwrap_missing_command_is_exec_missing() {
    if !bwrap_ready() {
        return;
    }
    twice(
        || bwrap(&[], "probe-no-such-command"),
        |t| {
            t.expect("exec.missing", None);
            assert_eq!(t.code, Some(127), "{}", t.context());
        },
    );
}

#[test]
fn bwrap_clean_runs_blame_nothing_with_threads_and_with_clone3_refused() {
    if !bwrap_ready() {
        return;
    }
    // glibc falls back to clone when clone3 is ENOSYS (as Docker's and
    // srt's older profiles make it)
    let refused = format!("{FAULT} --seccomp errno=ENOSYS:clone3 -- {THREADS}");
    for script in [THREADS, refused.as_str()] {
        twice(|| bwrap(&[], script), expect_clean);
    }
}

#[test]
fn bwrap_failures_hidden_by_or_true_and_a_pipeline_are_hidden_failures() {
    if !bwrap_ready() {
        return;
    }
    for script in [
        "touch /etc/probe-runtime-test || true",
        "touch /etc/probe-runtime-test | cat",
    ] {
        twice(|| bwrap(&[], script), |t| expect_hidden(t, "fs.readonly"));
    }
}

#[test]
fn bwrap_plain_exit_is_none_and_names_the_teardown_kill_as_no_cause() {
    if !bwrap_ready() {
        return;
    }
    twice(
        || bwrap(&[], "exit 3"),
        |t| {
            assert_eq!(t.code, Some(3));
            t.expect("none", None);
            let why = t.json["explanation"].as_str().unwrap();
            // the leftover job: killed by the kernel, not "sent by bwrap";
            // it is `sleep` once it ran, or still `sh` when the kill came
            // between its fork and its exec
            let leftover = why.contains(" sleep (pid ") || why.contains(" sh (pid ");
            assert!(
                why.contains("not a cause")
                    && leftover
                    && why.contains("by SIGKILL at PID-namespace teardown (its init, bwrap"),
                "{why}"
            );
        },
    );
}

// ------------------------------------------------------------------ srt

/// srt's binary: `SRT`, set by `cargo xtask test` to its pinned install.
fn srt_bin() -> Option<PathBuf> {
    let bin = std::env::var_os("SRT").map(PathBuf::from).or_else(|| {
        let default = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/runtimes/srt/node_modules/.bin/srt");
        default.exists().then_some(default)
    });
    if bin.is_none() {
        assert!(
            !ci(),
            "srt is not installed (SRT unset), and CI=true forbids skipping"
        );
        eprintln!("SKIPPED: srt is not installed (cargo xtask test installs it)");
    }
    bin
}

/// A settings file of srt: writes allowed under `allowed/`, reads of
/// `secret/` denied, only `localhost` through its proxy.
struct Srt {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

/// `env` arguments for runs with and without `$SHELL`: without it, bash
/// asks NSS for the user at startup, glibc's nscd client tries a unix
/// socket, srt's filter refuses it (EPERM, twice) and bash goes on.
const SHELLS: [&[&str]; 2] = [&["SHELL=/bin/bash"], &["-u", "SHELL"]];

impl Srt {
    fn new() -> Option<Srt> {
        if !root() || installed("bwrap").is_none() || installed("socat").is_none() {
            return None;
        }
        let bin = srt_bin()?;
        let dir = tempfile::Builder::new()
            .prefix("probe-srt-")
            .tempdir()
            .unwrap();
        for d in ["allowed", "secret"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        std::fs::write(dir.path().join("secret/key"), "x").unwrap();
        let settings = serde_json::json!({
            "network": {"allowedDomains": ["localhost"], "deniedDomains": []},
            "filesystem": {
                "denyRead": [dir.path().join("secret")],
                "allowWrite": [dir.path().join("allowed")],
                "denyWrite": []
            }
        });
        std::fs::write(dir.path().join("settings.json"), settings.to_string()).unwrap();
        Some(Srt { bin, dir })
    }

    fn path(&self, p: &str) -> String {
        self.dir.path().join(p).display().to_string()
    }

    /// `srt --settings … -c SCRIPT` under `probe trace`.
    fn run(&self, script: &str) -> Traced {
        self.run_with_env(&[], script)
    }

    /// [`Srt::run`] under `env ENV…` (`-u NAME` unsets).
    fn run_with_env(&self, env: &[&str], script: &str) -> Traced {
        let settings = self.path("settings.json");
        let bin = self.bin.to_str().unwrap();
        let mut cmd = vec!["env"];
        cmd.extend(env);
        cmd.extend([bin, "--settings", &settings, "-c", script]);
        trace_with(&[], &cmd)
    }
}

#[test]
fn srt_write_outside_allow_write_is_fs_readonly() {
    let Some(srt) = Srt::new() else { return };
    let script = format!("echo x > {}", srt.path("not-allowed"));
    twice(
        || srt.run(&script),
        |t| expect_failure(t, "fs.readonly", "openat", "EROFS"),
    );
    // and inside allowWrite it works
    let script = format!("echo x > {}", srt.path("allowed/f"));
    twice(|| srt.run(&script), expect_clean);
}

#[test]
fn srt_read_of_a_denied_path_is_fs_missing() {
    let Some(srt) = Srt::new() else { return };
    let script = format!("cat {}", srt.path("secret/key"));
    twice(
        || srt.run(&script),
        |t| expect_failure(t, "fs.missing", "openat", "ENOENT"),
    );
}

#[test]
fn srt_connect_to_the_hosts_loopback_is_net_egress_not_the_relays_kill() {
    let Some(srt) = Srt::new() else { return };
    // a listening port on the host: the sandbox's own loopback refuses it
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let script = python_connect(host.local_addr().unwrap().port());
    twice(
        || srt.run(&script),
        |t| {
            expect_failure(t, "net.egress", "connect", "ECONNREFUSED");
            assert!(
                !t.json["explanation"].as_str().unwrap().contains("SIGTERM"),
                "{}",
                t.context()
            );
        },
    );
}

#[test]
fn srt_unix_socket_is_its_seccomp_filter() {
    let Some(srt) = Srt::new() else { return };
    twice(
        || srt.run("python3 -c 'import socket; socket.socket(socket.AF_UNIX)'"),
        |t| expect_failure(t, "seccomp", "socket", "EPERM"),
    );
}

#[test]
fn srt_missing_command_is_exec_missing() {
    let Some(srt) = Srt::new() else { return };
    for env in SHELLS {
        twice(
            || srt.run_with_env(env, "probe-no-such-command"),
            |t| {
                t.expect("exec.missing", None);
                assert_eq!(t.code, Some(127), "{}", t.context());
            },
        );
    }
}

#[test]
fn srt_clean_runs_blame_nothing_and_hide_no_helpers_cleanup() {
    let Some(srt) = Srt::new() else { return };
    for script in ["echo hi", THREADS] {
        twice(|| srt.run(script), expect_clean);
    }
}

#[test]
fn srt_failures_hidden_by_or_true_and_a_pipeline_are_hidden_failures() {
    let Some(srt) = Srt::new() else { return };
    twice(
        || srt.run("cat /nonexistent-probe-runtime || true"),
        |t| expect_hidden(t, "fs.missing"),
    );
    twice(
        || srt.run("touch /etc/probe-runtime-test | cat"),
        |t| expect_hidden(t, "fs.readonly"),
    );
}

#[test]
fn srt_plain_exit_with_a_leftover_process_blames_nothing_and_names_the_real_senders() {
    let Some(srt) = Srt::new() else { return };
    for env in SHELLS {
        twice(
            || srt.run_with_env(env, "sleep 30 & exit 3"),
            |t| {
                assert_eq!(t.code, Some(3));
                t.expect("none", None);
                let why = t.json["explanation"].as_str().unwrap();
                assert!(
                    why.contains("at PID-namespace teardown (its init, apply-seccomp"),
                    "{why}"
                );
                assert!(why.contains("which started it"), "{why}");
            },
        );
    }
}

// ------------------------------------------------------------------ podman

/// `podman run` with runc (crun refuses this host's hybrid cgroups), the
/// default seccomp profile and capabilities, no network, a read-only root
/// from `RUNTIMES_ROOTFS` (a Debian root filesystem `cargo xtask test` builds
/// with mmdebstrap: no image registry is reachable) with an overlay that
/// throws writes away, and explicit rlimits (podman cannot raise its own
/// without CAP_SYS_RESOURCE).
struct Podman {
    rootfs: PathBuf,
    /// The working directory: conmon writes its `oom` marker there.
    cwd: tempfile::TempDir,
}

/// The containers' root filesystem, `RUNTIMES_ROOTFS` (None: skipped, a
/// failure under CI).
fn rootfs() -> Option<PathBuf> {
    let rootfs = std::env::var_os("RUNTIMES_ROOTFS").map(PathBuf::from);
    let found = rootfs.filter(|r| r.join("bin/sh").exists());
    if found.is_none() {
        assert!(
            !ci(),
            "RUNTIMES_ROOTFS names no root filesystem, and CI=true forbids skipping"
        );
        eprintln!("SKIPPED: RUNTIMES_ROOTFS is unset (cargo xtask test builds it)");
    }
    found
}

impl Podman {
    fn new() -> Option<Podman> {
        if !root() || installed("podman").is_none() || installed("runc").is_none() {
            return None;
        }
        let rootfs = rootfs()?;
        let cwd = tempfile::Builder::new()
            .prefix("probe-podman-")
            .tempdir()
            .unwrap();
        Some(Podman { rootfs, cwd })
    }

    fn run(&self, extra: &[&str], cmd: &[&str]) -> Traced {
        let rootfs = format!("{}:O", self.rootfs.display());
        let mut args = vec![
            "podman",
            "run",
            "--rm",
            "--runtime",
            "runc",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--network",
            "none",
            "--read-only",
        ];
        args.extend(extra);
        // --rootfs takes no value: the root is the first positional argument
        args.extend(["--rootfs", &rootfs]);
        args.extend(cmd);
        trace_in(self.cwd.path(), &[], &args)
    }

    fn sh(&self, extra: &[&str], script: &str) -> Traced {
        self.run(extra, &["sh", "-c", script])
    }
}

#[test]
fn podman_write_to_its_read_only_root_is_fs_readonly() {
    let Some(podman) = Podman::new() else { return };
    twice(
        || podman.run(&[], &["touch", "/x"]),
        |t| expect_failure(t, "fs.readonly", "openat", "EROFS"),
    );
}

#[test]
fn podman_connect_without_a_network_is_net_egress() {
    let Some(podman) = Podman::new() else { return };
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let script = python_connect(host.local_addr().unwrap().port());
    twice(
        || podman.sh(&[], &script),
        |t| expect_failure(t, "net.egress", "connect", "ECONNREFUSED"),
    );
}

#[test]
fn podman_syscall_its_default_seccomp_profile_refuses_is_seccomp() {
    let Some(podman) = Podman::new() else { return };
    // add_key (248) is not in the default profile: ENOSYS, never run
    twice(
        || {
            podman.run(
                &[],
                &["perl", "-e", "syscall(248, 0, 0, 0, 0, 0) == -1 and exit 1"],
            )
        },
        |t| expect_failure(t, "seccomp", "add_key", "ENOSYS"),
    );
}

#[test]
fn podman_pids_limit_is_proc_limit_not_the_kill_of_the_leftovers() {
    let Some(podman) = Podman::new() else { return };
    twice(
        || {
            podman.sh(
                &["--pids-limit", "20"],
                "for i in $(seq 50); do sleep 5 & done; wait",
            )
        },
        |t| expect_failure(t, "proc.limit", "clone", "EAGAIN"),
    );
}

#[test]
fn podman_memory_limit_is_mem_oom() {
    let Some(podman) = Podman::new() else { return };
    twice(
        || {
            podman.run(
                &["--memory", "64m"],
                &["python3", "-c", "x = b'a' * (200 << 20)"],
            )
        },
        |t| {
            t.expect("mem.oom", None);
            assert_eq!(t.decisive("kind"), Some("oom_victim"), "{}", t.context());
            assert_eq!(t.code, Some(137), "{}", t.context());
        },
    );
}

#[test]
fn podman_missing_command_through_the_containers_shell_is_exec_missing() {
    let Some(podman) = Podman::new() else { return };
    // dash in the minimal Debian root looks the name up itself and exits 127
    twice(
        || podman.run(&[], &["sh", "-c", "probe-no-such-command"]),
        |t| {
            t.expect("exec.missing", None);
            assert_eq!(t.code, Some(127), "{}", t.context());
        },
    );
}

#[test]
fn podman_missing_command_is_exec_missing_not_its_own_setrlimit() {
    let Some(podman) = Podman::new() else { return };
    twice(
        || podman.run(&[], &["probe-no-such-command"]),
        |t| {
            t.expect("exec.missing", None);
            assert_eq!(t.decisive("errno"), Some("ENOENT"), "{}", t.context());
            assert_eq!(t.code, Some(127), "{}", t.context());
        },
    );
}

#[test]
fn podman_clean_runs_and_hidden_failures() {
    let Some(podman) = Podman::new() else { return };
    twice(|| podman.run(&[], &["sh", "-c", THREADS]), expect_clean);
    twice(
        || podman.sh(&[], "touch /x || true"),
        |t| expect_hidden(t, "fs.readonly"),
    );
    twice(
        || podman.sh(&[], "touch /x | cat"),
        |t| expect_hidden(t, "fs.readonly"),
    );
    twice(
        || podman.sh(&[], "exit 3"),
        |t| {
            assert_eq!(t.code, Some(3));
            t.expect("none", None);
        },
    );
}

// ------------------------------------------------------------------ firejail

/// `firejail --noprofile --quiet` with `opts`, running `cmd`.
fn firejail(opts: &[&str], cmd: &[&str]) -> Traced {
    let mut args = vec!["firejail", "--noprofile", "--quiet"];
    args.extend(opts);
    args.extend(cmd);
    trace_with(&[], &args)
}

fn firejail_ready() -> bool {
    root() && installed("firejail").is_some()
}

#[test]
fn firejail_read_only_blacklist_no_network_and_seccomp_name_their_mechanism() {
    if !firejail_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ro, hidden) = (dir.path().join("ro"), dir.path().join("hidden"));
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::create_dir_all(&hidden).unwrap();
    std::fs::write(hidden.join("key"), "x").unwrap();
    let (ro, hidden) = (ro.display().to_string(), hidden.display().to_string());
    let read_only = format!("--read-only={ro}");
    let write = format!("echo x > {ro}/f");
    twice(
        || firejail(&[&read_only], &["sh", "-c", &write]),
        |t| expect_failure(t, "fs.readonly", "openat", "EROFS"),
    );
    let blacklist = format!("--blacklist={hidden}");
    let key = format!("{hidden}/key");
    twice(
        || firejail(&[&blacklist], &["cat", &key]),
        |t| expect_failure(t, "fs.missing", "openat", "ENOENT"),
    );
    let connect = python_connect(closed_port());
    twice(
        || firejail(&["--net=none"], &["sh", "-c", &connect]),
        |t| expect_failure(t, "net.egress", "connect", "ECONNREFUSED"),
    );
    let target = format!("{ro}/d");
    twice(
        || firejail(&["--seccomp.drop=mkdir"], &["mkdir", &target]),
        |t| expect_failure(t, "seccomp", "mkdir", "EPERM"),
    );
}

#[test]
fn firejail_missing_command_clean_runs_and_hidden_failures() {
    if !firejail_ready() {
        return;
    }
    // firejail looks the command up itself and exits 1, then cleans up
    // its run files (ENOENT): the lookup is the cause
    twice(
        || firejail(&[], &["probe-no-such-command"]),
        |t| {
            t.expect("exec.missing", None);
            assert_ne!(t.code, Some(0), "{}", t.context());
        },
    );
    twice(|| firejail(&[], &["sh", "-c", THREADS]), expect_clean);
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().display().to_string();
    let read_only = format!("--read-only={ro}");
    let script = format!("touch {ro}/x || true");
    twice(
        || firejail(&[&read_only], &["sh", "-c", &script]),
        |t| expect_hidden(t, "fs.readonly"),
    );
}

// ------------------------------------------------------------------ systemd-nspawn

/// `systemd-nspawn` over the read-only containers' root, the command as
/// PID 2; no machined and no systemd as PID 1 here (`--register=no
/// --keep-unit`), no host time zone to bind (`--timezone=off`).
fn nspawn(rootfs: &Path, opts: &[&str], cmd: &[&str]) -> Traced {
    let root = rootfs.display().to_string();
    let mut args = vec![
        "systemd-nspawn",
        "-q",
        "-D",
        &root,
        "--register=no",
        "--keep-unit",
        "--read-only",
        "--timezone=off",
        "--as-pid2",
    ];
    args.extend(opts);
    args.extend(cmd);
    trace_with(&[], &args)
}

fn nspawn_ready() -> Option<PathBuf> {
    if !root() || installed("systemd-nspawn").is_none() {
        return None;
    }
    rootfs()
}

#[test]
fn nspawn_read_only_root_private_network_and_syscall_filter_name_their_mechanism() {
    let Some(rootfs) = nspawn_ready() else { return };
    twice(
        || nspawn(&rootfs, &[], &["sh", "-c", "echo x > /etc/f"]),
        |t| expect_failure(t, "fs.readonly", "openat", "EROFS"),
    );
    let connect = python_connect(closed_port());
    twice(
        || nspawn(&rootfs, &["--private-network"], &["sh", "-c", &connect]),
        |t| expect_failure(t, "net.egress", "connect", "ECONNREFUSED"),
    );
    twice(
        || {
            nspawn(
                &rootfs,
                &["--system-call-filter=~mkdir"],
                &["mkdir", "/tmp/d"],
            )
        },
        |t| expect_failure(t, "seccomp", "mkdir", "EPERM"),
    );
}

#[test]
fn nspawn_missing_command_clean_runs_and_hidden_failures() {
    let Some(rootfs) = nspawn_ready() else { return };
    twice(
        || nspawn(&rootfs, &[], &["probe-no-such-command"]),
        |t| {
            t.expect("exec.missing", None);
            assert_ne!(t.code, Some(0), "{}", t.context());
        },
    );
    // its own EROFS while it sets up the read-only root is no hidden failure
    twice(|| nspawn(&rootfs, &[], &["echo", "hi"]), expect_clean);
    twice(
        || nspawn(&rootfs, &[], &["sh", "-c", THREADS]),
        expect_clean,
    );
    twice(
        || nspawn(&rootfs, &[], &["sh", "-c", "touch /x || true"]),
        |t| expect_hidden(t, "fs.readonly"),
    );
    twice(
        || nspawn(&rootfs, &[], &["sh", "-c", "sleep 30 & exit 3"]),
        |t| {
            assert_eq!(t.code, Some(3), "{}", t.context());
            t.expect("none", None);
        },
    );
}
