//! One probe daemon on the host, the bridges of many containers reaching
//! it through its bind-mounted socket directory: a podman container (runc,
//! its own PID namespace, a read-only Debian root) and a bubblewrap sandbox
//! (`--unshare-pid`). Each bridge names its children by the pids its own
//! namespace sees; the daemon translates them at the door, so the evidence
//! is the one a bridge on the host gets. A hostile client in one container
//! reaches nothing outside it: not the host's processes, not the other
//! container's, not their spans, stored or open or live.
//!
//! Root, podman with runc, bubblewrap and the containers' root filesystem
//! (`RUNTIMES_ROOTFS`, built by `cargo xtask test`); under CI=true a missing
//! one is a failure.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{BRIDGE, Bridge, Relay, refused, root, structured};
use serde_json::{Value, json};

const SOCKET_INSIDE: &str = "/run/probe/probe.sock";

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn installed(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The containers' root filesystem, when everything these tests need is
/// here (None: skipped, a failure under CI).
fn ready() -> Option<PathBuf> {
    if !root() {
        return None;
    }
    let rootfs = std::env::var_os("RUNTIMES_ROOTFS")
        .map(PathBuf::from)
        .filter(|r| r.join("usr/bin/python3").exists());
    let missing: Vec<&str> = ["podman", "runc", "bwrap"]
        .into_iter()
        .filter(|c| !installed(c))
        .collect();
    if rootfs.is_none() || !missing.is_empty() {
        assert!(
            !ci(),
            "RUNTIMES_ROOTFS ({:?}) or {missing:?} missing, and CI=true forbids skipping",
            std::env::var_os("RUNTIMES_ROOTFS")
        );
        eprintln!("SKIPPED: needs RUNTIMES_ROOTFS and podman, runc, bwrap");
        return None;
    }
    rootfs
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// `podman run` words for a container of its own PID namespace, with no
/// network, a read-only root (writes to /tmp only), no capability or
/// seccomp change, the daemon's socket directory at /run/probe and the
/// bridge and the fixtures at their host paths (read-only).
fn podman(rootfs: &Path, sockdir: &Path) -> Vec<String> {
    let bridge_dir = Path::new(BRIDGE).parent().unwrap();
    [
        "podman",
        "run",
        "-i",
        "--rm",
        "--runtime",
        "runc",
        "--network",
        "none",
        "--read-only",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=4096:4096",
        "-v",
        &format!("{}:/run/probe", sockdir.display()),
        "-v",
        &format!("{0}:{0}:ro", bridge_dir.display()),
        "-v",
        &format!("{0}:{0}:ro", fixtures().display()),
        "--rootfs",
        &format!("{}:O", rootfs.display()),
    ]
    .map(String::from)
    .to_vec()
}

/// `bwrap` words for a sandbox of its own PID namespace over the host's
/// /usr and /etc (read-only), the bridge and the fixtures at their host
/// paths, the daemon's socket directory at /run/probe.
fn bwrap(sockdir: &Path) -> Vec<String> {
    let bridge_dir = Path::new(BRIDGE).parent().unwrap().display().to_string();
    let fixtures = fixtures().display().to_string();
    // the private /tmp first: the workspace may live under /tmp, and a
    // tmpfs mounted after its binds would hide them
    let mut words: Vec<String> = [
        "bwrap",
        "--unshare-pid",
        "--die-with-parent",
        "--tmpfs",
        "/tmp",
    ]
    .map(String::from)
    .to_vec();
    words.extend(common::bwrap_system_binds(&[&bridge_dir, &fixtures]));
    words.extend(
        [
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--bind",
            &sockdir.display().to_string(),
            "/run/probe",
        ]
        .map(String::from),
    );
    words
}

fn words(w: &[String]) -> Vec<&str> {
    w.iter().map(String::as_str).collect()
}

fn bridge_args() -> Vec<String> {
    ["serve", "--stdio", "--probe-socket", SOCKET_INSIDE]
        .map(String::from)
        .to_vec()
}

/// A daemon's status as a host client (the probe CLI) sees it.
fn host_status(socket: &Path) -> Value {
    let mut c = probe::client::Client::connect(socket).unwrap();
    c.status().unwrap()
}

// ------------------------------------------------------------- evidence

#[tokio::test(flavor = "multi_thread")]
async fn bridges_in_two_containers_get_their_evidence_from_one_host_daemon() {
    let Some(rootfs) = ready() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket) = common::probe_daemon(dir.path());
    let sockdir = socket.parent().unwrap();
    let podman_words = podman(&rootfs, sockdir);
    let bwrap_words = bwrap(sockdir);
    let in_podman = Bridge::stdio_under(&words(&podman_words), &bridge_args(), false)
        .await
        .expect("MCP handshake with the bridge in podman");
    let in_bwrap = Bridge::stdio_under(&words(&bwrap_words), &bridge_args(), false)
        .await
        .expect("MCP handshake with the bridge in bubblewrap");

    let mut sandboxes = Vec::new();
    for (name, b) in [("podman", &in_podman), ("bwrap", &in_bwrap)] {
        let kernel = |r: &rmcp::model::CallToolResult| structured(r)["kernel"].clone();
        // a missing input: the container's own openat, attached by the
        // pid the container sees and translated at the door
        let k = kernel(
            &b.call("exec", json!({"argv": ["cat", "/nonexistent/input.csv"]}))
                .await,
        );
        assert_eq!(k["available"], true, "{name}: {k}");
        assert_eq!(k["source"], "ebpf", "{name}: {k}");
        assert_eq!(k["primitive"], "fs.missing", "{name}: {k}");
        assert_eq!(k["decisive"]["syscall"], "openat", "{name}: {k}");
        assert_eq!(k["decisive"]["errno"], "ENOENT", "{name}: {k}");
        assert_eq!(
            k["decisive"]["path"], "/nonexistent/input.csv",
            "{name}: {k}"
        );
        let view = &k["sandbox"];
        let id = view["id"].as_str().unwrap_or_default().to_owned();
        assert!(id.starts_with("pidns:"), "{name}: {k}");
        assert_eq!(view["pids"], "daemon", "{name}: {k}");
        let (daemon_pid, sandbox_pid) = (
            view["root_pid"]["daemon"].as_u64().unwrap(),
            view["root_pid"]["sandbox"].as_u64().unwrap(),
        );
        assert_eq!(
            k["decisive"]["pid"].as_u64(),
            Some(daemon_pid),
            "{name}: cat is the span's first process, in the daemon's numbering: {k}"
        );
        assert!(
            sandbox_pid < 1000 && sandbox_pid != daemon_pid,
            "{name}: the container's own number for it: {k}"
        );
        sandboxes.push(id);

        // a write to the read-only root: EROFS
        let k = kernel(
            &b.call("exec", json!({"argv": ["touch", "/etc/probe-hostd"]}))
                .await,
        );
        assert_eq!(k["primitive"], "fs.readonly", "{name}: {k}");
        assert_eq!(k["decisive"]["errno"], "EROFS", "{name}: {k}");

        // a command the shell cannot find
        let k = kernel(
            &b.call(
                "exec",
                json!({"argv": ["sh", "-c", "probe-no-such-tool --version"]}),
            )
            .await,
        );
        assert_eq!(k["primitive"], "exec.missing", "{name}: {k}");

        // a clean call: nothing failed, nothing blamed, the exec was seen
        let r = b.call("exec", json!({"argv": ["echo", "ran"]})).await;
        let k = kernel(&r);
        assert_eq!(k["available"], true, "{name}: {k}");
        assert_eq!(
            (k["failed"].clone(), k["primitive"].clone()),
            (json!(false), json!("none")),
            "{name}: {k}"
        );
        assert!(
            k["counts"]["exec"].as_u64().unwrap_or(0) >= 1,
            "{name}: the workload's exec was traced: {k}"
        );
    }
    assert_ne!(sandboxes[0], sandboxes[1], "two namespaces, two sandboxes");
    // each bridge connected when its first call began
    let connected = host_status(&socket)["clients"]["sandboxed"]
        .as_u64()
        .unwrap();
    assert!(connected >= 2, "{connected} confined connections");

    let status = host_status(&socket);
    assert_eq!(
        status["clients"]["forbidden"], 0,
        "a bridge's own requests are never refused: {status}"
    );
    // the host's CLI sees both sandboxes' spans
    let mut host = probe::client::Client::connect(&socket).unwrap();
    let rows = host.call(json!({"op": "query", "limit": 100})).unwrap();
    assert!(
        rows["spans"].as_array().unwrap().len() >= 8,
        "the host sees every span: {rows}"
    );
}

// ------------------------------------------------------------- campaign

/// (outcome, layer, primitive) of every test of `run`.
fn outcomes(db: &Path, run: &str) -> BTreeMap<String, (String, String, String)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT test_id, outcome, COALESCE(layer, ''), COALESCE(primitive, '') \
             FROM campaign_tests WHERE run = ?1",
        )
        .unwrap();
    stmt.query_map([run], |r| {
        Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?)))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

fn campaign_run(suite: &Path, targets: &[String], db: &Path, run: &str) -> Value {
    let mut args = vec!["run", "--suite", suite.to_str().unwrap()];
    for t in targets {
        args.extend(["--target", t]);
    }
    args.extend([
        "--db",
        db.to_str().unwrap(),
        "--run",
        run,
        "--workers",
        "2",
        "--json",
        "--no-bar",
    ]);
    let out = common::campaign(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{run}: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_campaign_against_both_containers_judges_each_test_as_on_the_host() {
    // the bridges run the `seccomp-errno` profile, so that tests fail on a
    // primitive whose evidence must survive the trip through the door
    let Some(rootfs) = ready() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket) = common::probe_daemon(dir.path());
    let sockdir = socket.parent().unwrap();
    let base = format!(
        "/tmp/campaign-hostd-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let (suite, n) =
        common::generated_suite(dir.path(), 60, &base, &["files", "process", "encoding"]);
    assert!(n >= 10, "too few tests generated: {n}");
    let stdio = |wrapper: &[String], socket: &str| {
        format!(
            "stdio:{} {BRIDGE} serve --stdio --profile seccomp-errno --probe-socket {socket}",
            wrapper.join(" ")
        )
    };
    let results = dir.path().join("results.db");
    // the baseline: a bridge on the host, the daemon's own namespace
    let host = campaign_run(
        &suite,
        &[stdio(&[], socket.to_str().unwrap())],
        &results,
        "host",
    );
    // the same suite spread over a podman and a bubblewrap container
    let contained = campaign_run(
        &suite,
        &[
            stdio(&podman(&rootfs, sockdir), SOCKET_INSIDE),
            stdio(&bwrap(sockdir), SOCKET_INSIDE),
        ],
        &results,
        "containers",
    );
    for s in [&host, &contained] {
        assert_eq!(s["recorded"], n as u64, "{s}");
        assert_eq!(s["complete"], true, "{s}");
        assert_eq!(
            s["steps_without_kernel"], 0,
            "every step had the host daemon's evidence: {s}"
        );
    }
    let conn = rusqlite::Connection::open(&results).unwrap();
    let (steps, sandboxed, namespaces): (i64, i64, i64) = conn
        .query_row(
            "SELECT COUNT(*), SUM(json_extract(kernel, '$.sandbox.id') LIKE 'pidns:%'), \
                    COUNT(DISTINCT json_extract(kernel, '$.sandbox.id')) \
             FROM campaign_steps WHERE run = 'containers' AND kernel IS NOT NULL",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert!(
        steps >= n as i64,
        "{steps} steps with evidence for {n} tests"
    );
    assert_eq!(sandboxed, steps, "every step's span is its container's");
    assert!(
        namespaces >= 2,
        "a container (a namespace) per bridge: {namespaces}"
    );
    let targets: i64 = conn
        .query_row(
            "SELECT COUNT(DISTINCT target) FROM campaign_tests WHERE run = 'containers'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(targets, 2, "both containers ran tests");
    // each test judged as on the host (same outcome, layer, primitive),
    // but where the container truly differs: it runs without the host's
    // capabilities, so a test that needs one (`unshare -m`) fails there on
    // `caps`, and the kernel says so (EPERM on the privileged call)
    let (on_host, in_containers) = (outcomes(&results, "host"), outcomes(&results, "containers"));
    assert_eq!(on_host.len(), n);
    // the profile's filter (EPERM for mkdir and socket) fails some tests
    // on the host, and they fail on the same primitive in the containers
    let seccomp: Vec<_> = on_host
        .iter()
        .filter(|(_, (o, l, p))| {
            (o.as_str(), l.as_str(), p.as_str()) == ("fail", "sandbox", "seccomp")
        })
        .map(|(t, _)| t.clone())
        .collect();
    assert!(
        !seccomp.is_empty(),
        "the profile failed no test: {on_host:?}"
    );
    let caps = (
        "fail".to_string(),
        "sandbox".to_string(),
        "caps".to_string(),
    );
    let differ: Vec<_> = on_host
        .iter()
        .filter(|(t, v)| in_containers.get(*t) != Some(v))
        .map(|(t, v)| (t.clone(), v, in_containers.get(t)))
        .collect();
    let unexplained: Vec<_> = differ
        .iter()
        .filter(|(_, _, c)| *c != Some(&caps))
        .collect();
    assert!(
        unexplained.is_empty(),
        "judged differently in a container: {unexplained:?}"
    );
    for (test, _, _) in &differ {
        let errno: String = conn
            .query_row(
                "SELECT COALESCE(json_extract(kernel, '$.decisive.errno'), '') \
                 FROM campaign_steps WHERE run = 'containers' AND test_id = ?1 \
                 AND json_extract(kernel, '$.primitive') = 'caps'",
                [test],
                |r| r.get(0),
            )
            .unwrap_or_default();
        assert_eq!(errno, "EPERM", "{test}: a capability the container lacks");
    }
    assert_eq!(host_status(&socket)["clients"]["forbidden"], 0);
}

// -------------------------------------------------------- confinement

/// The daemon's pid of the relay whose command line holds `mark`: the
/// one inside the sandbox (its runtime's command line holds it too).
fn host_pid_marked(mark: &str) -> u32 {
    let ours = probe::peer::pidns_inode(std::process::id());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c).contains(mark)
                    && c.split(|&b| b == 0)
                        .next()
                        .is_some_and(|argv0| String::from_utf8_lossy(argv0).contains("python"))
            }) && probe::peer::pidns_inode(*pid) != ours
        })
        .unwrap_or_else(|| panic!("no process marked {mark}"))
}

#[test]
fn a_hostile_client_in_one_container_reaches_nothing_outside_it() {
    let Some(rootfs) = ready() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket) = common::probe_daemon(dir.path());
    let sockdir = socket.parent().unwrap();
    let tag = dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();

    // the victim: a client in a podman container with spans of its own,
    // one stored and one open
    let victim_mark = format!("victim-{tag}");
    let mut victim = Relay::start(&podman(&rootfs, sockdir), SOCKET_INSIDE, &victim_mark);
    let victim_host_pid = host_pid_marked(&victim_mark);
    assert_eq!(
        probe::peer::nspid(victim_host_pid).and_then(|ids| ids.last().copied()),
        Some(victim.pid as u32),
        "the test found the victim"
    );
    let begin = |session: &str, pid: u64| json!({"op": "begin_span", "session": session, "label": "own", "pid": pid});
    let stored = victim.ask(begin("victim", victim.pid));
    let stored = stored["span_id"]
        .as_u64()
        .unwrap_or_else(|| panic!("{stored}"));
    let ended = victim.ask(json!({"op": "end_span", "span_id": stored}));
    assert_eq!(ended["ok"], true, "{ended}");
    assert_eq!(
        ended["attribution"]["sandbox"]["root_pid"]["daemon"].as_u64(),
        Some(victim_host_pid as u64),
        "{ended}"
    );
    let open = victim.ask(begin("victim", victim.pid));
    let open = open["span_id"].as_u64().unwrap_or_else(|| panic!("{open}"));
    // and the host's own span, open, on a process of the host
    let sleeper = common::Killed(Command::new("sleep").arg("120").spawn().unwrap());
    let mut host = probe::client::Client::connect(&socket).unwrap();
    let host_open = host
        .call(json!({"op": "begin_span", "session": "host", "label": "host's", "pid": sleeper.0.id()}))
        .unwrap()["span_id"]
        .as_u64()
        .unwrap();

    // the hostile client: bubblewrap, its own PID namespace
    let hostile_mark = format!("hostile-{tag}");
    let mut hostile = Relay::start(&bwrap(sockdir), SOCKET_INSIDE, &hostile_mark);
    let hostile_host_pid = host_pid_marked(&hostile_mark);
    let hostile_ns = probe::peer::pidns_inode(hostile_host_pid).unwrap();

    // pid 1 is its own namespace's init, never the host's
    let own = hostile.ask(begin("hostile", 1));
    let own = own["span_id"].as_u64().unwrap_or_else(|| panic!("{own}"));
    let a = hostile.ask(json!({"op": "end_span", "span_id": own}));
    let root = &a["attribution"]["sandbox"]["root_pid"];
    assert_eq!(root["sandbox"], 1, "{a}");
    let init = root["daemon"].as_u64().unwrap() as u32;
    assert_ne!(init, 1, "not the host's init: {a}");
    assert_eq!(probe::peer::pidns_inode(init), Some(hostile_ns), "{a}");
    assert_eq!(
        a["attribution"]["sandbox"]["id"],
        format!("pidns:{hostile_ns}")
    );

    // the victim's process, by the host's number and by the victim's own
    refused(
        &hostile.ask(begin("hostile", victim_host_pid as u64)),
        "begin_span on the victim by its host pid",
    );
    let by_its_number = hostile.ask(begin("hostile", victim.pid));
    if by_its_number["ok"] == true {
        // that number is one of the hostile namespace's own processes
        let id = by_its_number["span_id"].as_u64().unwrap();
        let a = hostile.ask(json!({"op": "end_span", "span_id": id}));
        let daemon = a["attribution"]["sandbox"]["root_pid"]["daemon"]
            .as_u64()
            .unwrap() as u32;
        assert_ne!(daemon, victim_host_pid, "{a}");
        assert_eq!(probe::peer::pidns_inode(daemon), Some(hostile_ns), "{a}");
    } else {
        refused(&by_its_number, "begin_span on the victim by its own pid");
    }
    // the host's processes by their numbers
    refused(
        &hostile.ask(begin("hostile", std::process::id() as u64)),
        "begin_span on the test process",
    );
    // the victim's and the host's open spans, the victim's stored one
    let sessions = common::out_of_reach(&mut hostile, &[open, host_open], stored);
    assert!(!sessions.is_empty(), "its own spans are listed");
    assert!(
        sessions.iter().all(|s| *s == "hostile"),
        "only its own spans: {sessions:?}"
    );
    let asked = hostile.ask(json!({"op": "query", "session": "victim"}));
    assert_eq!(asked["spans"], json!([]), "{asked}");
    // a cgroup holding the host's processes, and a gVisor sandbox
    refused(
        &hostile.ask(json!({"op": "begin_span", "label": "x", "cgroup": "/sys/fs/cgroup/unified"})),
        "follow the host's root cgroup",
    );
    refused(
        &hostile.ask(
            json!({"op": "begin_span", "label": "x", "gvisor_container": "agent-1", "pid": 1}),
        ),
        "name a gVisor container",
    );
    // its status names no host path and says it is confined
    let status = hostile.ask(json!({"op": "status"}));
    assert_eq!(
        status["status"]["client_sandbox"],
        format!("pidns:{hostile_ns}"),
        "{status}"
    );
    assert_eq!(status["status"]["db"]["path"], "", "{status}");

    // tailing everything gets its own spans' events only: the victim's
    // and the host's failures meanwhile reach the host's tail, not its
    let mut tail = Relay::start(&bwrap(sockdir), SOCKET_INSIDE, &format!("tail-{tag}"));
    let subscribed = tail.ask(json!({"op": "subscribe"}));
    assert_eq!(subscribed["subscribed"], true, "{subscribed}");
    let mut host_tail = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    host_tail
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    writeln!(host_tail, "{}", json!({"op": "subscribe"})).unwrap();
    let mut host_lines = BufReader::new(host_tail.try_clone().unwrap()).lines();
    let first = host_lines.next().unwrap().unwrap();
    assert!(first.contains("\"subscribed\":true"), "{first}");
    let out = Command::new(common::probe_binary())
        .args(["span", "--socket"])
        .arg(&socket)
        .args(["--session", "host", "--", "cat", "/nonexistent/host-secret"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let seen_by_host = host_lines
        .map_while(Result::ok)
        .any(|l| l.contains("/nonexistent/host-secret"));
    assert!(seen_by_host, "the host's tail saw the host's failure");
    let leaked = tail.lines_within(Duration::from_secs(2));
    assert!(
        leaked.is_empty(),
        "the host's events reached a sandbox: {leaked:?}"
    );

    // the victim's open span survived every attempt
    let ended = victim.ask(json!({"op": "end_span", "span_id": open}));
    assert_eq!(ended["ok"], true, "{ended}");
    let ended = host.call(json!({"op": "end_span", "span_id": host_open}));
    assert!(ended.is_ok(), "{ended:?}");
    let status = host_status(&socket);
    assert!(
        status["clients"]["forbidden"].as_u64().unwrap() >= 11,
        "every refusal counted: {status}"
    );
}
