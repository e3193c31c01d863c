//! The bridge a campaign runs against, and one MCP session with it.
//!
//! `stdio:CMD` starts CMD (through `sh -c`) for every session, so a bridge
//! that dies takes one test with it and the next session starts afresh.
//! An `http(s)://` URL opens a new Streamable HTTP session on one server.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, RequestMetaObject,
};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::Value;
use tokio::io::AsyncReadExt as _;

use super::record::CallError;

/// Largest single message the runner accepts from a bridge.
const MAX_MESSAGE: usize = 512 << 20;
/// How much of a stdio bridge's stderr is kept to explain its death.
const STDERR_TAIL: usize = 4096;
/// How long a call's answer is still awaited past its deadline, with
/// nothing sent meanwhile: an answer already on its way (a proxy's error
/// with its kernel evidence, when its `--call-timeout` fired about when the
/// step's time ran out) is still read, not dropped.
pub const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// The HTTP client for Streamable HTTP sessions: rmcp's own keeps no idle
/// connection (its guard against a server that leaves an answer's stream
/// open), so every call paid a new TCP connection and its accept. This one
/// keeps them: a finished answer (agent-bridge answers a lone result as
/// plain JSON) returns its connection to the pool, and one left open is
/// dropped, not reused. Redirects are not followed: a session's messages
/// go to the address it was given.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a reqwest client with no TLS settings to fail on")
}

#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Stdio(String),
    Http(String),
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Target, String> {
        if let Some(cmd) = s.strip_prefix("stdio:") {
            if cmd.trim().is_empty() {
                return Err(
                    "`stdio:` needs a command, e.g. stdio:'agent-bridge serve --stdio'".into(),
                );
            }
            Ok(Target::Stdio(cmd.to_string()))
        } else if s.starts_with("http://") || s.starts_with("https://") {
            Ok(Target::Http(s.to_string()))
        } else {
            Err(format!(
                "`{s}`: a target is stdio:'COMMAND' or an http(s):// MCP URL"
            ))
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Stdio(cmd) => write!(f, "stdio:{cmd}"),
            Target::Http(url) => f.write_str(url),
        }
    }
}

/// One MCP session with the bridge.
pub struct Connection {
    client: RunningService<RoleClient, ClientConfig>,
    child: Option<tokio::process::Child>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

/// What a bridge says it runs under (`sandbox_info`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxInfo {
    /// The profile's name.
    pub profile: Option<String>,
    /// The fault it injects: the profile's primitive, or `interface`.
    pub injected: Option<String>,
}

fn client_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        rmcp::model::Implementation::new("agent-bridge-campaign", env!("CARGO_PKG_VERSION")),
    )
}

/// Why a session with a target could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot start `{command}`: {error}")]
    Start {
        command: String,
        error: std::io::Error,
    },
    /// The server did not complete `initialize`; `stderr` is the end of
    /// what a stdio server printed.
    #[error("MCP handshake with {target} failed: {reason}{}", if stderr.is_empty() { String::new() } else { format!("; stderr: {stderr}") })]
    Handshake {
        target: String,
        reason: String,
        stderr: String,
    },
}

impl Target {
    /// Opens a session (starting the bridge for a stdio target).
    pub async fn connect(&self) -> Result<Connection, ConnectError> {
        match self {
            Target::Stdio(cmd) => {
                let mut child = tokio::process::Command::new("sh")
                    .args(["-c", cmd])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|error| ConnectError::Start {
                        command: cmd.clone(),
                        error,
                    })?;
                let stderr = Arc::new(Mutex::new(Vec::new()));
                let mut pipe = child.stderr.take().expect("piped");
                let tail = stderr.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                        let mut t = tail.lock().unwrap();
                        t.extend_from_slice(&buf[..n]);
                        let excess = t.len().saturating_sub(STDERR_TAIL);
                        t.drain(..excess);
                    }
                });
                let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(
                    child.stdout.take().expect("piped"),
                    child.stdin.take().expect("piped"),
                )
                .with_max_line_length(MAX_MESSAGE);
                let client = match client_info().serve(transport).await {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = child.kill().await;
                        let tail = String::from_utf8_lossy(&stderr.lock().unwrap()).into_owned();
                        return Err(ConnectError::Handshake {
                            target: format!("`{cmd}`"),
                            reason: e.to_string(),
                            stderr: tail.trim().to_owned(),
                        });
                    }
                };
                Ok(Connection {
                    client,
                    child: Some(child),
                    stderr,
                })
            }
            Target::Http(url) => {
                use rmcp::transport::StreamableHttpClientTransport;
                use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone())
                    .max_sse_event_size(MAX_MESSAGE)
                    .max_json_response_size(MAX_MESSAGE);
                if let Ok(token) = std::env::var("AGENT_BRIDGE_TOKEN") {
                    config = config.auth_header(token);
                }
                let transport = StreamableHttpClientTransport::with_client(http_client(), config);
                let client =
                    client_info()
                        .serve(transport)
                        .await
                        .map_err(|e| ConnectError::Handshake {
                            target: url.clone(),
                            reason: e.to_string(),
                            stderr: String::new(),
                        })?;
                Ok(Connection {
                    client,
                    child: None,
                    stderr: Arc::default(),
                })
            }
        }
    }
}

/// A JSON-RPC error answer, with the kernel evidence it carries.
fn protocol_error(e: rmcp::ErrorData) -> CallError {
    CallError::Protocol {
        message: format!("{} (code {})", e.message, e.code.0),
        kernel: e
            .data
            .and_then(|mut d| d.get_mut("probe/kernel").map(Value::take)),
    }
}

impl Connection {
    /// Calls `tool`; `meta` is the request's `_meta` (a step span's trace
    /// context, with --otlp: SEP-414). The answer is awaited until `wait`
    /// and [`ANSWER_GRACE`] have passed.
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        wait: Duration,
        meta: Option<RequestMetaObject>,
    ) -> Result<CallToolResult, CallError> {
        let mut params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        params.meta = meta;
        let patience = wait + ANSWER_GRACE;
        match tokio::time::timeout(patience, self.client.call_tool(params)).await {
            Err(_) => Err(CallError::timeout(patience)),
            Ok(Ok(r)) => Ok(r),
            Ok(Err(rmcp::ServiceError::McpError(e))) => Err(protocol_error(e)),
            Ok(Err(e)) => Err(CallError::transport(self.explain(e.to_string()))),
        }
    }

    /// Every tool the server lists (following pagination).
    pub async fn list_tools(&self) -> Result<Vec<rmcp::model::Tool>, CallError> {
        match tokio::time::timeout(Duration::from_secs(30), self.client.list_all_tools()).await {
            Err(_) => Err(CallError::timeout(Duration::from_secs(30))),
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(rmcp::ServiceError::McpError(e))) => Err(protocol_error(e)),
            Ok(Err(e)) => Err(CallError::transport(self.explain(e.to_string()))),
        }
    }

    /// The bridge's `sandbox_info`.
    pub async fn sandbox(&self) -> Result<SandboxInfo, CallError> {
        let r = self
            .call(
                "sandbox_info",
                serde_json::Map::new(),
                Duration::from_secs(30),
                None,
            )
            .await?;
        let s = r.structured_content.unwrap_or_default();
        let profile = s["profile"]["name"].as_str().map(String::from);
        let injected = if s["interface_fault"].is_string() {
            Some("interface".to_string())
        } else {
            s["profile"]["reproduces"]
                .as_str()
                .filter(|p| *p != "none")
                .map(String::from)
        };
        Ok(SandboxInfo { profile, injected })
    }

    /// Adds what a dead stdio bridge said last, or its exit status.
    fn explain(&self, error: String) -> String {
        let tail = String::from_utf8_lossy(&self.stderr.lock().unwrap())
            .trim()
            .to_string();
        if tail.is_empty() {
            error
        } else {
            format!("{error}; bridge stderr: {tail}")
        }
    }

    /// Ends the session; a stdio bridge is given a moment, then killed.
    pub async fn close(mut self) {
        let _ = self.client.close_with_timeout(Duration::from_secs(2)).await;
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(Duration::from_secs(2), child.wait())
                .await
                .is_err()
        {
            let _ = child.kill().await;
        }
    }
}
