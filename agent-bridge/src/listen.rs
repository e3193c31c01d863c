//! The HTTP listener of `serve --http` and `proxy --http`: accepts
//! connections up to a cap and serves each over HTTP/1.1 with timeouts, so
//! idle, stalled or too many clients cannot run the server out of file
//! descriptors. (`axum::serve` has neither timeouts nor a cap.)
//!
//! - `idle_timeout`: a connection waiting for a request's head — a new
//!   connection, or a kept-alive one between requests — is closed when the
//!   head has not arrived in full within it (hyper's header read timeout).
//!   A request in flight is never cut by it: a long call keeps its
//!   connection.
//! - `body_timeout`: a request body that stops arriving (nothing for that
//!   long) is answered 408 with a JSON-RPC error, and the connection closed.
//! - `max_connections`: one more is answered 503 with a JSON-RPC error and
//!   `Retry-After`, and closed, without reaching the MCP layer.
//! - `max_body`: a request whose Content-Length is over it is answered 413
//!   with a JSON-RPC error at once, its body unread, and the connection
//!   closed.
//!
//! On `shutdown` no connection is accepted; requests being handled finish,
//! but a body still arriving is cut: its request is answered 503 with a
//! JSON-RPC error and its connection closed, so a stalled client cannot
//! hold the exit for `body_timeout`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::http_errors::{BodyLimit, UntilShutdown, refuse_declared_too_large};

/// How many connections, and how long each may wait.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// None: wait for a request's head forever.
    pub idle_timeout: Option<Duration>,
    /// None: wait for a body's next bytes forever.
    pub body_timeout: Option<Duration>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 1024,
            idle_timeout: Some(Duration::from_secs(30)),
            body_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// Connections over the cap being answered 503 at once; beyond this many,
/// one more is closed without an answer (a flood gets nothing to read).
const REFUSING_MAX: usize = 64;

/// How long a refused connection gets to take its 503.
const REFUSAL_GRACE: Duration = Duration::from_secs(1);

/// Serves `app` on `addr` until `shutdown` fires, then lets the requests
/// in flight finish (cutting bodies still arriving); prints the bound
/// address (port 0 picks a free one) on stderr as
/// `agent-bridge: WHAT at http://ADDR/mcp`.
pub async fn listen(
    addr: SocketAddr,
    app: axum::Router,
    what: &str,
    limits: ConnectionLimits,
    max_body: BodyLimit,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let addr = listener.local_addr()?;
    warn_if_fds_run_short(limits.max_connections);
    eprintln!("agent-bridge: {what} at http://{addr}/mcp");
    let app = match limits.body_timeout {
        Some(t) => app.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(t)),
        None => app,
    };
    let cut = shutdown.clone();
    let app = app
        .layer(tower_http::map_request_body::MapRequestBodyLayer::new(
            move |body| axum::body::Body::new(UntilShutdown::new(body, cut.clone())),
        ))
        .layer(axum::middleware::from_fn_with_state(
            max_body,
            refuse_declared_too_large,
        ));
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let refusing = Arc::new(Semaphore::new(REFUSING_MAX));
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // EMFILE and the like: wait for a descriptor to free up
                    // rather than spin or stop serving
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        // an answer is written as several small chunks (SSE priming event,
        // message, end of stream): Nagle would hold each behind the last ACK
        let _ = tcp.set_nodelay(true);
        match open.clone().try_acquire_owned() {
            Ok(permit) => {
                let served = serve_connection(tcp, app.clone(), limits, permit, shutdown.clone());
                connections.spawn(served);
            }
            Err(_) => {
                if let Ok(permit) = refusing.clone().try_acquire_owned() {
                    tokio::spawn(refuse(tcp, limits.max_connections, permit));
                }
            }
        }
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

async fn serve_connection(
    tcp: TcpStream,
    app: axum::Router,
    limits: ConnectionLimits,
    _open: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout);
    let conn = http1.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app));
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = shutdown.cancelled() => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// 503 to a connection over the cap: written before its request is read,
/// then the request drained so closing does not reset the answer away.
async fn refuse(mut tcp: TcpStream, max: usize, _refusing: OwnedSemaphorePermit) {
    let body = crate::stdio::error_answer(
        serde_json::Value::Null,
        -32000,
        format!(
            "Server busy: {max} connections are open, the most this server holds \
             (--max-connections); retry when one closes"
        ),
    )
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_GRACE, async {
        tcp.write_all(answer.as_bytes()).await?;
        tcp.shutdown().await?;
        let mut sink = [0u8; 4096];
        while tcp.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Every connection is a descriptor: a cap above the soft RLIMIT_NOFILE
/// (less what sessions need) fails with EMFILE before it is reached.
fn warn_if_fds_run_short(max_connections: usize) {
    let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return;
    };
    let wanted = max_connections as u64 + 256;
    if soft < wanted {
        tracing::warn!(
            "--max-connections {max_connections} with a soft RLIMIT_NOFILE of {soft}: \
             accepting fails (EMFILE) before the cap is reached; raise it to {wanted} \
             (ulimit -n) or lower the cap"
        );
    }
}
