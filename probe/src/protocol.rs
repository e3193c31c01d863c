//! The control protocol: newline-delimited JSON over a Unix stream socket
//! (docs/PROTOCOL.md). One request per line, one response line per request
//! (a `subscribe` streams event lines until the client hangs up).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::attribution::{ExitStatus, Words};

/// Bumped on any incompatible change; `hello` and `status` report it.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest request line accepted (bytes, newline excluded).
pub const MAX_LINE: usize = 1 << 20;

/// Where the daemon listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/probe/probe.sock";

/// Where the daemon keeps its evidence unless told otherwise.
pub const DEFAULT_DB: &str = "/var/lib/probe/evidence.db";

fn words_empty(w: &Words) -> bool {
    w.command.is_none() && w.output.is_none()
}

/// A request. `id` (any JSON value) is echoed in the response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Protocol version and daemon identity.
    Hello,
    /// Opens a span ([`BeginSpan`]); answers `span_id`.
    BeginSpan(BeginSpan),
    /// Traces `pid` (and everything it starts) in the span. Send it while
    /// the child is blocked before exec.
    Attach { span_id: u64, pid: u32 },
    /// Closes a span; answers `attribution`. `exit` is how the span's
    /// first process ended, when the caller knows; `timed_out_ms` when the
    /// caller killed it on a deadline.
    EndSpan {
        span_id: u64,
        #[serde(default)]
        exit: Option<ExitStatus>,
        #[serde(default)]
        timed_out_ms: Option<u64>,
        /// The tool's result is an error (`isError`): exported as
        /// `error.type = tool_error`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
        /// What the workload was asked (`command`) and said (`output`):
        /// the witnesses that let a failed lookup be named as the cause
        /// (each cut to 32 KiB: the command's head, the output's tail).
        #[serde(default, skip_serializing_if = "words_empty")]
        words: Words,
    },
    /// Daemon health: kernel, programs, rates, drops, open spans, DB.
    Status,
    /// Stored spans (newest first), or one span with its events.
    Query(Query),
    /// Streams live decoded events (`{"span": N, "event": {...}}` lines).
    Subscribe {
        #[serde(default)]
        span_id: Option<u64>,
        #[serde(default)]
        kind: Option<String>,
    },
}

/// `begin_span`: opens a span; answers `span_id`. With `pid`, also
/// attaches it (as `attach` would), in one round trip. With `tree` too,
/// attaches every thread of `pid` and every thread of its descendants as
/// they are now (a running server); answers `tids`, how many were
/// attached. With `cgroup`, follows that cgroup (and answers `tids` too).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BeginSpan {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default)]
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tree: bool,
    /// With `pid`: a server already running that outlives the span
    /// (implied by `tree`): the span covers one of its calls, judged
    /// by the call's own work and words (docs/PROTOCOL.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub server: bool,
    /// With `pid` (not `tree`): its seccomp mode (0 none, 1 strict, 2
    /// filter), when the caller knows it (a child it started, before
    /// the child installs a filter of its own). The daemon then only
    /// checks that the process exists instead of reading its
    /// /proc status, which is most of an attach's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<u32>,
    /// With `pid`: it is in a memory cgroup with a limit. The daemon
    /// notes that cgroup and its limit at once, so an OOM kill can
    /// name them after every process of the call has gone (the kill
    /// is read from the ring buffer later, under load much later).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_limited: bool,
    /// A cgroup (v2 directory) the span follows: the threads in it now
    /// are attached, and whatever forks or execs in it until the span
    /// ends joins the span, whoever started it (a container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<std::path::PathBuf>,
    /// For OpenTelemetry export: the MCP tool the span runs for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The MCP method (`tools/call`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_method: Option<String>,
    /// The MCP session id (transports with sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_session: Option<String>,
    /// The caller's W3C trace context: the exported span is its child.
    /// An invalid one is ignored (and counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// Ended by the daemon (exit unknown) if still open when the
    /// connection that began it closes: a span kept between a server's
    /// calls, whose keeper may be killed at any time, would otherwise
    /// hold one of `max_open_spans` for the daemon's life.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ends_with_connection: bool,
    /// `"all"`: the store keeps every event of this span even if it
    /// explains nothing (someone debugging one workload); `"failed"`:
    /// as `[retention] keep_events` says by default. Absent: the
    /// daemon's setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_events: Option<crate::store::KeepEvents>,
    /// With `pid`: the process is in this gVisor sandbox container
    /// (its pid as the sandbox sees it), and the span's events come
    /// from the sandbox's runtime monitoring. A client inside a gVisor
    /// sandbox (through `--host-uds=open`) need not say: the daemon
    /// knows its sandbox from the connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gvisor_container: Option<String>,
}

/// `query`: stored spans (newest first), or one span with its events.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Query {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

impl Request {
    /// The request as JSON, to send (a client adds its `id`).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a request is plain data")
    }
}

pub const OPS: &str = "hello, begin_span, attach, end_span, status, query, subscribe";

/// Machine-readable error codes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not JSON, not UTF-8, or missing/invalid fields.
    BadRequest,
    /// `op` names no request.
    UnknownOp,
    /// Line longer than [`MAX_LINE`].
    TooLarge,
    /// No such span (never begun, or already ended).
    NotFound,
    /// The peer's uid/gid may not use the probe.
    Forbidden,
    /// Limits reached (open spans) or the kernel refused.
    Unavailable,
    /// The daemon is shutting down or failed internally.
    Internal,
}

/// An error response body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            code,
            message: message.into(),
        }
    }
}

/// Parses one request line into (id, request).
pub fn parse_request(line: &[u8]) -> (Value, Result<Request, ErrorBody>) {
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        Err(e) => {
            return (
                Value::Null,
                Err(ErrorBody::new(
                    ErrorCode::BadRequest,
                    format!("request is not UTF-8: {e}"),
                )),
            );
        }
    };
    if text.contains('\0') {
        return (
            Value::Null,
            Err(ErrorBody::new(
                ErrorCode::BadRequest,
                "request contains a NUL byte",
            )),
        );
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return (
                Value::Null,
                Err(ErrorBody::new(
                    ErrorCode::BadRequest,
                    format!("request is not JSON: {e}"),
                )),
            );
        }
    };
    let id = value.get("id").cloned().unwrap_or(Value::Null);
    let Some(op) = value.get("op").and_then(Value::as_str).map(str::to_owned) else {
        return (
            id,
            Err(ErrorBody::new(
                ErrorCode::BadRequest,
                format!("request has no \"op\" (one of: {OPS})"),
            )),
        );
    };
    let known = [
        "hello",
        "begin_span",
        "attach",
        "end_span",
        "status",
        "query",
        "subscribe",
    ];
    if !known.contains(&op.as_str()) {
        return (
            id,
            Err(ErrorBody::new(
                ErrorCode::UnknownOp,
                format!("unknown op \"{op}\" (one of: {OPS})"),
            )),
        );
    }
    let req = serde_json::from_value::<Request>(value)
        .map_err(|e| ErrorBody::new(ErrorCode::BadRequest, format!("bad \"{op}\" request: {e}")));
    (id, req)
}

/// A success response line: `{"id":…, "ok":true, …fields}`.
pub fn ok_line(id: &Value, fields: Value) -> String {
    let mut obj = serde_json::Map::new();
    obj.insert("id".into(), id.clone());
    obj.insert("ok".into(), Value::Bool(true));
    if let Value::Object(f) = fields {
        obj.extend(f);
    }
    let mut s = Value::Object(obj).to_string();
    s.push('\n');
    s
}

/// An error response line: `{"id":…, "ok":false, "error":{code, message}}`.
pub fn error_line(id: &Value, err: &ErrorBody) -> String {
    let mut s = serde_json::json!({"id": id, "ok": false, "error": err}).to_string();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_a_client_builds_parses_back_to_itself() {
        let requests = [
            Request::Hello,
            Request::BeginSpan(BeginSpan {
                session: Some("t-1".into()),
                label: "exec: ls".into(),
                pid: Some(42),
                tree: true,
                cgroup: Some("/sys/fs/cgroup/c".into()),
                keep_events: Some(crate::store::KeepEvents::All),
                ends_with_connection: true,
                traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
                ..BeginSpan::default()
            }),
            Request::BeginSpan(BeginSpan::default()),
            Request::Attach { span_id: 3, pid: 9 },
            Request::EndSpan {
                span_id: 3,
                exit: Some(ExitStatus {
                    code: Some(1),
                    signal: None,
                }),
                timed_out_ms: Some(5),
                is_error: true,
                words: Words::new(Some("ls".into()), Some(b"ls: no such file".as_slice())),
            },
            Request::Status,
            Request::Query(Query {
                session: Some("t-1".into()),
                limit: Some(200),
                ..Query::default()
            }),
            Request::Subscribe {
                span_id: None,
                kind: Some("exec".into()),
            },
        ];
        for (id, request) in requests.into_iter().enumerate() {
            let mut value = request.to_value();
            value["id"] = id.into();
            let (echoed, parsed) = parse_request(value.to_string().as_bytes());
            assert_eq!(echoed, id);
            assert_eq!(parsed, Ok(request), "{value}");
        }
    }

    #[test]
    fn parses_requests_and_echoes_ids() {
        let (id, r) = parse_request(
            br#"{"id": 7, "op": "begin_span", "session": "t-1", "label": "exec: ls"}"#,
        );
        assert_eq!(id, 7);
        assert_eq!(
            r.unwrap(),
            Request::BeginSpan(BeginSpan {
                session: Some("t-1".into()),
                label: "exec: ls".into(),
                pid: None,
                tree: false,
                server: false,
                seccomp: None,
                memory_limited: false,
                cgroup: None,
                tool: None,
                mcp_method: None,
                mcp_session: None,
                traceparent: None,
                tracestate: None,
                ends_with_connection: false,
                gvisor_container: None,
                keep_events: None,
            })
        );
        let (_, r) = parse_request(br#"{"op": "begin_span", "keep_events": "all"}"#);
        assert!(matches!(
            r.unwrap(),
            Request::BeginSpan(BeginSpan {
                keep_events: Some(crate::store::KeepEvents::All),
                ..
            })
        ));
        let (_, r) = parse_request(br#"{"op": "begin_span", "keep_events": "some"}"#);
        assert!(
            r.is_err(),
            "an unknown keep_events is an error, not the default"
        );
        let (_, r) = parse_request(br#"{"op": "begin_span", "label": "x", "pid": 42}"#);
        assert!(matches!(
            r.unwrap(),
            Request::BeginSpan(BeginSpan {
                pid: Some(42),
                tree: false,
                ..
            })
        ));
        let (_, r) = parse_request(br#"{"op": "begin_span", "seccomp": 2, "pid": 42}"#);
        assert!(matches!(
            r.unwrap(),
            Request::BeginSpan(BeginSpan {
                pid: Some(42),
                seccomp: Some(2),
                tree: false,
                ..
            })
        ));
        let (_, r) = parse_request(br#"{"op": "begin_span", "pid": 42, "memory_limited": true}"#);
        assert!(matches!(
            r.unwrap(),
            Request::BeginSpan(BeginSpan {
                memory_limited: true,
                ..
            })
        ));
        let (_, r) = parse_request(br#"{"op": "begin_span", "cgroup": "/sys/fs/cgroup/c"}"#);
        assert!(matches!(
            r.unwrap(),
            Request::BeginSpan(BeginSpan { cgroup: Some(c), pid: None, .. }) if c.as_os_str() == "/sys/fs/cgroup/c"
        ));
        let (_, r) = parse_request(br#"{"op": "begin_span", "pid": 42, "tree": true}"#);
        assert!(matches!(
            r.unwrap(),
            Request::BeginSpan(BeginSpan {
                pid: Some(42),
                tree: true,
                ..
            })
        ));
        let (_, r) = parse_request(
            br#"{"op": "begin_span", "label": "x", "tool": "exec", "mcp_method": "tools/call", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
        );
        assert!(matches!(
            r.unwrap(),
            Request::BeginSpan(BeginSpan {
                tool: Some(t),
                traceparent: Some(_),
                ..
            }) if t == "exec"
        ));
        let (_, r) = parse_request(br#"{"op": "end_span", "span_id": 3, "is_error": true}"#);
        assert!(matches!(
            r.unwrap(),
            Request::EndSpan { is_error: true, .. }
        ));
        let (_, r) = parse_request(
            br#"{"op": "end_span", "span_id": 3, "exit": {"code": 1, "signal": null}}"#,
        );
        assert!(matches!(
            r.unwrap(),
            Request::EndSpan {
                span_id: 3,
                exit: Some(_),
                timed_out_ms: None,
                is_error: false,
                ..
            }
        ));
        // the workload's words ride along
        let (_, r) = parse_request(
            br#"{"op": "end_span", "span_id": 3, "words": {"command": "cat /x", "output": "cat: /x: No such file or directory"}}"#,
        );
        let Request::EndSpan { words, .. } = r.unwrap() else {
            panic!("not end_span");
        };
        assert_eq!(words.command.as_deref(), Some("cat /x"));
        assert!(words.output.unwrap().starts_with("cat: /x"));
    }

    #[test]
    fn bad_input_gets_a_coded_error() {
        let code = |line: &[u8]| parse_request(line).1.unwrap_err().code;
        assert_eq!(code(b"{not json"), ErrorCode::BadRequest);
        assert_eq!(code(b"\xff\xfe"), ErrorCode::BadRequest);
        assert_eq!(
            code(b"{\"op\":\"status\",\"x\":\"a\0b\"}"),
            ErrorCode::BadRequest
        );
        assert_eq!(code(br#"{"op": "format_disk"}"#), ErrorCode::UnknownOp);
        assert_eq!(
            code(br#"{"op": "attach", "span_id": "x"}"#),
            ErrorCode::BadRequest
        );
        assert_eq!(code(br#"{"span_id": 1}"#), ErrorCode::BadRequest);
    }

    #[test]
    fn response_lines_are_single_json_lines() {
        let l = ok_line(&Value::from(1), serde_json::json!({"span_id": 5}));
        assert!(l.ends_with('\n') && l.matches('\n').count() == 1);
        let v: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["ok"], true);
        assert_eq!(v["span_id"], 5);
        let e: Value = serde_json::from_str(&error_line(
            &Value::Null,
            &ErrorBody::new(ErrorCode::NotFound, "x"),
        ))
        .unwrap();
        assert_eq!(e["error"]["code"], "not_found");
    }
}
