//! agent-bridge inside a gVisor sandbox, the probe daemon on the host as
//! that sandbox's runtime monitor: runsc started with the daemon's session
//! (`probe gvisor-session`), the bridge reaching the daemon's control
//! socket through `--host-uds=open`. Each tool call gets a span whose
//! evidence is gVisor's points, keyed by the sandbox's container and the
//! pid the sandbox sees; a short campaign runs against such bridges.
//!
//! They need root and runsc; under CI=true a missing one is a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{BRIDGE, Bridge, Killed, ok, payload_bytes, probe_daemon, root, structured};
use serde_json::{Value, json};

fn runsc_available() -> bool {
    if !root() {
        return false;
    }
    let found = Command::new("runsc").arg("--version").output().is_ok();
    assert!(
        found || !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
        "runsc is missing (cargo xtask setup installs it); CI=true forbids skipping"
    );
    if !found {
        eprintln!("SKIPPED: runsc is not installed");
    }
    found
}

fn probe_binary() -> PathBuf {
    Path::new(BRIDGE).with_file_name("probe")
}

/// A daemon of the test's own, and the runsc words that start a sandbox
/// sending it its points: `runsc --pod-init-config=… --host-uds=open
/// --network=none do`.
fn daemon_and_runsc(dir: &Path) -> (Killed, PathBuf, Vec<String>) {
    let (daemon, socket) = probe_daemon(dir);
    let session = dir.join("gvisor-session.json");
    let out = Command::new(probe_binary())
        .args(["gvisor-session", "--socket"])
        .arg(socket.with_extension("gvisor.sock"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::write(&session, &out.stdout).unwrap();
    let runsc = vec![
        "runsc".to_string(),
        format!("--pod-init-config={}", session.display()),
        "--host-uds=open".into(),
        "--network=none".into(),
        "do".into(),
    ];
    (daemon, socket, runsc)
}

fn status(socket: &Path) -> Value {
    let out = Command::new(probe_binary())
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_inside_gvisor_gets_a_span_per_call_from_the_host_daemon() {
    if !runsc_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket, runsc) = daemon_and_runsc(dir.path());
    garbage_to_the_monitor(&socket.with_extension("gvisor.sock"));
    let wrapper: Vec<&str> = runsc.iter().map(String::as_str).collect();
    let args: Vec<String> = ["serve", "--stdio", "--probe-socket"]
        .map(String::from)
        .into_iter()
        .chain([socket.display().to_string()])
        .collect();
    let b = Bridge::stdio_under(&wrapper, &args, false)
        .await
        .expect("MCP handshake with the bridge inside gVisor");

    let kernel_of = |r: &rmcp::model::CallToolResult| structured(r)["kernel"].clone();
    // a missing input: the sandbox's own openat, its path and pid
    let r = b
        .call("exec", json!({"argv": ["cat", "/nonexistent/input.csv"]}))
        .await;
    let k = kernel_of(&r);
    assert_eq!(k["available"], true, "{k}");
    assert_eq!(k["source"], "gvisor", "{k}");
    assert_eq!(k["primitive"], "fs.missing", "{k}");
    assert_eq!(k["decisive"]["syscall"], "openat", "{k}");
    assert_eq!(k["decisive"]["errno"], "ENOENT", "{k}");
    assert_eq!(k["decisive"]["path"], "/nonexistent/input.csv", "{k}");
    let pid = k["decisive"]["pid"].as_u64().unwrap();
    assert!(
        pid > 1 && pid < 1000,
        "a pid of the sandbox, not the host's: {k}"
    );

    // the environment as the sandbox's workloads see it: gVisor's kernel,
    // told apart from the host's; what it cannot read said, not guessed
    let r = b.call("sandbox_environment", json!({})).await;
    let inside = probe::env::Snapshot::from_value(structured(&r)["snapshot"].clone())
        .expect("a snapshot from inside gVisor");
    let runtime = &inside.facet("runtime").unwrap().items;
    assert_eq!(runtime["kind"], "gvisor", "{runtime:?}");
    let host = probe::env::collect::snapshot(&Default::default(), "host");
    let differences = probe::env::diff::diff(&host, &inside).differences;
    assert!(
        differences
            .iter()
            .any(|d| d.facet == "runtime" && d.key == "kind"),
        "{differences:?}"
    );

    // a clean call: nothing failed, nothing blamed
    let r = b.call("exec", json!({"argv": ["echo", "ran"]})).await;
    assert_eq!(payload_bytes(&structured(&r)["stdout"]), b"ran\n");
    let k = kernel_of(&r);
    assert_eq!(
        (k["failed"].clone(), k["primitive"].clone()),
        (json!(false), json!("none")),
        "{k}"
    );

    // a program failing by its own logic after lookups it got past
    let r = b
        .call(
            "exec",
            json!({"argv": ["python3", "-c", "import json; raise SystemExit('bad input')"]}),
        )
        .await;
    let k = kernel_of(&r);
    assert_eq!(k["primitive"], "none", "{k}");

    // a call this sandbox's kernel refuses, though Linux takes it
    let r = b
        .call("exec", json!({"argv": ["ls", "/nonexistent-probe-path"]}))
        .await;
    let k = kernel_of(&r);
    assert_eq!(k["primitive"], "sandbox.kernel", "{k}");
    assert_eq!(k["decisive"]["syscall"], "statx", "{k}");

    let s = status(&socket);
    let g = &s["gvisor"];
    assert_eq!(g["sandboxes"].as_array().map(Vec::len), Some(1), "{g}");
    let container = g["sandboxes"][0]["containers"][0].as_str().unwrap_or("");
    assert!(container.starts_with("runsc-"), "{g}");
    assert_eq!(
        (g["malformed"].clone(), g["refused"].clone()),
        (json!(1), json!(1)),
        "{g}"
    );
    assert!(g["points"].as_u64().unwrap() > 0, "{g}");

    // the sandbox dies mid-stream (runsc killed with the bridge): the
    // daemon lets it go and goes on serving
    drop(b);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let g = status(&socket)["gvisor"].clone();
        if g["sandboxes"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the dead sandbox is still listed: {g}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// What no runsc sends: a peer that skips the handshake, and one that
/// shakes hands and then sends a datagram that is no point.
fn garbage_to_the_monitor(path: &Path) {
    use nix::sys::socket::{
        AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, connect, recv, send, socket,
    };
    use std::os::fd::AsRawFd as _;
    let client = || {
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::empty(),
            None,
        )
        .unwrap();
        connect(fd.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
        fd
    };
    let mut buf = [0u8; 16];
    let rude = client();
    send(
        rude.as_raw_fd(),
        b"GET / HTTP/1.1\r\n\r\n",
        MsgFlags::empty(),
    )
    .unwrap();
    assert_eq!(
        recv(rude.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap(),
        0,
        "closed"
    );
    let peer = client();
    send(peer.as_raw_fd(), &[0x08, 0x01], MsgFlags::empty()).unwrap();
    let n = recv(peer.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
    assert_eq!(&buf[..n], &[0x08, 0x01]);
    // a header whose size points past the datagram's end
    send(
        peer.as_raw_fd(),
        &[0xff, 0x00, 0x07, 0x00, 0, 0, 0, 0, 1, 2],
        MsgFlags::empty(),
    )
    .unwrap();
}

#[test]
fn a_short_campaign_runs_against_bridges_inside_gvisor() {
    if !runsc_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket, runsc) = daemon_and_runsc(dir.path());
    let base = format!(
        "/tmp/campaign-gvisor-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let (suite, n) =
        common::generated_suite(dir.path(), 60, &base, &["files", "process", "encoding"]);
    assert!(n >= 10, "too few tests generated: {n}");
    let target = format!(
        "stdio:{} {BRIDGE} serve --stdio --probe-socket {}",
        runsc.join(" "),
        socket.display()
    );
    let results = dir.path().join("results.db");
    let out = common::campaign(&[
        "run",
        "--suite",
        suite.to_str().unwrap(),
        "--target",
        &target,
        "--db",
        results.to_str().unwrap(),
        "--run",
        "gvisor",
        "--workers",
        "2",
        "--json",
        "--no-bar",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["recorded"], n as u64, "{s}");
    assert_eq!(s["complete"], true, "{s}");
    assert_eq!(
        s["steps_without_kernel"], 0,
        "every step had the daemon's gVisor evidence: {s}"
    );
    let conn = rusqlite::Connection::open(&results).unwrap();
    let (steps, from_gvisor): (i64, i64) = conn
        .query_row(
            "SELECT COUNT(*), SUM(json_extract(kernel, '$.source') = 'gvisor') \
             FROM campaign_steps WHERE run = 'gvisor' AND kernel IS NOT NULL",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        steps >= n as i64,
        "{steps} steps with evidence for {n} tests"
    );
    assert_eq!(from_gvisor, steps, "every step's evidence came from gVisor");
    let failures: Vec<(String, String, String)> = conn
        .prepare(
            "SELECT test_id, COALESCE(layer, ''), COALESCE(primitive, '') \
             FROM campaign_tests WHERE run = 'gvisor' AND outcome = 'fail'",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    eprintln!(
        "{} of {n} tests failed under gVisor: {failures:?}",
        failures.len()
    );
    for (test, layer, primitive) in &failures {
        assert!(
            !layer.is_empty() && !primitive.is_empty(),
            "{test}: every failure is triaged ({layer}/{primitive})"
        );
    }
    let report: Value = serde_json::from_str(&ok(&[
        "report",
        "--db",
        results.to_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    assert_eq!(
        report["passed"].as_u64().unwrap()
            + report["degraded"].as_u64().unwrap()
            + report["failed"].as_u64().unwrap(),
        n as u64
    );
    let g = &status(&socket)["gvisor"];
    assert!(
        g["connections"].as_u64().unwrap() >= n as u64,
        "a sandbox per test: {g}"
    );
}

/// A client inside gVisor that reaches the host daemon's socket through
/// `--host-uds=open` is confined to its sandbox: it opens spans on its own
/// processes (keyed by its container), and the host's spans, stored, open
/// or live, are out of its reach.
#[test]
fn a_hostile_client_inside_gvisor_reaches_nothing_outside_its_sandbox() {
    if !runsc_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket, runsc) = daemon_and_runsc(dir.path());
    // the host's spans: one stored, one open
    let out = Command::new(probe_binary())
        .args(["span", "--json", "--socket"])
        .arg(&socket)
        .args(["--session", "host", "--", "cat", "/nonexistent/host-secret"])
        .output()
        .unwrap();
    let stored: Value = serde_json::from_slice(&out.stdout).unwrap();
    let stored = stored["span"].as_u64().unwrap();
    let sleeper = Killed(Command::new("sleep").arg("120").spawn().unwrap());
    let mut host = probe::client::Client::connect(&socket).unwrap();
    let open = host
        .call(json!({"op": "begin_span", "session": "host", "label": "host's", "pid": sleeper.0.id()}))
        .unwrap()["span_id"]
        .as_u64()
        .unwrap();

    let mut hostile = common::Relay::start(&runsc, socket.to_str().unwrap(), "hostile-gvisor");
    // its own init: a span of its sandbox, in its own numbering
    let own =
        hostile.ask(json!({"op": "begin_span", "session": "hostile", "label": "own", "pid": 1}));
    let own = own["span_id"].as_u64().unwrap_or_else(|| panic!("{own}"));
    let a = hostile.ask(json!({"op": "end_span", "span_id": own}));
    let view = &a["attribution"]["sandbox"];
    assert!(
        view["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("gvisor")),
        "{a}"
    );
    assert_eq!(view["pids"], "sandbox", "{a}");
    assert_eq!(a["attribution"]["source"], "gvisor", "{a}");

    let sessions = common::out_of_reach(&mut hostile, &[open], stored);
    assert_eq!(sessions, ["hostile"], "only its own span");
    common::refused(
        &hostile.ask(json!({"op": "begin_span", "label": "x", "gvisor_container": "another-sandbox", "pid": 1})),
        "name another gVisor container",
    );
    common::refused(
        &hostile.ask(json!({"op": "begin_span", "label": "x", "cgroup": "/sys/fs/cgroup"})),
        "follow a cgroup of the host's kernel",
    );
    let s = hostile.ask(json!({"op": "status"}));
    assert!(
        s["status"]["client_sandbox"]
            .as_str()
            .is_some_and(|id| id.starts_with("gvisor")),
        "{s}"
    );
    assert_eq!(s["status"]["db"]["path"], "", "{s}");
    assert_eq!(s["status"]["gvisor"]["socket"], "", "{s}");

    // the host's span survived; every refusal was counted
    assert!(
        host.call(json!({"op": "end_span", "span_id": open}))
            .is_ok()
    );
    let counted = status(&socket)["clients"]["forbidden"].as_u64().unwrap();
    assert!(counted >= 6, "{counted} refusals counted");
}
