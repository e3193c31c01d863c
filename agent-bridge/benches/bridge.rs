//! Bridge benchmark (`cargo bench -p agent-bridge --bench bridge`, run by
//! `cargo xtask bench`): exec `true` latency over stdio and HTTP with and
//! without the probe, against spawning `true` directly; 64 MiB read_file and
//! write_file throughput against a raw pipe; the bridge's peak RSS during a
//! 64 MiB transfer. Prints a Markdown section on stdout.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{Value, json};

const BRIDGE: &str = env!("CARGO_BIN_EXE_agent-bridge");
const CALLS: usize = 500;
/// Interleaved rounds the exec calls are split into.
const ROUNDS: usize = 5;
const MIB64: usize = 64 << 20;
/// 64 MiB transfers each way per bridge-alone row.
const TRANSFERS: usize = 5;
/// cargo runs benchmarks with LD_LIBRARY_PATH pointing into target/ and the
/// toolchain: inherited by the bridges' workloads, it sends the loader of
/// every `true` through a dozen failing opens (each one traced) that no
/// sandbox has. Every process the benchmark starts goes without it.
const CARGO_ONLY_ENV: &str = "LD_LIBRARY_PATH";

type Client = RunningService<RoleClient, ()>;

fn probe_bin() -> PathBuf {
    Path::new(BRIDGE).with_file_name("probe")
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

fn start_daemon(dir: &Path) -> (Daemon, PathBuf) {
    let socket = dir.join("probe.sock");
    let child = Command::new(probe_bin())
        .args(["run", "--socket"])
        .arg(&socket)
        .arg("--db")
        .arg(dir.join("evidence.db"))
        .stderr(Stdio::null())
        .spawn()
        .expect("probe run (build it: cargo build --release -p probe)");
    probe::client::wait_until_ready(&socket, Duration::from_secs(30))
        .expect("the probe daemon did not start");
    (Daemon(child), socket)
}

fn probe_args(socket: Option<&Path>) -> Vec<String> {
    match socket {
        Some(s) => vec!["--probe-socket".into(), s.display().to_string()],
        None => vec!["--no-probe".into()],
    }
}

/// A bridge process and a client; the process is killed on drop.
struct Bridge {
    client: Client,
    pid: u32,
    url: Option<String>,
    _child: BridgeChild,
}

enum BridgeChild {
    Tokio(#[allow(dead_code)] tokio::process::Child),
    Std(Child),
}

impl Drop for BridgeChild {
    fn drop(&mut self) {
        if let BridgeChild::Std(c) = self {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn stdio(socket: Option<&Path>) -> Bridge {
    let mut child = tokio::process::Command::new(BRIDGE)
        .env_remove(CARGO_ONLY_ENV)
        .arg("serve")
        .arg("--stdio")
        .args(probe_args(socket))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(
        child.stdout.take().unwrap(),
        child.stdin.take().unwrap(),
    )
    .with_max_line_length(512 << 20);
    let client = ().serve(transport).await.unwrap();
    let pid = child.id().unwrap();
    Bridge {
        client,
        pid,
        url: None,
        _child: BridgeChild::Tokio(child),
    }
}

/// An HTTP bridge process and its URL.
fn start_http(socket: Option<&Path>) -> (Child, String) {
    use std::io::BufRead as _;
    let mut child = Command::new(BRIDGE)
        .env_remove(CARGO_ONLY_ENV)
        .arg("serve")
        .args(["--http", "127.0.0.1:0"])
        .args(probe_args(socket))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().unwrap().unwrap();
        if let Some(u) = line.split("serving MCP at ").nth(1) {
            break u.trim().to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (child, url)
}

async fn http(socket: Option<&Path>, pooled: bool) -> Bridge {
    let (child, url) = start_http(socket);
    let client = connect_http(&url, pooled).await;
    let pid = child.id();
    Bridge {
        client,
        pid,
        url: Some(url),
        _child: BridgeChild::Std(child),
    }
}

/// An rmcp client of the bridge at `url`: on the campaign's HTTP client,
/// which keeps connections (`pooled`), or on rmcp's default one, which
/// opens a connection per call.
async fn connect_http(url: &str, pooled: bool) -> Client {
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string())
        .max_sse_event_size(512 << 20)
        .max_json_response_size(512 << 20);
    let transport = if pooled {
        let http = campaign::target::http_client();
        StreamableHttpClientTransport::with_client(http, config)
    } else {
        StreamableHttpClientTransport::from_config(config)
    };
    ().serve(transport).await.unwrap()
}

async fn call(client: &Client, tool: &str, args: Value) -> Value {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    let r = client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{tool}: {:?}", r.content);
    r.structured_content.unwrap()
}

struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    per_s: f64,
}

/// A row of the exec table: `l` against the direct spawn's `base`.
fn exec_row(label: &str, l: &Latency, base: &Latency) -> String {
    format!(
        "| {label} | {:.2} | {:.2} | {:.0} | {:.1}× |\n",
        l.p50_ms,
        l.p99_ms,
        l.per_s,
        l.p50_ms / base.p50_ms
    )
}

fn latency(mut ms: Vec<f64>, wall: Duration) -> Latency {
    ms.sort_by(f64::total_cmp);
    Latency {
        p50_ms: ms[ms.len() / 2],
        p99_ms: ms[(ms.len() * 99 / 100).min(ms.len() - 1)],
        per_s: ms.len() as f64 / wall.as_secs_f64(),
    }
}

/// `n` sequential exec `true` calls; latencies in ms.
async fn exec_true(b: &Bridge, probe: bool, n: usize) -> Vec<f64> {
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = call(&b.client, "exec", json!({"argv": ["true"]})).await;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(r["kernel"]["available"], probe, "{}", r["kernel"]);
    }
    ms
}

/// A Streamable HTTP POST to the bridge at `url`, speaking MCP `version`,
/// within `session` when there is one.
fn mcp_post(
    http: &reqwest::Client,
    url: &str,
    version: &str,
    session: Option<&str>,
) -> reqwest::RequestBuilder {
    let req = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", version);
    match session {
        Some(s) => req.header("mcp-session-id", s),
        None => req,
    }
}

/// `agent-bridge serve --stdio` with the probe attached, on plain pipes.
fn piped_stdio_bridge(socket: &Path) -> Child {
    Command::new(BRIDGE)
        .env_remove(CARGO_ONLY_ENV)
        .args(["serve", "--stdio"])
        .args(probe_args(Some(socket)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A bare MCP client for the exec rows' second measure: it sends each
/// `tools/call` pre-encoded and only frames the answer (stdio: to its
/// newline; HTTP: the whole response body on one keep-alive connection)
/// while the clock runs, then checks every answer in full: the exit code
/// and the kernel's attribution must be in it. What the bridge itself adds
/// per call, without an MCP client library's own JSON, channels and tasks.
enum BareClient {
    Stdio {
        _child: BridgeChild,
        stdin: std::process::ChildStdin,
        stdout: std::io::BufReader<std::process::ChildStdout>,
    },
    Http {
        _child: BridgeChild,
        http: reqwest::Client,
        url: String,
        session: String,
    },
}

const BARE_INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench-bare","version":"1"}}}"#;
const BARE_INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

impl BareClient {
    async fn start(transport: &str, socket: &Path) -> BareClient {
        use std::io::{BufRead as _, Write as _};
        if transport == "stdio" {
            let mut child = piped_stdio_bridge(socket);
            let mut stdin = child.stdin.take().unwrap();
            let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
            writeln!(stdin, "{BARE_INIT}").unwrap();
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            assert!(line.contains("\"result\""), "initialize: {line}");
            writeln!(stdin, "{BARE_INITIALIZED}").unwrap();
            return BareClient::Stdio {
                _child: BridgeChild::Std(child),
                stdin,
                stdout,
            };
        }
        let (child, url) = start_http(Some(socket));
        let http = reqwest::Client::new();
        let post = |body: &'static str, session: Option<&str>| {
            mcp_post(&http, &url, "2025-06-18", session)
                .body(body)
                .send()
        };
        let init = post(BARE_INIT, None).await.unwrap();
        let session = init.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        init.bytes().await.unwrap();
        post(BARE_INITIALIZED, Some(&session))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        BareClient::Http {
            _child: BridgeChild::Std(child),
            http,
            url,
            session,
        }
    }

    /// `n` sequential exec `true` calls; latencies in ms. Answers are
    /// checked after the clock stops.
    async fn exec_true(&mut self, n: usize) -> Vec<f64> {
        use std::io::{BufRead as _, Write as _};
        let requests: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let mut r = serde_json::to_vec(
                    &json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                    "params": {"name": "exec", "arguments": {"argv": ["true"]}}}),
                )
                .unwrap();
                r.push(b'\n');
                r
            })
            .collect();
        let mut answers = Vec::with_capacity(n);
        let mut ms = Vec::with_capacity(n);
        for req in requests {
            let t = Instant::now();
            let answer: Vec<u8> = match self {
                BareClient::Stdio { stdin, stdout, .. } => {
                    stdin.write_all(&req).unwrap();
                    let mut line = Vec::new();
                    stdout.read_until(b'\n', &mut line).unwrap();
                    line
                }
                BareClient::Http {
                    http, url, session, ..
                } => mcp_post(http, url, "2025-06-18", Some(session))
                    .body(req)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
                    .to_vec(),
            };
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            answers.push(answer);
        }
        for a in answers {
            let v: Value = serde_json::from_slice(&a)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&a)));
            let s = &v["result"]["structuredContent"];
            assert_eq!(s["exit_code"], 0, "{v}");
            assert_eq!(s["kernel"]["available"], true, "{v}");
            assert!(s["kernel"]["explanation"].is_string(), "{v}");
        }
        ms
    }
}

/// Calls an agent makes: each after 50 ms of idle, when the kernel has
/// long finished its last RCU grace period. A process moved into a cgroup
/// then waits for a new one (how every call began before the bridge cloned
/// its workloads straight into their cgroup); the table shows both.
async fn spaced_calls(socket: &Path) -> String {
    const SPACED: usize = 40;
    const IDLE: Duration = Duration::from_millis(50);
    let b = stdio(Some(socket)).await;
    exec_true(&b, true, 5).await; // warm-up
    let root = agent_bridge::cgroup::v2_root().expect("a cgroup2 mount");
    let dirs = [0, 1].map(|i| root.join(format!("bench-move-{}-{i}", std::process::id())));
    for d in &dirs {
        std::fs::create_dir(d).unwrap();
    }
    let mut mover = Command::new("sleep").arg("300").spawn().unwrap();
    let (mut bridge, mut direct, mut moves) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..SPACED {
        tokio::time::sleep(IDLE).await;
        bridge.extend(exec_true(&b, true, 1).await);
        tokio::time::sleep(IDLE).await;
        direct.extend(direct_true(1));
        tokio::time::sleep(IDLE).await;
        let t = Instant::now();
        std::fs::write(dirs[i % 2].join("cgroup.procs"), mover.id().to_string()).unwrap();
        moves.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let _ = mover.kill();
    let _ = mover.wait();
    for d in &dirs {
        let _ = std::fs::remove_dir(d);
    }
    let (bridge, direct, moves) = (
        latency(bridge, IDLE),
        latency(direct, IDLE),
        latency(moves, IDLE),
    );
    eprintln!(
        "bench: exec true after 50 ms idle: p50 {:.2} ms (direct {:.2} ms; a cgroup move {:.2} ms)",
        bridge.p50_ms, direct.p50_ms, moves.p50_ms
    );
    format!(
        "\n{SPACED} calls each after 50 ms idle (an agent's pace), stdio, probe attached, against a direct spawn after the same idle; \
         and what moving a process into a cgroup costs then (each call did that before this bridge cloned its workload straight into its cgroup):\n\n\
         | after 50 ms idle | p50 ms | p99 ms | p50 vs direct spawn |\n|---|---|---|---|\n\
         | direct spawn | {:.2} | {:.2} | 1.00× |\n\
         | exec `true`, stdio, probe attached | {:.2} | {:.2} | {:.1}× |\n\
         | moving a process into a cgroup (write to cgroup.procs) | {:.2} | {:.2} | |\n\n",
        direct.p50_ms,
        direct.p99_ms,
        bridge.p50_ms,
        bridge.p99_ms,
        bridge.p50_ms / direct.p50_ms,
        moves.p50_ms,
        moves.p99_ms
    )
}

/// `n` direct spawns of `true` (fork, exec, wait, pipes); latencies in ms.
fn direct_true(n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let s = Command::new("true")
                .env_remove(CARGO_ONLY_ENV)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .unwrap();
            assert!(s.status.success());
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect()
}

fn vm_hwm_kib(pid: u32) -> u64 {
    agent_bridge::process::status_kib(pid, "VmHWM")
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

/// A bridge-alone row: MB/s of each transfer in the order they ran, and
/// the bridge's peak RSS (KiB). In the first transfer of each kind the
/// bridge holds no freed big buffer yet (`big_alloc`); the later ones can
/// also reuse the last call's, as back-to-back transfers do.
struct Alone {
    write: Vec<f64>,
    read: Vec<f64>,
    peak: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (write MB/s, read MB/s) for 64 MiB, median of 3.
async fn transfer(b: &Bridge, dir: &Path, data: &[u8]) -> (f64, f64) {
    let b64 = base64::engine::general_purpose::STANDARD.encode(data);
    let path = dir.join("payload.bin");
    let (mut w, mut r) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        // built outside the timing: the payload's copy is the harness's, not the bridge's
        let args = json!({"path": path, "content_base64": b64});
        let t = Instant::now();
        let s = call(&b.client, "write_file", args).await;
        w.push(mbps(data.len(), t.elapsed()));
        assert_eq!(s["size"], data.len() as u64);
        let t = Instant::now();
        let s = call(&b.client, "read_file", json!({"path": path})).await;
        r.push(mbps(data.len(), t.elapsed()));
        assert_eq!(s["bytes"], data.len() as u64);
    }
    (median(w), median(r))
}

/// The bridge alone over stdio: each request is encoded before the clock
/// starts and each answer is only framed (read to its newline) while it
/// runs, so the client's own JSON and base64 work is left out; both are
/// checked, in full, after the clock.
fn bridge_alone_stdio(socket: &Path, dir: &Path, data: &[u8]) -> Alone {
    use std::io::{BufRead as _, Write as _};
    let mut child = piped_stdio_bridge(socket);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::with_capacity(1 << 20, child.stdout.take().unwrap());
    let line = |v: Value| {
        let mut bytes = serde_json::to_vec(&v).unwrap();
        bytes.push(b'\n');
        bytes
    };
    // the answer to a request: the next line that is not a notification
    let answer = |stdout: &mut std::io::BufReader<std::process::ChildStdout>| loop {
        let mut buf = Vec::new();
        stdout.read_until(b'\n', &mut buf).unwrap();
        assert!(!buf.is_empty(), "the bridge closed stdout");
        if !buf[..buf.len().min(64)]
            .windows(8)
            .any(|w| w == b"\"method\"")
        {
            break buf;
        }
    };
    stdin
        .write_all(&line(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})))
        .unwrap();
    answer(&mut stdout);
    stdin
        .write_all(&line(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        ))
        .unwrap();
    let sha = contract::bytes::sha256_hex(data);
    let path = dir.join("payload-alone.bin");
    let b64 = base64::engine::general_purpose::STANDARD.encode(data);
    let (mut w, mut r) = (Vec::new(), Vec::new());
    for round in 0..TRANSFERS as u64 {
        let write = line(
            json!({"jsonrpc": "2.0", "id": 10 + 2 * round, "method": "tools/call",
            "params": {"name": "write_file", "arguments": {"path": path, "content_base64": b64}}}),
        );
        let t = Instant::now();
        stdin.write_all(&write).unwrap();
        let reply = answer(&mut stdout);
        w.push(mbps(data.len(), t.elapsed()));
        let v: Value = serde_json::from_slice(&reply).unwrap();
        assert_eq!(v["id"], 10 + 2 * round, "{v}");
        assert_eq!(
            v["result"]["structuredContent"]["sha256"],
            sha.as_str(),
            "{v}"
        );
        assert_eq!(v["result"]["structuredContent"]["size"], data.len() as u64);

        let read = line(
            json!({"jsonrpc": "2.0", "id": 11 + 2 * round, "method": "tools/call",
            "params": {"name": "read_file", "arguments": {"path": path}}}),
        );
        let t = Instant::now();
        stdin.write_all(&read).unwrap();
        let reply = answer(&mut stdout);
        r.push(mbps(data.len(), t.elapsed()));
        let v: Value = serde_json::from_slice(&reply).unwrap();
        assert_eq!(v["id"], 11 + 2 * round);
        assert_read_back(&v, data);
    }
    let peak = vm_hwm_kib(child.id());
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    Alone {
        write: w,
        read: r,
        peak,
    }
}

/// Asserts that a read_file answer carries exactly `data` as its blob.
fn assert_read_back(answer: &Value, data: &[u8]) {
    let blob = answer["result"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|c| c["resource"]["blob"].as_str())
        .expect("read_file returns the bytes as a blob resource");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(blob)
        .unwrap();
    assert!(bytes == data, "read_file returned other bytes");
}

/// The JSON-RPC answer with `id` in a Streamable HTTP response body: plain
/// JSON, or the `data:` lines of the SSE event that carries it.
fn http_answer(body: &[u8], id: u64) -> Value {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return v;
    }
    let text = std::str::from_utf8(body).expect("UTF-8 body");
    text.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            serde_json::from_str::<Value>(&data.join("\n")).ok()
        })
        .find(|v| v["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id} in the response"))
}

/// A response body as the chunks that arrived: joining 87 MB into one
/// buffer is the client's work, done after the clock.
async fn body_chunks(mut resp: reqwest::Response) -> Vec<bytes::Bytes> {
    let mut chunks = Vec::new();
    while let Some(c) = resp.chunk().await.unwrap() {
        chunks.push(c);
    }
    chunks
}

/// The bridge alone over Streamable HTTP, like [`bridge_alone_stdio`]: each
/// request body is encoded before the clock starts, and each response body
/// is only read in full while it runs; both are checked after it. A
/// `sessionless` client speaks protocol 2026-07-28 (no `initialize`, no
/// session, each request carries its own metadata); the bridge answers it
/// with plain JSON where a session's answers are SSE events.
async fn bridge_alone_http(socket: &Path, dir: &Path, data: &[u8], sessionless: bool) -> Alone {
    let (child, url) = start_http(Some(socket));
    let pid = child.id();
    let _child = BridgeChild::Std(child);
    let http = reqwest::Client::new();
    let version = if sessionless {
        "2026-07-28"
    } else {
        "2025-06-18"
    };
    let post = |body: Vec<u8>, session: Option<String>, tool: Option<&str>| {
        let mut req = mcp_post(&http, &url, version, session.as_deref());
        if let (true, Some(tool)) = (sessionless, tool) {
            req = req
                .header("mcp-method", "tools/call")
                .header("mcp-name", tool);
        }
        req.body(body).send()
    };
    let mut session = None;
    if !sessionless {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}});
        let init = post(serde_json::to_vec(&init).unwrap(), None, None)
            .await
            .unwrap();
        session = init
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_string());
        init.bytes().await.unwrap();
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        post(
            serde_json::to_vec(&initialized).unwrap(),
            session.clone(),
            None,
        )
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    }
    let meta = sessionless.then(|| {
        json!({"io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {}})
    });
    let tool_call = |id: u64, name: &str, arguments: Value| {
        let mut params = json!({"name": name, "arguments": arguments});
        if let Some(meta) = &meta {
            params["_meta"] = meta.clone();
        }
        serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}),
        )
        .unwrap()
    };
    let sha = contract::bytes::sha256_hex(data);
    let path = dir.join(format!("payload-alone-http-{version}.bin"));
    let b64 = base64::engine::general_purpose::STANDARD.encode(data);
    let (mut w, mut r) = (Vec::new(), Vec::new());
    for round in 0..TRANSFERS as u64 {
        let id = 10 + 2 * round;
        let write = tool_call(
            id,
            "write_file",
            json!({"path": path, "content_base64": b64}),
        );
        let t = Instant::now();
        let resp = post(write, session.clone(), Some("write_file"))
            .await
            .unwrap();
        let body = body_chunks(resp).await;
        w.push(mbps(data.len(), t.elapsed()));
        let v = http_answer(&body.concat(), id);
        assert_eq!(
            v["result"]["structuredContent"]["sha256"],
            sha.as_str(),
            "{v}"
        );

        let id = 11 + 2 * round;
        let read = tool_call(id, "read_file", json!({"path": path}));
        let t = Instant::now();
        let resp = post(read, session.clone(), Some("read_file"))
            .await
            .unwrap();
        let body = body_chunks(resp).await;
        r.push(mbps(data.len(), t.elapsed()));
        let v = http_answer(&body.concat(), id);
        assert_read_back(&v, data);
    }
    Alone {
        write: w,
        read: r,
        peak: vm_hwm_kib(pid),
    }
}

/// The baseline for throughput: the same bytes through a pipe from `cat`.
fn raw_pipe(path: &Path) -> f64 {
    let mut v = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let out = Command::new("cat")
            .env_remove(CARGO_ONLY_ENV)
            .arg(path)
            .output()
            .unwrap();
        assert_eq!(out.stdout.len(), MIB64);
        v.push(mbps(MIB64, t.elapsed()));
    }
    median(v)
}

// one thread, as an agent's event loop (Node, Python) runs its client;
// the 8 concurrent sessions get a runtime of their own
#[tokio::main(flavor = "current_thread")]
async fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("the bridge benchmark needs root (probe daemon, cgroups)");
        std::process::exit(1);
    }
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket) = start_daemon(dir.path());
    let mut out = String::from("## agent-bridge\n\n");
    out.push_str(&format!(
        "`cargo bench -p agent-bridge --bench bridge`: {CALLS} sequential `exec {{\"argv\": [\"true\"]}}` calls per row after 20 warm-up calls, \
         one rmcp client on a single-threaded runtime (as an agent's event loop runs it; over HTTP on the campaign runner's reqwest client, which keeps its connection), in {ROUNDS} interleaved rounds; the baseline spawns `true` directly from the benchmark (fork, exec, wait, pipes) in the same rounds. \
         The *bare client* rows run in the same rounds with a client that sends each call pre-encoded and only frames the answer while the clock runs \
         (stdio: reads to its newline; HTTP: reqwest on one keep-alive connection), then checks every answer for the exit code and the kernel's attribution: \
         the bridge's own cost per call, without the MCP client library's. The issue's targets are judged on the rmcp rows. \
         This VM's speed drifts from run to run (the baseline's p50 moved between 0.7 and 1.6 ms within one day, and the \
         bridge's with it): compare rows within a run, and the ratio column across runs.\n\n"
    ));
    // BRIDGE_BENCH_PART=exec|transfer runs one half (while tuning)
    let part = std::env::var("BRIDGE_BENCH_PART").unwrap_or_default();
    let steal = Steal::read();
    // exec p50 with the probe per transport; the bridge-alone rates; peaks
    let mut exec_p50: Vec<(&str, f64)> = Vec::new();
    let mut alone_rates: Vec<(&str, Alone)> = Vec::new();
    let mut peaks: Vec<f64> = Vec::new();
    // the targets: (transport, p50 ratio, p99 ratio) against the direct spawn
    let mut exec_ratios: Vec<(&str, f64, f64)> = Vec::new();
    let mut concurrent: Option<f64> = None;
    // the bare client's p50 ratios (for reference)
    let mut bare_ratios: Vec<(&str, f64)> = Vec::new();
    if part != "transfer" {
        out.push_str("| exec `true` | p50 ms | p99 ms | calls/s | p50 vs direct spawn |\n|---|---|---|---|---|\n");
        // interleaved rounds: the VM's speed drifts, so every configuration
        // gets a share of every stretch of time
        let configs = [
            ("stdio", false),
            ("stdio", true),
            ("http", false),
            ("http", true),
        ];
        let mut bridges = Vec::new();
        for (name, probe) in configs {
            let socket = probe.then_some(socket.as_path());
            let b = if name == "stdio" {
                stdio(socket).await
            } else {
                http(socket, true).await
            };
            exec_true(&b, probe, 20).await; // warm-up
            bridges.push(b);
        }
        // for reference: rmcp's default HTTP client, a new connection per call
        let rmcp_default = http(Some(&socket), false).await;
        exec_true(&rmcp_default, true, 20).await;
        let mut bare = Vec::new();
        for transport in ["stdio", "http"] {
            let mut c = BareClient::start(transport, &socket).await;
            c.exec_true(20).await; // warm-up
            bare.push((transport, c));
        }
        let mut samples = vec![Vec::new(); configs.len() + 2];
        let mut wall = vec![Duration::ZERO; configs.len() + 2];
        let mut bare_samples = vec![Vec::new(); bare.len()];
        let mut bare_wall = vec![Duration::ZERO; bare.len()];
        for _ in 0..ROUNDS {
            let t = Instant::now();
            samples[0].extend(direct_true(CALLS / ROUNDS));
            wall[0] += t.elapsed();
            for (i, (b, (_, probe))) in bridges.iter().zip(configs).enumerate() {
                let t = Instant::now();
                samples[i + 1].extend(exec_true(b, probe, CALLS / ROUNDS).await);
                wall[i + 1] += t.elapsed();
            }
            let t = Instant::now();
            let last = configs.len() + 1;
            samples[last].extend(exec_true(&rmcp_default, true, CALLS / ROUNDS).await);
            wall[last] += t.elapsed();
            for (i, (_, c)) in bare.iter_mut().enumerate() {
                let t = Instant::now();
                bare_samples[i].extend(c.exec_true(CALLS / ROUNDS).await);
                bare_wall[i] += t.elapsed();
            }
        }
        drop(bridges);
        drop(rmcp_default);
        drop(bare);
        let base = latency(samples[0].clone(), wall[0]);
        out.push_str(&format!(
            "| direct spawn (baseline) | {:.2} | {:.2} | {:.0} | 1.00× |\n",
            base.p50_ms, base.p99_ms, base.per_s
        ));
        for (i, (name, probe)) in configs.iter().enumerate() {
            let l = latency(samples[i + 1].clone(), wall[i + 1]);
            let label = format!(
                "{name}, {}",
                if *probe { "probe attached" } else { "no probe" }
            );
            out.push_str(&exec_row(&label, &l, &base));
            eprintln!("bench: exec true over {label}: p50 {:.2} ms", l.p50_ms);
            if *probe {
                exec_p50.push((name, l.p50_ms));
                exec_ratios.push((name, l.p50_ms / base.p50_ms, l.p99_ms / base.p99_ms));
            }
        }
        {
            let last = configs.len() + 1;
            let l = latency(samples[last].clone(), wall[last]);
            out.push_str(&exec_row(
                "http, probe attached, rmcp's default HTTP client (a new connection per call)",
                &l,
                &base,
            ));
        }
        for (i, transport) in ["stdio", "http"].into_iter().enumerate() {
            let l = latency(bare_samples[i].clone(), bare_wall[i]);
            out.push_str(&exec_row(
                &format!("{transport}, probe attached, bare client"),
                &l,
                &base,
            ));
            eprintln!(
                "bench: exec true over {transport}, bare client: p50 {:.2} ms",
                l.p50_ms
            );
            bare_ratios.push((transport, l.p50_ms / base.p50_ms));
        }
        // concurrency: 8 HTTP sessions of one bridge at once, probe attached
        {
            let b = http(Some(&socket), true).await;
            let url = b.url.clone().unwrap();
            // 8 clients in one process: a runtime with a thread per CPU
            let (all, wall) = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let start = Instant::now();
                    let mut tasks = Vec::new();
                    for _ in 0..8 {
                        let url = url.clone();
                        tasks.push(tokio::spawn(async move {
                            let client = connect_http(&url, true).await;
                            let mut ms = Vec::new();
                            for _ in 0..CALLS / 4 {
                                let t = Instant::now();
                                call(&client, "exec", json!({"argv": ["true"]})).await;
                                ms.push(t.elapsed().as_secs_f64() * 1000.0);
                            }
                            ms
                        }));
                    }
                    let mut all = Vec::new();
                    for t in tasks {
                        all.extend(t.await.unwrap());
                    }
                    (all, start.elapsed())
                })
            })
            .join()
            .unwrap();
            let l = latency(all, wall);
            out.push_str(&exec_row(
                "http, probe attached, 8 concurrent sessions",
                &l,
                &base,
            ));
            eprintln!("bench: 8 concurrent HTTP sessions: {:.0} calls/s", l.per_s);
            concurrent = Some(l.per_s);
        }
        out.push_str(&spaced_calls(&socket).await);
    }
    if part != "transfer" {
        out.push_str(&exec_verdicts(&exec_ratios, &bare_ratios, concurrent));
    }
    if part == "exec" {
        out.push_str(&verdicts(&exec_p50, &alone_rates, &peaks));
        out.push_str(&steal.line());
        print!("{out}");
        return;
    }
    let data: Vec<u8> = (0..MIB64).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(dir.path().join("raw.bin"), &data).unwrap();
    let raw = raw_pipe(&dir.path().join("raw.bin"));
    out.push_str(&format!(
        "\n64 MiB of non-text bytes (base64 on the wire), probe attached; baseline: `cat` of the same file into a pipe, {raw:.0} MB/s. \
         *Bridge alone*: the median of {TRANSFERS} back-to-back transfers each way, and the first of them (the bridge holds no freed buffer yet, so only the \
         buffers freed earlier in the same call are reused; the later ones also reuse the last call's). *rmcp client*: the median of 3. \
         *Bridge alone* sends each request pre-encoded and only frames each answer (stdio: reads to its newline; HTTP: reads the \
         response body's chunks as they arrive) while the clock runs, and checks both in full after it: what the bridge sustains. *rmcp client* is end to end through rmcp's own client, whose JSON and base64 work on the same 2 vCPUs is counted too.\n\n\
         | transport | client | write_file MB/s | read_file MB/s | bridge peak RSS (VmHWM) | peak / payload |\n|---|---|---|---|---|---|\n"
    ));
    let alone = {
        let (socket, dir, data) = (socket.clone(), dir.path().to_path_buf(), data.clone());
        tokio::task::spawn_blocking(move || bridge_alone_stdio(&socket, &dir, &data))
            .await
            .unwrap()
    };
    // "283 (0.38× raw; first 200)": a median, and the first transfer
    let cell = |rate: f64, first: Option<f64>| {
        let first = first.map_or(String::new(), |f| format!("; first {f:.0}"));
        format!("{rate:.0} ({:.2}× raw{first})", rate / raw)
    };
    let mut row =
        |name: &str, client: &str, w: String, r: String, before: Option<u64>, peak: u64| {
            peaks.push(peak as f64 * 1024.0 / MIB64 as f64);
            eprintln!(
                "bench: 64 MiB over {name} ({client}): write {w} MB/s, read {r} MB/s, peak {} MiB",
                peak / 1024
            );
            format!(
                "| {name} | {client} | {w} | {r} | {:.0} MiB{} | {:.2}× |\n",
                peak as f64 / 1024.0,
                before.map_or(String::new(), |b| format!(
                    " (idle {:.0} MiB)",
                    b as f64 / 1024.0
                )),
                peak as f64 * 1024.0 / MIB64 as f64
            )
        };
    let mut alone_row = |name: &'static str, a: Alone| {
        let line = row(
            name,
            "bridge alone",
            cell(median(a.write.clone()), Some(a.write[0])),
            cell(median(a.read.clone()), Some(a.read[0])),
            None,
            a.peak,
        );
        alone_rates.push((name, a));
        line
    };
    out.push_str(&alone_row("stdio", alone));
    for (name, sessionless) in [("http", false), ("http, sessionless", true)] {
        let alone = bridge_alone_http(&socket, dir.path(), &data, sessionless).await;
        out.push_str(&alone_row(name, alone));
    }
    for name in ["stdio", "http"] {
        let b = if name == "stdio" {
            stdio(Some(&socket)).await
        } else {
            http(Some(&socket), true).await
        };
        let before = vm_hwm_kib(b.pid);
        let (w, r) = transfer(&b, dir.path(), &data).await;
        let peak = vm_hwm_kib(b.pid);
        out.push_str(&row(
            name,
            "rmcp client",
            cell(w, None),
            cell(r, None),
            Some(before),
            peak,
        ));
    }
    out.push_str(&verdicts(&exec_p50, &alone_rates, &peaks));
    out.push_str(&steal.line());
    out.push_str(
        "\nWhere a 64 MiB transfer's time goes: the bridge reads stdin in 1 MiB pipe loads (it widens its pipes and the \
         worker's from 64 KiB, so 64 MiB is 64 wake-ups, not 1,024), finds line ends with memchr, parses, decodes base64 \
         with SIMD, and hashes on another thread while the worker splices the pipe into the file, starting the disk's \
         writeback every 8 MiB so that the fsync before the rename waits for the last stretch only; for a read the worker \
         sendfiles the file into the pipe and the bridge reads it straight into one buffer, then hashes and encodes side \
         by side, and over stdio serializes with sonic-rs (SIMD escaping) straight to fd 1. Every step writes a fresh \
         64–87 MB buffer, and on this VM the first touch of fresh pages costs ~50 ms per 87 MB (fault and zeroing; \
         rewriting mapped pages takes ~4 ms): the bridge's allocator keeps up to two freed buffers of 8 MiB or more mapped \
         for a second, so a call's later steps write into pages its earlier steps mapped (the request line's pages take \
         the decoded bytes), and the next call into the last one's. Over HTTP the answer is rmcp's to \
         send: serde_json's byte-at-a-time escape scan of the 87 MB string, then, for a session, a copy into an SSE \
         event (whose data the bridge passes on as plain JSON, sliced, not copied, when it is the stream's only message). A sessionless client (protocol 2026-07-28) gets plain JSON without that copy, but rmcp's check of its \
         standard headers (SEP-2243) turns every request into a serde_json Value first, a deep copy of the 87 MB \
         argument: that costs its writes time and 86 MiB of peak. End to end, rmcp's client serializes an 87 MB request \
         and parses an 87 MB answer with serde_json on the same 2 vCPUs, which takes longer than the bridge's own work.\n",
    );
    print!("{out}");
}

/// The issue's targets against this run's numbers: a transfer row meets
/// 150 MB/s by its medians; whether its cold first transfers do is said.
fn verdicts(exec_p50: &[(&str, f64)], alone: &[(&str, Alone)], peaks: &[f64]) -> String {
    let mark = |ok: bool| if ok { "met" } else { "**missed**" };
    let mut out = String::from("\n| target | this run | |\n|---|---|---|\n");
    for (name, p50) in exec_p50 {
        out.push_str(&format!(
            "| exec `true` p50 ≤ 5 ms, probe attached, {name} | {p50:.2} ms | {} |\n",
            mark(*p50 <= 5.0)
        ));
    }
    for (name, a) in alone {
        let (w, r) = (median(a.write.clone()), median(a.read.clone()));
        let cold = if a.write[0] >= 150.0 && a.read[0] >= 150.0 {
            "the first transfers too"
        } else {
            "not the first transfers"
        };
        out.push_str(&format!(
            "| ≥ 150 MB/s each way, {name}, bridge alone | write {w:.0} (first {:.0}), read {r:.0} (first {:.0}) MB/s | {}{} |\n",
            a.write[0],
            a.read[0],
            mark(w >= 150.0 && r >= 150.0),
            if w >= 150.0 && r >= 150.0 { format!(", {cold}") } else { String::new() }
        ));
    }
    if let Some(worst) = peaks.iter().copied().reduce(f64::max) {
        out.push_str(&format!(
            "| peak RSS ≤ 5× the payload | at most {worst:.2}× | {} |\n",
            mark(worst <= 5.0)
        ));
    }
    out
}

/// 8 concurrent HTTP sessions before the HTTP server was reworked, calls/s (same
/// machine): the reference its 1.5× target is measured against.
const CONCURRENT_BEFORE: f64 = 254.0;

/// Issue 17's exec targets against the direct spawn of this run, and the
/// 8-session rate against [`CONCURRENT_BEFORE`].
fn exec_verdicts(
    ratios: &[(&str, f64, f64)],
    bare: &[(&str, f64)],
    concurrent: Option<f64>,
) -> String {
    let mark = |ok: bool| if ok { "met" } else { "**missed**" };
    let mut out = String::from("\n| target | this run | |\n|---|---|---|\n");
    for (name, p50) in bare {
        out.push_str(&format!(
            "| (for reference, not the target's measure) exec `true` p50, probe attached, {name}, bare client | {p50:.2}× | |\n"
        ));
    }
    for (name, p50, p99) in ratios {
        out.push_str(&format!(
            "| exec `true` p50 ≤ 2.0× direct spawn, probe attached, {name} | {p50:.2}× | {} |\n",
            mark(*p50 <= 2.0)
        ));
        out.push_str(&format!(
            "| exec `true` p99 ≤ 5× direct spawn's p99, probe attached, {name} | {p99:.2}× | {} |\n",
            mark(*p99 <= 5.0)
        ));
    }
    if let Some(rate) = concurrent {
        let ratio = rate / CONCURRENT_BEFORE;
        out.push_str(&format!(
            "| 8 concurrent http sessions ≥ 1.5× the {CONCURRENT_BEFORE:.0} calls/s before the HTTP server was reworked | {rate:.0} calls/s ({ratio:.2}×) | {} |\n",
            mark(ratio >= 1.5)
        ));
    }
    out
}

/// CPU time the hypervisor gave to other guests while the benchmark ran
/// (`steal` in /proc/stat): the phase of the VM, printed with the numbers.
struct Steal {
    steal: u64,
    total: u64,
}

impl Steal {
    fn read() -> Steal {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|t| t.parse().ok())
            .collect();
        Steal {
            steal: ticks.get(7).copied().unwrap_or(0),
            total: ticks.iter().take(8).sum(),
        }
    }

    fn line(&self) -> String {
        let now = Steal::read();
        let total = now.total.saturating_sub(self.total).max(1);
        let pct = 100.0 * now.steal.saturating_sub(self.steal) as f64 / total as f64;
        format!(
            "\nCPU steal during this run (time the hypervisor gave to other guests): {pct:.1}% of the vCPUs' time.\n"
        )
    }
}
