//! Test harness: a real probe daemon, real `agent-bridge` processes, and
//! rmcp's own client over stdio and Streamable HTTP.
#![allow(dead_code)]

use std::io::Write as _;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::{Value, json};

pub const BRIDGE: &str = env!("CARGO_BIN_EXE_agent-bridge");

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn unb64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

/// A real PNG image of `width` × `height`.
pub fn png(width: u32, height: u32) -> Vec<u8> {
    // a real PNG: python3's zlib and struct, no imaging library needed
    let script = format!(
        r#"
import struct, sys, zlib
w, h = {width}, {height}
raw = b''.join(b'\x00' + bytes((x * 7 + y * 3) % 256 for x in range(w * 3)) for y in range(h))
def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
sys.stdout.buffer.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
"#
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

pub fn sha256(data: &[u8]) -> String {
    contract::bytes::sha256_hex(data)
}

/// Root is needed for the probe and the profiles; CI=true forbids skipping.
pub fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
        "bridge tests need root; CI=true forbids skipping"
    );
    eprintln!("SKIPPED: bridge test needs root");
    false
}

pub fn probe_binary() -> PathBuf {
    let p = Path::new(BRIDGE).with_file_name("probe");
    assert!(
        p.exists(),
        "{} is missing: build it first (`cargo build -p probe`; `cargo xtask test` does)",
        p.display()
    );
    p
}

/// One probe daemon for the whole test binary, killed when the test
/// process ends (PDEATHSIG of a thread that lives as long as the process).
pub fn probe_socket() -> PathBuf {
    static SOCKET: OnceLock<PathBuf> = OnceLock::new();
    SOCKET
        .get_or_init(|| {
            sweep_dead_daemon_dirs();
            let dir =
                std::env::temp_dir().join(format!("bridge-test-probe-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let socket = dir.join("probe.sock");
            let (tx, rx) = std::sync::mpsc::channel();
            let (sock, db) = (socket.clone(), dir.join("evidence.db"));
            std::thread::spawn(move || {
                use std::os::unix::process::CommandExt as _;
                let mut cmd = Command::new(probe_binary());
                cmd.args(["run", "--socket"])
                    .arg(&sock)
                    .arg("--db")
                    .arg(&db);
                cmd.stderr(Stdio::null());
                // SAFETY: prctl is async-signal-safe.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                        Ok(())
                    });
                }
                let mut child = cmd.spawn().expect("start probe run");
                tx.send(child.id()).unwrap();
                // this thread lives as long as the test process: so does the daemon
                let _ = child.wait();
            });
            rx.recv().unwrap();
            probe::client::wait_until_ready(&socket, Duration::from_secs(30))
                .expect("the probe daemon did not come up");
            socket
        })
        .clone()
}

/// Removes the evidence DBs of test processes that are gone (a test
/// process cannot clean up after its once-per-process daemon).
fn sweep_dead_daemon_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("bridge-test-probe-")
            && pid.parse::<u32>().is_ok()
            && !Path::new("/proc").join(pid).exists()
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Counts progress notifications.
#[derive(Clone, Default)]
pub struct Handler {
    pub progress: Arc<AtomicUsize>,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        _p: ProgressNotificationParam,
        _c: NotificationContext<RoleClient>,
    ) {
        self.progress.fetch_add(1, Ordering::SeqCst);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("bridge-tests", "0.1.0"),
        )
    }
}

pub type Client = RunningService<RoleClient, Handler>;

/// A child process killed (and reaped) on drop.
pub struct Killed(pub Child);

impl Killed {
    pub fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A bridge process and an rmcp client connected to it.
pub struct Bridge {
    pub client: Client,
    pub handler: Handler,
    child: Option<Killed>,
    tokio_child: Option<tokio::process::Child>,
    pub url: Option<String>,
}

/// How a test wants its bridge.
#[derive(Clone, Default)]
pub struct Opts {
    pub profile: Option<&'static str>,
    pub probe: bool,
    /// A probe daemon of the test's own (instead of the shared one).
    pub probe_at: Option<PathBuf>,
    pub fault: Option<&'static str>,
    pub extra: Vec<String>,
    /// Speak protocol 2026-07-28, which has no sessions: `server/discover`
    /// instead of the `initialize` handshake, and no `Mcp-Session-Id`.
    pub sessionless: bool,
}

/// rmcp's client handshake: `initialize`, or `server/discover` for a
/// sessionless client (which then checks that 2026-07-28 was agreed).
async fn handshake<T, E, A>(
    handler: Handler,
    transport: T,
    sessionless: bool,
) -> Result<Client, String>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    use rmcp::model::ProtocolVersion;
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt as _};
    if !sessionless {
        return handler.serve(transport).await.map_err(|e| e.to_string());
    }
    let modern = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let client = handler
        .serve_with_lifecycle(transport, modern)
        .await
        .map_err(|e| e.to_string())?;
    let agreed = client.peer_info().map(|i| i.protocol_version.clone());
    assert_eq!(agreed, Some(ProtocolVersion::V_2026_07_28));
    Ok(client)
}

fn serve_args(o: &Opts) -> Vec<String> {
    let mut a = vec!["serve".to_string()];
    if let Some(p) = o.profile {
        a.extend(["--profile".into(), p.into()]);
    }
    if let Some(socket) = &o.probe_at {
        a.extend(["--probe-socket".into(), socket.display().to_string()]);
    } else if o.probe {
        a.extend([
            "--probe-socket".into(),
            probe_socket().display().to_string(),
        ]);
    } else {
        a.push("--no-probe".into());
    }
    if let Some(f) = o.fault {
        a.extend(["--interface-fault".into(), f.into()]);
    }
    a.extend(o.extra.iter().cloned());
    a
}

impl Bridge {
    /// `agent-bridge serve --stdio`, driven through rmcp's client.
    pub async fn stdio(o: Opts) -> Bridge {
        let mut args = serve_args(&o);
        args.push("--stdio".into());
        Bridge::stdio_with(&args, o.sessionless)
            .await
            .expect("MCP handshake over stdio")
    }

    /// `agent-bridge ARGS…` speaking MCP on stdio, driven through rmcp's client.
    pub async fn stdio_with(args: &[String], sessionless: bool) -> Result<Bridge, String> {
        Bridge::stdio_under(&[], args, sessionless).await
    }

    /// [`Bridge::stdio_with`], started by `wrapper` (e.g. `runsc do`).
    pub async fn stdio_under(
        wrapper: &[&str],
        args: &[String],
        sessionless: bool,
    ) -> Result<Bridge, String> {
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = tokio::process::Command::new(program);
                c.args(rest).arg(BRIDGE);
                c
            }
            None => tokio::process::Command::new(BRIDGE),
        };
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // a pipe copied to ours, not ours: a wrapper may chown its
            // stdio (runsc gives it to its sandbox's user), and ours may be
            // the caller's file (CI's log)
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start agent-bridge");
        let mut stderr = child.stderr.take().unwrap();
        tokio::spawn(async move { tokio::io::copy(&mut stderr, &mut tokio::io::stderr()).await });
        let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(
            child.stdout.take().unwrap(),
            child.stdin.take().unwrap(),
        )
        .with_max_line_length(512 << 20);
        let handler = Handler::default();
        let client = handshake(handler.clone(), transport, sessionless).await?;
        Ok(Bridge {
            client,
            handler,
            child: None,
            tokio_child: Some(child),
            url: None,
        })
    }

    /// `agent-bridge serve --http 127.0.0.1:0`; returns the process (killed
    /// on drop, even when a test fails) and its URL.
    pub fn start_http(o: &Opts) -> (Killed, String) {
        let mut args = serve_args(o);
        args.extend(["--http".into(), "127.0.0.1:0".into()]);
        Bridge::start_http_with(&args)
    }

    /// `agent-bridge ARGS…` serving HTTP; returns it and its URL.
    pub fn start_http_with(args: &[String]) -> (Killed, String) {
        Bridge::start_http_without(args, &[])
    }

    /// `start_http_with`, the bridge's environment without `unset`.
    pub fn start_http_without(args: &[String], unset: &[&str]) -> (Killed, String) {
        let mut command = Command::new(BRIDGE);
        for name in unset {
            command.env_remove(name);
        }
        let mut child = command
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start agent-bridge --http");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("bridge exited before listening")
                .unwrap();
            let rest = line
                .split("serving MCP at ")
                .nth(1)
                .or_else(|| line.split("proxying MCP at ").nth(1));
            if let Some(rest) = rest {
                break rest.trim().to_string();
            }
        };
        // keep draining stderr so the bridge never blocks on it
        std::thread::spawn(move || for _ in lines {});
        (Killed(child), url)
    }

    pub async fn connect_http(url: &str, token: Option<&str>) -> Result<(Client, Handler), String> {
        Bridge::connect_http_as(url, token, false).await
    }

    pub async fn connect_http_as(
        url: &str,
        token: Option<&str>,
        sessionless: bool,
    ) -> Result<(Client, Handler), String> {
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
        if let Some(t) = token {
            config = config.auth_header(t.to_string());
        }
        // rmcp's client takes 16 MiB per response by default; 64 MiB reads need more
        config = config
            .max_sse_event_size(512 << 20)
            .max_json_response_size(512 << 20);
        let handler = Handler::default();
        let transport = StreamableHttpClientTransport::from_config(config);
        let client = handshake(handler.clone(), transport, sessionless).await?;
        Ok((client, handler))
    }

    pub async fn http(o: Opts) -> Bridge {
        let (child, url) = Bridge::start_http(&o);
        let (client, handler) = Bridge::connect_http_as(&url, None, o.sessionless)
            .await
            .expect("MCP handshake over HTTP");
        Bridge {
            client,
            handler,
            child: Some(child),
            tokio_child: None,
            url: Some(url),
        }
    }

    pub async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        try_call(&self.client, tool, args)
            .await
            .unwrap_or_else(|e| panic!("{tool}: {e}"))
    }

    /// The bridge process is still alive.
    pub fn alive(&mut self) -> bool {
        if let Some(c) = &mut self.child {
            return c.alive();
        }
        self.tokio_child
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
            .is_none()
    }

    pub fn pid(&self) -> u32 {
        match (&self.child, &self.tokio_child) {
            (Some(c), _) => c.0.id(),
            (_, Some(c)) => c.id().unwrap(),
            _ => unreachable!(),
        }
    }
}

pub async fn try_call(
    client: &Client,
    tool: &str,
    args: Value,
) -> Result<CallToolResult, rmcp::ServiceError> {
    let params = CallToolRequestParams::new(tool.to_string())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    tokio::time::timeout(Duration::from_secs(120), client.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("{tool}: no answer in 120 s"))
}

pub fn structured(r: &CallToolResult) -> &Value {
    r.structured_content
        .as_ref()
        .expect("every result has structuredContent")
}

pub fn is_error(r: &CallToolResult) -> bool {
    r.is_error == Some(true)
}

/// The bytes of a payload object ({text | base64, ...}), checked against its sha256.
pub fn payload_bytes(p: &Value) -> Vec<u8> {
    let data = match (p.get("text"), p.get("base64")) {
        (Some(Value::String(t)), _) => t.clone().into_bytes(),
        (_, Some(Value::String(b))) => unb64(b),
        _ => panic!("payload without text or base64: {p}"),
    };
    assert_eq!(
        p["sha256"],
        sha256(&data),
        "payload sha256 does not match its bytes"
    );
    assert_eq!(p["bytes"], data.len() as u64);
    data
}

/// read_file's embedded resource blob.
pub fn blob(r: &CallToolResult) -> Vec<u8> {
    for c in &r.content {
        if let ContentBlock::Resource(res) = c
            && let rmcp::model::ResourceContents::BlobResourceContents { blob, .. } = &res.resource
        {
            return unb64(blob);
        }
    }
    panic!(
        "no blob in {:?}",
        r.content
            .iter()
            .map(|c| format!("{c:?}").chars().take(80).collect::<String>())
            .collect::<Vec<_>>()
    );
}

pub fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t) => Some(t.text.clone()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The process is gone (a zombie waiting for init to reap it counts).
pub fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// A `/proc/PID/status` field given in kB (`VmRSS`, `VmHWM`), in bytes.
pub fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    line.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .unwrap()
        << 10
}

/// A unique path under /tmp for one test.
pub fn scratch(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "/tmp/bridge-test-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `agent-bridge campaign ARGS…`.
pub fn campaign(args: &[&str]) -> std::process::Output {
    std::process::Command::new(BRIDGE)
        .arg("campaign")
        .args(args)
        .output()
        .expect("run agent-bridge campaign")
}

/// `agent-bridge campaign ARGS…`, which must succeed: its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = campaign(args);
    assert!(
        out.status.success(),
        "campaign {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A probe daemon of the test's own (killed on drop), ready; its socket.
/// `dir` holds socket and DB.
pub fn probe_daemon(dir: &Path) -> (Killed, PathBuf) {
    let socket = dir.join("probe.sock");
    let child = Command::new(probe_binary())
        .args(["run", "--socket"])
        .arg(&socket)
        .arg("--db")
        .arg(dir.join("evidence.db"))
        .stderr(Stdio::null())
        .spawn()
        .expect("start probe run");
    probe::client::wait_until_ready(&socket, Duration::from_secs(30))
        .expect("the probe daemon did not come up");
    (Killed(child), socket)
}

/// A probe daemon of the test's own that exports its spans over OTLP to
/// `otlp_url` (killed on drop); its socket. `dir` holds socket and DB.
pub fn otlp_probe(dir: &Path, otlp_url: &str) -> (Killed, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let socket = dir.join("probe.sock");
    let mut cmd = Command::new(probe_binary());
    cmd.args(["run", "--socket"])
        .arg(&socket)
        .arg("--db")
        .arg(dir.join("evidence.db"))
        .args(["--otlp", otlp_url])
        .stderr(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    let child = Killed(cmd.spawn().expect("start probe run --otlp"));
    probe::client::wait_until_ready(&socket, Duration::from_secs(30))
        .expect("the probe daemon did not come up");
    (child, socket)
}

/// A tools/call with `_meta` (e.g. W3C trace context, SEP-414).
pub async fn call_with_meta(
    client: &Client,
    tool: &str,
    args: Value,
    meta: Value,
) -> CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_string())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    params.meta = Some(meta.as_object().cloned().unwrap_or_default().into());
    tokio::time::timeout(Duration::from_secs(120), client.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("{tool}: no answer in 120 s"))
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// `campaign generate` into `dir/suite`, its tests working under `base`,
/// keeping those of `domains` (all when empty): the suite and its size.
pub fn generated_suite(dir: &Path, count: usize, base: &str, domains: &[&str]) -> (PathBuf, usize) {
    let suite = dir.join("suite");
    ok(&[
        "generate",
        "--count",
        &count.to_string(),
        "--out",
        suite.to_str().unwrap(),
        "--base",
        base,
    ]);
    for e in std::fs::read_dir(&suite).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !domains.is_empty() && !domains.iter().any(|d| name.starts_with(&format!("{d}-"))) {
            std::fs::remove_file(p).unwrap();
        }
    }
    let n = std::fs::read_dir(&suite).unwrap().count();
    (suite, n)
}

/// Flags of a server that [`assert_connection_limits`] checks.
pub const TIGHT_CONNECTION_LIMITS: [&str; 6] = [
    "--max-connections",
    "3",
    "--idle-timeout",
    "1",
    "--body-timeout",
    "1",
];

/// `HOST:PORT` of a server's `http://HOST:PORT/mcp`.
pub fn host_port(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string()
}

/// A raw connection to `addr` whose reads give up after 10 s (a server
/// that never answers or closes fails there).
pub fn raw_connect(addr: &str) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// The head of a JSON-RPC POST to `addr` announcing a body of `len` bytes.
pub fn post_head(addr: &str, len: usize) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {len}\r\n\r\n"
    )
}

/// All the server sends until it closes the connection (a reset after an
/// answer counts as a close); panics if it keeps it open.
pub fn read_until_closed(s: &mut std::net::TcpStream) -> String {
    use std::io::Read as _;
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => String::from_utf8_lossy(&out).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            String::from_utf8_lossy(&out).into_owned()
        }
        Err(e) => panic!(
            "the server kept the connection open ({e}); it sent: {}",
            String::from_utf8_lossy(&out)
        ),
    }
}

/// The JSON body of a raw answer.
pub fn answer_json(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {answer}"))
}

/// Checks the connection limits of a server (`serve --http` or `proxy
/// --http`) started with [`TIGHT_CONNECTION_LIMITS`], over raw sockets: the cap answers 503 in JSON-RPC,
/// idle and stalled connections are closed, a stalled body gets 408, and a
/// connection is served again once one closes. Blocking.
pub fn assert_connection_limits(url: &str) {
    use std::io::Write as _;
    use std::net::TcpStream;
    let addr = host_port(url);
    // reads time out far above the 1 s limits
    let connect = || raw_connect(&addr);

    // three idle connections fill the cap; a fourth is refused at once
    let mut idle: Vec<TcpStream> = (0..3).map(|_| connect()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut fourth = connect();
    let refused = read_until_closed(&mut fourth);
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    let v = answer_json(&refused);
    assert_eq!(v["error"]["code"], -32000, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-connections"),
        "{v}"
    );
    // the idle ones are closed without an answer after the idle timeout
    for s in &mut idle {
        assert_eq!(
            read_until_closed(s),
            "",
            "an idle connection is closed silently"
        );
    }
    drop(idle);

    // a head sent in part is closed too
    let mut partial = connect();
    partial.write_all(b"POST /mcp HTTP/1.1\r\nHost: ").unwrap();
    read_until_closed(&mut partial);

    // a kept-alive connection is answered, then closed once left idle
    let mut kept = connect();
    let bad = b"not json";
    kept.write_all(post_head(&addr, bad.len()).as_bytes())
        .unwrap();
    kept.write_all(bad).unwrap();
    let answer = read_until_closed(&mut kept);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert_eq!(answer_json(&answer)["error"]["code"], -32700, "{answer}");

    // a body that stops arriving: 408 with a JSON-RPC error, then closed
    // (small bodies and ones past the size checked before the MCP layer)
    for len in [1000, 200_000] {
        let mut stalled = connect();
        stalled.write_all(post_head(&addr, len).as_bytes()).unwrap();
        stalled.write_all(br#"{"jsonrpc":"2.0","#).unwrap();
        let answer = read_until_closed(&mut stalled);
        assert!(answer.starts_with("HTTP/1.1 408 "), "{len}: {answer}");
        let v = answer_json(&answer);
        assert_eq!(v["error"]["code"], -32700, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--body-timeout"),
            "{v}"
        );
    }
}

/// Checks that a server (`serve --http` or `proxy --http`) with a body
/// limit of 1 MiB set by `flag`, and `--body-timeout 60`, answers a
/// request whose Content-Length is over the limit before any of its body
/// is sent: 413 with a JSON-RPC -32600 error naming the flag (it waited for
/// the body, and answered 408 at the body timeout). Blocking.
pub fn assert_declared_too_large_refused_at_once(url: &str, flag: &str) {
    use std::io::Write as _;
    let addr = host_port(url);
    let mut s = raw_connect(&addr);
    let started = std::time::Instant::now();
    s.write_all(post_head(&addr, 1 << 30).as_bytes()).unwrap();
    // gives up at 10 s, well before the body timeout
    let answer = read_until_closed(&mut s);
    eprintln!("413 after {:?}", started.elapsed());
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    let v = answer_json(&answer);
    assert_eq!(v["error"]["code"], -32600, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains(flag), "{v}");
}

/// Checks that SIGTERM ends `server` (`serve --http` or `proxy --http` at
/// `url`, with `--body-timeout 60`) while clients are stalled mid-body:
/// each is answered 503 with a JSON-RPC -32000 error, and the server exits
/// cleanly within 10 s (it waited out the body timeout). One body is small
/// enough to be checked before the MCP layer, one is read by it. Blocking.
pub fn assert_sigterm_cuts_stalled_bodies(mut server: Killed, url: &str) {
    use std::io::{Read as _, Write as _};
    let addr = host_port(url);
    let stalled: Vec<std::net::TcpStream> = [1000, 200_000]
        .into_iter()
        .map(|len| {
            let mut s = raw_connect(&addr);
            // with 100-continue the server says when it starts reading the body
            let head =
                post_head(&addr, len).replacen("\r\n\r\n", "\r\nExpect: 100-continue\r\n\r\n", 1);
            s.write_all(head.as_bytes()).unwrap();
            let mut go = [0u8; 25];
            s.read_exact(&mut go).unwrap();
            assert_eq!(&go, b"HTTP/1.1 100 Continue\r\n\r\n", "{len}");
            s.write_all(br#"{"jsonrpc":"2.0","#).unwrap();
            s
        })
        .collect();
    let pid = nix::unistd::Pid::from_raw(server.0.id() as i32);
    let started = std::time::Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    for mut s in stalled {
        let answer = read_until_closed(&mut s);
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        assert_eq!(answer_json(&answer)["error"]["code"], -32000, "{answer}");
    }
    assert!(
        within_10s(|| !server.alive()),
        "still running 10 s after SIGTERM"
    );
    eprintln!("exited {:?} after SIGTERM", started.elapsed());
    assert!(server.0.wait().unwrap().success());
}

/// One JSON-RPC message POSTed to a Streamable HTTP server as it is
/// written, in session `session`: the session id the answer names, its
/// status and its body.
pub async fn raw_post(
    url: &str,
    session: Option<&str>,
    body: &str,
) -> (Option<String>, u16, String) {
    let mut r = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string());
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    let resp = r.send().await.unwrap();
    let session = resp
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    let status = resp.status().as_u16();
    (session, status, resp.text().await.unwrap())
}

/// A raw `initialize` of protocol `version` with id `id`.
pub fn raw_initialize(id: u64, version: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}).to_string()
}

/// A session opened with raw messages (`initialize` of 2025-06-18, then
/// `notifications/initialized`): its `Mcp-Session-Id`.
pub async fn raw_http_session(url: &str) -> String {
    let (session, status, answer) = raw_post(url, None, &raw_initialize(1, "2025-06-18")).await;
    assert!(
        status == 200 && answer.contains("2025-06-18"),
        "{status} {answer}"
    );
    let session = session.expect("an Mcp-Session-Id");
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    raw_post(url, Some(&session), initialized).await;
    session
}

/// Every call cgroup (`mcp-PID-…`) of any bridge, in any hierarchy.
pub fn call_cgroups() -> Vec<PathBuf> {
    [
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/pids",
    ]
    .iter()
    .filter_map(|root| std::fs::read_dir(Path::new(root).join("agent-bridge")).ok())
    .flat_map(|d| d.flatten())
    .map(|e| e.path())
    .filter(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("mcp-"))
    })
    .collect()
}

/// Pids of live processes whose command line is exactly `argv`.
pub fn running(argv: &[&str]) -> Vec<String> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .filter(|pid| !gone(pid))
        .collect()
}

/// The call cgroups of server `pid` still in any hierarchy.
pub fn call_cgroups_of(pid: u32) -> Vec<String> {
    let prefix = format!("mcp-{pid}-");
    call_cgroups()
        .iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .map(|p| p.display().to_string())
        .collect()
}

/// Waits up to `limit` for `done`.
pub fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

/// Waits up to 10 s for `done`.
pub fn within_10s(done: impl FnMut() -> bool) -> bool {
    within(Duration::from_secs(10), done)
}

/// A raw client of the daemon inside a sandbox (`probe_relay.py`): the
/// test writes request lines and reads the daemon's lines back.
pub struct Relay {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    /// Its pid as its own namespace numbers it.
    pub pid: u64,
}

impl Relay {
    /// `probe_relay.py` under `wrapper`, connecting to `socket` (its path
    /// inside the sandbox); `mark` names it in /proc.
    pub fn start(wrapper: &[String], socket: &str, mark: &str) -> Relay {
        let relay = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/probe_relay.py");
        let mut child = Command::new(&wrapper[0])
            .args(&wrapper[1..])
            .args(["python3", relay.to_str().unwrap(), socket, mark])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // a pipe, copied to ours: see `Bridge::stdio_under`
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the relay");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::stderr()));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the relay started");
        let pid = serde_json::from_str::<Value>(&first).unwrap()["pid"]
            .as_u64()
            .unwrap();
        Relay {
            child,
            stdin,
            lines,
            pid,
        }
    }

    pub fn ask(&mut self, request: Value) -> Value {
        writeln!(self.stdin, "{request}").unwrap();
        self.stdin.flush().unwrap();
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no answer to {request}"));
        serde_json::from_str(&line).unwrap()
    }

    /// Every line that arrives within `d`.
    pub fn lines_within(&self, d: Duration) -> Vec<String> {
        let deadline = std::time::Instant::now() + d;
        let mut got = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => got.push(l),
                Err(_) => break,
            }
        }
        got
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `forbidden` answer in one sentence.
pub fn refused(answer: &Value, what: &str) {
    assert_eq!(answer["ok"], false, "{what}: {answer}");
    assert_eq!(answer["error"]["code"], "forbidden", "{what}: {answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !message.is_empty() && !message.contains('\n'),
        "{what}: one sentence: {answer}"
    );
}

/// Asserts that `relay`'s client can touch none of `open` (attach into,
/// end, tail) nor read `stored`, and returns the sessions its own listing
/// holds.
pub fn out_of_reach(relay: &mut Relay, open: &[u64], stored: u64) -> Vec<String> {
    for &span in open {
        for (request, what) in [
            (
                json!({"op": "attach", "span_id": span, "pid": 1}),
                "attach into",
            ),
            (json!({"op": "end_span", "span_id": span}), "end"),
            (json!({"op": "subscribe", "span_id": span}), "tail"),
        ] {
            refused(
                &relay.ask(request),
                &format!("{what} another's span {span}"),
            );
        }
    }
    refused(
        &relay.ask(json!({"op": "query", "span_id": stored})),
        "read another's stored span",
    );
    let listed = relay.ask(json!({"op": "query", "limit": 1000}));
    listed["spans"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|s| s["session"].as_str().map(str::to_owned))
        .collect()
}

/// bubblewrap binds of the host's system, read-only: /usr, /etc and /sys,
/// then `dirs` at their host paths, and /bin, /lib… as the links into /usr
/// they are on a merged-/usr host. Not the host's whole root: a recursive
/// bind of / takes in the mounts of containers that come and go meanwhile
/// (a podman container's shm), and fails when one goes between bwrap's
/// listing and its remount.
pub fn bwrap_system_binds(dirs: &[&str]) -> Vec<String> {
    let mut words = Vec::new();
    for dir in ["/usr", "/etc", "/sys"].iter().chain(dirs) {
        words.extend(["--ro-bind".into(), dir.to_string(), dir.to_string()]);
    }
    for link in ["/bin", "/sbin", "/lib", "/lib64"] {
        match std::fs::read_link(link) {
            Ok(target) => words.extend([
                "--symlink".into(),
                target.display().to_string(),
                link.to_string(),
            ]),
            Err(_) => words.extend(["--ro-bind-try".into(), link.into(), link.into()]),
        }
    }
    words
}
