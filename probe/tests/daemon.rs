//! Daemon tests: a real `probe run` on a temp socket and a real SQLite file,
//! real clients, the real kernel. Root needed (never skipped under CI=true).

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use probe::attribution::ExitStatus;
use probe::client::Client;
use probe::protocol::ErrorCode;
use probe::store::{SpanFilter, Store};
use serde_json::{Value, json};

mod common;
use common::{PROBE, run_attached};

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
        "daemon tests need root; CI=true forbids skipping"
    );
    eprintln!("SKIPPED: daemon test needs root");
    false
}

/// A daemon on a fresh temp dir, stopped (SIGTERM) on drop.
struct Daemon {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        Daemon::start_with_config("")
    }

    /// A daemon with this config file (TOML).
    fn start_with_config(toml: &str) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("probe-dt-")
            .tempdir()
            .unwrap();
        let config = dir.path().join("probe.toml");
        std::fs::write(&config, toml).unwrap();
        let mut d = Daemon { child: None, dir };
        d.spawn(&["--config", config.to_str().unwrap()]);
        d
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("probe.sock")
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("evidence.db")
    }

    fn spawn(&mut self, extra: &[&str]) {
        let child = Command::new(PROBE)
            .args(["run", "--socket"])
            .arg(self.socket())
            .arg("--db")
            .arg(self.db())
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Client::connect(&self.socket())
            .and_then(|mut c| c.hello())
            .is_err()
        {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let mut err = String::new();
                self.child
                    .as_mut()
                    .unwrap()
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                panic!("daemon exited {status}: {err}");
            }
            assert!(Instant::now() < deadline, "daemon did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket()).unwrap()
    }

    /// SIGTERM and wait; returns the exit status and stderr.
    fn stop(&mut self) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = child.wait().unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status, err)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
    }
}

/// Runs `cmd` in a new span of `session` through the client library, the
/// way agent-bridge does.
fn run_span(client: &mut Client, session: &str, cmd: &[&str]) -> probe::attribution::Attribution {
    use std::os::unix::process::ExitStatusExt as _;
    let span = client.begin_span(Some(session), &cmd.join(" ")).unwrap();
    let mut c = Command::new(cmd[0]);
    c.args(&cmd[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let (child, _) = probe::spawn::spawn_attached(&mut c, |pid| client.attach(span, pid)).unwrap();
    let output = child.unwrap().wait_with_output().unwrap();
    let exit = ExitStatus {
        code: output.status.code(),
        signal: output.status.signal().map(probe::event::signal_name),
    };
    // what it was asked and said: the witnesses of a failed lookup
    let words = probe::attribution::Words::new(Some(cmd.join(" ")), Some(&output.stderr));
    client
        .end_span_with(span, Some(&exit), None, &words)
        .unwrap()
}

/// Ids of loaded BPF programs called `name` (ids are never reused, so
/// programs of earlier tests that the kernel frees late do not confuse us).
fn bpf_program_ids(name: &str) -> std::collections::HashSet<u64> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .expect("bpftool (cargo xtask setup installs it)");
    let progs: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Array(vec![]));
    progs
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|p| p["name"] == name)
                .filter_map(|p| p["id"].as_u64())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn lifecycle_sigterm_detaches_and_restart_reuses_the_db() {
    if !root() {
        return;
    }
    let before = bpf_program_ids("sys_enter");
    let mut d = Daemon::start();
    let ours: Vec<u64> = bpf_program_ids("sys_enter")
        .difference(&before)
        .copied()
        .collect();
    assert_eq!(ours.len(), 1, "the daemon loaded one sys_enter program");
    let status = d.client().status().unwrap();
    assert_eq!(status["protocol"], 1);
    assert_eq!(status["programs"].as_array().unwrap().len(), 14);
    let a = run_span(&mut d.client(), "s", &["sh", "-c", "exit 3"]);
    assert_eq!(a.span, 1);
    assert_eq!(a.exit.code, Some(3));
    // a span left open is ended and stored at shutdown, not lost
    let open = d.client().begin_span(Some("s"), "left open").unwrap();
    let (code, err) = d.stop();
    assert!(code.success(), "daemon exit {code}: {err}");
    assert!(!d.socket().exists(), "socket removed on exit");
    // the kernel frees a program after an RCU grace period once its last fd closes
    let deadline = Instant::now() + Duration::from_secs(5);
    while bpf_program_ids("sys_enter").contains(&ours[0]) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !bpf_program_ids("sys_enter").contains(&ours[0]),
        "programs detached after SIGTERM"
    );
    {
        let store = Store::open_readonly(&d.db()).unwrap();
        assert_eq!(store.integrity_check().unwrap(), "ok");
        let rows = store.spans(&SpanFilter::default()).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.span).collect::<Vec<_>>(),
            vec![open, 1]
        );
    }
    // restart: same DB, ids continue
    d.spawn(&[]);
    let a = run_span(&mut d.client(), "s", &["true"]);
    assert_eq!(a.span, open + 1, "span ids continue after a restart");
    let (code, _) = d.stop();
    assert!(code.success());
    assert_eq!(
        Store::open_readonly(&d.db())
            .unwrap()
            .spans(&SpanFilter::default())
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn thousand_spans_from_eight_clients_are_stored_exactly_once() {
    if !root() {
        return;
    }
    let mut d = Daemon::start();
    let socket = d.socket();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).unwrap();
                let mut ids = Vec::new();
                for i in 0..125 {
                    let session = format!("client-{t}");
                    if i % 5 == 0 {
                        // every fifth span runs a real, failing process
                        let a = run_span(&mut c, &session, &["sh", "-c", "exit 2"]);
                        assert_eq!(a.exit.code, Some(2));
                        ids.push(a.span);
                    } else {
                        let span = c.begin_span(Some(&session), &format!("span {i}")).unwrap();
                        let a = c
                            .end_span(
                                span,
                                Some(&ExitStatus {
                                    code: Some(0),
                                    signal: None,
                                }),
                                None,
                            )
                            .unwrap();
                        assert_eq!(a.span, span);
                        ids.push(span);
                    }
                }
                ids
            })
        })
        .collect();
    let mut ids: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 1000, "span ids are unique");
    let (code, err) = d.stop();
    assert!(code.success(), "{err}");
    let store = Store::open_readonly(&d.db()).unwrap();
    let conn = store.connection();
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM spans"), 1000);
    assert_eq!(count("SELECT COUNT(DISTINCT id) FROM spans"), 1000);
    assert_eq!(count("SELECT COUNT(*) FROM attributions"), 1000);
    assert_eq!(
        count("SELECT COUNT(*) FROM attributions WHERE failed = 1"),
        200
    );
    assert_eq!(count("SELECT COUNT(DISTINCT session) FROM spans"), 8);
}

#[test]
fn file_written_into_a_vanished_tmpfs_is_fs_persistence() {
    if !root() {
        return;
    }
    let d = Daemon::start();
    let work = tempfile::Builder::new()
        .prefix("probe-persist-")
        .tempdir()
        .unwrap();
    let w = work.path().display().to_string();
    let mut c = d.client();
    // span 1 writes into a tmpfs that lives in its own mount namespace
    let first = run_span(
        &mut c,
        "t-0042",
        &[
            "unshare",
            "-m",
            "sh",
            "-c",
            &format!("mount -t tmpfs tmpfs {w} && echo 1,2 > {w}/out.csv"),
        ],
    );
    assert!(!first.failed, "{}", first.explanation);
    // span 2 of the same session asks for it
    let second = run_span(&mut c, "t-0042", &["cat", &format!("{w}/out.csv")]);
    assert_eq!(
        second.primitive.id(),
        "fs.persistence",
        "{}",
        second.explanation
    );
    let decisive = second.decisive.as_ref().unwrap();
    assert_eq!(
        decisive.path.as_deref(),
        Some(format!("{w}/out.csv").as_str())
    );
    assert_eq!(decisive.errno.as_deref(), Some("ENOENT"));
    let earlier = decisive.written_earlier.as_ref().expect("cites the write");
    assert_eq!(earlier.span, first.span);
    assert!(
        second.explanation.contains(&format!("span {}", first.span)),
        "{}",
        second.explanation
    );
    // another session reading the same path is plain fs.missing
    let other = run_span(&mut c, "t-0043", &["cat", &format!("{w}/out.csv")]);
    assert_eq!(other.primitive.id(), "fs.missing");
}

#[test]
fn uid_65534_is_refused() {
    if !root() {
        return;
    }
    let d = Daemon::start();
    let sock = d.socket();
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                PROBE,
            ])
            .args(args)
            .output()
            .unwrap()
    };
    // the socket is 0600 root: the file mode stops nobody first
    let mode = std::fs::metadata(&sock).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    let tmp_parent = d.dir.path();
    std::fs::set_permissions(
        tmp_parent,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = as_nobody(&["status", "--socket", sock.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // with the mode opened up, SO_PEERCRED still refuses
    std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let out = as_nobody(&["status", "--socket", sock.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("uid 65534 may not use the probe"),
        "{stderr}"
    );
    // and root still gets served
    assert!(d.client().status().is_ok());
}

/// With `confine_clients = "all"`, a client of the daemon's own namespace
/// that is not root (here uid 65534, let in by the socket's group) is
/// confined: spans on its own uid's processes only, its own spans only;
/// root's CLI still sees everything.
#[test]
fn confine_all_keeps_a_non_root_client_to_its_own_processes_and_spans() {
    if !root() {
        return;
    }
    let d = Daemon::start_with_config("group = \"nogroup\"\nconfine_clients = \"all\"\n");
    std::fs::set_permissions(
        d.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let sock = d.socket();
    let nobody = |program: &str| {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            program,
        ]);
        c
    };
    // root's spans: one stored, one open
    let mut c = d.client();
    let stored = run_span(&mut c, "root", &["cat", "/nonexistent/root-secret"]).span;
    let open = c.begin_span(Some("root"), "root's open span").unwrap();

    // nobody's own command in a span of its own: served as on the host
    let out = nobody(PROBE)
        .args(["span", "--json", "--socket", sock.to_str().unwrap()])
        .args([
            "--session",
            "nobody",
            "--",
            "cat",
            "/nonexistent/nobody-input",
        ])
        .output()
        .unwrap();
    let a: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(a["primitive"], "fs.missing", "{a}");
    assert!(
        a["sandbox"]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("uid:65534")),
        "{a}"
    );

    // nobody's raw requests outside its reach
    let script = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rwb")
for line in sys.argv[2:]:
    f.write(line.encode() + b"\n"); f.flush()
    sys.stdout.write(f.readline().decode())
"#;
    let requests = [
        json!({"op": "begin_span", "label": "x", "pid": 1}),
        json!({"op": "begin_span", "label": "x", "pid": std::process::id()}),
        json!({"op": "end_span", "span_id": open}),
        json!({"op": "query", "span_id": stored}),
        json!({"op": "query", "limit": 100}),
    ];
    let out = nobody("/usr/bin/python3")
        .args(["-c", script, sock.to_str().unwrap()])
        .args(requests.iter().map(Value::to_string))
        .output()
        .unwrap();
    let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        answers.len(),
        requests.len(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (request, answer) in requests.iter().zip(&answers).take(4) {
        assert_eq!(answer["error"]["code"], "forbidden", "{request}: {answer}");
    }
    let sessions: Vec<&str> = answers[4]["spans"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["session"].as_str())
        .collect();
    assert_eq!(sessions, ["nobody"], "{}", answers[4]);

    // root sees both, and its open span survived
    let all = c.call(json!({"op": "query", "limit": 100})).unwrap();
    assert_eq!(all["spans"].as_array().unwrap().len(), 2, "{all}");
    assert!(c.end_span(open, None, None).is_ok());
    let status = c.status().unwrap();
    assert_eq!(status["clients"]["forbidden"], 4, "{status}");
}

/// Sends raw bytes on a fresh connection and reads one response line.
fn raw_exchange(sock: &Path, bytes: &[u8]) -> Option<Value> {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).ok()?;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while s.read(&mut byte).ok()? == 1 {
        if byte[0] == b'\n' {
            return serde_json::from_slice(&buf).ok();
        }
        buf.push(byte[0]);
    }
    None
}

#[test]
fn bad_input_gets_errors_and_the_daemon_keeps_serving() {
    if !root() {
        return;
    }
    let d = Daemon::start();
    let sock = d.socket();
    let code = |v: Option<Value>| v.and_then(|v| v["error"]["code"].as_str().map(str::to_string));
    assert_eq!(
        code(raw_exchange(&sock, b"{this is not json\n")).as_deref(),
        Some("bad_request")
    );
    assert_eq!(
        code(raw_exchange(&sock, b"\xff\xfe\x00garbage\n")).as_deref(),
        Some("bad_request")
    );
    assert_eq!(
        code(raw_exchange(&sock, b"{\"op\":\"format_disk\"}\n")).as_deref(),
        Some("unknown_op")
    );
    assert_eq!(
        code(raw_exchange(
            &sock,
            b"{\"op\":\"attach\",\"span_id\":\"x\"}\n"
        ))
        .as_deref(),
        Some("bad_request")
    );
    assert_eq!(
        code(raw_exchange(
            &sock,
            b"{\"op\":\"end_span\",\"span_id\":999999}\n"
        ))
        .as_deref(),
        Some("not_found")
    );
    // an oversized line: error, connection closed
    let mut big = vec![b'x'; probe::protocol::MAX_LINE + 10];
    big.push(b'\n');
    assert_eq!(
        code(raw_exchange(&sock, &big)).as_deref(),
        Some("too_large")
    );
    // a half-written line, then the client vanishes
    {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.write_all(b"{\"op\":\"begin_sp").unwrap();
    }
    // a client that begins a span and disconnects abruptly
    {
        let mut c = d.client();
        c.begin_span(Some("abandoned"), "x").unwrap();
    }
    // one begun to end with its connection (a span kept between a
    // server's calls) is ended by the daemon when that connection closes
    {
        let mut c = d.client();
        let r = c
            .call(
                json!({"op": "begin_span", "label": "between calls", "ends_with_connection": true}),
            )
            .unwrap();
        assert!(r["span_id"].as_u64().is_some(), "{r}");
    }
    // begin_span with a pid that cannot be attached leaves no span open
    let e = d
        .client()
        .begin_span_attached(Some("s"), "ghost", 4_000_000)
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    // the same when the caller states the seccomp mode (no /proc read)
    let e = d
        .client()
        .call(json!({"op": "begin_span", "label": "ghost", "seccomp": 0, "pid": 4_000_000}))
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    // errors keep the connection usable
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(b"not json\n{\"id\":5,\"op\":\"hello\"}\n")
        .unwrap();
    let mut text = String::new();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    while text.matches('\n').count() < 2 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["ok"], false);
    assert_eq!(lines[1]["id"], 5);
    assert_eq!(lines[1]["protocol"], 1);
    // still serving spans
    let a = run_span(&mut d.client(), "after", &["true"]);
    assert!(!a.failed);
    // the abandoned span stays open until shutdown; the one that ends
    // with its connection does not
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut status = d.client().status().unwrap();
    while status["open_spans"] != 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        status = d.client().status().unwrap();
    }
    assert_eq!(status["open_spans"], 1, "{status}");
    let e = d.client().end_span(424242, None, None).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
}

/// A server's connection lives for weeks and begins a span to end with it
/// between every two calls: the daemon forgets each one its client ends,
/// and ends the rest when the connection closes.
#[test]
fn a_connection_forgets_the_spans_its_client_ended() {
    if !root() {
        return;
    }
    let d = Daemon::start();
    let ending = |d: &Daemon| {
        let status = d.client().status().unwrap();
        status["clients"]["spans_ending_with_connection"].clone()
    };
    let mut server = d.client();
    let begin = |c: &mut Client| {
        let r = c
            .call(
                json!({"op": "begin_span", "label": "between calls", "ends_with_connection": true}),
            )
            .unwrap();
        r["span_id"].as_u64().unwrap()
    };
    for _ in 0..40 {
        let span = begin(&mut server);
        server.end_span(span, None, None).unwrap();
    }
    let left: Vec<u64> = (0..3).map(|_| begin(&mut server)).collect();
    assert_eq!(ending(&d), 3, "40 ended by their client, 3 not");
    // one ended twice: the second end finds it closed, nothing changes
    server.end_span(left[0], None, None).unwrap();
    let e = server.end_span(left[0], None, None).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    assert_eq!(ending(&d), 2);
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(5);
    while (ending(&d) != 0 || d.client().status().unwrap()["open_spans"] != 0)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(ending(&d), 0, "the connection closed: its spans ended");
    let status = d.client().status().unwrap();
    assert_eq!(status["open_spans"], 0, "{status}");
}

/// agent-bridge begins a call's span on one connection and ends it on
/// another: the first connection, which lives as long as the bridge, must
/// not keep the ids of spans ended elsewhere (8 bytes a call, for weeks).
#[test]
fn a_connection_forgets_the_spans_ended_on_another() {
    if !root() {
        return;
    }
    let d = Daemon::start();
    let kept = |d: &Daemon| {
        let status = d.client().status().unwrap();
        let clients = &status["clients"];
        (
            clients["spans_ending_with_client"].as_u64().unwrap(),
            clients["spans_ending_with_connection"].as_u64().unwrap(),
        )
    };
    let (mut begins, mut ends) = (d.client(), d.client());
    for i in 0..1000 {
        let r = begins
            .call(
                json!({"op": "begin_span", "label": "a call", "ends_with_connection": i % 2 == 0}),
            )
            .unwrap();
        ends.end_span(r["span_id"].as_u64().unwrap(), None, None)
            .unwrap();
    }
    // one still open, on the beginning connection
    let open = begins
        .call(json!({"op": "begin_span", "label": "a call"}))
        .unwrap()["span_id"]
        .as_u64()
        .unwrap();
    let (with_client, with_connection) = kept(&d);
    assert!(
        with_client + with_connection < 2 * 64,
        "1000 spans ended on another connection: {with_client} ending with their client \
         and {with_connection} with their connection still kept"
    );
    assert!(with_client >= 1, "the open span is kept");
    begins.end_span(open, None, None).unwrap();
    drop(begins);
    let deadline = Instant::now() + Duration::from_secs(5);
    while kept(&d) != (0, 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(kept(&d), (0, 0), "the connection closed: it keeps nothing");
    let status = d.client().status().unwrap();
    assert_eq!(status["open_spans"], 0, "{status}");
}

/// A bridge killed in the middle of a call never ends that call's span:
/// the daemon ends it once the client's process is gone, and leaves alone
/// a span whose client is alive (it may end it on another connection).
#[test]
fn a_span_ends_when_the_client_that_began_it_is_killed() {
    if !root() {
        return;
    }
    let d = Daemon::start();
    // a client that begins a call's span and is killed before it ends it
    let script = "import socket, sys, time\n\
                  s = socket.socket(socket.AF_UNIX)\n\
                  s.connect(sys.argv[1])\n\
                  s.sendall(b'{\"op\": \"begin_span\", \"label\": \"a call\"}\\n')\n\
                  print(s.makefile().readline(), flush=True)\n\
                  time.sleep(600)\n";
    let mut client = Command::new("python3")
        .args(["-c", script])
        .arg(d.socket())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut answer = String::new();
    let mut out = client.stdout.take().unwrap();
    while !answer.contains('\n') {
        let mut buf = [0u8; 256];
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "the client said nothing: {answer}");
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let begun: Value = serde_json::from_str(answer.trim()).unwrap();
    let span = begun["span_id"].as_u64().unwrap();
    // one begun by a client that stays alive and goes away from the socket
    {
        let mut c = d.client();
        c.begin_span(Some("left open"), "x").unwrap();
    }
    assert_eq!(d.client().status().unwrap()["open_spans"], 2);
    client.kill().unwrap();
    client.wait().unwrap();
    let mut c = d.client();
    wait_stored(&mut c, span);
    let status = c.status().unwrap();
    assert_eq!(status["open_spans"], 1, "the live client's stays: {status}");
}

#[test]
fn export_reimports_into_a_fresh_db_with_identical_rows() {
    if !root() {
        return;
    }
    let mut d = Daemon::start();
    let mut c = d.client();
    run_span(&mut c, "e1", &["sh", "-c", "cat /nonexistent/input.csv"]);
    run_span(&mut c, "e1", &["true"]);
    run_span(&mut c, "e2", &["sh", "-c", "exit 4"]);
    drop(c);
    let (code, _) = d.stop();
    assert!(code.success());
    let dump = |db: &Path| -> Vec<String> {
        let store = Store::open_readonly(db).unwrap();
        let mut out = Vec::new();
        for t in ["sessions", "spans", "attributions", "events", "drops"] {
            let conn = store.connection();
            let mut stmt = conn
                .prepare(&format!("SELECT * FROM {t} ORDER BY 1, 2, 3"))
                .unwrap();
            let n = stmt.column_count();
            let rows = stmt
                .query_map([], |r| {
                    Ok((0..n)
                        .map(|i| format!("{:?}", r.get::<_, rusqlite::types::Value>(i).unwrap()))
                        .collect::<Vec<_>>()
                        .join("|"))
                })
                .unwrap();
            out.extend(rows.map(|r| format!("{t}: {}", r.unwrap())));
        }
        out
    };
    let original = dump(&d.db());
    assert!(original.iter().filter(|l| l.starts_with("spans:")).count() == 3);
    for format in ["jsonl", "sqlite"] {
        let out = d.dir.path().join(format!("export.{format}"));
        let fresh = d.dir.path().join(format!("fresh-{format}.db"));
        let exported = Command::new(PROBE)
            .args([
                "export",
                "--db",
                d.db().to_str().unwrap(),
                "--format",
                format,
                "--out",
                out.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(
            exported.status.success(),
            "{}",
            String::from_utf8_lossy(&exported.stderr)
        );
        let imported = Command::new(PROBE)
            .args([
                "import",
                "--db",
                fresh.to_str().unwrap(),
                out.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(
            imported.status.success(),
            "{}",
            String::from_utf8_lossy(&imported.stderr)
        );
        assert_eq!(
            dump(&fresh),
            original,
            "{format} export differs after re-import"
        );
    }
    // the session filter exports only that session
    let only = d.dir.path().join("e2.jsonl");
    let out = Command::new(PROBE)
        .args([
            "export",
            "--db",
            d.db().to_str().unwrap(),
            "--session",
            "e2",
            "--out",
            only.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(&only).unwrap().lines().count(), 1);
}

#[test]
fn inspection_commands_read_the_db_and_socket() {
    if !root() {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let failed = run_span(&mut c, "insp", &["sh", "-c", "cat /nonexistent/data.csv"]);
    run_span(&mut c, "insp", &["true"]);
    // wait for the store thread
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.status().unwrap()["db"]["stored_spans"] != 2 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let db = d.db();
    let out = Command::new(PROBE)
        .args(["spans", "--db", db.to_str().unwrap(), "--failed", "--json"])
        .output()
        .unwrap();
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["primitive"], "fs.missing");
    let out = Command::new(PROBE)
        .args(["spans", "--db", db.to_str().unwrap()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("PRIMITIVE") && table.contains("fs.missing") && table.contains("insp"),
        "{table}"
    );
    let out = Command::new(PROBE)
        .args([
            "show",
            &failed.span.to_string(),
            "--db",
            db.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["primitive"], "fs.missing");
    assert!(
        shown["events"].as_array().unwrap().len() >= 2,
        "show has the full timeline"
    );
    let out = Command::new(PROBE)
        .args(["show", "99999", "--db", db.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let out = Command::new(PROBE)
        .args(["status", "--socket", d.socket().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("programs       14 attached")
            && text.contains("spans          0 open, 2 ended"),
        "{text}"
    );
    // probe span: a command in a span of the running daemon
    let out = Command::new(PROBE)
        .args([
            "span",
            "--json",
            "--socket",
            d.socket().to_str().unwrap(),
            "--session",
            "insp",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let a: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(a["primitive"], "none");
    assert_eq!(a["session"], "insp");
    // probe tail: live events of a span
    let mut tail = Command::new(PROBE)
        .args([
            "tail",
            "--json",
            "--kind",
            "exec",
            "--socket",
            d.socket().to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    run_span(&mut c, "insp", &["/bin/true"]);
    std::thread::sleep(Duration::from_millis(300));
    let _ = tail.kill();
    let mut seen = String::new();
    tail.stdout
        .take()
        .unwrap()
        .read_to_string(&mut seen)
        .unwrap();
    let _ = tail.wait();
    assert!(
        seen.lines()
            .any(|l| l.contains("\"kind\":\"exec\"") && l.contains("/bin/true")),
        "tail saw: {seen}"
    );
}

#[test]
fn corrupt_or_missing_db_directory_fails_at_start_with_a_clear_message() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bad.db");
    std::fs::write(&db, vec![b'z'; 8192]).unwrap();
    let out = Command::new(PROBE)
        .args([
            "run",
            "--socket",
            dir.path().join("s.sock").to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("corrupt or not a probe database") && err.contains("left untouched"),
        "{err}"
    );
    assert_eq!(std::fs::read(&db).unwrap(), vec![b'z'; 8192], "never reset");
    let out = Command::new(PROBE)
        .args([
            "run",
            "--socket",
            dir.path().join("s.sock").to_str().unwrap(),
            "--db",
            "/nonexistent/dir/x.db",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open the database"));
    let _ = json!(null);
}

#[test]
fn locked_or_full_db_fails_at_start_with_a_clear_message() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    // locked: another process holds the write lock past busy_timeout
    let db = dir.path().join("locked.db");
    drop(Store::open(&db).unwrap());
    let holder = rusqlite::Connection::open(&db).unwrap();
    holder
        .execute_batch("BEGIN EXCLUSIVE; CREATE TABLE hold (x);")
        .unwrap();
    let out = Command::new(PROBE)
        .args([
            "run",
            "--socket",
            sock.to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("locked by another process"), "{err}");
    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    // full: a 64 KiB tmpfs cannot hold the schema
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    assert!(
        Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                "size=64k",
                "tmpfs",
                small.to_str().unwrap()
            ])
            .status()
            .unwrap()
            .success()
    );
    std::fs::write(small.join("filler"), vec![0u8; 40 * 1024]).unwrap();
    let out = Command::new(PROBE)
        .args([
            "run",
            "--socket",
            sock.to_str().unwrap(),
            "--db",
            small.join("e.db").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let _ = Command::new("umount").arg(&small).status();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("disk is full"), "{err}");
}

/// A long-running "server": a worker thread and a child process, both
/// started before any span, that each open a missing path per command.
const TREE_SERVER: &str = r#"
import queue, subprocess, sys, threading
jobs, acks = queue.Queue(), queue.Queue()
def worker():
    while True:
        path = jobs.get()
        try: open(path)
        except OSError: pass
        acks.put(1)
threading.Thread(target=worker, daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", "import sys\nfor l in sys.stdin:\n    try: open(l.strip())\n    except OSError: pass\n    print('ok', flush=True)\n"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print("ready", flush=True)
for line in sys.stdin:
    tag = line.strip()
    jobs.put(f"/nonexistent-tree-thread-{tag}")
    acks.get()
    child.stdin.write(f"/nonexistent-tree-child-{tag}\n"); child.stdin.flush(); child.stdout.readline()
    print("done", flush=True)
"#;

struct TreeServer {
    child: Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl TreeServer {
    fn start() -> TreeServer {
        use std::io::BufRead as _;
        let mut child = Command::new("python3")
            .args(["-c", TREE_SERVER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        TreeServer { child, out }
    }

    /// Has the thread and the child each open a missing path named `tag`.
    fn work(&mut self, tag: &str) {
        use std::io::BufRead as _;
        writeln!(self.child.stdin.as_mut().unwrap(), "{tag}").unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert_eq!(line, "done\n");
    }
}

impl Drop for TreeServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The missing paths of a stored span's events.
fn stored_paths(client: &mut Client, span: u64) -> Vec<String> {
    let r = client
        .call(json!({"op": "query", "span_id": span}))
        .unwrap();
    r["span"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["path"].as_str())
        .filter(|p| p.starts_with("/nonexistent-tree-"))
        .map(str::to_owned)
        .collect()
}

/// Asserts that both the thread's and the child's failures for `tag` are stored.
fn assert_thread_and_child(paths: &[String], tag: &str) {
    for who in ["thread", "child"] {
        let want = format!("/nonexistent-tree-{who}-{tag}");
        assert!(paths.contains(&want), "{want} missing from {paths:?}");
    }
}

/// How a call whose tool result is an error ends its span.
fn tool_error() -> ExitStatus {
    ExitStatus {
        code: Some(1),
        signal: None,
    }
}

/// A daemon, its client and a tree server (None without root).
fn tree_setup() -> Option<(Daemon, Client, TreeServer)> {
    if !root() {
        return None;
    }
    // these tests read every traced failure back from the DB, not only
    // those the attribution holds as evidence
    let d = Daemon::start_with_config("[retention]\nkeep_events = \"all\"\n");
    let c = d.client();
    Some((d, c, TreeServer::start()))
}

fn wait_stored(client: &mut Client, span: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while client
        .call(json!({"op": "query", "span_id": span}))
        .is_err()
    {
        assert!(Instant::now() < deadline, "span {span} was never stored");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tree_attach_traces_existing_threads_and_descendants() {
    let Some((_d, mut c, mut server)) = tree_setup() else {
        return;
    };
    let pid = server.child.id();
    let (span, tids) = c
        .begin_span_tree(Some("tree"), "tools/call x", pid)
        .unwrap();
    // python's main thread and worker, and the child's main thread
    assert!(tids >= 3, "only {tids} threads attached");
    server.work("a");
    let failed = tool_error();
    let a = c.end_span(span, Some(&failed), None).unwrap();
    assert!(a.failed);
    let failures = a.counts.get("syscall_failed").copied().unwrap_or(0);
    assert!(failures >= 2, "{a:?}");
    wait_stored(&mut c, span);
    assert_thread_and_child(&stored_paths(&mut c, span), "a");
    // ended: the server is no longer traced
    server.work("after");
    let (span2, _) = c
        .begin_span_tree(Some("tree"), "tools/call y", pid)
        .unwrap();
    c.end_span(span2, Some(&failed), None).unwrap();
    wait_stored(&mut c, span2);
    assert!(stored_paths(&mut c, span2).is_empty());
    // a plain begin_span (no tree) still answers without `tids`
    let r = c
        .call(json!({"op": "begin_span", "label": "plain", "pid": pid}))
        .unwrap();
    assert!(r.get("tids").is_none(), "{r}");
    c.end_span(r["span_id"].as_u64().unwrap(), None, None)
        .unwrap();
}

#[test]
fn ending_an_overlapped_span_leaves_the_later_span_traced() {
    let Some((_d, mut c, mut server)) = tree_setup() else {
        return;
    };
    let pid = server.child.id();
    let (a, _) = c.begin_span_tree(Some("overlap"), "call A", pid).unwrap();
    let (b, _) = c.begin_span_tree(Some("overlap"), "call B", pid).unwrap();
    let failed = tool_error();
    // A ends first: it must not untrack the threads B now traces
    c.end_span(a, Some(&failed), None).unwrap();
    server.work("b");
    c.end_span(b, Some(&failed), None).unwrap();
    wait_stored(&mut c, a);
    wait_stored(&mut c, b);
    assert_thread_and_child(&stored_paths(&mut c, b), "b");
    assert!(stored_paths(&mut c, a).is_empty());
}

#[test]
fn a_span_that_follows_a_cgroup_gets_its_threads_and_what_execs_in_it() {
    let Some((_d, mut c, mut server)) = tree_setup() else {
        return;
    };
    // the server and its child in a cgroup of their own (a container)
    let root = probe::cgroup::v2_root().expect("a cgroup2 mount");
    let cg = root.join(format!("probe-dt-follow-{}", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    let procs = cg.join("cgroup.procs");
    let server_pid = server.child.id();
    let child =
        std::fs::read_to_string(format!("/proc/{server_pid}/task/{server_pid}/children")).unwrap();
    for pid in
        std::iter::once(server_pid.to_string()).chain(child.split_whitespace().map(String::from))
    {
        std::fs::write(&procs, pid).unwrap();
    }
    let r = c
        .call(json!({"op": "begin_span", "label": "container", "cgroup": cg}))
        .unwrap();
    let span = r["span_id"].as_u64().unwrap();
    assert!(r["tids"].as_u64().unwrap() >= 3, "{r}");
    server.work("cg");
    // a process nobody traced runs a program in the cgroup: it is the span's
    let outside = format!(
        "echo $$ > {}; exec cat /nonexistent-tree-exec-cg",
        procs.display()
    );
    let st = Command::new("sh").args(["-c", &outside]).status().unwrap();
    assert!(!st.success());
    let a = c.end_span(span, Some(&tool_error()), None).unwrap();
    assert!(a.failed);
    wait_stored(&mut c, span);
    let paths = stored_paths(&mut c, span);
    assert_thread_and_child(&paths, "cg");
    assert!(
        paths.contains(&"/nonexistent-tree-exec-cg".to_string()),
        "{paths:?}"
    );
    // a path that is no cgroup is a clear error
    let e = c
        .call(json!({"op": "begin_span", "label": "bad", "cgroup": "/tmp"}))
        .unwrap_err();
    assert!(e.to_string().contains("not a cgroup v2 directory"), "{e}");
    drop(server);
    remove_cgroup(&cg);
}

/// A span asked to follow a cgroup and a process that is gone fails; the
/// cgroup's threads it had tracked by then leave with it, and its id is
/// not the next span's (else that span would get their events).
#[test]
fn a_failed_begin_leaves_no_thread_traced_for_the_next_span() {
    if !root() {
        return;
    }
    let d = Daemon::start_with_config("[retention]\nkeep_events = \"all\"\n");
    let mut c = d.client();
    let root = probe::cgroup::v2_root().expect("a cgroup2 mount");
    let cg = root.join(format!("probe-dt-failed-begin-{}", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    // another process of the call's container, failing all the time
    let mut neighbour = Command::new("sh")
        .args([
            "-c",
            "while :; do cat /nonexistent-tree-neighbour 2>/dev/null; sleep 0.02; done",
        ])
        .spawn()
        .unwrap();
    std::fs::write(cg.join("cgroup.procs"), neighbour.id().to_string()).unwrap();
    // the call's own process, gone before the span begins
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let e = c
        .call(json!({"op": "begin_span", "label": "call", "cgroup": cg, "pid": gone_pid}))
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    // the next span follows a process of its own, and only that
    let r = c
        .call(json!({"op": "begin_span", "label": "next", "pid": std::process::id()}))
        .unwrap();
    let span = r["span_id"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.end_span(span, Some(&tool_error()), None).unwrap();
    wait_stored(&mut c, span);
    let paths = stored_paths(&mut c, span);
    neighbour.kill().unwrap();
    neighbour.wait().unwrap();
    remove_cgroup(&cg);
    assert!(paths.is_empty(), "the failed span's threads: {paths:?}");
    let status = d.client().status().unwrap();
    assert_eq!(status["open_spans"], 0, "{status}");
}

/// Removes a test's cgroup once its killed processes have left it.
fn remove_cgroup(cg: &Path) {
    for _ in 0..50 {
        if std::fs::remove_dir(cg).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `sh -c SCRIPT` in a new span of `session` (begun with `begin`'s extra
/// fields), ended with its exit; answers the span id and its attribution.
fn script_span(
    client: &mut Client,
    session: &str,
    script: &str,
    begin: Value,
) -> (u64, probe::attribution::Attribution) {
    let mut fields = json!({"session": session});
    for (k, v) in begin.as_object().unwrap() {
        fields[k] = v.clone();
    }
    let (span, exit) = run_attached(client, fields, &["sh", "-c", script]);
    (span, client.end_span(span, Some(&exit), None).unwrap())
}

/// Every span queued so far is in the DB.
fn wait_all_stored(client: &mut Client, spans: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let db = client.daemon_status().unwrap().db;
        // stored, and room made for them
        if db.stored_spans >= spans && db.store_queue == 0 && !db.retention_behind {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "stored {} of {spans}",
            db.stored_spans
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A shell that looks for 40 files that are not there and goes on: the
/// tolerated lookups of a program that worked.
const LOOKS_AND_GOES_ON: &str = "for i in $(seq 40); do [ -e /nonexistent-kept-$i ]; done; true";

#[test]
fn a_span_that_explains_nothing_keeps_its_figures_not_its_lookups() {
    if !root() {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let (plain, _) = script_span(&mut c, "keep", LOOKS_AND_GOES_ON, json!({}));
    let (asked, _) = script_span(
        &mut c,
        "keep",
        LOOKS_AND_GOES_ON,
        json!({"keep_events": "all"}),
    );
    let (failed, reply) = script_span(
        &mut c,
        "keep",
        &LOOKS_AND_GOES_ON.replace("; true", "; exit 3"),
        json!({}),
    );
    wait_all_stored(&mut c, 3);
    let stored = |c: &mut Client, span: u64| -> Value {
        c.call(json!({"op": "query", "span_id": span})).unwrap()["span"].clone()
    };
    let lookups = |s: &Value| {
        s["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                e["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/nonexistent-kept-"))
            })
            .count()
    };
    let p = stored(&mut c, plain);
    assert_eq!(p["failed"], false);
    assert_eq!(
        lookups(&p),
        0,
        "a worked program's lookups are not kept: {p}"
    );
    assert!(
        p["drops"]["not_kept"].as_u64().unwrap() >= 40,
        "{}",
        p["drops"]
    );
    assert!(
        p["counts"]["syscall_failed"].as_u64().unwrap() >= 40,
        "counted: {}",
        p["counts"]
    );
    assert_eq!(p["exit"]["code"], 0);
    assert_eq!(
        lookups(&stored(&mut c, asked)),
        40,
        "keep_events=all on begin_span keeps them"
    );
    // a failed span keeps its lineage and the failures its attribution
    // holds as evidence; the lookups it got past are counted, not kept
    let f = stored(&mut c, failed);
    assert_eq!(f["failed"], true);
    let kept: Vec<probe::event::KernelEvent> = serde_json::from_value(f["events"].clone()).unwrap();
    for e in &reply.events {
        assert!(kept.contains(e), "evidence {e:?} not kept");
    }
    assert!(
        kept.iter()
            .filter(|e| e.kind.is_failure())
            .all(|e| reply.events.contains(e)),
        "only the evidence's failures are kept: {kept:?}"
    );
    assert!(
        kept.iter().any(|e| e.kind == probe::event::Kind::Exit),
        "{kept:?}"
    );
    let not_kept = f["drops"]["not_kept"].as_u64().unwrap_or(0);
    assert!(
        lookups(&f) as u64 + not_kept >= 40,
        "each lookup kept or counted: {}",
        f["drops"]
    );
    let rows = c
        .query(probe::protocol::Query {
            session: Some("keep".into()),
            ..Default::default()
        })
        .unwrap();
    let row = rows.iter().find(|r| r.span == plain).unwrap();
    assert!(row.events_not_kept >= 40 && row.events == 0, "{row:?}");
    let show = Command::new(PROBE)
        .args(["show", "--db"])
        .arg(d.db())
        .arg(plain.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("events not kept"), "{text}");
    // a span whose lookups were left out cannot be attributed again: it
    // says so (exit 2), naming why; the one whose begin asked for all can
    let again = |span: u64| {
        Command::new(PROBE)
            .args(["show", "--reattribute", "--db"])
            .arg(d.db())
            .arg(span.to_string())
            .output()
            .unwrap()
    };
    let out = again(plain);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("not replayable") && text.contains("were not stored"),
        "{text}"
    );
    let out = again(asked);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("same verdict"), "{text}");
    let db = c.daemon_status().unwrap().db;
    assert_eq!((db.keep_events.as_str(), db.spans_in_db), ("failed", 3));
    assert!(db.bytes_per_span > 0 && db.budget_bytes > 0, "{db:?}");
    assert_eq!(db.auto_vacuum, "incremental");
}

#[test]
fn a_small_cap_keeps_failed_spans_stays_under_it_and_never_stalls() {
    if !root() {
        return;
    }
    const CAP: u64 = 1 << 20;
    // every event kept, so a few spans are over the cap
    let mut d = Daemon::start_with_config(&format!(
        "[retention]\nmax_db_bytes = {CAP}\nkeep_events = \"all\"\n"
    ));
    let mut c = d.client();
    let failed: Vec<u64> = (0..5)
        .map(|_| script_span(&mut c, "cap", "[ -e /nonexistent-cap ]; exit 3", json!({})).0)
        .collect();
    let worked = "for i in $(seq 300); do [ -e /nonexistent-cap-$i ]; done; true";
    for _ in 0..60 {
        script_span(&mut c, "cap", worked, json!({}));
    }
    wait_all_stored(&mut c, 65);
    let db = c.daemon_status().unwrap().db;
    let on_disk = |p: PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let wal = PathBuf::from(format!("{}-wal", d.db().display()));
    let used = on_disk(d.db()) + on_disk(wal);
    assert!(
        used <= CAP,
        "{used} bytes on disk over a cap of {CAP}: {db:?}"
    );
    assert_eq!(db.budget_bytes, CAP);
    assert!(db.retention_removed.spans > 0, "{db:?}");
    assert_eq!(db.retention_removed.explaining_spans, 0, "{db:?}");
    let kept: Vec<u64> = c
        .query(probe::protocol::Query {
            session: Some("cap".into()),
            failed: true,
            ..Default::default()
        })
        .unwrap()
        .iter()
        .map(|r| r.span)
        .collect();
    for f in &failed {
        assert!(kept.contains(f), "failed span {f} was removed: {kept:?}");
    }
    // how long ingestion waited at worst is measured by `cargo xtask
    // bench --only evidence`, not timed here: a loaded machine's fsync
    // is not the store's bound
    assert!(db.longest_write_ms > 0.0, "{db:?}");
    let (status, err) = d.stop();
    assert!(status.success(), "{err}");
    assert_eq!(
        Store::open_readonly(&d.db())
            .unwrap()
            .integrity_check()
            .unwrap(),
        "ok"
    );
}

/// Every span a daemon stored with all its events is attributed again by
/// another process, from the DB alone, to the verdict stored: the
/// failures, the words that corroborated them, the facts captured at close.
#[test]
fn stored_spans_attribute_again_identically_in_another_process() {
    if !root() {
        return;
    }
    let d = Daemon::start_with_config("[retention]\nkeep_events = \"all\"\n");
    let mut c = d.client();
    let verdicts: Vec<(u64, String)> = [
        &["sh", "-c", "cat /nonexistent-replay/data.csv"][..],
        &["sh", "-c", "no-such-tool-replay --version"],
        &["sh", "-c", "ls /nonexistent-replay-dir; exit 0"],
        &["sh", "-c", "echo x > /proc/version"],
        &["true"],
    ]
    .iter()
    .map(|cmd| {
        let a = run_span(&mut c, "replay", cmd);
        (a.span, a.primitive.id().to_string())
    })
    .collect();
    wait_all_stored(&mut c, verdicts.len() as u64);
    let out = Command::new(PROBE)
        .args(["show", "--all", "--reattribute", "--json", "--db"])
        .arg(d.db())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            report["same"].as_u64(),
            report["changed"].as_u64(),
            report["not_replayable"].as_u64()
        ),
        (Some(verdicts.len() as u64), Some(0), Some(0)),
        "{report:#}"
    );
    for (span, primitive) in &verdicts {
        let r = report["spans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["span"] == *span)
            .unwrap_or_else(|| panic!("span {span} missing: {report:#}"));
        assert_eq!(r["verdict"]["primitive"], *primitive, "{r:#}");
    }
    let primitives: Vec<&str> = verdicts.iter().map(|(_, p)| p.as_str()).collect();
    assert!(
        primitives.contains(&"fs.missing") && primitives.contains(&"exec.missing"),
        "the spans exercise the rules: {primitives:?}"
    );
}

/// A DB an earlier version made (no auto-vacuum) is converted when the
/// daemon starts, so retention can give pages back; nothing in it is lost.
#[test]
fn a_db_made_before_incremental_auto_vacuum_is_converted_at_start() {
    if !root() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("probe-dt-")
        .tempdir()
        .unwrap();
    let db = dir.path().join("evidence.db");
    {
        let st = probe::store::Store::open(&db).unwrap();
        st.connection()
            .execute_batch("PRAGMA auto_vacuum = NONE; VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        assert_eq!(st.auto_vacuum().unwrap(), "none");
    }
    let mut d = Daemon { child: None, dir };
    d.spawn(&[]);
    let mut c = d.client();
    let span = c
        .begin_span(Some("old-db"), "after the conversion")
        .unwrap();
    c.end_span(span, None, None).unwrap();
    let status = c.status().unwrap();
    assert_eq!(status["db"]["auto_vacuum"], "incremental", "{status}");
    // a query waits for what ended before it to be stored
    let rows = c
        .query(probe::protocol::Query {
            session: Some("old-db".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
}
