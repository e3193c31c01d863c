//! The stdio transport: newline-delimited JSON-RPC on stdin/stdout.
//!
//! Ours rather than rmcp's so that every bad line gets an answer (rmcp drops
//! an oversized line silently and folds parse errors together), and so that
//! big messages are cheap: a reader thread pulls stdin in 1 MiB reads, finds
//! line ends with memchr and parses each request on the spot, and a writer
//! thread serializes each response with sonic-rs (SIMD string escaping:
//! a read_file answer is one 87 MB base64 string) straight to fd 1, past
//! std's line-buffered `Stdout`, which would scan every write for newlines.

use std::io::{BufRead as _, Read as _};

use rmcp::RoleServer;
use rmcp::model::RequestId;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// One line for the writer thread.
pub enum Outgoing {
    Message(Box<TxJsonRpcMessage<RoleServer>>),
    Raw(Value),
    /// A message already encoded, in pieces (written as they are, then `\n`).
    Chunks(Vec<bytes::Bytes>),
}

/// Starts the thread that writes [`Outgoing`] lines to `output` until
/// every sender is gone or `output` breaks.
pub fn spawn_writer(
    output: impl std::io::Write + Send + 'static,
) -> std::sync::mpsc::Sender<Outgoing> {
    let (out, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || write_all(rx, output));
    out
}

#[derive(Debug, thiserror::Error)]
#[error("stdout is closed")]
pub struct Closed;

pub struct StdioTransport {
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    out: std::sync::mpsc::Sender<Outgoing>,
    in_flight: InFlight,
}

/// The ids of the client's requests not answered yet. JSON-RPC wants them
/// unique: a second request under an id still in flight is refused, where
/// rmcp would take it and drop the first request's answer.
#[derive(Clone, Default)]
pub struct InFlight(std::sync::Arc<std::sync::Mutex<std::collections::HashSet<RequestId>>>);

impl InFlight {
    /// Notes `message` as it arrives: Err(answer) for a request whose id is
    /// in flight; a cancellation frees its request's id (no answer follows).
    fn arrived(
        &self,
        message: RxJsonRpcMessage<RoleServer>,
    ) -> Result<RxJsonRpcMessage<RoleServer>, Outgoing> {
        use rmcp::model::{ClientNotification, JsonRpcMessage};
        let mut ids = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &message {
            JsonRpcMessage::Request(r) if !ids.insert(r.id.clone()) => {
                let id = serde_json::to_value(&r.id).unwrap_or_default();
                Err(Outgoing::Raw(error_answer(
                    id,
                    -32600,
                    format!(
                        "Invalid Request: request id {} is still in flight (ids must be unique \
                         among a session's unanswered requests); this request was not run",
                        r.id
                    ),
                )))
            }
            JsonRpcMessage::Notification(n) => {
                if let ClientNotification::CancelledNotification(c) = &n.notification
                    && let Some(id) = &c.params.request_id
                {
                    ids.remove(id);
                }
                Ok(message)
            }
            _ => Ok(message),
        }
    }

    /// Returns once no request is in flight.
    async fn until_answered(&self) {
        while !self.0.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// An answer leaves: its request is no longer in flight.
    fn answered(&self, message: &TxJsonRpcMessage<RoleServer>) {
        use rmcp::model::JsonRpcMessage;
        let id = match message {
            JsonRpcMessage::Response(r) => Some(&r.id),
            JsonRpcMessage::Error(e) => e.id.as_ref(),
            _ => None,
        };
        if let Some(id) = id {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        }
    }
}

impl StdioTransport {
    /// Reads requests from `input` (at most `max_line` bytes each) on a
    /// thread of its own, and writes responses to `output` from another.
    pub fn new(
        input: impl std::io::Read + Send + 'static,
        output: impl std::io::Write + Send + 'static,
        max_line: usize,
    ) -> StdioTransport {
        let out = spawn_writer(output);
        let (tx, incoming) = mpsc::channel(16);
        let answers = out.clone();
        let in_flight = InFlight::default();
        let arrivals = in_flight.clone();
        std::thread::spawn(move || read_all(input, tx, answers, max_line, arrivals));
        StdioTransport {
            incoming,
            out,
            in_flight,
        }
    }

    /// The process's own stdin and stdout, as raw file descriptors.
    pub fn process_stdio(max_line: usize) -> std::io::Result<StdioTransport> {
        use std::os::fd::AsFd as _;
        let stdin = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
        let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
        crate::workload::widen_pipe(stdin.as_fd());
        crate::workload::widen_pipe(stdout.as_fd());
        Ok(StdioTransport::new(stdin, stdout, max_line))
    }
}

impl Transport<RoleServer> for StdioTransport {
    type Error = Closed;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Closed>> + Send + 'static {
        self.in_flight.answered(&item);
        let sent = self
            .out
            .send(Outgoing::Message(Box::new(item)))
            .map_err(|_| Closed);
        std::future::ready(sent)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        let message = self.incoming.recv().await;
        if message.is_none() {
            // stdin closed: the requests read before it are answered
            // first. Told now, rmcp would give them 5 s, then cancel them
            // and drop their answers.
            self.in_flight.until_answered().await;
        }
        message
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Closed>> + Send {
        self.incoming.close();
        std::future::ready(Ok(()))
    }
}

/// A JSON-RPC error answer.
pub fn error_answer(id: Value, code: i32, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The error answer a line deserves that the parser rejected with `e`:
/// not UTF-8 (and where), not JSON, or JSON that is not a message this
/// server understands (then answered with its id).
pub fn bad_line_answer(line: &[u8], e: &dyn std::fmt::Display) -> Value {
    if let Err(bad) = std::str::from_utf8(line) {
        let msg = format!(
            "Parse error: the message is not UTF-8 (invalid byte at offset {})",
            bad.valid_up_to()
        );
        return error_answer(Value::Null, -32700, msg);
    }
    match serde_json::from_slice::<Value>(line) {
        Err(e) => error_answer(
            Value::Null,
            -32700,
            format!("Parse error: the message is not JSON: {e}"),
        ),
        Ok(_) => error_answer(exact_id(line), -32600, format!("Invalid Request: {e}")),
    }
}

/// The request's id as it can be echoed exactly: a string, or an integer
/// that JSON's numbers here hold without loss (i64). Anything else (a float,
/// an integer beyond 64 bits, `1e2`) would come back changed: `null`, as
/// JSON-RPC answers a request whose id cannot be told.
fn exact_id(line: &[u8]) -> Value {
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
    }
    let Ok(Id { id: Some(raw) }) = serde_json::from_slice::<Id<'_>>(line) else {
        return Value::Null;
    };
    let raw = raw.get();
    if raw.starts_with('"') {
        return serde_json::from_str(raw).unwrap_or(Value::Null);
    }
    raw.parse::<i64>().map_or(Value::Null, Value::from)
}

/// The error answer a line deserves, `None` for a message the server takes.
/// `restart`: the session is initialized already, and a second `initialize`
/// is refused saying this is how to start another.
pub fn refusal(line: &[u8], restart: Option<&str>) -> Option<Value> {
    let mut initialized = restart.is_some();
    let restart = restart.unwrap_or_default();
    match parse(line).and_then(|m| once_initialized(m, &mut initialized, restart)) {
        Ok(_) => None,
        Err(Outgoing::Raw(v)) => Some(v),
        Err(_) => None,
    }
}

/// Parses one line: a message, or the error answer it deserves. The parser
/// checks UTF-8 itself; only a line it rejects is checked again, to say where.
fn parse(line: &[u8]) -> Result<RxJsonRpcMessage<RoleServer>, Outgoing> {
    let message: RxJsonRpcMessage<RoleServer> =
        serde_json::from_slice(line).map_err(|e| Outgoing::Raw(bad_line_answer(line, &e)))?;
    if let rmcp::model::JsonRpcMessage::Request(r) = &message
        && let rmcp::model::ClientRequest::CustomRequest(c) = &r.request
        && let Some(why) = invalid_params(&c.method, c.params.clone().unwrap_or_default())
    {
        let id = serde_json::to_value(&r.id).unwrap_or_default();
        let msg = format!("Invalid params for `{}`: {why}", c.method);
        return Err(Outgoing::Raw(error_answer(id, -32602, msg)));
    }
    Ok(message)
}

/// Why `params` do not fit `method`, for a method of MCP's: rmcp takes a
/// request whose params do not parse for a custom one, and would answer
/// "Method not found"; JSON-RPC says -32602 Invalid params. `None` for a
/// method MCP does not define (that one is not found).
pub fn invalid_params(method: &str, params: Value) -> Option<String> {
    use rmcp::model::*;
    fn why<P: serde::de::DeserializeOwned>(params: Value) -> String {
        match serde_json::from_value::<P>(params) {
            Err(e) => e.to_string(),
            Ok(_) => "they do not fit the method".into(),
        }
    }
    Some(match method {
        "initialize" => why::<InitializeRequestParams>(params),
        "tools/call" => why::<CallToolRequestParams>(params),
        "resources/read" => why::<ReadResourceRequestParams>(params),
        "resources/subscribe" => why::<SubscribeRequestParams>(params),
        "resources/unsubscribe" => why::<UnsubscribeRequestParams>(params),
        "prompts/get" => why::<GetPromptRequestParams>(params),
        #[expect(deprecated, reason = "clients still send it")]
        "logging/setLevel" => why::<SetLevelRequestParams>(params),
        "completion/complete" => why::<CompleteRequestParams>(params),
        "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" => {
            why::<PaginatedRequestParams>(params)
        }
        "ping" => "ping takes no params".into(),
        _ => return None,
    })
}

/// How a stdio client starts another session.
const STDIO_RESTART: &str = "start a new one (a new process) to initialize again";

/// A session is initialized once: a second `initialize` is refused
/// (rmcp would answer it and switch protocol without a word).
fn once_initialized(
    message: RxJsonRpcMessage<RoleServer>,
    initialized: &mut bool,
    restart: &str,
) -> Result<RxJsonRpcMessage<RoleServer>, Outgoing> {
    if let rmcp::model::JsonRpcMessage::Request(r) = &message
        && matches!(r.request, rmcp::model::ClientRequest::InitializeRequest(_))
    {
        if *initialized {
            let id = serde_json::to_value(&r.id).unwrap_or_default();
            return Err(Outgoing::Raw(error_answer(
                id,
                -32600,
                format!("Invalid Request: this session is already initialized; {restart}"),
            )));
        }
        *initialized = true;
    }
    Ok(message)
}

fn read_all(
    input: impl std::io::Read,
    incoming: mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    out: std::sync::mpsc::Sender<Outgoing>,
    max_line: usize,
    in_flight: InFlight,
) {
    let mut initialized = false;
    read_lines(
        input,
        max_line,
        "--max-body",
        |line| match parse(&line)
            .and_then(|m| once_initialized(m, &mut initialized, STDIO_RESTART))
            .and_then(|m| in_flight.arrived(m))
        {
            Ok(message) => {
                drop(line);
                incoming.blocking_send(message).is_ok()
            }
            Err(answer) => out.send(answer).is_ok(),
        },
        |answer| {
            let _ = out.send(Outgoing::Raw(answer));
        },
    );
}

/// Reads newline-delimited messages from `input` (1 MiB reads) until it
/// ends or `on_line` returns false. Blank lines are skipped; a line over
/// `max_line` bytes is counted, not kept, and its error answer goes to
/// `on_error` (naming `flag`, the option that sets the limit).
pub fn read_lines(
    input: impl std::io::Read,
    max_line: usize,
    flag: &str,
    mut on_line: impl FnMut(Vec<u8>) -> bool,
    mut on_error: impl FnMut(Value),
) {
    let mut input = std::io::BufReader::with_capacity(1 << 20, input);
    loop {
        let mut line = Vec::new();
        // at most one byte past the limit, so an oversized line is known as such
        let limit = max_line as u64 + 1;
        let Ok(n) = (&mut input).take(limit).read_until(b'\n', &mut line) else {
            return;
        };
        if n == 0 {
            return; // end of input: dropping `incoming` ends the session
        }
        if line.last() != Some(&b'\n') && n as u64 == limit {
            // over the limit: count the rest of the line, keep nothing
            drop(line);
            let rest = input.skip_until(b'\n').unwrap_or(0);
            let seen = n + rest;
            let msg = format!(
                "Invalid Request: a message of at least {seen} bytes is over this server's limit of {max_line} bytes ({flag})"
            );
            on_error(error_answer(Value::Null, -32600, msg));
            continue;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if !on_line(line) {
            return;
        }
    }
}

/// JSON of a message: sonic-rs, or serde_json should sonic-rs refuse it.
fn encode<T: serde::Serialize>(value: &T) -> Option<Vec<u8>> {
    sonic_rs::to_vec(value)
        .ok()
        .or_else(|| serde_json::to_vec(value).ok())
}

fn write_all(rx: std::sync::mpsc::Receiver<Outgoing>, mut output: impl std::io::Write) {
    for item in rx {
        // one buffer per message, freed after it: a big answer is not kept
        let bytes = match item {
            Outgoing::Message(m) => encode(&m),
            Outgoing::Raw(v) => encode(&v),
            Outgoing::Chunks(chunks) => {
                // big answers: never joined; all pieces and the `\n` in one
                // writev, so the reader wakes once for a small message
                let written =
                    write_vectored_all(&mut output, &chunks).and_then(|()| output.flush());
                if written.is_err() {
                    return;
                }
                continue;
            }
        };
        let Some(mut bytes) = bytes else {
            tracing::error!("a response could not be serialized");
            continue;
        };
        bytes.push(b'\n');
        if output
            .write_all(&bytes)
            .and_then(|()| output.flush())
            .is_err()
        {
            return; // stdout is gone; `send` reports it from now on
        }
    }
}

/// `chunks` then `\n`, with as few writes as the output takes.
fn write_vectored_all(
    output: &mut impl std::io::Write,
    chunks: &[bytes::Bytes],
) -> std::io::Result<()> {
    use std::io::IoSlice;
    let mut slices: Vec<IoSlice<'_>> = chunks
        .iter()
        .filter(|c| !c.is_empty())
        .map(|c| IoSlice::new(c))
        .chain([IoSlice::new(b"\n")])
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match output.write_vectored(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(line: &[u8]) -> Value {
        match parse(line) {
            Err(Outgoing::Raw(v)) => v,
            Err(_) => panic!("not a raw answer"),
            Ok(_) => panic!("{:?} parsed", String::from_utf8_lossy(line)),
        }
    }

    #[test]
    fn bad_lines_get_the_right_errors() {
        let a = answer(b"not json");
        assert_eq!(a["error"]["code"], -32700);
        let a = answer(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\xff\"}");
        assert_eq!(a["error"]["code"], -32700);
        assert!(
            a["error"]["message"]
                .as_str()
                .unwrap()
                .contains("offset 35"),
            "{a}"
        );
        let a = answer(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":"nope"}"#);
        assert_eq!(a["error"]["code"], -32600);
        assert_eq!(a["id"], 4);
        assert!(parse(br#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#).is_ok());
        // a method MCP defines with params that do not fit it: -32602
        for (line, says) in [
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"arguments":{}}}"#,
                "missing field `name`",
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":7}}"#,
                "invalid type",
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"stat","arguments":"x"}}"#,
                "invalid type",
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"protocolVersion":1}}"#,
                "",
            ),
        ] {
            let a = answer(line.as_bytes());
            assert_eq!(a["error"]["code"], -32602, "{line}: {a}");
            assert_eq!(a["id"], 6);
            let m = a["error"]["message"].as_str().unwrap();
            assert!(
                m.starts_with("Invalid params for `") && m.contains(says),
                "{m}"
            );
        }
        // ids that would not come back as sent are answered with id null
        for (id, echoed) in [
            ("123456789012345678901234567890", Value::Null),
            ("1.5", Value::Null),
            ("-7", json!(-7)),
            ("\"x\\u0041\"", json!("xA")),
        ] {
            let line =
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":"x"}}"#);
            let a = answer(line.as_bytes());
            assert_eq!(a["id"], echoed, "{line}: {a}");
            assert_eq!(a["error"]["code"], -32600, "{a}");
        }
        // a method nobody defined is still rmcp's to refuse (Method not found)
        assert!(parse(br#"{"jsonrpc":"2.0","id":8,"method":"x/y","params":{}}"#).is_ok());
    }
}
