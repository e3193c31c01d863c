//! The stdio transport: newline-delimited JSON-RPC on stdin/stdout.
//!
//! Ours rather than rmcp's so that every bad line gets an answer (rmcp drops
//! an oversized line silently and folds parse errors together), and so that
//! big messages are not held twice: a request line is parsed and freed at
//! once, and a response is serialized straight into stdout by a writer
//! thread instead of into a buffer first.

use std::io::Write as _;

use rmcp::RoleServer;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::sync::mpsc;

/// Lines longer than this are parsed on a blocking thread.
const PARSE_INLINE: usize = 1 << 20;

enum Outgoing {
    Message(Box<TxJsonRpcMessage<RoleServer>>),
    Raw(Value),
}

#[derive(Debug, thiserror::Error)]
#[error("stdout is closed")]
pub struct Closed;

pub struct StdioTransport {
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    out: std::sync::mpsc::Sender<Outgoing>,
}

impl StdioTransport {
    /// Reads requests from `input` (at most `max_line` bytes each) and
    /// writes responses to `output` from a thread of its own.
    pub fn new(
        input: impl AsyncRead + Unpin + Send + 'static,
        output: impl std::io::Write + Send + 'static,
        max_line: usize,
    ) -> StdioTransport {
        let (out, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || write_all(rx, output));
        let (tx, incoming) = mpsc::channel(16);
        tokio::spawn(read_all(input, tx, out.clone(), max_line));
        StdioTransport { incoming, out }
    }
}

impl Transport<RoleServer> for StdioTransport {
    type Error = Closed;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Closed>> + Send + 'static {
        let sent = self
            .out
            .send(Outgoing::Message(Box::new(item)))
            .map_err(|_| Closed);
        std::future::ready(sent)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.incoming.recv()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Closed>> + Send {
        self.incoming.close();
        std::future::ready(Ok(()))
    }
}

fn error(id: Value, code: i32, message: String) -> Outgoing {
    Outgoing::Raw(json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}))
}

/// Parses one line: a message, or the error answer it deserves.
fn parse(line: &[u8]) -> Result<RxJsonRpcMessage<RoleServer>, Outgoing> {
    let text = std::str::from_utf8(line).map_err(|e| {
        let msg = format!(
            "Parse error: the message is not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        );
        error(Value::Null, -32700, msg)
    })?;
    serde_json::from_str(text).map_err(|e| match serde_json::from_str::<Value>(text) {
        Err(e) => error(
            Value::Null,
            -32700,
            format!("Parse error: the message is not JSON: {e}"),
        ),
        // JSON, but not a message this server understands: answer its id
        Ok(v) => error(
            v.get("id").cloned().unwrap_or(Value::Null),
            -32600,
            format!("Invalid Request: {e}"),
        ),
    })
}

async fn read_all(
    input: impl AsyncRead + Unpin,
    incoming: mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    out: std::sync::mpsc::Sender<Outgoing>,
    max_line: usize,
) {
    let mut input = BufReader::with_capacity(1 << 20, input);
    loop {
        let mut line = Vec::new();
        let mut seen = 0usize;
        let ended = loop {
            let buf = match input.fill_buf().await {
                Ok(b) if !b.is_empty() => b,
                _ => break true,
            };
            let (take, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            seen += take;
            if seen <= max_line + 1 {
                line.extend_from_slice(&buf[..take]);
            } else {
                line = Vec::new(); // over the limit: count the rest, keep nothing
            }
            input.consume(take);
            if done {
                break false;
            }
        };
        if seen > max_line + 1 {
            let msg = format!(
                "Invalid Request: a message of at least {seen} bytes is over this server's limit of {max_line} bytes (--max-body)"
            );
            let _ = out.send(error(Value::Null, -32600, msg));
        } else if !line.iter().all(u8::is_ascii_whitespace) {
            let parsed = if line.len() > PARSE_INLINE {
                tokio::task::spawn_blocking(move || parse(&line))
                    .await
                    .unwrap_or_else(|e| Err(error(Value::Null, -32603, e.to_string())))
            } else {
                parse(&line)
            };
            match parsed {
                Ok(message) => {
                    if incoming.send(message).await.is_err() {
                        return;
                    }
                }
                Err(answer) => {
                    let _ = out.send(answer);
                }
            }
        }
        if ended {
            return; // dropping `incoming` ends the session
        }
    }
}

fn write_all(rx: std::sync::mpsc::Receiver<Outgoing>, output: impl std::io::Write) {
    let mut w = std::io::BufWriter::with_capacity(64 * 1024, output);
    for item in rx {
        let written = match item {
            Outgoing::Message(m) => serde_json::to_writer(&mut w, &m),
            Outgoing::Raw(v) => serde_json::to_writer(&mut w, &v),
        };
        if written.is_err() || w.write_all(b"\n").and_then(|()| w.flush()).is_err() {
            return; // stdout is gone; `send` reports it from now on
        }
    }
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
    }
}
