//! The bridge through rmcp's own client, in real processes: exact bytes,
//! argument errors, background processes, timeouts, cancellation, HTTP.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

async fn round_trip(b: &Bridge, name: &str, data: &[u8]) {
    let path = scratch(name);
    let w = b
        .call(
            "write_file",
            json!({"path": path, "content_base64": b64(data), "sha256": sha256(data)}),
        )
        .await;
    assert!(!is_error(&w), "{name}: write failed: {}", text(&w));
    assert_eq!(structured(&w)["sha256"], sha256(data), "{name}");
    assert_eq!(structured(&w)["size"], data.len() as u64, "{name}");
    let r = b.call("read_file", json!({"path": path})).await;
    assert!(!is_error(&r), "{name}: read failed: {}", text(&r));
    let back = blob(&r);
    assert_eq!(back.len(), data.len(), "{name}: length");
    assert!(back == data, "{name}: bytes differ");
    assert_eq!(structured(&r)["sha256"], sha256(data), "{name}");
    assert_eq!(structured(&r)["size"], data.len() as u64, "{name}");
    std::fs::remove_file(&path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn files_round_trip_bit_for_bit_over_stdio() {
    let b = Bridge::stdio(Opts::default()).await;
    round_trip(&b, "empty", b"").await;
    round_trip(&b, "nul-only", &[0u8; 4096]).await;
    round_trip(&b, "invalid-utf8", b"\xff\xfe\xc3\x28 caf\xe9 \x80\x00end").await;
    round_trip(&b, "5mib", &pattern(5 << 20, 5)).await;
    round_trip(&b, "64mib", &pattern(64 << 20, 64)).await;
    let image = png(64, 48);
    round_trip(&b, "image.png", &image).await;
    // images come back as image content too, with their MIME type
    let path = scratch("pic.png");
    b.call(
        "write_file",
        json!({"path": path, "content_base64": b64(&image)}),
    )
    .await;
    let r = b.call("read_file", json!({"path": path})).await;
    assert_eq!(structured(&r)["mime"], "image/png");
    let img = r.content.iter().find_map(|c| match c {
        rmcp::model::ContentBlock::Image(i) => Some(i.clone()),
        _ => None,
    });
    let img = img.expect("image content for a PNG");
    assert_eq!(img.mime_type, "image/png");
    assert_eq!(unb64(&img.data), image);
    std::fs::remove_file(&path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn files_round_trip_over_http() {
    let b = Bridge::http(Opts::default()).await;
    round_trip(&b, "http-invalid-utf8", b"\x00\xff\x00 \xc0\xaf").await;
    round_trip(&b, "http-5mib", &pattern(5 << 20, 7)).await;
    round_trip(&b, "http-64mib", &pattern(64 << 20, 9)).await;
    // the big buffers the bridge kept for reuse are given back once idle
    let rss = || status_bytes(b.pid(), "VmRSS");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while rss() >= 64 << 20 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        rss() < 64 << 20,
        "an idle bridge still holds {} MiB after a 64 MiB transfer",
        rss() >> 20
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn offsets_text_append_and_modes() {
    let b = Bridge::stdio(Opts::default()).await;
    let path = scratch("text.txt");
    let w = b
        .call(
            "write_file",
            json!({"path": path, "text": "héllo\n", "mode": "0600"}),
        )
        .await;
    assert!(!is_error(&w), "{}", text(&w));
    let w = b
        .call(
            "write_file",
            json!({"path": path, "text": "more", "append": true}),
        )
        .await;
    assert_eq!(structured(&w)["size"], 11);
    let r = b
        .call("read_file", json!({"path": path, "offset": 7, "length": 2}))
        .await;
    assert_eq!(blob(&r), b"mo");
    let s = b.call("stat", json!({"path": path})).await;
    assert_eq!(structured(&s)["mode"], "0600");
    assert_eq!(structured(&s)["type"], "file");
    std::fs::remove_file(&path).unwrap();
    // files whose size says 0 and files that are not regular read in full
    let r = b
        .call("read_file", json!({"path": "/proc/sys/kernel/ostype"}))
        .await;
    assert_eq!(blob(&r), b"Linux\n");
    let r = b
        .call(
            "read_file",
            json!({"path": "/proc/sys/kernel/ostype", "offset": 2}),
        )
        .await;
    assert_eq!(blob(&r), b"nux\n");
    let r = b
        .call("read_file", json!({"path": "/dev/zero", "length": 5}))
        .await;
    assert_eq!(blob(&r), b"\0\0\0\0\0");
}

#[tokio::test(flavor = "multi_thread")]
async fn sha256_mismatch_writes_nothing_and_says_so() {
    let b = Bridge::stdio(Opts::default()).await;
    let path = scratch("mismatch");
    let r = b
        .call(
            "write_file",
            json!({"path": path, "content_base64": b64(b"abc"), "sha256": "00".repeat(32)}),
        )
        .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["error"]["argument"], "sha256");
    assert!(
        text(&r).contains("mismatch") && text(&r).contains(&sha256(b"abc")),
        "{}",
        text(&r)
    );
    assert!(
        !std::path::Path::new(&path).exists(),
        "a mismatched write left a file"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn non_utf8_names_are_listed_and_addressable() {
    use std::os::unix::ffi::OsStrExt as _;
    let b = Bridge::stdio(Opts::default()).await;
    let dir = scratch("names");
    std::fs::create_dir(&dir).unwrap();
    let raw = b"caf\xe9-\xff.bin";
    let full = [dir.as_bytes(), b"/", raw].concat();
    std::fs::write(std::ffi::OsStr::from_bytes(&full), b"payload").unwrap();
    std::fs::write(format!("{dir}/ünïcödé.txt"), b"u").unwrap();
    let l = b.call("list_dir", json!({"path": dir})).await;
    let entries = structured(&l)["entries"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 2, "{entries:?}");
    let odd = entries
        .iter()
        .find(|e| e.get("name_base64").is_some())
        .expect("a base64 name");
    assert_eq!(unb64(odd["name_base64"].as_str().unwrap()), raw);
    assert!(
        entries
            .iter()
            .any(|e| e["name"] == "ünïcödé.txt" && e.get("name_base64").is_none())
    );
    // the base64 path reads the file back
    let r = b
        .call("read_file", json!({"path_base64": b64(&full)}))
        .await;
    assert_eq!(blob(&r), b"payload");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_output_with_nul_and_invalid_utf8_is_exact() {
    let b = Bridge::stdio(Opts::default()).await;
    let r = b
        .call(
            "exec",
            json!({"command": "printf 'a\\000b\\377c'; printf 'plain' >&2; exit 3"}),
        )
        .await;
    assert!(!is_error(&r), "{}", text(&r));
    let s = structured(&r);
    assert_eq!(s["exit_code"], 3);
    assert_eq!(s["stdout"]["has_nul"], true);
    assert!(
        s["stdout"].get("text").is_none(),
        "binary stdout must not be text"
    );
    assert_eq!(payload_bytes(&s["stdout"]), b"a\0b\xffc");
    assert_eq!(s["stderr"]["text"], "plain");
    assert_eq!(payload_bytes(&s["stderr"]), b"plain");
    // stdin bytes go in exactly, and argv without a shell
    let data = pattern(100_000, 3);
    let r = b
        .call(
            "exec",
            json!({"argv": ["sha256sum"], "stdin_base64": b64(&data)}),
        )
        .await;
    let out = String::from_utf8(payload_bytes(&structured(&r)["stdout"])).unwrap();
    assert!(out.starts_with(&sha256(&data)), "{out}");
    // env and cwd
    let r = b.call("exec", json!({"argv": ["sh", "-c", "echo $GREETING; pwd"], "env": {"GREETING": "hi"}, "cwd": "/usr"})).await;
    assert_eq!(structured(&r)["stdout"]["text"], "hi\n/usr\n");
    // an explicit cap says so
    let r = b
        .call(
            "exec",
            json!({"command": "head -c 10000 /dev/zero", "max_output_bytes": 100}),
        )
        .await;
    let s = structured(&r);
    assert_eq!(s["stdout"]["truncated"], true);
    assert_eq!(s["stdout"]["bytes"], 100);
    assert_eq!(s["stdout"]["total_bytes"], 10000);
}

#[tokio::test(flavor = "multi_thread")]
async fn run_code_in_python_and_sh() {
    let b = Bridge::stdio(Opts::default()).await;
    let r = b.call("run_code", json!({"language": "python", "code": "import sys\nsys.stdout.buffer.write(bytes(range(256)))"})).await;
    assert_eq!(
        payload_bytes(&structured(&r)["stdout"]),
        (0..=255u8).collect::<Vec<_>>()
    );
    let r = b
        .call(
            "run_code",
            json!({"language": "sh", "code": "echo one; echo two >&2; exit 4"}),
        )
        .await;
    assert_eq!(structured(&r)["exit_code"], 4);
    assert_eq!(structured(&r)["stdout"]["text"], "one\n");
    let r = b
        .call("run_code", json!({"language": "cobol", "code": "x"}))
        .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["error"]["argument"], "language");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_arguments_name_the_argument_and_the_server_stays_up() {
    let mut b = Bridge::stdio(Opts::default()).await;
    let cases = [
        (
            "exec",
            json!({"argv": ["echo", "a\u{0}b"]}),
            "argv[1]",
            "offset 1",
        ),
        (
            "exec",
            json!({"command": "echo", "env": {"K": "v\u{0}"}}),
            "env.K",
            "NUL",
        ),
        ("exec", json!({"argv": []}), "argv", "empty"),
        (
            "exec",
            json!({"argv": ["true"], "command": "true"}),
            "argv",
            "not both",
        ),
        ("exec", json!({"argv": "true"}), "argv", "invalid type"),
        (
            "exec",
            json!({"argv": ["true"], "timeout_ms": "soon"}),
            "timeout_ms",
            "invalid type",
        ),
        (
            "exec",
            json!({"argv": ["true"], "max_output_bytes": 1u64 << 40}),
            "max_output_bytes",
            "limit",
        ),
        (
            "write_file",
            json!({"path": "/tmp/x\u{0}y", "text": "t"}),
            "path",
            "offset 6",
        ),
        (
            "write_file",
            json!({"path": "/tmp/x", "content_base64": "!!!"}),
            "content_base64",
            "invalid base64",
        ),
        (
            "write_file",
            json!({"path": "/tmp/x"}),
            "content_base64",
            "give",
        ),
        (
            "write_file",
            json!({"path": "/tmp/x", "text": "t", "mode": "rwx"}),
            "mode",
            "octal",
        ),
        ("read_file", json!({"path": 42}), "path", "invalid type"),
        (
            "read_file",
            json!({"path": "/tmp/x", "colour": "red"}),
            "colour",
            "unknown field",
        ),
        ("poll_process", json!({"id": 999}), "id", "no process 999"),
        (
            "browser_screenshot",
            json!({"format": "gif"}),
            "format",
            "png or jpeg",
        ),
        (
            "browser_close_tab",
            json!({"index": "one"}),
            "index",
            "invalid type",
        ),
        (
            "kill_process",
            json!({"id": 1, "signal": "SIGWHATEVER"}),
            "id",
            "no process",
        ),
        (
            "record_result",
            json!({"test_id": "t", "domain": "files", "status": "maybe"}),
            "status",
            "not one of",
        ),
    ];
    for (tool, args, argument, needle) in cases {
        let r = b.call(tool, args.clone()).await;
        assert!(is_error(&r), "{tool} {args} should be a tool error");
        let err = &structured(&r)["error"];
        assert_eq!(err["argument"], argument, "{tool} {args}: {err}");
        assert!(
            text(&r).contains(needle),
            "{tool} {args}: `{}` lacks `{needle}`",
            text(&r)
        );
    }
    // unknown tool: a protocol error (invalid params), not a crash
    let e = try_call(&b.client, "no_such_tool", json!({}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("unknown tool"), "{e}");
    // a file that is not there: a tool error with errno
    let r = b
        .call("read_file", json!({"path": "/nonexistent/file"}))
        .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["errno"], "ENOENT");
    assert!(b.alive());
    let r = b
        .call("exec", json!({"argv": ["echo", "still here"]}))
        .await;
    assert_eq!(structured(&r)["stdout"]["text"], "still here\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_json_rpc_gets_errors_and_the_server_stays_up() {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let mut child = tokio::process::Command::new(BRIDGE)
        .args(["serve", "--stdio", "--no-probe", "--max-body", "4M"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = async |line: &[u8]| {
        stdin.write_all(line).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
    };
    send(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#).await;
    let init: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).await;
    // garbage, invalid UTF-8, a NUL, a wrong shape: none may kill the server
    send(b"this is not json").await;
    send(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\xff\"}").await;
    send(b"{\"jsonrpc\":\"2.0\",\"id\":3,\0}").await;
    send(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":"nope"}"#).await;
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{{"name":"exec","arguments":{{"command":"{}"}}}}}}"#,
        "x".repeat(5 << 20)
    );
    send(huge.as_bytes()).await;
    // big lines are checked while they stream through: unterminated JSON,
    // and invalid UTF-8 deep inside a string
    let cut = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"ping","pad":"{}"#,
        "y".repeat(2 << 20)
    );
    send(cut.as_bytes()).await;
    let mut bad = format!(
        r#"{{"jsonrpc":"2.0","id":8,"method":"ping","pad":"{}"#,
        "z".repeat(2 << 20)
    )
    .into_bytes();
    bad.extend_from_slice(b"\xff\xfe\"}");
    send(&bad).await;
    send(br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"exec","arguments":{"argv":["echo","ok"]}}}"#).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut answered = Vec::new();
    while Instant::now() < deadline {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the server stopped answering")
            .unwrap()
            .expect("the server closed stdout");
        let v: Value = serde_json::from_str(&line).expect("stdout carries only JSON-RPC");
        answered.push(v.clone());
        if v["id"] == 5 {
            assert_eq!(
                v["result"]["structuredContent"]["stdout"]["text"], "ok\n",
                "{v}"
            );
            break;
        }
    }
    // every bad line got an error answer: 5 parse errors (two of them on
    // big lines checked while streaming), 1 invalid request, 1 too large
    let codes: Vec<i64> = answered
        .iter()
        .filter_map(|v| v["error"]["code"].as_i64())
        .collect();
    assert_eq!(
        codes.iter().filter(|&&c| c == -32700).count(),
        5,
        "{answered:?}"
    );
    assert!(
        answered
            .iter()
            .any(|v| v["id"] == 4 && v["error"]["code"] == -32600),
        "a well-formed but invalid request is answered with its id: {answered:?}"
    );
    assert!(
        answered.iter().any(|v| v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not UTF-8 (invalid byte at offset 2097"))),
        "invalid UTF-8 deep in a big message is found: {answered:?}"
    );
    assert!(
        answered.iter().any(|v| v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("over this server's limit"))),
        "an oversized message is answered: {answered:?}"
    );
    assert!(child.try_wait().unwrap().is_none(), "the server died");
}

#[tokio::test(flavor = "multi_thread")]
async fn background_processes_stream_take_stdin_and_die_on_kill() {
    let b = Bridge::stdio(Opts::default()).await;
    let (id, _, p) = start_and_poll(
        &b,
        "echo ready; while read line; do echo \"got $line\"; done; echo bye >&2",
    )
    .await;
    assert_eq!(structured(&p)["stdout"]["text"], "ready\n");
    let cursor = structured(&p)["stdout"]["cursor"].as_u64().unwrap();
    b.call(
        "write_stdin",
        json!({"id": id, "text": "one\n", "close": true}),
    )
    .await;
    let mut out = String::new();
    let mut c = cursor;
    let deadline = Instant::now() + Duration::from_secs(20);
    let last = loop {
        let p = b
            .call(
                "poll_process",
                json!({"id": id, "stdout_cursor": c, "wait_ms": 2000}),
            )
            .await;
        let s = structured(&p).clone();
        out.push_str(s["stdout"]["text"].as_str().unwrap_or(""));
        c = s["stdout"]["cursor"].as_u64().unwrap();
        if s["running"] == false {
            break s;
        }
        assert!(Instant::now() < deadline, "process did not end");
    };
    assert_eq!(out, "got one\n");
    assert_eq!(last["exit_code"], 0);
    assert_eq!(last["stderr"]["text"], "bye\n");
    // a process tree killed on request: the grandchild dies too
    let (id, _, p) = start_and_poll(&b, "sleep 300 & echo $!; wait").await;
    let grandchild: i32 = structured(&p)["stdout"]["text"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let cursor = structured(&p)["stdout"]["cursor"].as_u64().unwrap();
    kill_and_wait(&b, id, cursor, "").await;
    assert!(gone(&grandchild.to_string()), "the grandchild survived");
}

/// `start_process` of `command`, then a poll that waits for its first
/// output: (id, start answer, poll answer).
async fn start_and_poll(b: &Bridge, command: &str) -> (u64, CallToolResult, CallToolResult) {
    let r = b.call("start_process", json!({"command": command})).await;
    let id = structured(&r)["id"].as_u64().unwrap();
    let p = b
        .call("poll_process", json!({"id": id, "wait_ms": 5000}))
        .await;
    (id, r, p)
}

/// `kill_process`, then the process's end: killed by SIGKILL.
async fn kill_and_wait(b: &Bridge, id: u64, cursor: u64, context: &str) {
    b.call("kill_process", json!({"id": id})).await;
    // past the output already read, a wait returns at the exit (the exit is recorded
    // after the probe's attribution, so it is not instant)
    let p = b
        .call(
            "poll_process",
            json!({"id": id, "stdout_cursor": cursor, "wait_ms": 10000}),
        )
        .await;
    assert_eq!(structured(&p)["running"], false, "{context}: {p:?}");
    assert_eq!(structured(&p)["signal"], "SIGKILL");
}

/// Protocol 2026-07-28 has no sessions, and rmcp serves each of its
/// requests on a fresh service: the sandbox must still last between calls.
#[tokio::test(flavor = "multi_thread")]
async fn sessionless_clients_keep_their_sandbox_between_calls() {
    for http in [false, true] {
        let o = Opts {
            sessionless: true,
            ..Opts::default()
        };
        let b = if http {
            Bridge::http(o).await
        } else {
            Bridge::stdio(o).await
        };
        let (id, r, p) = start_and_poll(&b, "echo up; exec sleep 300").await;
        assert!(!is_error(&p), "http={http}: {}", text(&p));
        assert_eq!(structured(&p)["pid"], structured(&r)["pid"]);
        assert_eq!(structured(&p)["stdout"]["text"], "up\n");
        let cursor = structured(&p)["stdout"]["cursor"].as_u64().unwrap();
        if let Some(url) = &b.url {
            // answered as one JSON document, without an event stream's framing
            let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}});
            let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                "name": "poll_process", "arguments": {"id": id}, "_meta": meta}});
            let resp = reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "poll_process")
                .body(call.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.headers()["content-type"], "application/json");
            let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
            assert_eq!(v["result"]["structuredContent"]["running"], true, "{v}");
            // every sessionless client of a bridge is in the same sandbox…
            let (other, _) = Bridge::connect_http_as(url, None, true).await.unwrap();
            let p = try_call(&other, "poll_process", json!({"id": id}))
                .await
                .unwrap();
            assert_eq!(structured(&p)["running"], true, "{}", text(&p));
            // …and a client with a session is in its own
            let (own, _) = Bridge::connect_http(url, None).await.unwrap();
            let p = try_call(&own, "poll_process", json!({"id": id}))
                .await
                .unwrap();
            assert!(is_error(&p), "a session saw another's process");
        }
        kill_and_wait(&b, id, cursor, &format!("http={http}")).await;
    }
}

/// A session's call whose answer is all its stream would hold comes back
/// as one JSON document, which a client reads to its end and so keeps the
/// connection for the next call (rmcp's client opened one per call on the
/// event stream); a call that sends progress first stays a stream.
#[tokio::test(flavor = "multi_thread")]
async fn session_calls_are_answered_as_json_unless_progress_comes_first() {
    let (_child, url) = Bridge::start_http(&Opts::default());
    let http = reqwest::Client::new();
    let post = |body: Value, session: Option<String>| {
        let mut req = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(s) = session {
            req = req
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-11-25");
        }
        async move {
            let resp = req.send().await.unwrap();
            let ct = resp
                .headers()
                .get("content-type")
                .map_or(String::new(), |v| v.to_str().unwrap().to_string());
            let sid = resp
                .headers()
                .get("mcp-session-id")
                .map(|v| v.to_str().unwrap().to_string());
            (
                ct,
                sid,
                String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap(),
            )
        }
    };
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}});
    let (ct, sid, _) = post(init, None).await;
    assert_eq!(ct, "application/json");
    let sid = sid.expect("a session id");
    post(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(sid.clone()),
    )
    .await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "exec", "arguments": {"argv": ["true"]}}});
    let (ct, _, body) = post(call, Some(sid.clone())).await;
    assert_eq!(ct, "application/json", "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"]["structuredContent"]["exit_code"], 0, "{v}");
    let slow = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "exec", "arguments": {"argv": ["sleep", "1.5"]},
        "_meta": {"progressToken": "p1"}}});
    let (ct, _, body) = post(slow, Some(sid)).await;
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let progress = body.find("notifications/progress").expect("progress");
    let answer = body.find("\"result\"").expect("the answer");
    assert!(progress < answer, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_kill_the_tree_and_say_timeout() {
    let b = Bridge::stdio(Opts::default()).await;
    let marker = scratch("timeout-pid");
    let start = Instant::now();
    let r = b
        .call(
            "exec",
            json!({"command": format!("sleep 300 & echo $! > {marker}; wait"), "timeout_ms": 500}),
        )
        .await;
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(is_error(&r));
    assert_eq!(structured(&r)["timed_out"], true);
    assert!(text(&r).starts_with("timeout"), "{}", text(&r));
    let pid = std::fs::read_to_string(&marker).unwrap();
    assert!(gone(&pid), "sleep survived the timeout");
    std::fs::remove_file(&marker).unwrap();
}

/// What a call leaves running dies when it ends, even a process that left
/// the call's process group: the call's cgroup holds it (root only).
#[tokio::test(flavor = "multi_thread")]
async fn a_call_leaves_nothing_running_even_in_a_new_session() {
    if !root() {
        return;
    }
    let b = Bridge::stdio(Opts::default()).await;
    let r = b
        .call(
            "exec",
            json!({"command": "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"}),
        )
        .await;
    assert_eq!(structured(&r)["exit_code"], 0, "{}", text(&r));
    let pid = structured(&r)["stdout"]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(gone(&pid), "the setsid child {pid} outlived its call");
}

/// An empty call cgroup serves the session's next call (no mkdir, no
/// rmdir); one that held a leftover is removed with it, never reused.
#[tokio::test(flavor = "multi_thread")]
async fn an_empty_call_cgroup_serves_the_next_call_and_a_dirty_one_goes() {
    if !root() {
        return;
    }
    let b = Bridge::stdio(Opts::default()).await;
    let v2 = |r: &rmcp::model::CallToolResult| -> String {
        let out = structured(r)["stdout"]["text"]
            .as_str()
            .unwrap()
            .to_string();
        let line = out
            .lines()
            .find(|l| l.starts_with("0::"))
            .expect("a cgroup v2 line");
        line["0::".len()..].to_string()
    };
    let first = v2(&b
        .call("exec", json!({"argv": ["cat", "/proc/self/cgroup"]}))
        .await);
    assert!(first.contains("/agent-bridge/mcp-"), "{first}");
    let again = v2(&b
        .call("exec", json!({"argv": ["cat", "/proc/self/cgroup"]}))
        .await);
    assert_eq!(again, first, "the empty cgroup was not reused");
    let r = b
        .call(
            "exec",
            json!({"command": "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; cat /proc/self/cgroup"}),
        )
        .await;
    assert_eq!(v2(&r), first);
    let out = structured(&r)["stdout"]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let pid = out.lines().next().unwrap().to_string();
    assert!(gone(&pid), "the leftover {pid} outlived its call");
    let dir = agent_bridge::cgroup::v2_root()
        .unwrap()
        .join(first.trim_start_matches('/'));
    let deadline = Instant::now() + Duration::from_secs(10);
    while dir.exists() {
        assert!(
            Instant::now() < deadline,
            "{} was not removed",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fresh = v2(&b
        .call("exec", json!({"argv": ["cat", "/proc/self/cgroup"]}))
        .await);
    assert_ne!(fresh, first, "a cgroup that held a leftover was reused");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_workload_reports_its_signal() {
    let b = Bridge::stdio(Opts::default()).await;
    let r = b.call("exec", json!({"command": "kill -9 $$"})).await;
    assert_eq!(structured(&r)["signal"], "SIGKILL");
    assert_eq!(structured(&r)["exit_code"], Value::Null);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_call_kills_its_workload() {
    use rmcp::model::{CallToolRequestParams, ClientRequest, Request};
    let b = Bridge::stdio(Opts::default()).await;
    let marker = scratch("cancel-pid");
    let params = CallToolRequestParams::new("exec").with_arguments(
        json!({"command": format!("echo $$ > {marker}; exec sleep 300")})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let handle = b
        .client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        if let Ok(p) = std::fs::read_to_string(&marker)
            && !p.trim().is_empty()
        {
            break p.trim().to_string();
        }
        assert!(Instant::now() < deadline, "workload never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    handle.cancel(Some("test cancels".into())).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(&pid) {
        assert!(
            Instant::now() < deadline,
            "the cancelled workload is still running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // the session still works
    let r = b.call("exec", json!({"argv": ["true"]})).await;
    assert_eq!(structured(&r)["exit_code"], 0);
    std::fs::remove_file(&marker).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn long_calls_send_progress() {
    // sessionless HTTP answers plain JSON, unless a call has news before
    // its answer: then an event stream, so no notification is lost
    for sessionless_http in [false, true] {
        let b = if sessionless_http {
            Bridge::http(Opts {
                sessionless: true,
                ..Opts::default()
            })
            .await
        } else {
            Bridge::stdio(Opts::default()).await
        };
        let r = b.call("exec", json!({"command": "sleep 2.5"})).await;
        assert_eq!(structured(&r)["exit_code"], 0);
        let n = b.handler.progress.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            n >= 2,
            "{n} progress notifications for a 2.5 s call (sessionless HTTP: {sessionless_http})"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sixteen_concurrent_http_sessions() {
    // more than the default one protocol thread: sessions served in parallel
    let opts = Opts {
        extra: vec!["--async-threads".into(), "4".into()],
        ..Opts::default()
    };
    let (mut child, url) = Bridge::start_http(&opts);
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let (client, _) = Bridge::connect_http(&url, None).await.unwrap();
            let data = pattern(200_000 + i as usize, i + 100);
            let path = scratch(&format!("concurrent-{i}"));
            for round in 0..3 {
                let r = try_call(
                    &client,
                    "exec",
                    json!({"argv": ["echo", format!("session {i} round {round}")]}),
                )
                .await
                .unwrap();
                assert_eq!(
                    structured(&r)["stdout"]["text"],
                    format!("session {i} round {round}\n")
                );
            }
            try_call(
                &client,
                "write_file",
                json!({"path": path, "content_base64": b64(&data)}),
            )
            .await
            .unwrap();
            let r = try_call(&client, "read_file", json!({"path": path}))
                .await
                .unwrap();
            assert!(blob(&r) == data, "session {i}: bytes differ");
            std::fs::remove_file(&path).unwrap();
            client.cancel().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(child.alive());
}

#[tokio::test(flavor = "multi_thread")]
async fn http_guards_token_origin_and_body_size() {
    let opts = Opts {
        extra: vec![
            "--token".into(),
            "s3cret".into(),
            "--max-body".into(),
            "1M".into(),
        ],
        ..Opts::default()
    };
    let (mut child, url) = Bridge::start_http(&opts);
    assert!(
        Bridge::connect_http(&url, None).await.is_err(),
        "no token must be refused"
    );
    assert!(Bridge::connect_http(&url, Some("wrong")).await.is_err());
    let (client, _) = Bridge::connect_http(&url, Some("s3cret")).await.unwrap();
    let r = try_call(&client, "exec", json!({"argv": ["echo", "authorised"]}))
        .await
        .unwrap();
    assert_eq!(structured(&r)["stdout"]["text"], "authorised\n");
    // oversized: 413 at once on the declared length, and the server stays
    // up. Raw, without the body: a client still uploading when the 413
    // closes the connection may get a broken pipe instead of the answer
    // (rmcp's and reqwest's both did, now and then)
    {
        use std::io::Write as _;
        let addr = host_port(&url);
        let mut s = raw_connect(&addr);
        let head = post_head(&addr, 2 << 20).replacen(
            "\r\n\r\n",
            "\r\nAuthorization: Bearer s3cret\r\n\r\n",
            1,
        );
        s.write_all(head.as_bytes()).unwrap();
        let answer = read_until_closed(&mut s);
        assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let resp = http
        .post(&url)
        .bearer_auth("s3cret")
        .header("origin", "https://evil.example")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    let (client, _) = Bridge::connect_http(&url, Some("s3cret")).await.unwrap();
    let r = try_call(&client, "exec", json!({"argv": ["echo", "still up"]}))
        .await
        .unwrap();
    assert_eq!(structured(&r)["stdout"]["text"], "still up\n");
    assert!(child.alive());
    drop(child);
    // a public address without a token is refused at start
    let out = std::process::Command::new(BRIDGE)
        .args(["serve", "--no-probe", "--http", "0.0.0.0:0"])
        .env_remove("AGENT_BRIDGE_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bearer token is required"));
}

/// An answer goes out as several small writes (SSE priming event, message,
/// end of stream). With Nagle's algorithm on the server's socket, a client
/// that writes a request's headers and body apart (Python's http.client)
/// waited for a delayed ACK: 40 ms per call. The server's end of a live
/// connection is inspected directly, through pidfd_getfd.
#[tokio::test(flavor = "multi_thread")]
async fn http_connections_send_small_writes_at_once() {
    use std::io::{Read as _, Write as _};
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    let (child, url) = Bridge::start_http(&Opts::default());
    let pid = child.0.id() as i32;
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    // an answered request: the server has accepted and set up the connection
    conn.write_all(b"DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut status = [0u8; 12];
    conn.read_exact(&mut status).unwrap();
    assert!(status.starts_with(b"HTTP/1.1 "), "{status:?}");
    let client_port = conn.local_addr().unwrap().port();
    let port_of = |field: &str| {
        field
            .split(':')
            .nth(1)
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    let tcp = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    let inode = tcp
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| port_of(f[1]) == Some(addr.port()) && port_of(f[2]) == Some(client_port))
        .map(|f| f[9].to_string())
        .expect("the server's end of the connection in /proc/PID/net/tcp");
    let fd: i32 = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .find(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy() == format!("socket:[{inode}]"))
        })
        .and_then(|e| e.file_name().to_string_lossy().parse().ok())
        .expect("the bridge's descriptor of the connection");
    // SAFETY: plain syscalls; the returned descriptors are checked and owned.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) } as i32;
    assert!(dup >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
    let sock = unsafe { OwnedFd::from_raw_fd(dup) };
    let mut on: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into a c_int of the length given.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&mut on as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "getsockopt: {}", std::io::Error::last_os_error());
    assert_eq!(
        on, 1,
        "TCP_NODELAY is off on the bridge's end of an HTTP connection"
    );
}

/// The bridge keeps two connections to the probe daemon (spans begin on one,
/// end on the other). After the daemon restarts (killed, as a supervisor
/// would find it), the very next call carries its attribution: neither
/// connection loses it to the old daemon (nor leaves its span open in the
/// new one).
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_probe_daemon_is_picked_up_at_once() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("probe.sock");
    let start = || probe_daemon(dir.path()).0;
    let mut daemon = start();
    let b = Bridge::stdio(Opts {
        probe_at: Some(socket.clone()),
        ..Opts::default()
    })
    .await;
    let r = b.call("exec", json!({"argv": ["true"]})).await;
    assert_eq!(structured(&r)["kernel"]["available"], true, "{r:?}");
    for signal in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGKILL,
    ] {
        // a new daemon on the same socket
        let pid = nix::unistd::Pid::from_raw(daemon.0.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        daemon.0.wait().unwrap();
        daemon = start();
        let r = b.call("exec", json!({"argv": ["false"]})).await;
        let kernel = &structured(&r)["kernel"];
        assert_eq!(kernel["available"], true, "after {signal}: {kernel}");
        assert_eq!(kernel["exit"]["code"], 1, "after {signal}: {kernel}");
    }
}

/// The workload's words reach the probe: a missing file only its output
/// names (the path comes from the environment, not the command) is
/// `fs.missing`; a program failing by its own logic after lookups nothing
/// names is `none`, with those lookups listed as noticed. The same for a
/// background process.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_lookup_is_the_cause_only_when_the_workloads_words_name_it() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket) = probe_daemon(dir.path());
    let b = Bridge::stdio(Opts {
        probe_at: Some(socket),
        ..Opts::default()
    })
    .await;
    let read = "import os; open(os.environ['INPUT']).read()";
    let r = b
        .call(
            "exec",
            json!({"argv": ["python3", "-c", read], "env": {"INPUT": "/nonexistent-words/in.csv"}}),
        )
        .await;
    let kernel = &structured(&r)["kernel"];
    assert_eq!(kernel["primitive"], "fs.missing", "{kernel}");
    assert_eq!(kernel["decisive"]["path"], "/nonexistent-words/in.csv");
    assert!(
        kernel["explanation"]
            .as_str()
            .unwrap()
            .ends_with("(the workload's own output names it)"),
        "{kernel}"
    );
    // its own logic, after lookups it got past or never needed
    let r = b
        .call(
            "exec",
            json!({"argv": ["python3", "-c", "raise ValueError('bad input')"]}),
        )
        .await;
    let kernel = &structured(&r)["kernel"];
    assert_eq!(kernel["exit"]["code"], 1, "{kernel}");
    assert_eq!(kernel["primitive"], "none", "{kernel}");
    assert_eq!(kernel["layer"], "test", "{kernel}");
    // a background process's words too
    let r = b
        .call(
            "start_process",
            json!({"argv": ["python3", "-c", read], "env": {"INPUT": "/nonexistent-words/bg.csv"}}),
        )
        .await;
    let id = structured(&r)["id"].clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let kernel = loop {
        let r = b.call("poll_process", json!({"id": id})).await;
        let k = structured(&r)["kernel"].clone();
        if k.is_object() {
            break k;
        }
        assert!(std::time::Instant::now() < deadline, "{r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(kernel["primitive"], "fs.missing", "{kernel}");
    assert_eq!(kernel["decisive"]["path"], "/nonexistent-words/bg.csv");
}

/// A daemon that accepts connections and never answers costs a call a few
/// seconds, not the bridge: the workload runs untraced, the call says why,
/// and the next call is answered too (a lone launch holds the bridge's
/// async thread while its workload waits for `begin_span`).
#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_that_never_answers_costs_a_call_seconds_not_the_bridge() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        // holds every connection open, reads nothing, answers nothing
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn);
        }
    });
    let b = Bridge::stdio(Opts {
        probe_at: Some(socket),
        ..Opts::default()
    })
    .await;
    for _ in 0..2 {
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            b.call("exec", json!({"argv": ["echo", "ran"]})),
        )
        .await
        .expect("the call hung on the silent daemon");
        let s = structured(&r);
        assert_eq!(s["exit_code"], 0, "{r:?}");
        assert_eq!(payload_bytes(&s["stdout"]), b"ran\n");
        assert_eq!(s["kernel"]["available"], false, "{r:?}");
        let reason = s["kernel"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("did not answer"), "{reason}");
    }
    // a query waits its 5 s and says why it has nothing, in words
    let r = b.call("kernel_evidence", json!({})).await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let s = structured(&r);
    assert_eq!(s["kernel"]["available"], false, "{r:?}");
    let reason = s["kernel"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("did not answer within 5 s") && !reason.contains("os error"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn interface_faults_corrupt_and_are_announced() {
    let b = Bridge::stdio(Opts {
        fault: Some("lossy-utf8"),
        ..Opts::default()
    })
    .await;
    let info = b.client.peer_info().unwrap();
    let name = &info.server_info.as_ref().unwrap().name;
    assert!(
        name.contains("INTERFACE FAULT") && name.contains("lossy-utf8"),
        "{name}"
    );
    let data = b"\x89PNG\r\n\x1a\n\xff\xfe binary";
    let path = scratch("fault.bin");
    let w = b
        .call(
            "write_file",
            json!({"path": path, "content_base64": b64(data)}),
        )
        .await;
    assert_eq!(structured(&w)["interface_fault"], "lossy-utf8");
    let on_disk = std::fs::read(&path).unwrap();
    assert_ne!(on_disk, data, "lossy-utf8 must corrupt the write");
    assert!(String::from_utf8(on_disk).unwrap().contains('\u{fffd}'));
    std::fs::remove_file(&path).unwrap();
    let b = Bridge::stdio(Opts {
        fault: Some("nul-truncate"),
        ..Opts::default()
    })
    .await;
    let r = b
        .call("exec", json!({"command": "printf 'ab\\000cd'"}))
        .await;
    assert_eq!(payload_bytes(&structured(&r)["stdout"]), b"ab");
}

#[tokio::test(flavor = "multi_thread")]
async fn record_result_writes_the_results_db() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("results.db");
    let b = Bridge::stdio(Opts {
        extra: vec!["--results-db".into(), db.display().to_string()],
        ..Opts::default()
    })
    .await;
    let r = b
        .call(
            "record_result",
            json!({"test_id": "files-001", "domain": "files", "status": "fail",
            "layer": "sandbox", "primitive": "fs.readonly", "notes": "EROFS on /tmp", "run": "r1"}),
        )
        .await;
    assert!(!is_error(&r), "{}", text(&r));
    b.call(
        "record_result",
        json!({"test_id": "files-001", "domain": "files", "status": "pass", "run": "r1"}),
    )
    .await;
    let r = b
        .call(
            "record_result",
            json!({"test_id": "x", "domain": "d", "status": "fail", "primitive": "fs.bogus"}),
        )
        .await;
    assert_eq!(structured(&r)["error"]["argument"], "primitive");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let rows: Vec<(String, String)> = conn
        .prepare("SELECT test_id, status FROM recorded_results WHERE run = 'r1'")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows, vec![("files-001".to_string(), "pass".to_string())]);
}

#[tokio::test(flavor = "multi_thread")]
async fn call_cgroups_left_by_a_killed_bridge_are_swept_at_start() {
    if !root() {
        return;
    }
    let root = agent_bridge::cgroup::v2_root().expect("a cgroup2 mount");
    // a bridge that was SIGKILLed mid-call leaves its call cgroup behind
    let stale = root.join("agent-bridge/mcp-4000000-1-0-7");
    std::fs::create_dir_all(&stale).unwrap();
    let mut b = Bridge::stdio(Opts::default()).await;
    let r = b.call("exec", json!({"argv": ["true"]})).await;
    assert_eq!(structured(&r)["exit_code"], 0);
    assert!(!stale.exists(), "the stale cgroup was not swept");
    assert!(b.alive());
}

/// W3C trace context in a tools/call's `params._meta` (SEP-414) reaches
/// the probe daemon: the span it exports over OTLP is a child of the
/// caller's span, named and attributed after the MCP conventions.
#[tokio::test(flavor = "multi_thread")]
async fn trace_context_in_meta_reaches_the_probe_span_over_otlp() {
    use probe::otlp::hex;
    use probe::otlp_receiver::{Receiver, attr, attr_str};
    if !root() {
        return;
    }
    let rx = Receiver::start().unwrap();
    let dir = std::path::PathBuf::from(scratch("otlp-probe"));
    let (_probe, socket) = otlp_probe(&dir, &rx.url());
    let b = Bridge::stdio(Opts {
        probe_at: Some(socket),
        ..Default::default()
    })
    .await;
    let (trace, parent) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let r = call_with_meta(
        &b.client,
        "exec",
        json!({"argv": ["cat", "/nonexistent-otlp-bridge/data.csv"]}),
        json!({"traceparent": format!("00-{trace}-{parent}-01"), "tracestate": "k=v"}),
    )
    .await;
    assert!(!is_error(&r));
    assert_eq!(structured(&r)["kernel"]["primitive"], "fs.missing");
    let exec_span = structured(&r)["kernel"]["span"].as_u64().unwrap();
    // a file tool whose worker fails: the result is an error
    let r = call_with_meta(
        &b.client,
        "read_file",
        json!({"path": "/nonexistent-otlp-bridge/other"}),
        json!({}),
    )
    .await;
    assert!(is_error(&r));
    let read_span = structured(&r)["kernel"]["span"].as_u64().unwrap();
    assert!(rx.wait_for(2, Duration::from_secs(10)));
    let spans = rx.spans();
    let find = |id: u64| {
        spans
            .iter()
            .map(|r| &r.span)
            .find(|s| {
                matches!(attr(&s.attributes, "probe.span_id"),
                    Some(probe::otlp::any_value::Value::IntValue(v)) if *v as u64 == id)
            })
            .unwrap_or_else(|| panic!("span {id} exported: {spans:?}"))
    };
    let s = find(exec_span);
    assert_eq!(s.name, "tools/call exec");
    assert_eq!(hex(&s.trace_id), trace);
    assert_eq!(hex(&s.parent_span_id), parent);
    assert_eq!(s.trace_state, "k=v");
    assert_eq!(
        attr_str(&s.attributes, "mcp.method.name"),
        Some("tools/call")
    );
    assert_eq!(attr_str(&s.attributes, "gen_ai.tool.name"), Some("exec"));
    assert_eq!(
        attr_str(&s.attributes, "probe.primitive"),
        Some("fs.missing")
    );
    // exec's failing command is a result, not a tool error
    assert!(attr(&s.attributes, "error.type").is_none());
    // stdio has no MCP session id
    assert!(attr(&s.attributes, "mcp.session.id").is_none());
    let s = find(read_span);
    assert_eq!(s.name, "tools/call read_file");
    assert!(
        s.parent_span_id.is_empty(),
        "no trace context: a trace of its own"
    );
    assert_eq!(attr_str(&s.attributes, "error.type"), Some("tool_error"));
}

/// A raw stdio session: initialized, then `calls` written (not awaited).
fn raw_session(argv: &[&str], calls: &[Value]) -> std::process::Child {
    use std::io::Write as _;
    let mut child = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdin = child.stdin.as_mut().unwrap();
    let mut lines = vec![
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ];
    lines.extend(calls.iter().cloned());
    for (i, l) in lines.iter().enumerate() {
        let mut l = l.clone();
        if l.get("id").is_none() && l.get("method").is_some_and(|m| m == "tools/call") {
            l["id"] = json!(i);
            l["jsonrpc"] = json!("2.0");
        }
        writeln!(stdin, "{l}").unwrap();
    }
    child
}

fn tool_call(name: &str, arguments: Value) -> Value {
    json!({"method": "tools/call", "params": {"name": name, "arguments": arguments}})
}

/// Nothing a session started outlives its server: a background process and
/// an exec in flight die with a SIGKILLed bridge, and a proxied server's
/// whole tree with a proxy whose client went away; no call cgroup is left.
#[test]
fn workloads_die_with_their_server_however_it_ends() {
    if !root() {
        return;
    }
    let background = ["sleep", "3001"];
    let in_flight = ["sleep", "3002"];
    let mut bridge = raw_session(
        &[BRIDGE, "serve", "--stdio", "--no-probe"],
        &[
            tool_call("start_process", json!({"argv": background})),
            tool_call("exec", json!({"argv": in_flight, "timeout_ms": 600000})),
        ],
    );
    assert!(
        within_10s(|| !running(&background).is_empty() && !running(&in_flight).is_empty()),
        "the workloads did not start"
    );
    let pid = bridge.id();
    assert!(
        !call_cgroups_of(pid).is_empty(),
        "no call cgroup while they run"
    );
    bridge.kill().unwrap();
    bridge.wait().unwrap();
    assert!(
        within_10s(|| running(&background).is_empty() && running(&in_flight).is_empty()),
        "still running after the bridge was SIGKILLed: {:?} {:?}",
        running(&background),
        running(&in_flight)
    );
    assert!(
        within_10s(|| call_cgroups_of(pid).is_empty()),
        "{:?}",
        call_cgroups_of(pid)
    );

    // the proxy's client closes stdin: the proxy exits, and the server it
    // ran (here the bridge, with a background process) goes with it
    let proxied = ["sleep", "3003"];
    let mut proxy = raw_session(
        &[
            BRIDGE,
            "proxy",
            "--stdio",
            "--probe-socket",
            "/nonexistent/probe.sock",
            "--",
            BRIDGE,
            "serve",
            "--stdio",
            "--no-probe",
        ],
        &[tool_call("start_process", json!({"argv": proxied}))],
    );
    assert!(
        within_10s(|| !running(&proxied).is_empty()),
        "the proxied workload did not start"
    );
    let pid = proxy.id();
    drop(proxy.stdin.take());
    proxy.wait().unwrap();
    assert!(
        within_10s(|| running(&proxied).is_empty()),
        "still running after the proxy exited: {:?}",
        running(&proxied)
    );
    assert!(
        within_10s(|| call_cgroups_of(pid).is_empty()),
        "{:?}",
        call_cgroups_of(pid)
    );
}

/// Too many, idle and stalled HTTP connections are refused or closed (see
/// `assert_connection_limits`); a call longer than the idle timeout is not.
#[tokio::test(flavor = "multi_thread")]
async fn http_connections_are_capped_and_timed_out_and_a_long_call_is_not_cut() {
    let limits = TIGHT_CONNECTION_LIMITS;
    let o = Opts {
        extra: limits.map(String::from).to_vec(),
        ..Opts::default()
    };
    let (_child, url) = Bridge::start_http(&o);
    let checked = url.clone();
    tokio::task::spawn_blocking(move || assert_connection_limits(&checked))
        .await
        .unwrap();
    // a request in flight for longer than the idle timeout keeps its connection
    let (client, _h) = Bridge::connect_http(&url, None).await.unwrap();
    let r = try_call(
        &client,
        "exec",
        json!({"argv": ["sh", "-c", "sleep 2.5; echo done"]}),
    )
    .await
    .unwrap();
    assert_eq!(structured(&r)["stdout"]["text"], "done\n");
}

/// A request whose Content-Length is over `--max-body` is answered 413 at
/// once, not 408 at `--body-timeout` (see
/// `assert_declared_too_large_refused_at_once`).
#[test]
fn http_a_body_declared_over_max_body_is_refused_at_once() {
    let o = Opts {
        extra: ["--max-body", "1M", "--body-timeout", "60"]
            .map(String::from)
            .to_vec(),
        ..Opts::default()
    };
    let (_child, url) = Bridge::start_http(&o);
    assert_declared_too_large_refused_at_once(&url, "--max-body");
}

/// SIGTERM while clients are stalled mid-body: they get 503 and the bridge
/// exits at once, not at `--body-timeout` (see
/// `assert_sigterm_cuts_stalled_bodies`).
#[test]
fn http_sigterm_answers_stalled_bodies_and_exits() {
    let o = Opts {
        extra: ["--body-timeout", "60"].map(String::from).to_vec(),
        ..Opts::default()
    };
    let (child, url) = Bridge::start_http(&o);
    assert_sigterm_cuts_stalled_bodies(child, &url);
}

/// Over HTTP a body the server cannot use is refused as JSON-RPC says, with
/// a JSON-RPC error object: 400 and -32700 for one that is not JSON (small
/// or big), 400 and -32600 for JSON that is not a message, 400 and -32700
/// for a body the client cut short, and -32602 (with the request's id) for
/// a tools/call without a name, never rmcp's -32601.
#[tokio::test(flavor = "multi_thread")]
async fn http_refusals_are_jsonrpc_errors() {
    let (_child, url) = Bridge::start_http(&Opts::default());
    let http = reqwest::Client::new();
    let post = |body: Vec<u8>| {
        let req = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let ct = resp
                .headers()
                .get("content-type")
                .map_or(String::new(), |v| v.to_str().unwrap().to_string());
            let body = resp.bytes().await.unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap_or_else(|_| {
                panic!(
                    "{status} {ct}: not JSON: {}",
                    String::from_utf8_lossy(&body)
                )
            });
            (status, ct, v)
        }
    };
    let big_garbage = format!("{{\"x\": \"{}\" nope", "a".repeat(100 << 10)).into_bytes();
    for (body, code) in [
        (b"not json".to_vec(), -32700),
        (b"{\"a\":\"\xff\"}".to_vec(), -32700),
        (big_garbage, -32700),
        (br#"{"jsonrpc":"2.0","id":3}"#.to_vec(), -32600),
    ] {
        let (status, ct, v) = post(body).await;
        assert_eq!((status, ct.as_str()), (400, "application/json"), "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
    }
    let (status, _, v) = post(
        br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"arguments":{}}}"#.to_vec(),
    )
    .await;
    assert_eq!(
        (status, v["error"]["code"].clone(), v["id"].clone()),
        (200, json!(-32602), json!(9)),
        "{v}"
    );
    // a body that stops short of its Content-Length: the client hangs up
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 200000\r\n\r\n{{\"jsonrpc\":"
        )
        .unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
    .await
    .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("-32700"),
        "{answer}"
    );
}

/// Over HTTP too: a second `initialize` in a session is refused with its
/// id (the session keeps its protocol), and an id no i64 holds gets -32600
/// with id null, not a float's rounding of it.
#[tokio::test(flavor = "multi_thread")]
async fn over_http_a_second_initialize_is_refused_and_inexact_ids_are_null() {
    let (_child, url) = Bridge::start_http(&Opts::default());
    let session = raw_http_session(&url).await;
    let session = Some(session.as_str());
    let (_, status, again) = raw_post(&url, session, &raw_initialize(2, "junk")).await;
    let again: Value = serde_json::from_str(&again).unwrap();
    assert_eq!(
        (status, &again["id"], &again["error"]["code"]),
        (400, &json!(2), &json!(-32600)),
        "{again}"
    );
    assert!(
        again["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already initialized"),
        "{again}"
    );
    let big = r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}"#;
    let (_, status, answer) = raw_post(&url, session, big).await;
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        (status, &answer["id"], &answer["error"]["code"]),
        (400, &Value::Null, &json!(-32600)),
        "{answer}"
    );
    // the session goes on under the protocol it agreed
    let (_, status, ping) =
        raw_post(&url, session, r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).await;
    assert_eq!(
        (
            status,
            serde_json::from_str::<Value>(&ping).unwrap()["result"].clone()
        ),
        (200, json!({})),
        "{ping}"
    );
}

/// A second `initialize` in a session is refused with its id, and the
/// session goes on under the protocol it agreed (ping still answered); a
/// `tools/list` cursor the server never gave out is Invalid params (it was
/// answered with the whole list again).
#[test]
fn a_second_initialize_and_a_cursor_never_given_out_are_refused() {
    use std::io::Write as _;
    let mut child = std::process::Command::new(BRIDGE)
        .args(["serve", "--stdio", "--no-probe"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let init = |id: u64, version: &str| json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let stdin = child.stdin.as_mut().unwrap();
    for l in [
        init(1, "2025-06-18"),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        init(2, "junk"),
        json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {"cursor": "cursor_AAAA"}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}}),
    ] {
        writeln!(stdin, "{l}").unwrap();
    }
    // stdin stays open until all five are answered: a server whose client
    // closed stdin may exit before answering what it had read
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let answers: Vec<Value> = (0..5)
        .map(|i| {
            let line = rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("answer {i} of 5 did not come: {e}"));
            serde_json::from_str(&line).unwrap()
        })
        .collect();
    drop(child.stdin.take());
    child.wait().unwrap();
    let by_id = |id: u64| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        by_id(1)["result"]["protocolVersion"],
        "2025-06-18",
        "{answers:?}"
    );
    assert_eq!(by_id(2)["error"]["code"], -32600, "{answers:?}");
    assert!(
        by_id(2)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already initialized")
    );
    assert_eq!(by_id(3)["result"], json!({}), "{answers:?}");
    assert_eq!(by_id(4)["error"]["code"], -32602, "{answers:?}");
    assert!(
        by_id(4)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown cursor `cursor_AAAA`")
    );
    assert!(by_id(5)["result"]["tools"].as_array().unwrap().len() > 10);
}

/// Inside gVisor no probe can run (no bpf(2), no tracepoints): the bridge
/// still serves, and every call's `kernel` says so in one sentence naming
/// gVisor, not a socket error.
#[tokio::test(flavor = "multi_thread")]
async fn under_gvisor_the_bridge_serves_and_says_why_there_is_no_kernel_evidence() {
    if !root() {
        return;
    }
    let runsc = std::process::Command::new("sh")
        .args(["-c", "command -v runsc"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        runsc || !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
        "runsc is missing (cargo xtask setup installs it); CI=true forbids skipping"
    );
    if !runsc {
        eprintln!("SKIPPED: runsc is not installed");
        return;
    }
    let args: Vec<String> = ["serve", "--stdio", "--probe-socket", "/run/probe/none.sock"]
        .map(String::from)
        .to_vec();
    let b = Bridge::stdio_under(&["runsc", "--network=none", "do"], &args, false)
        .await
        .expect("MCP handshake with the bridge inside gVisor");
    let r = b.call("exec", json!({"argv": ["echo", "ran"]})).await;
    let s = structured(&r);
    assert_eq!(s["exit_code"], 0, "{r:?}");
    assert_eq!(payload_bytes(&s["stdout"]), b"ran\n");
    assert_eq!(s["kernel"]["available"], false, "{r:?}");
    let reason = s["kernel"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("gVisor") && reason.contains("docs/KERNELS.md"),
        "{reason}"
    );
    assert!(!reason.contains("os error"), "{reason}");
}

/// A shell kept between calls (a background process reading commands on
/// stdin) with a timer of its own that runs programs around them: the
/// command that failed is named from the process's own words, the same
/// verdict every time, whatever the timer ran meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_persistent_shells_failed_command_is_named_from_its_words_every_time() {
    if !root() {
        return;
    }
    let b = Bridge::stdio(Opts {
        probe: true,
        ..Opts::default()
    })
    .await;
    let shell = "( for i in 1 2 3 4 5 6 7 8; do ls / >/dev/null; sleep 0.01; done ) & \
                 echo ready; while IFS= read -r c; do sh -c \"$c\"; echo \"exit $?\"; done";
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..20 {
        let (id, _, p) = start_and_poll(&b, shell).await;
        let cursor = structured(&p)["stdout"]["cursor"].as_u64().unwrap();
        b.call(
            "write_stdin",
            json!({"id": id, "text": "cat /nonexistent/data.csv\n", "close": true}),
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(20);
        let last = loop {
            let p = b
                .call(
                    "poll_process",
                    json!({"id": id, "stdout_cursor": cursor, "wait_ms": 2000}),
                )
                .await;
            let s = structured(&p).clone();
            if s["running"] == false {
                break s;
            }
            assert!(Instant::now() < deadline, "the shell did not end");
        };
        let k = &last["kernel"];
        assert_eq!(k["available"], true, "{k}");
        *seen
            .entry((
                k["primitive"].as_str().unwrap_or("?").to_owned(),
                k["hidden_failure"]["primitive"]
                    .as_str()
                    .unwrap_or("-")
                    .to_owned(),
            ))
            .or_insert(0) += 1;
    }
    let want = ("none".to_string(), "fs.missing".to_string());
    assert_eq!(seen.get(&want), Some(&20), "{seen:?}");
}

/// A request under an id still in flight is refused with its own answer;
/// the first request runs to its end and is answered, and its span ends
/// (rmcp alone would run both and drop the first's answer).
#[test]
fn a_request_reusing_an_id_in_flight_is_refused_and_the_first_is_answered() {
    use std::io::{BufRead as _, Write as _};
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket) = probe_daemon(dir.path());
    let mut child = std::process::Command::new(BRIDGE)
        .args(["serve", "--stdio", "--probe-socket"])
        .arg(&socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut send = |v: Value| writeln!(stdin, "{v}").unwrap();
    send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = |argv: Value| {
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "exec", "arguments": {"argv": argv}}})
    };
    send(call(json!(["sleep", "1"])));
    std::thread::sleep(Duration::from_millis(300));
    send(call(json!(["echo", "second"])));
    let mut answers = Vec::new();
    for _ in 0..2 {
        line.clear();
        stdout.read_line(&mut line).unwrap();
        answers.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    let refused = &answers[0];
    assert_eq!(refused["id"], 7, "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("still in flight"),
        "{refused}"
    );
    let first = &answers[1];
    assert_eq!(first["id"], 7, "{first}");
    assert_eq!(
        first["result"]["structuredContent"]["exit_code"], 0,
        "{first}"
    );
    assert_eq!(
        first["result"]["structuredContent"]["kernel"]["available"], true,
        "{first}"
    );
    // answered: the id is free again
    send(call(json!(["echo", "third"])));
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let third: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        third["result"]["structuredContent"]["exit_code"], 0,
        "{third}"
    );
    drop(stdin); // the session ends with its input
    let _ = child.wait();
    let status = probe::client::Client::connect(&socket)
        .unwrap()
        .daemon_status()
        .unwrap();
    assert_eq!(status.open_spans, 0, "{status:?}");
}

/// A client that sends its calls and closes stdin at once gets every
/// answer, however long the calls take: rmcp alone gives in-flight calls
/// 5 s after stdin closes, then cancels them and drops their answers (the
/// answers seen lost "when stdin closed right after the requests").
#[test]
fn every_call_sent_before_stdin_closed_is_answered() {
    use std::io::{Read as _, Write as _};
    let mut child = std::process::Command::new(BRIDGE)
        .args(["serve", "--stdio", "--no-probe"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut requests = vec![
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ];
    for (id, secs) in [(1, 0), (2, 7), (3, 1)] {
        requests.push(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "exec", "arguments": {"command": format!("sleep {secs}; echo done-{id}")}}}));
    }
    for r in requests {
        writeln!(stdin, "{r}").unwrap();
    }
    drop(stdin);
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success());
    let answers: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for id in 1..=3 {
        let a = answers
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("no answer to call {id}: {out}"));
        assert_eq!(
            structured(&serde_json::from_value(a["result"].clone()).unwrap())["stdout"]["text"],
            format!("done-{id}\n"),
            "{a}"
        );
    }
}

/// Over HTTP too, a request under an id still in flight in its session is
/// refused with its own answer, and the first is answered: rmcp alone runs
/// both and drops the first's answer. Once answered, the id is free again;
/// another session may use it meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn over_http_a_request_reusing_an_id_in_flight_is_refused_and_the_first_is_answered() {
    let (_bridge, url) = Bridge::start_http(&Opts::default());
    let (session, other) = (raw_http_session(&url).await, raw_http_session(&url).await);
    let call = |command: &str| {
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "exec", "arguments": {"command": command}}})
        .to_string()
    };
    let first = {
        let (url, session, call) = (url.clone(), session.clone(), call("sleep 1; echo first"));
        tokio::spawn(async move { raw_post(&url, Some(&session), &call).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, status, refused) = raw_post(&url, Some(&session), &call("echo second")).await;
    assert_eq!(status, 200, "{refused}");
    let refused: Value = serde_json::from_str(&refused).unwrap();
    assert_eq!(refused["id"], 7, "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let (_, _, elsewhere) = raw_post(&url, Some(&other), &call("echo other")).await;
    assert!(
        elsewhere.contains("other\\n"),
        "another session's id 7: {elsewhere}"
    );
    let (_, status, answer) = first.await.unwrap();
    assert_eq!(status, 200);
    assert!(
        answer.contains("first\\n"),
        "the first call's answer: {answer}"
    );
    let (_, _, again) = raw_post(&url, Some(&session), &call("echo again")).await;
    assert!(
        again.contains("again\\n"),
        "the id is free once answered: {again}"
    );
}
