//! `agent-bridge proxy` through rmcp's own client, over stdio and HTTP:
//! results byte-identical to the direct server's plus the kernel evidence,
//! a profile applied to the foreign server, and misbehaving servers.

mod common;

use std::time::Duration;

use common::*;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/misbehaving_server.py"
);

/// `proxy` arguments in front of `-- CMD…`.
fn proxy_args(extra: &[&str], probe: bool, cmd: &[&str]) -> Vec<String> {
    let mut a = vec!["proxy".to_string()];
    let socket = if probe {
        probe_socket().display().to_string()
    } else {
        "/nonexistent/probe.sock".into()
    };
    a.extend(["--probe-socket".into(), socket]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push("--".into());
    a.extend(cmd.iter().map(|s| s.to_string()));
    a
}

/// The bridge itself as the foreign server.
fn bridge_server() -> Vec<&'static str> {
    vec![BRIDGE, "serve", "--stdio", "--no-probe"]
}

async fn proxy_stdio(extra: &[&str], probe: bool, cmd: &[&str]) -> Bridge {
    let mut a = proxy_args(extra, probe, cmd);
    a.insert(1, "--stdio".into());
    Bridge::stdio_with(&a, false)
        .await
        .expect("handshake through the proxy")
}

async fn proxy_http(extra: &[&str], probe: bool, cmd: &[&str]) -> (Killed, Client, Handler) {
    let mut a = proxy_args(extra, probe, cmd);
    a.splice(1..1, ["--http".to_string(), "127.0.0.1:0".to_string()]);
    let (child, url) = Bridge::start_http_with(&a);
    let (client, handler) = Bridge::connect_http(&url, None)
        .await
        .expect("HTTP handshake");
    (child, client, handler)
}

/// The evidence, and the result as JSON without it.
fn split(r: &CallToolResult) -> (Value, Value) {
    let mut v = serde_json::to_value(r).unwrap();
    let kernel = v["_meta"]
        .as_object_mut()
        .and_then(|m| m.remove("probe/kernel"))
        .unwrap_or_else(|| panic!("no _meta[\"probe/kernel\"] in {v:.300}"));
    if v["_meta"].as_object().is_some_and(|m| m.is_empty()) {
        v.as_object_mut().unwrap().remove("_meta");
    }
    (kernel, v)
}

#[tokio::test(flavor = "multi_thread")]
async fn results_match_the_direct_server_over_stdio_and_http() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("ten-mib.bin");
    let data: Vec<u8> = (0..10u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&big, &data).unwrap();
    let image = dir.path().join("pic.png");
    std::fs::write(&image, png(64, 48)).unwrap();
    let text = dir.path().join("hello.txt");
    std::fs::write(&text, "héllo\n").unwrap();
    let calls = [
        ("read_file", json!({"path": big})),
        ("read_file", json!({"path": image})),
        ("read_file", json!({"path": text})),
        ("stat", json!({"path": text})),
        ("list_dir", json!({"path": dir.path()})),
    ];
    let direct = Bridge::stdio(Opts::default()).await;
    let via_stdio = proxy_stdio(&[], true, &bridge_server()).await;
    let (_http, via_http, _) = proxy_http(&[], true, &bridge_server()).await;
    for (tool, args) in &calls {
        let want = serde_json::to_value(direct.call(tool, args.clone()).await).unwrap();
        for (how, client) in [("stdio", &via_stdio.client), ("http", &via_http)] {
            let got = try_call(client, tool, args.clone()).await.unwrap();
            let (kernel, rest) = split(&got);
            assert!(
                rest == want,
                "{tool} {args} over {how}: the result differs from the direct server's"
            );
            assert_eq!(kernel["available"], true, "{kernel}");
            assert_eq!(kernel["failed"], false, "{kernel}");
            assert_eq!(kernel["outcome"], "ok");
            assert_eq!(kernel["overlapping_calls"], 0);
            assert_eq!(kernel["label"], format!("tools/call {tool}"));
        }
    }
    // the binary blocks survived: a resource blob and an image
    let r = via_stdio.call("read_file", json!({"path": big})).await;
    assert!(blob(&r) == data, "10 MiB blob through the proxy");
    let r = via_stdio.call("read_file", json!({"path": image})).await;
    assert!(
        serde_json::to_value(&r).unwrap()["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "image")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_profile_on_the_foreign_server_is_named_by_the_evidence() {
    if !root() {
        return;
    }
    let path = format!("/tmp/proxy-readonly-{}", std::process::id());
    for http in [false, true] {
        let extra = ["--profile", "readonly"];
        let (_keep, client) = if http {
            let (k, c, _) = proxy_http(&extra, true, &bridge_server()).await;
            (Some(k), Some(c))
        } else {
            (None, None)
        };
        let stdio = if http {
            None
        } else {
            Some(proxy_stdio(&extra, true, &bridge_server()).await)
        };
        let client = client
            .as_ref()
            .unwrap_or_else(|| &stdio.as_ref().unwrap().client);
        let r = try_call(
            client,
            "write_file",
            json!({"path": path, "content_base64": b64(b"x")}),
        )
        .await
        .unwrap();
        assert!(is_error(&r), "a write to /tmp under readonly succeeded");
        let (kernel, _) = split(&r);
        assert_eq!(kernel["available"], true, "{kernel}");
        assert_eq!(kernel["failed"], true, "{kernel}");
        assert_eq!(kernel["outcome"], "is_error");
        assert_eq!(kernel["primitive"], "fs.readonly", "{kernel:#}");
        // a call that succeeds is not failed
        let r = try_call(client, "stat", json!({"path": "/etc/hostname"}))
            .await
            .unwrap();
        let (kernel, _) = split(&r);
        assert_eq!(kernel["failed"], false, "{kernel}");
    }
    assert!(!std::path::Path::new(&path).exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_daemon_the_proxy_forwards_with_unavailable_evidence() {
    let b = proxy_stdio(&[], false, &bridge_server()).await;
    let r = b.call("stat", json!({"path": "/etc/hostname"})).await;
    assert!(!is_error(&r));
    let (kernel, _) = split(&r);
    assert_eq!(kernel["available"], false);
    assert!(
        kernel["reason"]
            .as_str()
            .unwrap()
            .contains("cannot connect to the probe daemon"),
        "{kernel}"
    );
}

/// The error message of a call that must fail with a JSON-RPC error.
async fn rpc_error(client: &Client, tool: &str) -> String {
    match try_call(client, tool, json!({})).await {
        Err(e) => e.to_string(),
        Ok(r) => panic!("{tool} answered {r:?}"),
    }
}

async fn echo_pid(client: &Client) -> String {
    let r = try_call(client, "echo", json!({})).await.expect("echo");
    let (_, rest) = split(&r);
    assert_eq!(
        rest["_meta"]["fixture/own"], "kept",
        "the server's own _meta is kept"
    );
    text(&r)
}

#[tokio::test(flavor = "multi_thread")]
async fn misbehaving_servers_get_clear_errors_and_a_restart() {
    let cmd = ["python3", FIXTURE];
    // long enough for a restarted Python server to answer on a loaded
    // 2-core CI machine, which the hang case then waits out
    let b = proxy_stdio(&["--call-timeout", "10"], false, &cmd).await;
    let mut pid = echo_pid(&b.client).await;
    let cases = [
        ("crash", vec!["SIGSEGV", "about to crash on purpose"]),
        (
            "hang",
            vec!["did not answer `tools/call` within 10 s (--call-timeout)"],
        ),
        (
            "garbage",
            vec!["not a JSON-RPC message", "this is not JSON-RPC"],
        ),
        ("huge", vec!["at least", "--max-message"]),
    ];
    for (tool, says) in cases {
        let e = rpc_error(&b.client, tool).await;
        for s in says {
            assert!(e.contains(s), "{tool}: {s:?} missing from {e}");
        }
        assert!(e.contains("starts again for the next request"), "{e}");
        // the next call reaches a new server, which was initialized again
        let now = echo_pid(&b.client).await;
        assert_ne!(now, pid, "{tool}: the server was not restarted");
        pid = now;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_never_initializes_gets_an_error() {
    let a = {
        let mut a = proxy_args(
            &["--init-timeout", "1"],
            false,
            &["python3", FIXTURE, "silent"],
        );
        a.insert(1, "--stdio".into());
        a
    };
    let e = Bridge::stdio_with(&a, false)
        .await
        .err()
        .expect("handshake must fail");
    assert!(
        e.contains("did not answer `initialize` within 1 s (--init-timeout)"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_server_requests_and_overlaps_pass_through_stdio_and_http() {
    let cmd = ["python3", FIXTURE];
    let stdio = proxy_stdio(&[], false, &cmd).await;
    let (_keep, http, http_handler) = proxy_http(&[], false, &cmd).await;
    for (how, client, handler) in [
        ("stdio", &stdio.client, &stdio.handler),
        ("http", &http, &http_handler),
    ] {
        let before = handler.progress.load(std::sync::atomic::Ordering::SeqCst);
        let r = try_call(client, "progress", json!({})).await.unwrap();
        assert_eq!(text(&r), "progressed");
        // rmcp runs notification handlers on tasks of their own: they may
        // finish just after the result is returned
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let seen = || handler.progress.load(std::sync::atomic::Ordering::SeqCst) - before;
        while seen() < 2 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(seen(), 2, "{how}: progress notifications");
        // the server pings the client in the middle of a call
        let r = try_call(client, "ask", json!({})).await.unwrap();
        assert_eq!(text(&r), "the client answered ping: {}", "{how}");
        // two calls in flight at once: each says so
        let (a, b) = tokio::join!(
            try_call(client, "sleep", json!({})),
            try_call(client, "sleep", json!({}))
        );
        for r in [a.unwrap(), b.unwrap()] {
            assert_eq!(split(&r).0["overlapping_calls"], 1, "{how}");
        }
    }
}

/// Raw lines through `proxy --stdio`: the answers, one per line.
fn raw_exchange(input: &[u8]) -> Vec<Value> {
    raw_exchange_lines(input)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The proxy's answer lines, as written.
fn raw_exchange_lines(input: &[u8]) -> Vec<String> {
    let args = proxy_args(&["--stdio", "--max-message", "1M"], false, &bridge_server());
    answer_lines(&args, input, None)
}

/// The lines `agent-bridge ARGS…` writes on stdout for `input` on stdin:
/// all of them (stdin closed at once), or the first `n` (stdin closed
/// after them: `serve` drops answers still being made when stdin ends).
fn answer_lines(args: &[String], input: &[u8], n: Option<usize>) -> Vec<String> {
    use std::io::{BufRead as _, Write as _};
    let mut child = std::process::Command::new(BRIDGE)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    let stdin = n.is_some().then_some(stdin);
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let lines = out.lines().map(Result::unwrap);
    let lines = lines.take(n.unwrap_or(usize::MAX)).collect();
    drop(stdin);
    child.wait().unwrap();
    lines
}

/// Requests whose ids come back: the lines of `exact_ids_and_one_initialize`.
const ID_CASES: [&str; 6] = [
    r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}"#,
    r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
    r#"{"jsonrpc":"2.0","id":1e400,"method":"ping"}"#,
    r#"{"jsonrpc":"2.0","id":"\ud800","method":"ping"}"#,
    r#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"junk","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
    r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#,
];

/// The answers to [`ID_CASES`], in any order: a 2^97 id comes back as
/// written (the server refused it with id null; the proxy put it back), a
/// null, out-of-range or unpaired-surrogate id gets -32600 with id null
/// from the proxy (never silence), a second initialize is refused with its
/// id, and the session still answers a ping.
fn exact_ids_and_one_initialize(lines: &[String]) {
    assert_eq!(lines.len(), ID_CASES.len(), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(r#""id":123456789012345678901234567890,"#) && l.contains("-32600")),
        "the 2^97 id did not come back as written: {lines:?}"
    );
    let answers: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let nulls: Vec<&Value> = answers.iter().filter(|a| a["id"].is_null()).collect();
    assert_eq!(nulls.len(), 3, "{answers:?}");
    for a in nulls {
        assert_eq!(a["error"]["code"], -32600, "{a}");
        assert!(
            a["error"]["message"]
                .as_str()
                .unwrap()
                .contains("is not an id"),
            "{a}"
        );
    }
    let again = answers.iter().find(|a| a["id"] == 2).unwrap();
    assert_eq!(again["error"]["code"], -32600, "{again}");
    assert!(
        again["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already initialized"),
        "{again}"
    );
    let ping = answers.iter().find(|a| a["id"] == 7).unwrap();
    assert_eq!(ping["result"], json!({}), "{ping}");
}

#[test]
fn ids_come_back_exactly_or_as_null_and_a_second_initialize_is_refused_on_stdio() {
    let mut input = Vec::new();
    input.extend_from_slice(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#);
    input.extend_from_slice(b"\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n");
    for l in ID_CASES {
        input.extend_from_slice(l.as_bytes());
        input.push(b'\n');
    }
    // the proxy's own refusals may come before the server's first answer
    let (init, rest): (Vec<String>, Vec<String>) = raw_exchange_lines(&input)
        .into_iter()
        .partition(|l| l.contains("\"protocolVersion\":\"2025-06-18\""));
    assert_eq!(init.len(), 1, "{init:?} {rest:?}");
    exact_ids_and_one_initialize(&rest);
}

#[tokio::test(flavor = "multi_thread")]
async fn ids_come_back_exactly_or_as_null_and_a_second_initialize_is_refused_over_http() {
    let mut a = proxy_args(&[], false, &bridge_server());
    a.splice(1..1, ["--http".to_string(), "127.0.0.1:0".to_string()]);
    let (_keep, url) = Bridge::start_http_with(&a);
    let session = raw_http_session(&url).await;
    let session = Some(session.as_str());
    let mut lines = Vec::new();
    for l in ID_CASES {
        lines.push(raw_post(&url, session, l).await.2);
    }
    exact_ids_and_one_initialize(&lines);
}

#[test]
fn malformed_client_input_gets_the_same_errors_as_serve() {
    let mut input = Vec::new();
    input.extend_from_slice(b"not json\n");
    input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\xff\"}\n");
    input.extend_from_slice(
        b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{\"a\":\"\0\"}}\n",
    );
    input.extend_from_slice(
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\",\"params\":{{\"pad\":\"{}\"}}}}\n",
            "x".repeat(2 << 20)
        )
        .as_bytes(),
    );
    input.extend_from_slice(br#"{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#);
    input.push(b'\n');
    let answers = raw_exchange(&input);
    assert_eq!(answers.len(), 5, "{answers:?}");
    assert_eq!(answers[0]["error"]["code"], -32700);
    assert!(
        answers[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not UTF-8")
    );
    assert_eq!(answers[2]["error"]["code"], -32700);
    let big = answers[3]["error"]["message"].as_str().unwrap();
    assert!(
        big.contains("over this server's limit") && big.contains("--max-message"),
        "{big}"
    );
    // a good message after all that is answered by the server
    assert_eq!(answers[4]["id"], 4);
    assert_eq!(answers[4]["result"]["serverInfo"]["name"], "agent-bridge");
}

/// A `tools/call` whose name is not a string is a valid request with
/// params that do not fit: -32602 (Invalid params) with its id, from the
/// proxy as from `serve` itself, over stdio and HTTP; a message that is no
/// request at all stays -32600, and the session goes on.
#[tokio::test(flavor = "multi_thread")]
async fn params_that_do_not_fit_are_invalid_params_as_serve_says() {
    let bad =
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5,"arguments":{}}}"#;
    let not_a_request = r#"{"jsonrpc":"2.0","id":2,"params":{"name":5}}"#;
    let ping = r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#;
    let check = |how: &str, answers: &[Value]| {
        let by_id = |id: i64| {
            answers
                .iter()
                .find(|a| a["id"] == id)
                .unwrap_or_else(|| panic!("{how}: no answer to {id}: {answers:?}"))
        };
        assert_eq!(by_id(1)["error"]["code"], -32602, "{how}");
        let m = by_id(1)["error"]["message"].as_str().unwrap();
        assert!(
            m.starts_with("Invalid params for `tools/call`") && m.contains("invalid type"),
            "{how}: {m}"
        );
        assert_eq!(by_id(2)["error"]["code"], -32600, "{how}");
        assert_eq!(by_id(3)["result"], json!({}), "{how}");
    };
    let mut input = raw_initialize(0, "2025-06-18").into_bytes();
    input.extend_from_slice(b"\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n");
    for l in [bad, not_a_request, ping] {
        input.extend_from_slice(l.as_bytes());
        input.push(b'\n');
    }
    check("proxy over stdio", &raw_exchange(&input));
    let serve = ["serve", "--stdio", "--no-probe"].map(String::from);
    let answers: Vec<Value> = answer_lines(&serve, &input, Some(4))
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    check("serve over stdio", &answers);
    // the proxy's HTTP reads a body with the same parser
    let mut a = proxy_args(&[], false, &bridge_server());
    a.splice(1..1, ["--http".to_string(), "127.0.0.1:0".to_string()]);
    let (_keep, url) = Bridge::start_http_with(&a);
    let session = raw_http_session(&url).await;
    let mut answers = Vec::new();
    let mut statuses = Vec::new();
    for l in [bad, not_a_request, ping] {
        let (_, status, body) = raw_post(&url, Some(&session), l).await;
        statuses.push(status);
        answers.push(serde_json::from_str(&body).unwrap());
    }
    check("proxy over HTTP", &answers);
    // a request whose params do not fit is answered like any request
    // (200, as serve answers it); what is no request is a 400
    assert_eq!(statuses, [200, 400, 200], "{answers:?}");
}

/// A line the proxy can pass on but the server cannot read (a number
/// beyond f64): the server's `id: null` parse error is the answer to that
/// request (the latest sent), with its id, and the server lives on to
/// answer the next one.
#[test]
fn a_servers_answer_with_a_null_id_is_passed_on_and_the_server_kept() {
    let mut input = Vec::new();
    input.extend_from_slice(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#);
    input.push(b'\n');
    input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n");
    input.extend_from_slice(
        b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{\"x\":1e400}}\n",
    );
    input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"exec\",\"arguments\":{\"argv\":[\"sh\",\"-c\",\"echo $PPID\"]}}}\n");
    // a lone surrogate and 200-deep nesting, sent before request 3 is answered
    input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":\"s\",\"method\":\"tools/call\",\"params\":{\"name\":\"stat\",\"arguments\":{\"path\":\"\\ud800\"}}}\n");
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    input.extend_from_slice(
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\",\"params\":{{\"d\":{deep}}}}}\n"
        )
        .as_bytes(),
    );
    let answers = raw_exchange(&input);
    assert_eq!(answers.len(), 5, "{answers:?}");
    for id in [json!("s"), json!(5)] {
        let a = answers.iter().find(|a| a["id"] == id);
        assert!(
            a.is_some_and(|a| a["error"]["code"] == -32700),
            "{id}: {answers:?}"
        );
    }
    let bad = answers
        .iter()
        .find(|a| a["id"] == 2)
        .unwrap_or_else(|| panic!("request 2 got no answer: {answers:?}"));
    assert_eq!(bad["error"]["code"], -32700, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("number out of range"),
        "{bad}"
    );
    let call = answers.iter().find(|a| a["id"] == 3).unwrap();
    assert_eq!(
        call["result"]["isError"], false,
        "the server was not kept: {call}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn http_connections_are_capped_and_timed_out() {
    let cmd = ["python3", FIXTURE];
    let mut a = proxy_args(&[], false, &cmd);
    let limits = TIGHT_CONNECTION_LIMITS;
    a.splice(
        1..1,
        ["--http", "127.0.0.1:0"]
            .iter()
            .chain(&limits)
            .map(|s| s.to_string()),
    );
    let (_keep, url) = Bridge::start_http_with(&a);
    tokio::task::spawn_blocking(move || assert_connection_limits(&url))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn http_sessions_end_with_delete_and_bad_requests_are_refused() {
    let cmd = ["python3", FIXTURE];
    let mut a = proxy_args(&[], false, &cmd);
    a.splice(1..1, ["--http".to_string(), "127.0.0.1:0".to_string()]);
    let (_keep, url) = Bridge::start_http_with(&a);
    let http = reqwest::Client::new();
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let post = |session: Option<&str>, origin: Option<&str>| {
        let mut r = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(ping);
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        r.send()
    };
    assert_eq!(
        post(Some("no-such-session"), None).await.unwrap().status(),
        404
    );
    assert_eq!(post(None, None).await.unwrap().status(), 400);
    assert_eq!(
        post(None, Some("https://evil.example"))
            .await
            .unwrap()
            .status(),
        403
    );
    let (client, _) = Bridge::connect_http(&url, None)
        .await
        .expect("HTTP handshake");
    let pid: u32 = echo_pid(&client)
        .await
        .trim_start_matches("pid ")
        .parse()
        .unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    let proxy = _keep.0.id();
    if root() {
        assert_eq!(
            server_cgroups(proxy),
            1,
            "the server runs in a cgroup of its own"
        );
    }
    let _ = client.cancel().await; // rmcp sends DELETE for its session
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !gone(&pid.to_string()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the server outlived its session"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // its cgroup (a directory, and two files the proxy holds open) goes
    // with it, not when the timers of its requests (--call-timeout) fire
    while root() && server_cgroups(proxy) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the ended session's cgroup is still there"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The proxy `pid`'s server cgroups (`mcp-PID-proxy-…`), in any hierarchy.
fn server_cgroups(pid: u32) -> usize {
    let prefix = format!("mcp-{pid}-proxy-");
    let mut names = std::collections::BTreeSet::new();
    for root in [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup/pids",
    ] {
        for e in std::fs::read_dir(format!("{root}/agent-bridge"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) {
                names.insert(name);
            }
        }
    }
    names.len()
}

/// A process of the server's that dies between two calls (a child the
/// OOM killer took after the call that started it was answered) is in no
/// call's span: the span between calls keeps it, and the next call carries
/// it as `before_call`; a call after a quiet interval carries none.
#[tokio::test(flavor = "multi_thread")]
async fn a_death_between_two_calls_is_told_by_the_next_call() {
    if !root() {
        return;
    }
    let profile = std::env::temp_dir().join(format!("proxy-between-{}.toml", std::process::id()));
    std::fs::write(&profile, "memory_limit = \"128M\"\n").unwrap();
    let cmd = ["python3", FIXTURE];
    let b = proxy_stdio(&["--profile", profile.to_str().unwrap()], true, &cmd).await;
    let started = b.call("hog_later", json!({})).await;
    let hog = text(&started).trim_start_matches("hog ").to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !gone(&hog) {
        assert!(
            std::time::Instant::now() < deadline,
            "the hog {hog} was not killed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (kernel, _) = split(&b.call("echo", json!({})).await);
    let before = &kernel["before_call"];
    let cause = if before["hidden_failure"].is_object() {
        &before["hidden_failure"]
    } else {
        before
    };
    assert_eq!(cause["primitive"], "mem.oom", "{kernel:#}");
    let why = cause["explanation"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("(pid {hog})")) && why.contains("OOM killer"),
        "{why}"
    );
    assert_eq!(
        kernel["primitive"], "none",
        "the call itself failed nothing: {kernel:#}"
    );
    let (quiet, _) = split(&b.call("echo", json!({})).await);
    assert!(quiet.get("before_call").is_none(), "{quiet:#}");
    let _ = std::fs::remove_file(&profile);
}

/// A client gone without DELETE: its session ends once idle for
/// `--session-idle-timeout`, and its server with it; a session in use is
/// kept however long it lives.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_its_client_abandoned_ends_when_idle_and_its_server_with_it() {
    let cmd = ["python3", FIXTURE];
    let mut a = proxy_args(&["--session-idle-timeout", "2"], false, &cmd);
    a.splice(1..1, ["--http".to_string(), "127.0.0.1:0".to_string()]);
    let (_keep, url) = Bridge::start_http_with(&a);
    let echo =
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
    let pid_of = |answer: &str| -> String {
        let v: Value = serde_json::from_str(answer).unwrap();
        let text = v["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_string();
        text.trim_start_matches("pid ").to_string()
    };
    let (kept, abandoned) = (raw_http_session(&url).await, raw_http_session(&url).await);
    let (_, _, answer) = raw_post(&url, Some(&kept), echo).await;
    let kept_pid = pid_of(&answer);
    let (_, _, answer) = raw_post(&url, Some(&abandoned), echo).await;
    let abandoned_pid = pid_of(&answer);
    // one session keeps calling, every half second, for 6 s
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, status, _) = raw_post(&url, Some(&kept), echo).await;
        assert_eq!(status, 200, "a session in use was ended");
    }
    assert!(
        gone(&abandoned_pid),
        "the abandoned session's server still runs after 6 s"
    );
    assert!(
        !gone(&kept_pid),
        "the server of the session in use was stopped"
    );
    let (_, status, answer) = raw_post(&url, Some(&abandoned), echo).await;
    assert_eq!(status, 404, "{answer}");
    assert!(answer.contains("no such session"), "{answer}");
}

/// What the bridge behind proxy `b` runs: `sleep BASE.PID` in the
/// background and `sleep BASE-1.PID` as an exec left in flight (argv no
/// other test uses). Returns once both run in that bridge's call cgroups:
/// their argv, the exec's answer to come, and that bridge's pid.
async fn sleeps_behind(
    b: &Bridge,
    base: u32,
) -> (
    [[String; 2]; 2],
    tokio::task::JoinHandle<Result<CallToolResult, rmcp::ServiceError>>,
    u32,
) {
    let me = std::process::id();
    let sleeps = [base, base - 1].map(|s| ["sleep".to_string(), format!("{s}.{me}")]);
    let r = b.call("start_process", json!({"argv": sleeps[0]})).await;
    assert!(!is_error(&r), "{r:?}");
    let server = split(&r).0["server_pid"].as_u64().unwrap() as u32;
    let exec = rmcp::model::CallToolRequestParams::new("exec").with_arguments(
        json!({"argv": sleeps[1], "timeout_ms": 600_000})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let peer = b.client.peer().clone();
    let exec = tokio::spawn(async move { peer.call_tool(exec).await });
    let both = sleeps.clone();
    let started = tokio::task::block_in_place(|| {
        within_10s(|| both.iter().all(|s| !running(&[&s[0], &s[1]]).is_empty()))
    });
    assert!(started, "the sleeps did not start");
    assert_eq!(call_cgroups_of(server).len(), 2, "one call cgroup each");
    (sleeps, exec, server)
}

/// Waits (up to 5 s) until no sleep runs and bridge `server` has no call
/// cgroup left; says how long that took after `since`.
fn assert_gone(sleeps: &[[String; 2]; 2], server: u32, since: std::time::Instant, how: &str) {
    let left = || -> Vec<String> {
        let mut left: Vec<String> = sleeps
            .iter()
            .flat_map(|s| running(&[&s[0], &s[1]]))
            .collect();
        left.extend(call_cgroups_of(server));
        left
    };
    let gone = tokio::task::block_in_place(|| within(Duration::from_secs(5), || left().is_empty()));
    assert!(gone, "{how}: still there after 5 s: {:?}", left());
    eprintln!(
        "{how}: the sleeps and call cgroups were gone {:?} later",
        since.elapsed()
    );
}

/// `proxy -- serve`: the proxy SIGKILLed while the bridge behind it has a
/// background process and an exec in flight. Its reaper kills the bridge's
/// tree, and the bridge's own reaper with it; the call cgroups of the
/// bridge that ran in that tree go too: nothing outlives the chain.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_the_bridge_behind_a_sigkilled_proxy_started_outlives_it() {
    if !root() {
        return;
    }
    let b = proxy_stdio(&[], false, &bridge_server()).await;
    let (sleeps, _exec, server) = sleeps_behind(&b, 300).await;
    let killed = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert_gone(&sleeps, server, killed, "proxy SIGKILLed");
}

/// The bridge behind the proxy dies with a background process and an exec
/// in flight: SIGKILLed, or killed by the proxy for not answering within
/// `--call-timeout` (its reaper, in the tree the proxy kills, dies at the
/// same moment). Nothing it started outlives it, the exec is answered
/// saying how it ended, and the next call reaches a new bridge.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_a_killed_bridge_behind_the_proxy_started_outlives_it() {
    if !root() {
        return;
    }
    for (base, timeout) in [(298, None), (296, Some("3"))] {
        let extra: Vec<&str> = timeout.iter().flat_map(|t| ["--call-timeout", t]).collect();
        let b = proxy_stdio(&extra, false, &bridge_server()).await;
        let (sleeps, exec, server) = sleeps_behind(&b, base).await;
        let killed = std::time::Instant::now();
        let says = match timeout {
            None => {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(server as i32),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
                "it was killed by SIGKILL"
            }
            Some(_) => "did not answer `tools/call` within 3 s (--call-timeout)",
        };
        let answer = exec.await.unwrap().expect_err("the exec got a result");
        let e = answer.to_string();
        assert!(e.contains(says) && e.contains("starts again"), "{e}");
        // the proxy kills a hung server when it answers the call
        let killed = timeout.map_or(killed, |_| std::time::Instant::now());
        assert_gone(&sleeps, server, killed, says);
        let r = b.call("stat", json!({"path": "/etc/hostname"})).await;
        assert!(!is_error(&r));
        assert_ne!(split(&r).0["server_pid"], server, "not a new bridge");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn trace_context_in_meta_reaches_the_kernel_span_through_the_proxy() {
    use probe::otlp::hex;
    use probe::otlp_receiver::{Receiver, attr, attr_str};
    if !root() {
        return;
    }
    let rx = Receiver::start().unwrap();
    let dir = std::path::PathBuf::from(scratch("otlp-proxy"));
    let (_probe, socket) = otlp_probe(&dir, &rx.url());
    let mut args: Vec<String> = ["proxy", "--stdio", "--probe-socket"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(socket.display().to_string());
    args.push("--".into());
    args.extend(bridge_server().iter().map(|s| s.to_string()));
    let b = Bridge::stdio_with(&args, false)
        .await
        .expect("handshake through the proxy");
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let r = call_with_meta(
        &b.client,
        "exec",
        json!({"argv": ["cat", "/nonexistent-otlp-proxy/data.csv"]}),
        json!({"traceparent": format!("00-{trace}-{parent}-01"), "tracestate": "vendor=1"}),
    )
    .await;
    assert!(!is_error(&r));
    // the foreign server failed its tool: an error for the trace too
    let r = call_with_meta(
        &b.client,
        "read_file",
        json!({"path": "/nonexistent-otlp-proxy/other"}),
        json!({}),
    )
    .await;
    assert!(is_error(&r));
    assert!(rx.wait_for(2, Duration::from_secs(10)));
    let spans = rx.spans();
    let named = |name: &str| {
        spans
            .iter()
            .map(|r| &r.span)
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no span {name}: {spans:?}"))
    };
    let s = named("tools/call exec");
    assert_eq!(hex(&s.trace_id), trace);
    assert_eq!(hex(&s.parent_span_id), parent);
    assert_eq!(s.trace_state, "vendor=1");
    assert_eq!(attr_str(&s.attributes, "gen_ai.tool.name"), Some("exec"));
    // a plain result: the call did not fail, nothing is blamed
    assert_eq!(attr_str(&s.attributes, "probe.primitive"), Some("none"));
    assert!(attr(&s.attributes, "error.type").is_none());
    let s = named("tools/call read_file");
    assert!(
        s.parent_span_id.is_empty(),
        "no trace context: its own trace"
    );
    assert_eq!(attr_str(&s.attributes, "error.type"), Some("tool_error"));
}

/// `proxy --http` with `extra` flags in front of the misbehaving server.
fn start_proxy_http(extra: &[&str]) -> (Killed, String) {
    let mut a = proxy_args(extra, false, &["python3", FIXTURE]);
    a.splice(1..1, ["--http".to_string(), "127.0.0.1:0".to_string()]);
    Bridge::start_http_with(&a)
}

/// As `serve --http`: a Content-Length over `--max-message` is answered 413
/// at once, not 408 at `--body-timeout`.
#[test]
fn http_a_body_declared_over_max_message_is_refused_at_once() {
    let (_keep, url) = start_proxy_http(&["--max-message", "1M", "--body-timeout", "60"]);
    assert_declared_too_large_refused_at_once(&url, "--max-message");
}

/// As `serve --http`: SIGTERM while clients are stalled mid-body answers
/// them 503 and the proxy exits at once, not at `--body-timeout`.
#[test]
fn http_sigterm_answers_stalled_bodies_and_exits() {
    let (proxy, url) = start_proxy_http(&["--body-timeout", "60"]);
    assert_sigterm_cuts_stalled_bodies(proxy, &url);
}

/// The proxy over stdio driven line by line, without an rmcp client: its
/// answers as it wrote them. Dropped: stdin closed, the proxy given 5 s to
/// end, then killed.
struct Raw {
    proxy: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    answers: std::sync::mpsc::Receiver<String>,
}

impl Raw {
    /// `proxy --stdio EXTRA… -- CMD…`, with the probe's socket when
    /// `socket` is given (else one where no daemon listens).
    fn start(extra: &[&str], socket: Option<&std::path::Path>, cmd: &[&str]) -> Raw {
        use std::io::BufRead as _;
        let mut args = proxy_args(extra, false, cmd);
        args.insert(1, "--stdio".into());
        if let Some(s) = socket {
            args[3] = s.display().to_string();
        }
        let mut proxy = std::process::Command::new(BRIDGE)
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(proxy.stdout.take().unwrap());
        let (tx, answers) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stdin = proxy.stdin.take();
        Raw {
            proxy,
            stdin,
            answers,
        }
    }

    /// In front of the fixture, initialized (its answer read).
    fn fixture(extra: &[&str], socket: Option<&std::path::Path>) -> Raw {
        let mut raw = Raw::start(extra, socket, &["python3", FIXTURE]);
        raw.send(&raw_initialize(0, "2025-06-18"));
        raw.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert_eq!(raw.answer()["id"], 0);
        raw
    }

    fn send(&mut self, line: &str) {
        use std::io::Write as _;
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
    }

    /// A tools/call of `tool` (no arguments) with id `id`.
    fn call(&mut self, id: u64, tool: &str) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": {}}}).to_string());
    }

    /// The next line the proxy writes (within 20 s).
    fn answer_line(&self) -> String {
        self.answers
            .recv_timeout(Duration::from_secs(20))
            .expect("no answer from the proxy within 20 s")
    }

    fn answer(&self) -> Value {
        serde_json::from_str(&self.answer_line()).unwrap()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let ended = within(Duration::from_secs(5), || {
            self.proxy.try_wait().is_ok_and(|s| s.is_some())
        });
        if !ended {
            let _ = self.proxy.kill();
            let _ = self.proxy.wait();
        }
    }
}

/// The evidence an answer carries: `result._meta` or `error.data`.
fn kernel_of(answer: &Value) -> &Value {
    let at = if answer.get("error").is_some() {
        &answer["error"]["data"]
    } else {
        &answer["result"]["_meta"]
    };
    let kernel = &at["probe/kernel"];
    assert!(kernel.is_object(), "no probe/kernel in {answer}");
    kernel
}

/// An answer the client no longer waited for still carries its call's
/// evidence: a cancelled call's (`cancelled`: what its span saw until the
/// cancellation), and the real answer to a call the proxy gave a server's
/// `id: null` error to (`late`). Before, both went out without it.
#[test]
fn a_late_answer_carries_its_calls_evidence() {
    let mut raw = Raw::fixture(&[], None);
    raw.call(2, "slow");
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}"#);
    let late = raw.answer();
    assert_eq!(late["id"], 2, "{late}");
    assert_eq!(late["result"]["_meta"]["fixture/own"], "kept", "{late}");
    let kernel = kernel_of(&late);
    assert_eq!(kernel["outcome"], "cancelled", "{late}");
    assert_eq!(kernel["tool"], "slow", "{late}");
    // the server's `id: null` error goes to the call, then its real answer
    raw.call(3, "null_error");
    let (guessed, real) = (raw.answer(), raw.answer());
    assert_eq!(guessed["id"], 3, "{guessed}");
    assert_eq!(kernel_of(&guessed)["outcome"], "jsonrpc_error", "{guessed}");
    assert_eq!(real["id"], 3, "{real}");
    assert_eq!(real["result"]["content"][0]["text"], "answered after all");
    assert_eq!(kernel_of(&real)["outcome"], "late", "{real}");
}

/// Over HTTP a cancelled call's late answer ends the call's own event
/// stream, with the call's evidence. Before, it went to the newest call's
/// stream without it, and that stream never ended; and a call without a
/// progress token (answered as JSON, not a stream) got a 500 at its
/// cancellation, so its late answer had nowhere to go.
#[tokio::test(flavor = "multi_thread")]
async fn over_http_a_cancelled_calls_late_answer_ends_its_own_stream() {
    let (_keep, url) = start_proxy_http(&[]);
    let session = raw_http_session(&url).await;
    for (id, meta) in [(2, json!({"progressToken": "t"})), (3, json!({}))] {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "slow", "arguments": {}, "_meta": meta}});
        let posted = {
            let (url, session) = (url.clone(), session.clone());
            tokio::spawn(async move { raw_post(&url, Some(&session), &call.to_string()).await })
        };
        // the fixture takes 1 s to answer
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id}});
        assert_eq!(
            raw_post(&url, Some(&session), &cancel.to_string()).await.1,
            202
        );
        let (_, status, body) = tokio::time::timeout(Duration::from_secs(20), posted)
            .await
            .expect("the call's stream did not end within 20 s")
            .unwrap();
        assert_eq!(status, 200, "{meta}: {body}");
        let last = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .next_back()
            .unwrap_or_else(|| panic!("{meta}: no event in {body}"));
        let late: Value = serde_json::from_str(last).unwrap();
        assert_eq!(late["id"], id, "{late}");
        assert_eq!(kernel_of(&late)["outcome"], "cancelled", "{late}");
    }
}

/// A tools/call without a name (no `name`, params that are no object, no
/// params) has a span like any call (`tools/call ?`): its answer carries
/// evidence. Before, it opened none, and its answer had no evidence.
#[test]
fn a_call_without_a_name_has_evidence_too() {
    let mut raw = Raw::fixture(&[], None);
    for (id, params) in [
        (2, Some(json!({"arguments": {}}))),
        (3, Some(json!([1]))),
        (4, None),
    ] {
        let mut call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call"});
        if let Some(p) = params {
            call["params"] = p;
        }
        raw.send(&call.to_string());
        let a = raw.answer();
        assert_eq!(
            (&a["id"], &a["error"]["code"]),
            (&json!(id), &json!(-32602))
        );
        let kernel = kernel_of(&a);
        assert_eq!(kernel["outcome"], "jsonrpc_error", "{a}");
        assert_eq!(kernel["tool"], Value::Null, "{a}");
    }
}

/// A result whose `_meta` is null or not an object: the evidence is where
/// a parser reads it (a null `_meta` becomes an object, a list is kept under
/// `value`). Before, a second `_meta` was added, and parsers kept the
/// server's.
#[test]
fn a_meta_that_is_null_or_no_object_still_carries_the_evidence() {
    let mut raw = Raw::fixture(&[], None);
    for (id, tool, kept) in [
        (2, "meta_null", None),
        (3, "meta_list", Some(json!(["kept"]))),
    ] {
        raw.call(id, tool);
        let line = raw.answer_line();
        assert_eq!(line.matches("\"_meta\"").count(), 1, "{line}");
        let a: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(kernel_of(&a)["outcome"], "ok", "{a}");
        assert_eq!(a["result"]["_meta"].get("value"), kept.as_ref(), "{a}");
        assert_eq!(a["result"]["content"][0]["text"], tool, "{a}");
    }
}

/// A JSON-RPC error whose `data` is a string carries the evidence beside
/// it (`data: {value, probe/kernel}`); an `error` that is not an object
/// (nowhere to put it) is passed on as it is, and the proxy goes on: the
/// next call is answered at once. Before, string data went without
/// evidence, and the `error` that is no object panicked the task reading
/// the server: no answer to it, and none to any later call until
/// `--call-timeout`.
#[test]
fn error_data_of_any_shape_carries_the_evidence_and_an_odd_error_is_survived() {
    let mut raw = Raw::fixture(&["--call-timeout", "60"], None);
    raw.call(2, "error_string_data");
    let a = raw.answer();
    assert_eq!(a["error"]["data"]["value"], "kept", "{a}");
    assert_eq!(kernel_of(&a)["outcome"], "jsonrpc_error", "{a}");
    raw.call(3, "error_not_object");
    let a = raw.answer();
    assert_eq!((&a["id"], &a["error"]), (&json!(3), &json!("boom")), "{a}");
    raw.call(4, "echo");
    let a = raw.answer();
    assert_eq!(a["id"], 4, "{a}");
    assert_eq!(kernel_of(&a)["outcome"], "ok", "{a}");
}

/// A request that is not a call has no span of its own: when the server
/// dies during it, the proxy's -32000 carries the span between calls over
/// that server (the kernel saw it die), or says there was none. The same
/// for a request that reached no server. Before, none of them had
/// `probe/kernel`.
#[test]
fn a_server_gone_during_another_request_still_answers_with_evidence() {
    if !root() {
        return;
    }
    let mut raw = Raw::fixture(&[], Some(&probe_socket()));
    raw.send(r#"{"jsonrpc":"2.0","id":2,"method":"fixture/crash"}"#);
    let a = raw.answer();
    assert_eq!(a["error"]["data"]["proxy"]["reason"], "server_gone", "{a}");
    let kernel = kernel_of(&a);
    assert_eq!(kernel["available"], false, "{a}");
    assert!(
        kernel["reason"].as_str().unwrap().contains("had no span"),
        "{a}"
    );
    // after a call, the span between calls watches the (restarted) server
    raw.call(3, "echo");
    assert_eq!(kernel_of(&raw.answer())["available"], true);
    raw.send(r#"{"jsonrpc":"2.0","id":4,"method":"fixture/crash"}"#);
    let a = raw.answer();
    let kernel = kernel_of(&a);
    assert_eq!(kernel["available"], true, "{a}");
    assert_eq!(kernel["outcome"], "server_gone", "{a}");
    assert_eq!(kernel["exit"]["signal"], "SIGSEGV", "{a}");
    // a server that cannot be started
    let mut raw = Raw::start(&[], None, &["/nonexistent/mcp-server"]);
    raw.send(&raw_initialize(1, "2025-06-18"));
    let a = raw.answer();
    assert_eq!(a["error"]["data"]["proxy"]["reason"], "spawn_failed", "{a}");
    assert_eq!(kernel_of(&a)["available"], false, "{a}");
}

/// The span between calls that cannot be read (the daemon restarted since
/// it began) is said in `before_call`, not taken for one where nothing
/// died. Before, `before_call` was left out, as after a quiet interval.
#[test]
fn a_span_between_calls_that_cannot_be_read_is_said() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (first, socket) = probe_daemon(dir.path());
    let mut raw = Raw::fixture(&[], Some(&socket));
    raw.call(2, "echo");
    let quiet = raw.answer();
    assert_eq!(kernel_of(&quiet)["available"], true, "{quiet}");
    assert!(kernel_of(&quiet).get("before_call").is_none(), "{quiet}");
    // another daemon on the same socket, which never saw the span between calls
    drop(first);
    let again = tempfile::tempdir().unwrap();
    let _second = Killed(
        std::process::Command::new(probe_binary())
            .args(["run", "--socket"])
            .arg(&socket)
            .arg("--db")
            .arg(again.path().join("evidence.db"))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    probe::client::wait_until_ready(&socket, Duration::from_secs(30)).unwrap();
    raw.call(3, "echo");
    let a = raw.answer();
    let kernel = kernel_of(&a);
    assert_eq!(kernel["available"], true, "{a}");
    let before = &kernel["before_call"];
    assert_eq!(before["available"], false, "{a}");
    assert!(
        !before["reason"].as_str().unwrap_or_default().is_empty(),
        "{a}"
    );
}

const TERMINAL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/terminal_server.py"
);

/// How many times each call runs: the verdict must not depend on when the
/// server's own version probes run around it.
const TIMES: usize = 50;

/// A call's verdict as the proxy attached it: the primitive, and the
/// hidden failure's (the terminal server never sets `isError`).
fn verdict_of(r: &CallToolResult) -> (String, String) {
    let (k, _) = split(r);
    assert_eq!(k["available"], true, "{k}");
    assert_eq!(k["failed"], false, "no isError, so exit 0: {k}");
    (
        k["primitive"].as_str().unwrap_or("?").to_owned(),
        k["hidden_failure"]["primitive"]
            .as_str()
            .unwrap_or("-")
            .to_owned(),
    )
}

/// Each command `TIMES` times through `call`; every verdict must be the
/// expected one. Returns how many calls were judged.
async fn judged_every_time<F, Fut>(transport: &str, call: F) -> usize
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = CallToolResult>,
{
    let cases = [
        ("cat /nonexistent/data.csv", ("none", "fs.missing")),
        ("no-such-tool --version", ("none", "exec.missing")),
        ("echo ok", ("none", "-")),
    ];
    let mut judged = 0;
    for (command, expected) in cases {
        let mut seen = std::collections::BTreeMap::new();
        for _ in 0..TIMES {
            let r = call(command.to_string()).await;
            *seen.entry(verdict_of(&r)).or_insert(0) += 1;
            judged += 1;
        }
        let want = (expected.0.to_string(), expected.1.to_string());
        assert_eq!(
            seen.get(&want),
            Some(&TIMES),
            "{transport}: `{command}` judged {seen:?}, not {want:?} {TIMES} times out of {TIMES}"
        );
    }
    judged
}

#[tokio::test(flavor = "multi_thread")]
async fn a_terminal_servers_calls_are_judged_by_their_own_work_and_words_every_time() {
    if !root() {
        return;
    }
    let cmd = ["python3", TERMINAL];
    let b = proxy_stdio(&[], true, &cmd).await;
    let n = judged_every_time("stdio", |command| {
        let b = &b;
        async move { b.call("run_command", json!({"command": command})).await }
    })
    .await;
    assert_eq!(n, 3 * TIMES);

    let (_proxy, client, _handler) = proxy_http(&[], true, &cmd).await;
    let n = judged_every_time("http", |command| {
        let client = &client;
        async move {
            try_call(client, "run_command", json!({"command": command}))
                .await
                .unwrap()
        }
    })
    .await;
    assert_eq!(n, 3 * TIMES);
}

/// A request under an id still in flight is refused with its own answer
/// and never reaches the server; the first is answered, and no span is
/// left open in the daemon. Before, the second replaced the first, whose
/// asker got an error and whose span stayed open for the daemon's life
/// (the soak saw open spans climb by about 90 an hour).
#[test]
fn a_request_reusing_an_id_in_flight_is_refused_and_leaves_no_span_open() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket) = probe_daemon(dir.path());
    let open_spans = || {
        let out = std::process::Command::new(probe_binary())
            .args(["status", "--json", "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["open_spans"]
            .as_u64()
            .unwrap()
    };
    {
        let mut raw = Raw::fixture(&[], Some(&socket));
        for _ in 0..3 {
            // the fixture takes 1 s to answer `slow`
            raw.call(9, "slow");
            std::thread::sleep(Duration::from_millis(300));
            raw.call(9, "slow");
            let refused = raw.answer();
            assert_eq!(refused["id"], 9, "{refused}");
            assert_eq!(refused["error"]["code"], -32600, "{refused}");
            let first = raw.answer();
            assert_eq!(first["id"], 9, "{first}");
            assert!(
                first.get("result").is_some(),
                "the first is answered: {first}"
            );
        }
    }
    // the session is over: its span between calls ended with it
    assert!(
        within(Duration::from_secs(10), || open_spans() == 0),
        "{} spans left open",
        open_spans()
    );
}

/// JSON-RPC asks ids to be unique among requests in flight only: a client
/// may use an answered request's id again. The first request's
/// `--call-timeout` timer must not fire on the second.
#[test]
fn an_answered_requests_timer_does_not_time_out_a_later_request_under_its_id() {
    let mut raw = Raw::fixture(&["--call-timeout", "3"], None);
    raw.call(5, "echo");
    let first = raw.answer();
    assert!(first.get("result").is_some(), "{first}");
    // the first request's timer, had it run on, fires 3 s after it began
    std::thread::sleep(Duration::from_secs(2));
    raw.call(5, "hang");
    let sent = std::time::Instant::now();
    let second = raw.answer();
    let waited = sent.elapsed();
    let message = second["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("did not answer `tools/call` within 3 s"),
        "{second}"
    );
    assert!(
        waited >= Duration::from_millis(2_500),
        "the second request was timed out {waited:?} after it was sent, by the first's timer"
    );
}
