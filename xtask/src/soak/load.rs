//! The soak's load: three campaign loops (the HTTP bridge; stdio bridges
//! under every fault profile in turn; the proxy through the identity
//! adapter) and a hostile client, until told to stop. A loop whose target
//! was killed under it resumes its run once the target is back, as a user
//! would with `--resume`; each finished run must hold every test once.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::fleet::{Fleet, dies_with_the_soak};

/// The built-in fault profiles the stdio loop cycles through.
pub const PROFILES: [&str; 12] = [
    "clean",
    "readonly",
    "noexec",
    "ephemeral",
    "full-disk",
    "no-network",
    "no-tools",
    "pids-limit",
    "memory-limit",
    "seccomp-errno",
    "hidden-data",
    "no-caps",
];

/// What one campaign loop did.
#[derive(Debug, Default, Clone)]
pub struct LoopStats {
    pub name: String,
    /// (run id, profile or target) of every finished run.
    pub runs: Vec<(String, String)>,
    /// Resumes after the target went away under a run.
    pub resumes: u32,
    /// Runs that ended other than finished or resumable (with why).
    pub errors: Vec<String>,
    pub results: PathBuf,
}

/// What the hostile client sent and what came back.
#[derive(Debug, Default, Clone)]
pub struct HostileStats {
    /// op → (sent, answered at all).
    pub ops: std::collections::BTreeMap<&'static str, (u64, u64)>,
}

#[derive(Debug, Default, Clone)]
pub struct Load {
    pub loops: Vec<LoopStats>,
    pub hostile: HostileStats,
    pub tests_per_run: usize,
}

pub struct Drivers {
    loops: Vec<JoinHandle<LoopStats>>,
    hostile: JoinHandle<HostileStats>,
    tests: usize,
}

impl Drivers {
    pub fn spawn(
        fleet: &Arc<Fleet>,
        suite: &Path,
        tests: usize,
        dir: &Path,
        stop: Arc<AtomicBool>,
    ) -> Drivers {
        let bridge = fleet.agent_bridge().display().to_string();
        let socket = fleet.socket.display().to_string();
        let identity = crate::workspace_root().join("agent-bridge/adapters/agent-bridge.toml");
        let specs: Vec<(&str, Box<Target>)> = vec![
            ("http", {
                let url = fleet.bridge_url();
                Box::new(move |_| (url.clone(), vec![]))
            }),
            (
                "stdio",
                Box::new(move |k| {
                    let profile = PROFILES[k % PROFILES.len()];
                    (
                        format!(
                            "stdio:{bridge} serve --stdio --probe-socket {socket} --profile {profile}"
                        ),
                        vec![],
                    )
                }),
            ),
            ("proxy", {
                let url = fleet.proxy_url();
                let adapter = identity.display().to_string();
                Box::new(move |_| (url.clone(), vec!["--adapter".into(), adapter.clone()]))
            }),
        ];
        let loops = specs
            .into_iter()
            .map(|(name, target)| {
                let (fleet, stop) = (Arc::clone(fleet), Arc::clone(&stop));
                let (suite, results) =
                    (suite.to_path_buf(), dir.join(format!("results-{name}.db")));
                std::thread::spawn(move || {
                    campaign_loop(name, &fleet, &suite, &results, &*target, &stop)
                })
            })
            .collect();
        let hostile = {
            let (fleet, stop) = (Arc::clone(fleet), Arc::clone(&stop));
            std::thread::spawn(move || hostile_loop(&fleet, &stop))
        };
        Drivers {
            loops,
            hostile,
            tests,
        }
    }

    pub fn join(self) -> Load {
        Load {
            loops: self
                .loops
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect(),
            hostile: self.hostile.join().unwrap_or_default(),
            tests_per_run: self.tests,
        }
    }
}

/// Run `k`'s target and extra `campaign run` arguments.
type Target = dyn Fn(usize) -> (String, Vec<String>) + Send;

/// A hostile operation against a port: whether anything answered.
type Op = fn(u16) -> bool;

/// Runs the suite again and again against `target(k)` until `stop`.
fn campaign_loop(
    name: &str,
    fleet: &Fleet,
    suite: &Path,
    results: &Path,
    target: &Target,
    stop: &AtomicBool,
) -> LoopStats {
    let mut stats = LoopStats {
        name: name.to_string(),
        results: results.to_path_buf(),
        ..LoopStats::default()
    };
    let mut k = 0;
    while !stop.load(Ordering::SeqCst) {
        let run = format!("{name}-{k}");
        let (url, extra) = target(k);
        let mut resume = false;
        loop {
            let mut cmd = Command::new(fleet.agent_bridge());
            dies_with_the_soak(&mut cmd)
                .env_remove("LD_LIBRARY_PATH")
                .args(["campaign", "run", "--suite"])
                .arg(suite)
                .args(["--target", &url, "--db"])
                .arg(results)
                .args(if resume {
                    ["--resume", &run]
                } else {
                    ["--run", &run]
                })
                .args(["--workers", "1", "--no-bar"])
                .args(&extra);
            let out = match cmd.output() {
                Ok(o) => o,
                Err(e) => {
                    stats.errors.push(format!("{run}: {e}"));
                    break;
                }
            };
            if out.status.success() {
                stats.runs.push((run.clone(), url.clone()));
                break;
            }
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("--resume") {
                // the target (or the daemon) was killed under the run:
                // continue it once it is back
                stats.resumes += 1;
                resume = true;
                std::thread::sleep(Duration::from_secs(2));
                continue;
            }
            let last = err.lines().last().unwrap_or("").to_string();
            stats.errors.push(format!("{run}: {last}"));
            break;
        }
        k += 1;
    }
    stats
}

/// Misbehaving clients against the bridge and the proxy in turn, one
/// operation every second or so, until `stop`.
fn hostile_loop(fleet: &Fleet, stop: &AtomicBool) -> HostileStats {
    let mut stats = HostileStats::default();
    let ops: [(&'static str, Op); 6] = [
        ("garbage", garbage),
        ("malformed JSON", malformed),
        ("stalled body", stalled_body),
        ("abandoned session", abandoned_session),
        ("cancelled call", cancelled_call),
        ("reused id", reused_id),
    ];
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let (name, op) = ops[i % ops.len()];
        let port = if (i / ops.len()).is_multiple_of(2) {
            fleet.bridge_port
        } else {
            fleet.proxy_port
        };
        let answered = op(port);
        let e = stats.ops.entry(name).or_default();
        e.0 += 1;
        e.1 += u64::from(answered);
        i += 1;
        std::thread::sleep(Duration::from_millis(700));
    }
    stats
}

/// One request on its own connection (`Connection: close`); `declared`
/// overrides Content-Length (a body that never arrives in full). The raw
/// answer, whatever came within `wait`.
fn request(
    port: u16,
    session: Option<&str>,
    body: &[u8],
    declared: Option<usize>,
    wait: Duration,
) -> Option<String> {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    s.set_read_timeout(Some(wait)).ok()?;
    let session = session.map_or(String::new(), |id| format!("Mcp-Session-Id: {id}\r\n"));
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n{session}\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        declared.unwrap_or(body.len())
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    (!answer.is_empty()).then(|| String::from_utf8_lossy(&answer).into_owned())
}

const SHORT: Duration = Duration::from_secs(10);

/// A new MCP session's id.
fn initialize(port: u16) -> Option<String> {
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"soak-hostile","version":"0"}}}"#;
    let answer = request(port, None, body, None, SHORT)?;
    let id = answer.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("mcp-session-id")
            .then(|| v.trim().to_string())
    })?;
    request(
        port,
        Some(&id),
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        None,
        SHORT,
    );
    Some(id)
}

fn call(id: u64, command: &str) -> Vec<u8> {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "exec", "arguments": {"command": command, "timeout_ms": 20000}}})
    .to_string()
    .into_bytes()
}

fn garbage(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(SHORT));
    let junk: Vec<u8> = (0..512u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let _ = s.write_all(&junk);
    let _ = s.write_all(b"\r\n\r\n");
    let mut answer = [0u8; 64];
    matches!(s.read(&mut answer), Ok(n) if n > 0)
}

fn malformed(port: u16) -> bool {
    request(
        port,
        None,
        b"{\"jsonrpc\":\"2.0\",\"id\":\x00,\xff",
        None,
        SHORT,
    )
    .is_some_and(|a| a.starts_with("HTTP/1.1 4"))
}

fn stalled_body(port: u16) -> bool {
    // 4 KiB promised, 40 bytes sent: the server's body timeout answers
    request(
        port,
        None,
        &call(3, "true")[..40],
        Some(4096),
        Duration::from_secs(15),
    )
    .is_some_and(|a| a.starts_with("HTTP/1.1 408"))
}

fn abandoned_session(port: u16) -> bool {
    let Some(session) = initialize(port) else {
        return false;
    };
    // a call left running, its connection closed, the session never deleted
    if let Ok(mut s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
        let body = call(2, "sleep 5");
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes());
        let _ = s.write_all(&body);
        std::thread::sleep(Duration::from_millis(300));
    }
    true
}

fn cancelled_call(port: u16) -> bool {
    let Some(session) = initialize(port) else {
        return false;
    };
    let caller = {
        let session = session.clone();
        std::thread::spawn(move || request(port, Some(&session), &call(7, "sleep 4"), None, SHORT))
    };
    std::thread::sleep(Duration::from_millis(500));
    request(
        port,
        Some(&session),
        br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"soak"}}"#,
        None,
        SHORT,
    );
    let answered = caller.join().ok().flatten().is_some();
    delete(port, &session);
    answered
}

fn reused_id(port: u16) -> bool {
    let Some(session) = initialize(port) else {
        return false;
    };
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let session = session.clone();
            std::thread::spawn(move || {
                request(port, Some(&session), &call(9, "sleep 1"), None, SHORT)
            })
        })
        .collect();
    let answered = calls
        .into_iter()
        .filter_map(|c| c.join().ok().flatten())
        .count();
    delete(port, &session);
    answered > 0
}

fn delete(port: u16, session: &str) {
    if let Ok(mut s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
        let _ = s.set_read_timeout(Some(SHORT));
        let _ = write!(
            s,
            "DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nMcp-Session-Id: {session}\r\nConnection: close\r\n\r\n"
        );
        let _ = s.read_to_end(&mut Vec::new());
    }
}
