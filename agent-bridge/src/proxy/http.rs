//! The proxy over Streamable HTTP: one foreign server per MCP session.
//!
//! - `POST /mcp` with `initialize` and no `Mcp-Session-Id` starts a session
//!   (and its server); the answer carries the new `Mcp-Session-Id`.
//! - `POST /mcp` with a request: the answer as `application/json`, or as
//!   an SSE stream for a `tools/call` with a `progressToken` (its progress
//!   notifications, and the server's own requests while it runs, come first).
//! - `POST /mcp` with a notification or a response: `202 Accepted`.
//! - `GET /mcp`: an SSE stream of what the server sends unprompted
//!   (notifications, requests such as `sampling/createMessage` or `roots/list`,
//!   whose answers the client POSTs back).
//! - `DELETE /mcp`: ends the session and kills its server.
//! - A session idle for `--session-idle-timeout` (no request in flight, no
//!   event stream open: a client gone without DELETE) is ended the same way.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use super::frame::{ChildHead, Kind};
use super::{ClientSink, Deliver, Options, Relay};
use crate::http_errors::BodyLimit;
use crate::server::Guard;

const SESSION: &str = "mcp-session-id";

/// A session's relay and where its server's messages go.
type Entry = (Arc<Relay>, Arc<HttpSink>);

struct Sessions {
    opts: Arc<Options>,
    max_body: BodyLimit,
    by_id: Mutex<HashMap<String, Entry>>,
}

/// Streams a session's server messages can go to, and whether its client
/// is still there.
struct HttpSink {
    /// SSE streams of calls in flight (by request id), newest last.
    calls: Mutex<Vec<(String, mpsc::UnboundedSender<Vec<Bytes>>)>>,
    /// The client's GET stream.
    standalone: Mutex<Option<mpsc::UnboundedSender<Vec<Bytes>>>>,
    /// Requests of the session being answered.
    busy: std::sync::atomic::AtomicUsize,
    /// When a request of the session last started or ended.
    last_seen: Mutex<Instant>,
}

impl Default for HttpSink {
    fn default() -> Self {
        HttpSink {
            calls: Mutex::default(),
            standalone: Mutex::default(),
            busy: Default::default(),
            last_seen: Mutex::new(Instant::now()),
        }
    }
}

/// One request of a session in flight, until dropped (answered, or its
/// client gone).
struct Busy(Arc<HttpSink>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

impl HttpSink {
    fn touch(&self) {
        *self.last_seen.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.touch();
        Busy(self.clone())
    }

    /// How long nothing has happened in the session: no request in flight,
    /// no event stream open. `None` while something is.
    fn idle_for(&self) -> Option<Duration> {
        let open = |tx: &mpsc::UnboundedSender<Vec<Bytes>>| !tx.is_closed();
        if self.busy.load(Ordering::Relaxed) > 0
            || self
                .calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|(_, tx)| open(tx))
            || self
                .standalone
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(open)
        {
            return None;
        }
        Some(
            self.last_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed(),
        )
    }
}

impl ClientSink for HttpSink {
    fn server_message(&self, line: Bytes, head: &ChildHead, related: Option<&str>) -> bool {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.retain(|(_, tx)| !tx.is_closed());
        if head.kind == Kind::Response
            && let Some(id) = related
        {
            // a late answer ends the stream of the call it answers, if that
            // is still open; no other stream may carry it
            let Some(at) = calls.iter().position(|(i, _)| i == id) else {
                return false;
            };
            let (_, tx) = calls.remove(at);
            return tx.send(vec![line, Bytes::new()]).is_ok();
        }
        let to_call = related
            .and_then(|id| calls.iter().find(|(i, _)| i == id))
            .or(calls.last());
        if let Some((_, tx)) = to_call
            && tx.send(vec![line.clone()]).is_ok()
        {
            return true;
        }
        let mut standalone = self.standalone.lock().unwrap_or_else(|p| p.into_inner());
        match standalone.as_ref() {
            Some(tx) if tx.send(vec![line]).is_ok() => true,
            _ => {
                *standalone = None;
                false
            }
        }
    }
}

fn jsonrpc_error(status: StatusCode, answer: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
        .into_response()
}

fn plain(status: StatusCode, text: &str) -> Response {
    let answer = crate::stdio::error_answer(Value::Null, -32600, text.to_string());
    jsonrpc_error(status, answer)
}

/// 128 random bits, hex.
fn new_session_id() -> String {
    use std::io::Read as _;
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        b[..8].copy_from_slice(&probe::clock::monotonic_ns().to_ne_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An SSE event per message; the stream ends after the answer (the
/// message whose last piece is empty).
fn sse(mut rx: mpsc::UnboundedReceiver<Vec<Bytes>>) -> Response {
    let stream = async_stream(
        move |tx: mpsc::Sender<Result<Bytes, std::io::Error>>| async move {
            while let Some(chunks) = rx.recv().await {
                let last = chunks.last().is_some_and(Bytes::is_empty);
                let mut ok = tx
                    .send(Ok(Bytes::from_static(b"event: message\ndata: ")))
                    .await
                    .is_ok();
                for c in chunks.into_iter().filter(|c| !c.is_empty()) {
                    ok &= tx.send(Ok(c)).await.is_ok();
                }
                ok &= tx.send(Ok(Bytes::from_static(b"\n\n"))).await.is_ok();
                if !ok || last {
                    return;
                }
            }
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(stream)
        .expect("response")
}

/// A body fed by a task.
fn async_stream<F, Fut>(f: F) -> Body
where
    F: FnOnce(mpsc::Sender<Result<Bytes, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(f(tx));
    Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

fn json_body(chunks: Vec<Bytes>, session: Option<&str>) -> Response {
    let mut r = Response::builder().header(header::CONTENT_TYPE, "application/json");
    if let Some(s) = session {
        r = r.header(SESSION, s);
    }
    let body = Body::from_stream(futures::stream::iter(
        chunks.into_iter().map(Ok::<_, std::io::Error>),
    ));
    r.body(body).expect("response")
}

async fn post(State(s): State<Arc<Sessions>>, headers: HeaderMap, body: Body) -> Response {
    let line = match axum::body::to_bytes(body, s.max_body.bytes).await {
        Ok(b) => b.to_vec(),
        Err(e) => return crate::http_errors::unreadable_body(&e, s.max_body),
    };
    let head = match super::frame::client_head(&line) {
        Ok(h) => h,
        Err(answer) => {
            // a request whose params do not fit is a request: answered 200
            // with its error, as serve answers it; what is no request is 400
            let status = if answer["error"]["code"] == -32602 {
                StatusCode::OK
            } else {
                StatusCode::BAD_REQUEST
            };
            return jsonrpc_error(status, answer);
        }
    };
    let given = headers.get(SESSION).and_then(|v| v.to_str().ok());
    let initialize = head.method.as_deref() == Some("initialize");
    let (session, relay, sink) = match given {
        None if initialize => {
            let sink = Arc::new(HttpSink::default());
            let relay = match Relay::new(s.opts.clone(), sink.clone()) {
                Ok(r) => r,
                Err(e) => {
                    return plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!("cannot apply the profile: {e}"),
                    );
                }
            };
            let id = new_session_id();
            s.by_id
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.clone(), (relay.clone(), sink.clone()));
            (Some(id), relay, sink)
        }
        None => {
            return plain(
                StatusCode::BAD_REQUEST,
                "Bad Request: no Mcp-Session-Id header (start a session with initialize)",
            );
        }
        Some(id) => match s.by_id.lock().unwrap_or_else(|p| p.into_inner()).get(id) {
            Some((r, k)) => (None, r.clone(), k.clone()),
            None => {
                return plain(
                    StatusCode::NOT_FOUND,
                    "Not Found: no such session (it was ended, or never started): initialize again",
                );
            }
        },
    };
    let _busy = sink.busy();
    if head.kind != Kind::Request {
        relay.on_client_message(line, head, Box::new(|_| {})).await;
        return StatusCode::ACCEPTED.into_response();
    }
    let id = head.id.clone().unwrap_or_default();
    let streamed = head.method.as_deref() == Some("tools/call") && head.progress_token.is_some();
    if streamed {
        let (tx, rx) = mpsc::unbounded_channel();
        sink.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id.clone(), tx.clone()));
        // the answer is the stream's last event (an empty piece marks it)
        let deliver: Deliver = Box::new(move |mut chunks| {
            chunks.push(Bytes::new());
            let _ = tx.send(chunks);
        });
        relay.on_client_message(line, head, deliver).await;
        return sse(rx);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    relay
        .on_client_message(
            line,
            head,
            Box::new(move |chunks| {
                let _ = tx.send(chunks);
            }),
        )
        .await;
    match rx.await {
        Ok(chunks) => json_body(chunks, session.as_deref()),
        // the client cancelled it: the answer becomes an event stream that
        // the server's late answer, if one comes, ends with its evidence
        Err(_) => {
            let (tx, rx) = mpsc::unbounded_channel();
            sink.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((id, tx));
            sse(rx)
        }
    }
}

async fn get(State(s): State<Arc<Sessions>>, headers: HeaderMap) -> Response {
    let Some(sink) = headers
        .get(SESSION)
        .and_then(|v| v.to_str().ok())
        .and_then(|id| {
            s.by_id
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(id)
                .map(|(_, k)| k.clone())
        })
    else {
        return plain(StatusCode::NOT_FOUND, "Not Found: no such session");
    };
    let (tx, rx) = mpsc::unbounded_channel();
    sink.touch();
    *sink.standalone.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    sse(rx)
}

async fn delete(State(s): State<Arc<Sessions>>, headers: HeaderMap) -> Response {
    let removed = headers
        .get(SESSION)
        .and_then(|v| v.to_str().ok())
        .and_then(|id| s.by_id.lock().unwrap_or_else(|p| p.into_inner()).remove(id));
    match removed {
        Some((relay, _)) => {
            relay.shutdown().await;
            StatusCode::OK.into_response()
        }
        None => plain(StatusCode::NOT_FOUND, "Not Found: no such session"),
    }
}

/// Serves Streamable HTTP at `http://ADDR/mcp` until `shutdown` fires.
pub async fn serve_http(
    opts: Arc<Options>,
    addr: SocketAddr,
    guard: Guard,
    limits: crate::listen::ConnectionLimits,
    session_idle: Option<Duration>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let max_body = BodyLimit {
        bytes: opts.max_message,
        flag: "--max-message",
    };
    let sessions = Arc::new(Sessions {
        max_body,
        opts,
        by_id: Mutex::new(HashMap::new()),
    });
    let routes = axum::routing::post(post).get(get).delete(delete);
    let app = axum::Router::new()
        .route("/mcp", routes)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(sessions.clone());
    let sweeper =
        session_idle.map(|limit| tokio::spawn(end_idle_sessions(sessions.clone(), limit)));
    let app = guard.wrap(app);
    let served = crate::listen::listen(addr, app, "proxying MCP", limits, max_body, shutdown).await;
    if let Some(sweeper) = sweeper {
        sweeper.abort();
    }
    let all: Vec<_> = sessions
        .by_id
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .collect();
    for (_, (relay, _)) in all {
        relay.shutdown().await;
    }
    served
}

/// Ends the sessions idle for `limit` (a client gone without DELETE), and
/// their servers with them; looks every quarter of it (1 to 30 s).
async fn end_idle_sessions(sessions: Arc<Sessions>, limit: Duration) {
    let every = (limit / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let idle: Vec<(String, Entry)> = {
            let mut by_id = sessions.by_id.lock().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<String> = by_id
                .iter()
                .filter(|(_, (_, sink))| sink.idle_for().is_some_and(|d| d >= limit))
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| by_id.remove(&id).map(|e| (id, e)))
                .collect()
        };
        for (id, (relay, _)) in idle {
            tracing::info!(
                "session {id} idle for {}s: ending it and its server",
                limit.as_secs()
            );
            relay.shutdown().await;
        }
    }
}
