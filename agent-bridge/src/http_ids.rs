//! Request ids over Streamable HTTP, unique among a session's unanswered
//! requests as JSON-RPC wants them: a second request under an id still in
//! flight is refused with its own answer (-32600), as over stdio
//! ([`crate::stdio::InFlight`]). rmcp would take it and, its cancellation
//! token replacing the first's in its pool, drop the first's answer.
//!
//! A request is in flight from its POST until its answer's body ends (or
//! its client hangs up), or until the client cancels it. Bodies over
//! 1 MiB (file writes) are passed on as they stream, unchecked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use futures::StreamExt as _;
use serde_json::Value;

/// The largest body whose id is checked.
const CHECKED_BODY: usize = 1 << 20;

/// (session, id as JSON text) → the token of the request holding it.
#[derive(Default)]
pub struct InFlightIds {
    held: Mutex<HashMap<(String, String), u64>>,
    next: AtomicU64,
}

impl InFlightIds {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), u64>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Frees its id when dropped, unless a cancellation freed it (and a new
/// request took it) before.
struct Hold {
    ids: Arc<InFlightIds>,
    key: (String, String),
    token: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut held = self.ids.held();
        if held.get(&self.key) == Some(&self.token) {
            held.remove(&self.key);
        }
    }
}

/// The middleware (see the module's doc).
pub async fn refuse_reused_ids(
    State(ids): State<Arc<InFlightIds>>,
    request: Request,
    next: Next,
) -> Response {
    let session = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (Some(session), true) = (session, request.method() == Method::POST) else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    // up to 1 MiB read here; a bigger body (a file's bytes) passes on as it
    // streams, unchecked: holding all its chunks would leave tens of MiB
    // of small blocks in the heap
    let mut head = Vec::new();
    let mut read = 0;
    let mut stream = body.into_data_stream();
    let whole = loop {
        match stream.next().await {
            None => break true,
            Some(Err(_)) => {
                return (StatusCode::BAD_REQUEST, "the body could not be read").into_response();
            }
            Some(Ok(chunk)) => {
                read += chunk.len();
                head.push(chunk);
                if read > CHECKED_BODY {
                    break false;
                }
            }
        }
    };
    let message: Value = if whole {
        serde_json::from_slice(&head.concat()).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    let body = Body::from_stream(
        futures::stream::iter(head.into_iter().map(Ok::<_, axum::Error>)).chain(stream),
    );
    let request = Request::from_parts(parts, body);
    let (Some(method), Some(id)) = (message["method"].as_str(), message.get("id")) else {
        // a notification: a cancellation frees its request's id
        if message["method"] == "notifications/cancelled"
            && let Some(id) = message["params"].get("requestId")
        {
            ids.held().remove(&(session, id.to_string()));
        }
        return next.run(request).await;
    };
    let key = (session, id.to_string());
    let token = ids.next.fetch_add(1, Ordering::Relaxed);
    {
        let mut held = ids.held();
        if held.contains_key(&key) {
            let answer = crate::stdio::error_answer(
                id.clone(),
                -32600,
                format!(
                    "Invalid Request: request id {id} is still in flight (ids must be unique \
                     among a session's unanswered requests); this request (`{method}`) was not run"
                ),
            );
            return (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                answer.to_string(),
            )
                .into_response();
        }
        held.insert(key.clone(), token);
    }
    let hold = Hold {
        ids: ids.clone(),
        key,
        token,
    };
    let response = next.run(request).await;
    // held until the answer's body is read to its end or dropped
    response.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _ = &hold;
            chunk
        }))
    })
}
