//! The MCP server: one [`Session`] per MCP session, over stdio or
//! Streamable HTTP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;
use tokio::sync::OnceCell;

use crate::session::{Config, Session};

/// A sandbox session made on first use.
type SessionSlot = Arc<OnceCell<Arc<Session>>>;

/// The MCP service of one client connection. Its calls run in its own
/// sandbox session, except those of clients that have no MCP session:
/// protocol 2026-07-28 removed sessions, and rmcp serves each such request
/// on a fresh service, so those calls share one session of the whole
/// bridge — else a background process, the probe's memory of what earlier
/// calls wrote and a session's disks would last a single call.
#[derive(Clone)]
pub struct Bridge {
    own: SessionSlot,
    sessionless: SessionSlot,
    config: Arc<Config>,
    tools: Arc<Vec<Tool>>,
}

impl Bridge {
    /// A bridge whose session is set up now, so that a profile that cannot
    /// be applied fails at start.
    pub fn new(config: Arc<Config>) -> std::io::Result<Bridge> {
        let session = Arc::new(Session::new(config.clone())?);
        Ok(Bridge {
            own: Arc::new(OnceCell::new_with(Some(session))),
            ..Bridge::lazy(config, SessionSlot::default())
        })
    }

    /// A bridge whose session is set up by its first tool call; sessionless
    /// calls use `sessionless`, shared by every bridge of the server.
    fn lazy(config: Arc<Config>, sessionless: SessionSlot) -> Bridge {
        Bridge {
            own: SessionSlot::default(),
            sessionless,
            config,
            tools: contract::tools::all(),
        }
    }

    /// The session a call runs in: sessionless HTTP requests carry no
    /// `Mcp-Session-Id` (rmcp refuses such requests from session clients).
    async fn session(&self, context: &RequestContext<RoleServer>) -> std::io::Result<Arc<Session>> {
        let sessionless = context
            .extensions
            .get::<axum::http::request::Parts>()
            .is_some_and(|p| !p.headers.contains_key(HEADER_SESSION_ID));
        let slot = if sessionless {
            &self.sessionless
        } else {
            &self.own
        };
        slot.get_or_try_init(|| async { Session::new(self.config.clone()).map(Arc::new) })
            .await
            .cloned()
    }
}

/// The name clients show: an interface fault is impossible to miss.
pub fn server_name(config: &Config) -> String {
    match config.fault {
        Some(f) => format!("agent-bridge [INTERFACE FAULT INJECTED: {}]", f.name()),
        None => "agent-bridge".into(),
    }
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        let p = &self.config.profile;
        let mut instructions = format!(
            "Sandbox bridge. Every result carries exact bytes (text only when valid UTF-8 without NUL, else base64) with sha256, \
             and `kernel`: the probe's attribution of why a workload failed. Profile `{}`: {}",
            p.name, p.description
        );
        if let Some(f) = self.config.fault {
            instructions = format!(
                "WARNING: interface fault `{}` is injected: this server corrupts bytes on purpose (for testing harnesses). {instructions}",
                f.name()
            );
        }
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                server_name(&self.config),
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(instructions)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // one page, and so no cursor ever handed out: one sent is not ours,
        // and MCP says an invalid cursor is -32602 (not the first page again)
        if let Some(cursor) = request.and_then(|r| r.cursor) {
            let shown: String = cursor.chars().take(40).collect();
            let more = if shown.len() < cursor.len() {
                "…"
            } else {
                ""
            };
            return Err(McpError::invalid_params(
                format!(
                    "unknown cursor `{shown}{more}`: this server lists every tool in one page and gives out no cursor"
                ),
                None,
            ));
        }
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let token = context.meta.get_progress_token();
        let peer = context.peer.clone();
        let tick = move |elapsed: Duration| {
            if let Some(token) = &token {
                let secs = elapsed.as_secs_f64();
                let note = ProgressNotificationParam::new(token.clone(), secs)
                    .with_message(format!("running for {secs:.0} s"));
                let peer = peer.clone();
                tokio::spawn(async move {
                    let _ = peer.notify_progress(note).await;
                });
            }
        };
        let name = request.name.to_string();
        let session = self.session(&context).await.map_err(|e| {
            McpError::internal_error(format!("cannot set up the sandbox session: {e}"), None)
        })?;
        // for the probe's OpenTelemetry export: the tool, the MCP session
        // (HTTP transports) and the caller's trace context (`params._meta`)
        let call = crate::kernel::CallTrace {
            tool: name.clone(),
            mcp_session: context
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|p| p.headers.get(HEADER_SESSION_ID))
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            traceparent: context.meta.get_traceparent().map(str::to_owned),
            tracestate: context.meta.get_tracestate().map(str::to_owned),
        };
        let called = crate::kernel::CALL.scope(
            call,
            session.call(&name, request.arguments, context.ct.clone(), tick),
        );
        match called.await {
            Some(reply) => {
                let mut result = if reply.is_error {
                    CallToolResult::error(reply.content)
                } else {
                    CallToolResult::success(reply.content)
                };
                result.structured_content = Some(reply.structured);
                Ok(result.into())
            }
            None => {
                let known: Vec<&str> = self.tools.iter().map(|t| t.name.as_ref()).collect();
                Err(McpError::invalid_params(
                    format!("unknown tool `{name}` (tools: {})", known.join(", ")),
                    Some(json!({"tool": name})),
                ))
            }
        }
    }
}

/// Serves one session on stdin/stdout until the client closes it.
pub async fn serve_stdio(config: Arc<Config>, max_message: usize) -> anyhow::Result<()> {
    let bridge = Bridge::new(config)?;
    let transport = crate::stdio::StdioTransport::process_stdio(max_message)?;
    let running = rmcp::serve_server(bridge, transport).await?;
    running.waiting().await?;
    Ok(())
}

/// HTTP settings beyond the sessions' [`Config`].
pub struct HttpOptions {
    pub addr: SocketAddr,
    pub token: Option<String>,
    pub allowed_origins: Vec<String>,
    pub max_body: usize,
    pub limits: crate::listen::ConnectionLimits,
    /// An MCP session idle this long is ended (None: never).
    pub session_idle: Option<Duration>,
}

/// What every HTTP request must pass (`serve` and `proxy` alike).
#[derive(Clone)]
pub struct Guard {
    pub token: Option<String>,
    pub allowed_origins: Vec<String>,
    /// Refuse Host headers other than loopback names (DNS rebinding);
    /// for servers that do not check Host themselves (rmcp's does).
    pub loopback_hosts: bool,
}

impl Guard {
    /// The guard of a server listening on `addr`; refuses a non-loopback
    /// address without a token.
    pub fn for_addr(
        addr: SocketAddr,
        token: Option<String>,
        allowed_origins: Vec<String>,
        check_host: bool,
    ) -> anyhow::Result<Guard> {
        let loopback = addr.ip().is_loopback();
        if !loopback && token.is_none() {
            anyhow::bail!(
                "{addr} is not a loopback address: a bearer token is required (--token or AGENT_BRIDGE_TOKEN)"
            );
        }
        Ok(Guard {
            token,
            allowed_origins,
            loopback_hosts: check_host && loopback,
        })
    }

    /// `app` behind this guard.
    pub fn wrap(self, app: axum::Router) -> axum::Router {
        app.layer(axum::middleware::from_fn_with_state(Arc::new(self), guard))
    }
}

/// Host header names a loopback server answers to.
fn host_allowed(host: &str) -> bool {
    let name = if host.starts_with('[') {
        host.split_once(']')
            .map_or(host, |(h, _)| h)
            .trim_start_matches('[')
    } else {
        host.split(':').next().unwrap_or(host)
    };
    matches!(name, "localhost" | "127.0.0.1" | "::1")
}

/// Browsers send Origin; a page from elsewhere must not drive the sandbox.
fn origin_allowed(origin: &str, extra: &[String]) -> bool {
    if extra.iter().any(|o| o == origin) {
        return true;
    }
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    let Some(rest) = rest else {
        return false;
    };
    host_allowed(rest)
}

async fn guard(State(g): State<Arc<Guard>>, req: axum::extract::Request, next: Next) -> Response {
    if g.loopback_hosts {
        let ok = req
            .headers()
            .get(header::HOST)
            .is_none_or(|h| h.to_str().is_ok_and(host_allowed));
        if !ok {
            return (
                StatusCode::FORBIDDEN,
                "Host not allowed: this server answers to localhost only\n",
            )
                .into_response();
        }
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .is_ok_and(|o| origin_allowed(o, &g.allowed_origins));
        if !ok {
            return (
                StatusCode::FORBIDDEN,
                "origin not allowed (see --allow-origin)\n",
            )
                .into_response();
        }
    }
    if let Some(token) = &g.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        // constant-time enough: compare digests, not the strings
        let matches = given.is_some_and(|g| {
            contract::bytes::sha256_hex(g.as_bytes())
                == contract::bytes::sha256_hex(token.as_bytes())
        });
        if !matches {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "a bearer token is required\n",
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// Serves Streamable HTTP at `/mcp` until `shutdown` fires. Prints the
/// bound address on stderr (port 0 picks a free one).
pub async fn serve_http(
    config: Arc<Config>,
    opts: HttpOptions,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let loopback = opts.addr.ip().is_loopback();
    // rmcp checks Host itself
    let g = Guard::for_addr(opts.addr, opts.token, opts.allowed_origins, false)?;
    let mut http = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(opts.max_body)
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        // sessionless calls (2026-07-28) get plain JSON where nothing comes
        // before the answer: no copy of a 64 MiB answer into an SSE event
        .with_json_response(true)
        .with_cancellation_token(shutdown.child_token());
    if !loopback {
        // the bearer token guards a public address; Host names vary there
        http = http.disable_allowed_hosts();
    }
    let factory_config = config.clone();
    let sessionless = SessionSlot::default();
    // rmcp ends a session whose worker saw no event for `keep_alive`; the
    // session's sandbox (workloads, browser, probe session) drops with it
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = opts.session_idle;
    let service: StreamableHttpService<Bridge, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(Bridge::lazy(factory_config.clone(), sessionless.clone())),
        Arc::new(sessions),
        http,
    );
    // a call whose answer is all its stream holds is answered as JSON
    let ids = Arc::new(crate::http_ids::InFlightIds::default());
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(
            crate::http_answer::single_answer_as_json,
        ))
        .layer(axum::middleware::from_fn_with_state(
            ids,
            crate::http_ids::refuse_reused_ids,
        ))
        // outermost: a refusal in JSON-RPC, whoever refused
        .layer(axum::middleware::from_fn(
            crate::http_errors::jsonrpc_errors,
        ));
    let app = g.wrap(app);
    let max_body = crate::http_errors::BodyLimit {
        bytes: opts.max_body,
        flag: "--max-body",
    };
    crate::listen::listen(
        opts.addr,
        app,
        "serving MCP",
        opts.limits,
        max_body,
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::{host_allowed, origin_allowed};

    #[test]
    fn only_loopback_hosts_when_checked() {
        assert!(host_allowed("localhost:8765"));
        assert!(host_allowed("127.0.0.1"));
        assert!(host_allowed("[::1]:80"));
        assert!(!host_allowed("evil.example:8765"));
        assert!(!host_allowed("localhost.evil.example"));
    }

    #[test]
    fn only_loopback_origins_by_default() {
        assert!(origin_allowed("http://localhost:3000", &[]));
        assert!(origin_allowed("http://127.0.0.1", &[]));
        assert!(origin_allowed("http://[::1]:8080", &[]));
        assert!(!origin_allowed("https://evil.example", &[]));
        assert!(!origin_allowed("http://localhost.evil.example", &[]));
        assert!(!origin_allowed("null", &[]));
        assert!(origin_allowed(
            "https://app.example",
            &["https://app.example".into()]
        ));
    }
}
