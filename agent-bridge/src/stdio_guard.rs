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

/// Lines up to this size are checked whole before rmcp sees them; longer
/// ones stream through to rmcp while a blocking thread checks them, so the
/// guard never holds a big request in memory.
const CHECK_WHOLE: usize = 1 << 20;

/// Checks one complete line: UTF-8, then JSON.
fn check(line: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(line).map_err(|e| {
        format!(
            "the message is not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        )
    })?;
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(drop)
        .map_err(|e| format!("the message is not JSON: {e}"))
}

/// Validates a line that arrives in chunks, on a blocking thread.
struct StreamCheck {
    chunks: std::sync::mpsc::SyncSender<Vec<u8>>,
    verdict: tokio::task::JoinHandle<Result<(), String>>,
    /// The incomplete UTF-8 sequence at the end of the last chunk.
    utf8_tail: Vec<u8>,
    offset: usize,
    utf8_error: Option<usize>,
}

struct ChunkReader {
    chunks: std::sync::mpsc::Receiver<Vec<u8>>,
    current: std::io::Cursor<Vec<u8>>,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = std::io::Read::read(&mut self.current, buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            match self.chunks.recv() {
                Ok(next) => self.current = std::io::Cursor::new(next),
                Err(_) => return Ok(0),
            }
        }
    }
}

impl StreamCheck {
    fn start() -> StreamCheck {
        let (chunks, rx) = std::sync::mpsc::sync_channel(4);
        let verdict = tokio::task::spawn_blocking(move || {
            let reader = ChunkReader {
                chunks: rx,
                current: Default::default(),
            };
            let result = serde_json::from_reader::<_, serde::de::IgnoredAny>(reader)
                .map(drop)
                .map_err(|e| format!("the message is not JSON: {e}"));
            result
        });
        StreamCheck {
            chunks,
            verdict,
            utf8_tail: Vec::new(),
            offset: 0,
            utf8_error: None,
        }
    }

    async fn feed(&mut self, chunk: &[u8]) {
        if self.utf8_error.is_none() {
            let mut joined = std::mem::take(&mut self.utf8_tail);
            joined.extend_from_slice(chunk);
            match std::str::from_utf8(&joined) {
                Ok(_) => self.offset += joined.len(),
                Err(e) if e.error_len().is_none() => {
                    let ok = e.valid_up_to();
                    self.offset += ok;
                    self.utf8_tail = joined[ok..].to_vec();
                }
                Err(e) => self.utf8_error = Some(self.offset + e.valid_up_to()),
            }
        }
        let chunks = self.chunks.clone();
        let chunk = chunk.to_vec();
        // a full channel blocks: keep that off the async threads
        let _ = tokio::task::spawn_blocking(move || chunks.send(chunk)).await;
    }

    async fn finish(self) -> Result<(), String> {
        drop(self.chunks);
        if let Some(at) = self.utf8_error {
            return Err(format!(
                "the message is not UTF-8 (invalid byte at offset {at})"
            ));
        }
        if !self.utf8_tail.is_empty() {
            return Err(format!(
                "the message is not UTF-8 (truncated sequence at offset {})",
                self.offset
            ));
        }
        self.verdict.await.unwrap_or_else(|e| Err(e.to_string()))
    }
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
        let mut streaming: Option<StreamCheck> = None;
        let mut seen = 0usize;
        let mut too_long = false;
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
            seen += n;
            if seen > max_line + 1 && !too_long {
                too_long = true;
                if streaming.take().is_some() {
                    // end the partial line: rmcp drops it as not JSON
                    if feed.write_all(b"\n").await.is_err() {
                        return;
                    }
                }
                line.clear();
            }
            if !too_long {
                let chunk = chunk.to_vec();
                if let Some(check) = &mut streaming {
                    check.feed(&chunk).await;
                    if feed.write_all(&chunk).await.is_err() {
                        return;
                    }
                } else {
                    line.extend_from_slice(&chunk);
                    if line.len() > CHECK_WHOLE {
                        let mut check = StreamCheck::start();
                        check.feed(&line).await;
                        if feed.write_all(&line).await.is_err() {
                            return;
                        }
                        line = Vec::new();
                        streaming = Some(check);
                    }
                }
            }
            input.consume(n);
            if done {
                break false;
            }
        };
        if too_long {
            let msg = format!(
                "Invalid Request: a message of at least {seen} bytes is over this server's limit of {max_line} bytes (--max-body)"
            );
            let _ = errors.send(error_line(-32600, msg));
        } else if let Some(check) = streaming {
            if ended && feed.write_all(b"\n").await.is_err() {
                return;
            }
            if let Err(e) = check.finish().await {
                let _ = errors.send(error_line(-32700, format!("Parse error: {e}")));
            }
        } else if !line.iter().all(u8::is_ascii_whitespace) {
            match check(&line) {
                Ok(()) => {
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
