//! Every built-in profile, applied by a real bridge to a real workload,
//! yields its primitive in `structuredContent.kernel` (real probe daemon,
//! real kernel). Root needed; never skipped under CI=true.

mod common;

use common::*;
use serde_json::{Value, json};

/// A stdio bridge under `profile` (a name or a file), probe attached.
async fn probed(profile: &'static str) -> Bridge {
    Bridge::stdio(Opts {
        profile: Some(profile),
        probe: true,
        ..Opts::default()
    })
    .await
}

/// Runs `steps` (exec commands) in one session under `profile` and returns
/// the last step's result.
async fn under(profile: &'static str, steps: &[&str]) -> Value {
    let b = probed(profile).await;
    let mut last = Value::Null;
    for cmd in steps {
        let r = b
            .call("exec", json!({"command": cmd, "timeout_ms": 20_000}))
            .await;
        last = structured(&r).clone();
    }
    last
}

fn assert_primitive(profile: &str, r: &Value, primitive: &str) {
    let k = &r["kernel"];
    assert_eq!(k["available"], true, "{profile}: no kernel evidence: {k}");
    assert_eq!(
        k["primitive"], primitive,
        "{profile}: expected {primitive}; kernel said {} — {}\nresult: {r}",
        k["primitive"], k["explanation"]
    );
    assert_eq!(k["failed"], primitive != "none", "{profile}: {k}");
}

async fn check(profile: &'static str, steps: &[&str], primitive: &str) {
    if !root() {
        return;
    }
    let r = under(profile, steps).await;
    assert_primitive(profile, &r, primitive);
}

#[tokio::test(flavor = "multi_thread")]
async fn clean_runs_clean() {
    check(
        "clean",
        &["python3 -c 'import json, os; os.makedirs(\"/tmp/clean-ok\", exist_ok=True)'"],
        "none",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn seccomp_errno() {
    let dir = scratch("seccomp-errno");
    check("seccomp-errno", &[&format!("mkdir {dir}")], "seccomp").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn seccomp_kill() {
    let dir = scratch("seccomp-kill");
    check("seccomp-kill", &[&format!("mkdir {dir}")], "seccomp").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn seccomp_trap() {
    check(
        "seccomp-trap",
        &["python3 -c 'import socket; socket.socket()'"],
        "seccomp",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readonly() {
    let f = scratch("ro");
    check("readonly", &[&format!("echo data > {f}")], "fs.readonly").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn noexec() {
    let f = scratch("noexec.sh");
    check(
        "noexec",
        &[&format!(
            "printf '#!/bin/sh\\necho hi\\n' > {f} && chmod +x {f} && {f}"
        )],
        "fs.noexec",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ephemeral_paths_lose_files_between_calls() {
    let f = scratch("ephemeral");
    let r = under(
        "ephemeral",
        &[&format!("echo state > {f}"), &format!("cat {f}")],
    )
    .await;
    if root() {
        assert_primitive("ephemeral", &r, "fs.persistence");
        assert!(
            !std::path::Path::new(&f).exists(),
            "the write leaked out of the call's tmpfs"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ephemeral_paths_also_hold_for_the_file_tools() {
    if !root() {
        return;
    }
    let b = probed("ephemeral").await;
    let f = scratch("ephemeral-tools");
    let w = b
        .call("write_file", json!({"path": f, "text": "kept?"}))
        .await;
    assert!(!is_error(&w), "{}", text(&w));
    let r = b.call("read_file", json!({"path": f})).await;
    assert!(is_error(&r), "the file survived the call");
    assert_eq!(structured(&r)["errno"], "ENOENT");
    assert_primitive("ephemeral", structured(&r), "fs.persistence");
    // the worker is named after the bridge (exec'd by fd), not `exe`, where
    // the kernel names fd execs after the file (Linux 6.13)
    let who = if agent_bridge::self_exec::names_fd_execs() {
        "agent-bridge"
    } else {
        "exe"
    };
    let explanation = structured(&r)["kernel"]["explanation"].as_str().unwrap();
    assert!(
        explanation.contains(&format!(" in {who} (pid ")),
        "{explanation}"
    );
}

/// The same across calls of a client without an MCP session (protocol
/// 2026-07-28), whose calls share the bridge's one sessionless sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn ephemeral_paths_hold_for_sessionless_clients() {
    if !root() {
        return;
    }
    let b = Bridge::http(Opts {
        profile: Some("ephemeral"),
        probe: true,
        sessionless: true,
        ..Opts::default()
    })
    .await;
    let f = scratch("ephemeral-sessionless");
    b.call("exec", json!({"command": format!("echo state > {f}")}))
        .await;
    let r = b.call("exec", json!({"command": format!("cat {f}")})).await;
    assert_primitive("ephemeral", structured(&r), "fs.persistence");
}

/// A user's profile that denies `execveat` (which the file worker's exec by
/// fd uses) denies it to workloads, never to the bridge's own file tools.
#[tokio::test(flavor = "multi_thread")]
async fn a_profile_denying_execveat_keeps_the_file_tools() {
    if !root() {
        return;
    }
    let file = scratch("deny-execveat.toml");
    std::fs::write(
        &file,
        "reproduces = \"seccomp\"\n[[seccomp]]\naction = \"errno\"\nsyscalls = [\"execveat\"]\n",
    )
    .unwrap();
    let b = probed(file.clone().leak()).await;
    let f = scratch("deny-execveat-data");
    let w = b
        .call("write_file", json!({"path": f, "text": "still here"}))
        .await;
    assert!(!is_error(&w), "{}", text(&w));
    let r = b.call("read_file", json!({"path": f})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["bytes"], 10);
    assert_primitive("deny-execveat", structured(&r), "none");
    // the profile still holds for the workload's own execveat
    let denied = b
        .call(
            "run_code",
            json!({"language": "python", "code": "import os\nfd = os.open('/bin/true', os.O_RDONLY)\nos.execve(fd, ['true'], {})"}),
        )
        .await;
    assert_primitive("deny-execveat", structured(&denied), "seccomp");
    let _ = std::fs::remove_file(&f);
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread")]
async fn full_disk() {
    let f = scratch("big");
    check(
        "full-disk",
        &[&format!("head -c 4M /dev/zero > {f}")],
        "fs.space",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn full_disk_persists_within_the_session() {
    let f = scratch("small");
    let r = under(
        "full-disk",
        &[&format!("echo kept > {f}"), &format!("cat {f}")],
    )
    .await;
    if root() {
        assert_eq!(r["stdout"]["text"], "kept\n", "{r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unprivileged() {
    check(
        "unprivileged",
        &["touch /etc/agent-bridge-test-denied"],
        "fs.permission",
    )
    .await;
}

/// The ids a workload takes are its own: every thread of the bridge that
/// started it (cloned with CLONE_VM, see `launch`) is still root after it,
/// and the next call still gets its cgroup and span.
#[tokio::test(flavor = "multi_thread")]
async fn unprivileged_workloads_leave_the_bridge_root() {
    if !root() {
        return;
    }
    let b = probed("unprivileged").await;
    for _ in 0..2 {
        let r = b.call("exec", json!({"command": "id -u; id -g"})).await;
        let s = structured(&r);
        assert_eq!(s["stdout"]["text"], "65534\n65534\n", "{s}");
        assert_eq!(s["kernel"]["available"], true, "{s}");
    }
    let tasks = std::fs::read_dir(format!("/proc/{}/task", b.pid())).unwrap();
    let mut seen = 0;
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for key in ["Uid:", "Gid:"] {
            let line = status.lines().find(|l| l.starts_with(key));
            let Some(line) = line else { continue };
            let ids: Vec<&str> = line.split_whitespace().skip(1).collect();
            assert_eq!(
                ids,
                ["0"; 4],
                "bridge thread {:?}: {line}",
                task.file_name()
            );
        }
        seen += 1;
    }
    assert!(seen > 1, "the bridge runs more than one thread");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_caps() {
    check("no-caps", &["unshare -m true"], "caps").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pids_limit() {
    check(
        "pids-limit",
        &["for i in $(seq 40); do sleep 2 & done; wait"],
        "proc.limit",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_limit() {
    check(
        "memory-limit",
        &["python3 -c 'b = bytearray(300 << 20); print(len(b))'"],
        "mem.oom",
    )
    .await;
}

/// A child the OOM killer took inside a call that exited 0 (a browser's
/// tab, in small): the call "succeeded", the evidence must not say
/// "nothing failed".
#[tokio::test(flavor = "multi_thread")]
async fn memory_limit_names_an_oom_kill_inside_a_call_that_exited_0() {
    if !root() {
        return;
    }
    let r = under(
        "memory-limit",
        &["python3 -c 'b = bytearray(300 << 20)'; echo the shell went on"],
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_primitive("memory-limit", &r, "none");
    let k = &r["kernel"];
    assert_eq!(k["hidden_failure"]["primitive"], "mem.oom", "{k}");
    let why = k["hidden_failure"]["explanation"].as_str().unwrap();
    assert!(
        why.starts_with("python3 (pid ") && why.contains("was killed by the OOM killer at "),
        "{why}"
    );
    // where the limit was: the call's own cgroup, 64 MiB
    assert!(
        why.contains(" in cgroup /") && why.contains("(memory limit 64 MiB)"),
        "{why}"
    );
    assert!(
        k["explanation"]
            .as_str()
            .unwrap()
            .starts_with("exited 0, but python3"),
        "{k}"
    );
    assert_eq!(k["decisive"]["kind"], "oom_victim", "{k}");
}

#[tokio::test(flavor = "multi_thread")]
async fn address_space() {
    check(
        "address-space",
        &["python3 -c 'b = bytearray(2 << 30)'"],
        "mem.limit",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_network() {
    check(
        "no-network",
        &["python3 -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), timeout=5)'"],
        "net.egress",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_network_keeps_loopback() {
    let r = under(
        "no-network",
        &["python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); c = socket.create_connection(s.getsockname()); print(\"ok\")'"],
    )
    .await;
    if root() {
        assert_eq!(r["stdout"]["text"], "ok\n", "{r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_tools() {
    check("no-tools", &["gcc --version"], "exec.missing").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hidden_data() {
    check(
        "hidden-data",
        &["cat /usr/share/common-licenses/GPL-3"],
        "fs.missing",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cpu_limit() {
    check("cpu-limit", &["python3 -c 'while True: pass'"], "signal").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deadline() {
    check("deadline", &["sleep 10"], "timeout").await;
}
