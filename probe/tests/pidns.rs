//! The probe inside a PID namespace (a container-like sandbox): `probe
//! trace`, and `probe run` with `probe span`, run inside `unshare --pid
//! --fork --mount-proc` attribute the same faults as outside, and every pid
//! they print is one the namespace sees.
//!
//! Root only; under CI=true a missing capability is a failure.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_probe");
const FAULT: &str = env!("CARGO_BIN_EXE_probe-fault");

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
        "PID-namespace tests need root, and CI=true forbids skipping them"
    );
    eprintln!("SKIPPED: PID-namespace test needs root");
    false
}

/// `cmd` run directly, or as the first process of a new PID namespace with
/// its own /proc.
fn command(in_pidns: bool, cmd: &[&str]) -> Command {
    if in_pidns {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--"]).args(cmd);
        c
    } else {
        let mut c = Command::new(cmd[0]);
        c.args(&cmd[1..]);
        c
    }
}

fn trace(in_pidns: bool, workload: &[&str]) -> Value {
    let mut cmd = vec![PROBE, "trace", "--json", "--"];
    cmd.extend(workload);
    let out = command(in_pidns, &cmd).output().expect("run probe trace");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "probe trace (pidns: {in_pidns}) printed no JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// (primitive, decisive syscall, decisive errno): what must not change.
fn verdict(v: &Value) -> (String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    (
        s(&v["primitive"]),
        s(&v["decisive"]["syscall"]),
        s(&v["decisive"]["errno"]),
    )
}

/// Every pid and tid the evidence names.
fn pids_in(v: &Value) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for ev in v["events"].as_array().into_iter().flatten() {
        for key in ["pid", "tid", "child_pid", "sender_pid"] {
            if let Some(p) = ev[key].as_u64() {
                out.insert(p);
            }
        }
    }
    for key in ["pid", "tid"] {
        if let Some(p) = v["decisive"][key].as_u64() {
            out.insert(p);
        }
    }
    out
}

/// A workload that records the pid of every process it runs (each one
/// `exec`s the next, so the recorded pid is the process that fails).
fn recording(log: &Path, last: &str) -> Vec<String> {
    let log = log.display();
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo $$ >> {log}; sh -c 'echo $$ >> {log}; exec {last}'; rc=$?; echo $$ >> {log}; exit $rc"
        ),
    ]
}

fn recorded_pids(log: &Path) -> BTreeSet<u64> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// The io_uring workload of the kernel tests (tests/workloads/uring.c).
fn uring_workload(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("uring.c");
    std::fs::write(&src, include_str!("workloads/uring.c")).unwrap();
    let bin = dir.join("uring");
    let out = Command::new("gcc")
        .args(["-O1", "-static", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("gcc builds the io_uring workload: install gcc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("probe-pidns-")
        .tempdir()
        .unwrap()
}

#[test]
fn trace_in_a_pid_namespace_attributes_like_outside() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let target = dir.path().join("made");
    let target = target.to_str().unwrap();
    let uring = uring_workload(dir.path());
    let uring = uring.to_str().unwrap();
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("fs.missing", vec!["cat", "/nonexistent/input.csv"]),
        // completed on an io-wq worker, reported under the submitter's ids
        (
            "fs.missing",
            vec![uring, "open-async", "/nonexistent/uring.csv"],
        ),
        (
            "seccomp",
            vec![FAULT, "--seccomp", "errno:mkdir", "--", "mkdir", target],
        ),
        ("exec.missing", vec!["agentctl-not-installed", "--version"]),
        (
            "signal",
            vec!["python3", "-c", "import ctypes; ctypes.string_at(0)"],
        ),
        ("none", vec!["sh", "-c", "echo fine; exit 0"]),
    ];
    for (expected, workload) in &cases {
        let outside = trace(false, workload);
        let inside = trace(true, workload);
        assert_eq!(outside["primitive"], *expected, "outside: {outside:#}");
        assert_eq!(
            verdict(&inside),
            verdict(&outside),
            "{expected}: inside a PID namespace\n{inside:#}\noutside\n{outside:#}"
        );
        assert_eq!(inside["exit"], outside["exit"], "{expected}");
        if workload[0] == uring {
            let d = &inside["decisive"];
            assert_eq!(d["kind"], "uring_failed", "{inside:#}");
            // the namespace's first process is unshare's child, pid 1: the
            // workload is one of its first few
            assert!(d["pid"].as_u64().is_some_and(|p| p < 100), "{inside:#}");
            assert_eq!(d["pid"], d["tid"], "{inside:#}");
        }
    }

    // the pids printed are the namespace's: each one is a pid the workload
    // itself saw as its own
    let log = dir.path().join("pids");
    let script = recording(&log, "cat /nonexistent/input.csv");
    let args: Vec<&str> = script.iter().map(String::as_str).collect();
    let inside = trace(true, &args);
    assert_eq!(inside["primitive"], "fs.missing", "{inside:#}");
    let seen = recorded_pids(&log);
    let printed = pids_in(&inside);
    assert!(!printed.is_empty(), "{inside:#}");
    assert!(
        printed.is_subset(&seen),
        "pids in the evidence {printed:?} are not the namespace's {seen:?}\n{inside:#}"
    );
    // the failing cat is the inner shell's pid, as the namespace numbers it
    let failing = inside["decisive"]["pid"].as_u64().expect("decisive pid");
    assert!(
        seen.contains(&failing) && failing < 100,
        "{failing} {seen:?}"
    );
    // and the fork the outer shell made names that child by the same id
    let forked: BTreeSet<u64> = inside["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "fork")
        .filter_map(|e| e["child_pid"].as_u64())
        .collect();
    assert!(
        forked.iter().all(|p| seen.contains(p)),
        "{forked:?} {seen:?}"
    );
}

#[test]
fn span_through_a_daemon_in_a_pid_namespace() {
    if !root() {
        return;
    }
    let dir = tempdir();
    let sock = dir.path().join("probe.sock");
    let db = dir.path().join("evidence.db");
    let log = dir.path().join("pids");
    let out = dir.path().join("span.json");
    let status = dir.path().join("status.json");
    let workload = recording(&log, "cat /nonexistent/input.csv")
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    // daemon and client both inside one new PID namespace
    let script = format!(
        r#"
        {probe} run --socket {sock} --db {db} 2>{dir}/daemon.log &
        daemon=$!
        for i in $(seq 1 100); do [ -S {sock} ] && break; sleep 0.1; done
        {probe} status --socket {sock} --json > {status}
        {probe} status --socket {sock} > {status}.txt
        {probe} span --socket {sock} --session pidns --json -- {workload} > {out}
        {probe} span --socket {sock} --session pidns --json -- {fault} --seccomp errno:mkdir -- mkdir {dir}/made > {out}.seccomp
        kill -TERM $daemon; wait $daemon
        "#,
        probe = PROBE,
        fault = FAULT,
        sock = sock.display(),
        db = db.display(),
        dir = dir.path().display(),
        status = status.display(),
        out = out.display(),
    );
    let st = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--", "sh", "-c", &script])
        .status()
        .unwrap();
    let daemon_log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default();
    assert!(st.success(), "namespace script failed: {st}\n{daemon_log}");

    let status_path = status;
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(&status_path).unwrap()).unwrap();
    assert!(
        status["pid_namespace"]["inode"].as_u64().is_some(),
        "status does not name the PID namespace: {status:#}"
    );
    assert!(status["pid"].as_u64().unwrap() < 100, "{status:#}");
    let human = std::fs::read_to_string(format!("{}.txt", status_path.display())).unwrap();
    assert!(
        human.contains(&format!(
            "pids           of PID namespace pid:[{}]",
            status["pid_namespace"]["inode"]
        )),
        "{human}"
    );

    let span: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap())
        .unwrap_or_else(|e| panic!("{e}\n{daemon_log}"));
    assert_eq!(span["primitive"], "fs.missing", "{span:#}\n{daemon_log}");
    let seen = recorded_pids(&log);
    let printed = pids_in(&span);
    assert!(
        !printed.is_empty() && printed.is_subset(&seen),
        "pids in the evidence {printed:?} are not the namespace's {seen:?}\n{span:#}"
    );
    let seccomp: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{}.seccomp", out.display())).unwrap(),
    )
    .unwrap();
    assert_eq!(seccomp["primitive"], "seccomp", "{seccomp:#}");
    assert_eq!(seccomp["decisive"]["syscall"], "mkdir", "{seccomp:#}");
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
