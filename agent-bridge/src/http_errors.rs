//! JSON-RPC's error answers over Streamable HTTP, as the stdio transport
//! gives them. rmcp answers a body it cannot use in plain text: 415 for one
//! that is not a JSON-RPC message, 500 for one the client cut short, 413
//! for one over the limit; and it takes a request of an MCP method whose
//! params do not fit for an unknown method (-32601). In front of it, this
//! layer checks a small body (64 KiB or less, by its Content-Length) the
//! way the stdio transport checks a line, and answers in JSON-RPC itself:
//! 400 with `-32700` (not JSON, not UTF-8) or `-32600` (not a message),
//! 200 with `-32602` (a request, answered). A bigger body goes to rmcp as
//! it streams, and rmcp's plain-text refusals become 400 (or 413) with a
//! JSON-RPC error object saying the same.
//!
//! The listener (`listen.rs`) uses the rest for every server: a body
//! declared over the limit is refused before it is read
//! ([`refuse_declared_too_large`]), and one still arriving at shutdown is
//! cut ([`UntilShutdown`]) and answered 503.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use futures::FutureExt as _;
use hyper::body::{Frame, SizeHint};
use serde_json::Value;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::stdio::error_answer;

/// Bodies up to this size are checked before rmcp sees them.
const CHECKED: usize = 64 << 10;

/// The middleware (see the module's doc).
pub async fn jsonrpc_errors(request: Request, next: Next) -> Response {
    if request.method() != Method::POST || !is_json(request.headers()) {
        return next.run(request).await;
    }
    if content_length(request.headers()).is_none_or(|n| n > CHECKED) {
        return plain_refusals_as_jsonrpc(next.run(request).await).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, CHECKED).await {
        Ok(b) => b,
        Err(e) => {
            // a body within its Content-Length is never over CHECKED
            let limit = BodyLimit {
                bytes: CHECKED,
                flag: "--max-body",
            };
            return unreadable_body(&e, limit);
        }
    };
    // a request with a session id belongs to an initialized session
    let restart = parts
        .headers
        .contains_key("mcp-session-id")
        .then_some("send `initialize` without an Mcp-Session-Id to start another session");
    if let Some(refusal) = crate::stdio::refusal(&bytes, restart) {
        // a request with params that do not fit is answered; the rest is a bad request
        let status = match refusal["error"]["code"].as_i64() {
            Some(-32602) => StatusCode::OK,
            _ => StatusCode::BAD_REQUEST,
        };
        return answer(status, refusal);
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    plain_refusals_as_jsonrpc(response).await
}

fn content_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The largest request body a server takes, and the flag that sets it.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimit {
    pub bytes: usize,
    pub flag: &'static str,
}

/// A request whose Content-Length is over the limit gets its 413 at once:
/// waiting for a body that will be refused only ends in a 408.
pub async fn refuse_declared_too_large(
    State(limit): State<BodyLimit>,
    request: Request,
    next: Next,
) -> Response {
    if content_length(request.headers()).is_some_and(|n| n > limit.bytes) {
        // the body is left unread: the connection cannot carry another request
        return closing(too_large(limit));
    }
    next.run(request).await
}

fn too_large(limit: BodyLimit) -> Response {
    let why = format!(
        "Invalid Request: the body is over this server's limit of {} bytes ({})",
        limit.bytes, limit.flag
    );
    answer(
        StatusCode::PAYLOAD_TOO_LARGE,
        error_answer(Value::Null, -32600, why),
    )
}

/// A request body cut at shutdown.
#[derive(Debug, thiserror::Error)]
#[error("the server is shutting down")]
pub struct ShuttingDown;

/// A request body that fails with [`ShuttingDown`] when it keeps its reader
/// waiting after `shutdown` fired: a client stalled mid-body would
/// otherwise hold the server's exit until `--body-timeout`.
pub struct UntilShutdown {
    body: Body,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl UntilShutdown {
    pub fn new(body: Body, shutdown: CancellationToken) -> Self {
        UntilShutdown {
            body,
            shutdown: Box::pin(shutdown.cancelled_owned()),
        }
    }
}

impl hyper::body::Body for UntilShutdown {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        // what has arrived is still read; only a wait is cut
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.shutdown.poll_unpin(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(ShuttingDown)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split(';').next().unwrap_or_default().trim();
            essence.eq_ignore_ascii_case("application/json")
        })
}

/// The answer to a request body that could not be read in full: 408 when
/// it stopped arriving (the listener's `--body-timeout`), 503 when the
/// server is shutting down, 413 when it went over `limit`, else 400 (the
/// client cut it short); the connection is closed after a 408, 503 or 400,
/// whose unread rest is unknown.
pub fn unreadable_body(e: &axum::Error, limit: BodyLimit) -> Response {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<tower_http::timeout::TimeoutError>() {
            return closing(body_stopped());
        }
        if c.is::<ShuttingDown>() {
            return closing(shutting_down());
        }
        if c.is::<http_body_util::LengthLimitError>() {
            return too_large(limit);
        }
        cause = c.source();
    }
    let why = format!("Parse error: the request body could not be read in full: {e}");
    closing(answer(
        StatusCode::BAD_REQUEST,
        error_answer(Value::Null, -32700, why),
    ))
}

/// 408 for a body that stopped arriving.
fn body_stopped() -> Response {
    let why = "Parse error: the request body stopped arriving before its end \
               (nothing for longer than the server's --body-timeout)";
    answer(
        StatusCode::REQUEST_TIMEOUT,
        error_answer(Value::Null, -32700, why.into()),
    )
}

/// 503 for a body cut at shutdown.
fn shutting_down() -> Response {
    let why = "Server shutting down: the request body had not arrived in full; \
               send the request again once the server is back";
    answer(
        StatusCode::SERVICE_UNAVAILABLE,
        error_answer(Value::Null, -32000, why.into()),
    )
}

fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

fn answer(status: StatusCode, error: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error.to_string(),
    )
        .into_response()
}

/// rmcp's plain-text refusal of a body, as JSON-RPC says to refuse it.
async fn plain_refusals_as_jsonrpc(response: Response) -> Response {
    let status = response.status();
    let refusal = matches!(
        status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
            | StatusCode::INTERNAL_SERVER_ERROR
            | StatusCode::PAYLOAD_TOO_LARGE
    );
    if !refusal || is_json(response.headers()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(text) = axum::body::to_bytes(body, CHECKED).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let text = String::from_utf8_lossy(&text).trim().to_string();
    // rmcp's "Failed to read request body: ERROR" in tower-http's words
    if text.contains("not received within the designated timeout") {
        return closing(body_stopped());
    }
    if text.contains(&ShuttingDown.to_string()) {
        return closing(shutting_down());
    }
    let (status, code, message) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (status, -32600, format!("Invalid Request: {text}")),
        StatusCode::INTERNAL_SERVER_ERROR if text.starts_with("Failed to read request body") => (
            StatusCode::BAD_REQUEST,
            -32700,
            format!("Parse error: the request body was cut short: {text}"),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE if text.starts_with("fail to deserialize") => {
            // serde's words for JSON that is not a message, rather than not JSON
            let not_a_message = ["did not match", "missing field", "invalid type", "unknown"]
                .iter()
                .any(|w| text.contains(w));
            let (code, what) = if not_a_message {
                (-32600, "Invalid Request")
            } else {
                (-32700, "Parse error")
            };
            (StatusCode::BAD_REQUEST, code, format!("{what}: {text}"))
        }
        _ => return Response::from_parts(parts, Body::from(text)),
    };
    answer(status, error_answer(Value::Null, code, message))
}
