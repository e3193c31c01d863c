//! A tool call's answer over Streamable HTTP as one JSON document rather
//! than an event stream, where nothing else comes with it.
//!
//! rmcp answers every POST of a session as an SSE stream (a priming event,
//! the answer, the end of the stream), even when the answer is all there
//! is. Clients stop reading at the answer, before the stream's end, and
//! then cannot reuse the connection (rmcp's own client keeps none idle for
//! that reason; the campaign runner's keeps them, see
//! `campaign::target::http_client`). The spec lets the server answer a request
//! with `application/json` instead; this layer does so whenever the
//! stream's only message is the answer, as soon as the answer comes (it
//! is a request stream's last message). A stream whose first message is a
//! notification (progress) or a request to the client stays a stream, from
//! that message on, with what came before it.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt as _;

/// The middleware (see the module's doc).
pub async fn single_answer_as_json(request: Request, next: Next) -> Response {
    let post = request.method() == Method::POST;
    let response = next.run(request).await;
    let sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !post || !sse {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let mut stream = body.into_data_stream();
    // everything read, to pass on as it came if the stream must stay one
    let mut seen: Vec<Bytes> = Vec::new();
    loop {
        let chunk = match stream.next().await {
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => {
                tracing::debug!("answer stream failed: {e}");
                break; // the client sees the cut where it was
            }
            None => break,
        };
        match scan(&chunk) {
            Scan::Nothing => seen.push(chunk),
            // the answer ends a request's stream (nothing follows it), so
            // it goes out now, without waiting for the stream to close
            Scan::Answer(json) => {
                parts.headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                parts.headers.remove(header::CONTENT_LENGTH);
                parts.headers.remove(header::TRANSFER_ENCODING);
                return Response::from_parts(parts, Body::from(json));
            }
            // a notification, a request to the client, a second message,
            // or an event cut across chunks: the stream stays a stream
            Scan::Other => {
                seen.push(chunk);
                break;
            }
        }
    }
    let head = futures::stream::iter(seen.into_iter().map(Ok::<_, axum::Error>));
    Response::from_parts(parts, Body::from_stream(head.chain(stream)))
}

/// What a chunk of a stream holds.
#[derive(Debug, PartialEq)]
enum Scan {
    /// Only events without data (priming events, keep-alive comments).
    Nothing,
    /// Exactly one message, a JSON-RPC answer: its JSON.
    Answer(Bytes),
    /// A message that is no answer, more than one message, or an event
    /// that does not end in the chunk.
    Other,
}

/// Looks at the events of one chunk, which rmcp writes whole (one chunk
/// per event): a chunk that does not end an event is `Other`. A one-line
/// `data:` (JSON has no raw newline) is sliced out of the chunk, not copied.
fn scan(chunk: &Bytes) -> Scan {
    if !chunk.ends_with(b"\n\n") {
        return Scan::Other;
    }
    let mut found = Scan::Nothing;
    let mut at = 0;
    while at < chunk.len() {
        let end = memchr::memmem::find(&chunk[at..], b"\n\n").map_or(chunk.len(), |e| at + e);
        let Some(data) = event_data(chunk, at, end) else {
            return Scan::Other;
        };
        at = end + 2;
        if data.is_empty() {
            continue;
        }
        if found != Scan::Nothing || !is_answer(&data) {
            return Scan::Other;
        }
        found = Scan::Answer(data);
    }
    found
}

/// The data of the event at `chunk[start..end]`: its one `data:` line's
/// value (empty without one); None for several data lines (not rmcp's).
fn event_data(chunk: &Bytes, start: usize, end: usize) -> Option<Bytes> {
    let mut data = None;
    let mut line_start = start;
    while line_start < end {
        let line_end =
            memchr::memchr(b'\n', &chunk[line_start..end]).map_or(end, |e| line_start + e);
        let line = &chunk[line_start..line_end];
        if let Some(value) = line.strip_prefix(b"data:") {
            if data.is_some() {
                return None;
            }
            let value = value.strip_prefix(b" ").unwrap_or(value);
            let value = value.strip_suffix(b"\r").unwrap_or(value);
            data = Some(chunk.slice_ref(value));
        }
        line_start = line_end + 1;
    }
    Some(data.unwrap_or_default())
}
/// Whether `json` is a JSON-RPC answer (`id`, then `result` or `error`),
/// as rmcp writes one: the keys in that order, no whitespace.
fn is_answer(json: &[u8]) -> bool {
    let Some(rest) = json.strip_prefix(br#"{"jsonrpc":"2.0","id":"#) else {
        return false;
    };
    let after_id = if let Some(s) = rest.strip_prefix(b"\"") {
        // a string id: up to its closing quote, escapes skipped
        let mut i = 0;
        loop {
            match s.get(i) {
                Some(b'\\') => i += 2,
                Some(b'"') => break &s[i + 1..],
                Some(_) => i += 1,
                None => return false,
            }
        }
    } else {
        let n = rest
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'-')
            .count();
        &rest[n..]
    };
    after_id.starts_with(br#","result":"#) || after_id.starts_with(br#","error":"#)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_told_from_notifications_and_requests() {
        assert!(is_answer(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#));
        assert!(is_answer(br#"{"jsonrpc":"2.0","id":"a\"b","error":{}}"#));
        assert!(!is_answer(
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#
        ));
        assert!(!is_answer(
            br#"{"jsonrpc":"2.0","id":3,"method":"elicitation/create"}"#
        ));
        assert!(!is_answer(br#"{"jsonrpc":"2.0","id":"unclosed"#));
    }

    #[test]
    fn a_lone_answer_after_priming_is_the_answer() {
        let answer = br#"{"jsonrpc":"2.0","id":1,"result":{"x":"a\\nb"}}"#;
        let priming = Bytes::from_static(b"id: 0\nretry: 3000\ndata:\n\n: keep-alive\n\n");
        assert_eq!(scan(&priming), Scan::Nothing);
        let mut event = b"id: 1\ndata: ".to_vec();
        event.extend_from_slice(answer);
        event.extend_from_slice(b"\n\n");
        assert_eq!(
            scan(&Bytes::from(event.clone())),
            Scan::Answer(Bytes::from_static(answer))
        );
        event.truncate(event.len() - 1);
        assert_eq!(scan(&Bytes::from(event)), Scan::Other, "an event cut short");
    }

    #[test]
    fn a_notification_or_a_second_message_keeps_the_stream() {
        let progress = Bytes::from_static(
            b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n",
        );
        assert_eq!(scan(&progress), Scan::Other);
        let two = Bytes::from_static(
            b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
        );
        assert_eq!(scan(&two), Scan::Other);
        let split = Bytes::from_static(b"data: a\ndata: b\n\n");
        assert_eq!(scan(&split), Scan::Other, "several data lines");
    }
}
