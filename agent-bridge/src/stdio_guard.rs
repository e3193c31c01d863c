//! A guard between stdin/stdout and rmcp's stdio transport. rmcp drops a
//! line that is not JSON, or is longer than its limit, without answering,
//! so a client would wait forever; here such lines get a JSON-RPC error
//! (-32700 parse error, -32600 too large) and valid lines pass unchanged.

use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufReader,
};
use tokio::sync::mpsc;

const PIPE: usize = 1 << 20;

/// Returns the (reader, writer) pair to give rmcp instead of stdin/stdout.
pub fn guard(
    input: impl AsyncRead + Unpin + Send + 'static,
    output: impl AsyncWrite + Unpin + Send + 'static,
    max_line: usize,
) -> (
    impl AsyncRead + Unpin + Send,
    impl AsyncWrite + Unpin + Send,
) {
    let (rmcp_in, feed) = tokio::io::duplex(PIPE);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(PIPE);
    let (errors, error_lines) = mpsc::unbounded_channel::<String>();
    tokio::spawn(read_requests(input, feed, errors, max_line));
    tokio::spawn(write_responses(from_rmcp, error_lines, output));
    (rmcp_in, rmcp_out)
}

fn error_line(code: i32, message: String) -> String {
    let v = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    format!("{v}\n")
}

async fn read_requests(
    input: impl AsyncRead + Unpin,
    mut feed: impl AsyncWrite + Unpin,
    errors: mpsc::UnboundedSender<String>,
    max_line: usize,
) {
    let mut input = BufReader::with_capacity(PIPE, input);
    let mut line = Vec::new();
    loop {
        line.clear();
        // read one line, but never hold more than max_line of it
        let mut too_long = 0usize;
        let ended = loop {
            let buf = match input.fill_buf().await {
                Ok(b) => b,
                Err(_) => break true,
            };
            if buf.is_empty() {
                break true;
            }
            let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..=i], true),
                None => (buf, false),
            };
            let n = chunk.len();
            if too_long == 0 && line.len() + n <= max_line + 1 {
                line.extend_from_slice(chunk);
            } else {
                too_long += line.len() + n;
                line.clear();
            }
            input.consume(n);
            if done {
                break false;
            }
        };
        if too_long > 0 {
            let msg = format!(
                "Invalid Request: a message of at least {too_long} bytes is over this server's limit of {max_line} bytes (--max-body)"
            );
            let _ = errors.send(error_line(-32600, msg));
        } else if !line.iter().all(u8::is_ascii_whitespace) {
            let parsed = std::str::from_utf8(&line)
                .map_err(|e| {
                    format!(
                        "the message is not UTF-8 (invalid byte at offset {})",
                        e.valid_up_to()
                    )
                })
                .and_then(|text| {
                    serde_json::from_str::<serde::de::IgnoredAny>(text)
                        .map_err(|e| format!("the message is not JSON: {e}"))
                });
            match parsed {
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    if feed.write_all(&line).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = errors.send(error_line(-32700, format!("Parse error: {e}")));
                }
            }
        }
        if ended {
            let _ = feed.shutdown().await;
            return;
        }
    }
}

/// Forwards rmcp's output as it comes, and slips error lines in only
/// between whole messages.
async fn write_responses(
    mut from_rmcp: impl AsyncRead + Unpin,
    mut error_lines: mpsc::UnboundedReceiver<String>,
    mut output: impl AsyncWrite + Unpin,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut at_boundary = true;
    let mut errors_open = true;
    loop {
        tokio::select! {
            n = from_rmcp.read(&mut buf) => {
                let n = match n { Ok(0) | Err(_) => break, Ok(n) => n };
                if output.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                at_boundary = buf[n - 1] == b'\n';
                if at_boundary {
                    while let Ok(line) = error_lines.try_recv() {
                        if output.write_all(line.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
                let _ = output.flush().await;
            }
            line = error_lines.recv(), if at_boundary && errors_open => {
                match line {
                    Some(line) => {
                        if output.write_all(line.as_bytes()).await.is_err() {
                            return;
                        }
                        let _ = output.flush().await;
                    }
                    None => errors_open = false,
                }
            }
        }
    }
    let _ = output.flush().await;
}
