//! `cargo xtask demo`: inject real faults and let `probe trace` name each.

use std::path::Path;
use std::process::Command;

/// (what is injected, expected primitive, shell script). `{F}` is probe-fault,
/// `{D}` a fresh directory.
const SCENARIOS: [(&str, &str, &str); 9] = [
    (
        "seccomp filter returns EPERM for mkdir",
        "seccomp",
        "{F} --seccomp errno:mkdir -- mkdir {D}/out",
    ),
    (
        "seccomp filter kills on socket()",
        "seccomp",
        "{F} --seccomp kill:socket -- python3 -c 'import socket; socket.socket()'",
    ),
    (
        "read-only mount",
        "fs.readonly",
        "unshare -m sh -c 'mount -t tmpfs -o ro tmpfs {D} && echo data > {D}/result.json'",
    ),
    (
        "1 MiB tmpfs filled",
        "fs.space",
        "unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs {D} && dd if=/dev/zero of={D}/blob bs=64k count=64 status=none'",
    ),
    (
        "noexec mount",
        "fs.noexec",
        "unshare -m sh -c 'mount -t tmpfs -o noexec tmpfs {D} && cp /bin/true {D}/tool && {D}/tool'",
    ),
    (
        "tool not installed",
        "exec.missing",
        "sh -c 'agentctl --version'",
    ),
    (
        "no route in a fresh network namespace",
        "net.egress",
        "unshare -n bash -c 'echo hi > /dev/tcp/10.1.2.3/80'",
    ),
    (
        "a data file that is not there",
        "fs.missing",
        "python3 -c 'open(\"{D}/input.csv\").read()'",
    ),
    (
        "a clean python3 run (dozens of benign ENOENTs)",
        "none",
        "python3 -c 'import json, csv, email'",
    ),
];

pub fn run(bin: &Path) -> anyhow::Result<()> {
    let probe = bin.join("probe");
    let fault = bin.join("probe-fault");
    let mut summary = Vec::new();
    for (i, (what, expected, script)) in SCENARIOS.iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("probe-demo-{}-{i}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let script = script
            .replace("{F}", &fault.to_string_lossy())
            .replace("{D}", &dir.to_string_lossy());
        println!(
            "\n=== {}. {what}\n$ probe trace -- sh -c \"{script}\"",
            i + 1
        );
        let out = Command::new(&probe)
            .args(["trace", "--", "sh", "-c", &script])
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        let got = stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("primitive"))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        summary.push((what.to_string(), expected.to_string(), got));
        let _ = std::fs::remove_dir_all(&dir);
    }
    summary.push(daemon_persistence(&probe)?);
    println!(
        "\n=== summary\n{:<48} {:<14} {:<14}",
        "fault injected", "expected", "attributed"
    );
    let mut wrong = 0;
    for (what, expected, got) in &summary {
        let (what, expected, got) = (what.as_str(), expected.as_str(), got.as_str());
        let mark = if expected == got {
            ""
        } else {
            "  <-- mismatch"
        };
        wrong += usize::from(expected != got);
        println!("{what:<48} {expected:<14} {got:<14}{mark}");
    }
    if wrong > 0 {
        anyhow::bail!("{wrong} scenario(s) attributed differently than expected");
    }
    Ok(())
}

/// The daemon: a session writes a file into a tmpfs in one span; the next
/// span of the same session finds it gone.
fn daemon_persistence(probe: &Path) -> anyhow::Result<(String, String, String)> {
    let dir = std::env::temp_dir().join(format!("probe-demo-daemon-{}", std::process::id()));
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    let socket = dir.join("probe.sock");
    let db = dir.join("evidence.db");
    println!(
        "\n=== 10. a file written in one tool call is gone in the next (daemon, two spans of one session)"
    );
    println!(
        "$ probe run --socket {} --db {} &",
        socket.display(),
        db.display()
    );
    let mut daemon = Command::new(probe)
        .args(["run", "--socket"])
        .arg(&socket)
        .arg("--db")
        .arg(&db)
        .spawn()?;
    let up = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        Command::new(probe)
            .args(["status", "--socket"])
            .arg(&socket)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let result = (|| -> anyhow::Result<String> {
        anyhow::ensure!(up, "the daemon did not start");
        let d = data.display();
        let span = |script: &str| -> anyhow::Result<String> {
            println!("$ probe span --session demo-1 -- sh -c \"{script}\"");
            let out = Command::new(probe)
                .args(["span", "--session", "demo-1", "--socket"])
                .arg(&socket)
                .args(["--", "sh", "-c", script])
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            print!("{text}");
            Ok(text)
        };
        span(&format!(
            "unshare -m sh -c 'mount -t tmpfs tmpfs {d} && echo 1,2 > {d}/result.csv'"
        ))?;
        let second = span(&format!("cat {d}/result.csv"))?;
        println!("$ probe spans --db {}", db.display());
        std::thread::sleep(std::time::Duration::from_millis(300));
        let spans = Command::new(probe)
            .args(["spans", "--db"])
            .arg(&db)
            .output()?;
        print!("{}", String::from_utf8_lossy(&spans.stdout));
        Ok(second
            .lines()
            .find_map(|l| l.trim().strip_prefix("primitive"))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or("?")
            .to_string())
    })();
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let _ = daemon.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Ok((
        "written, then gone in the next call (daemon)".into(),
        "fs.persistence".into(),
        result?,
    ))
}
