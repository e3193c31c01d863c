//! Clients of the daemon's control socket: a blocking one (what
//! `probe span`/`probe status` use, and agent-bridge's workloads send
//! their own `begin_span` on) and
//! an async one, for callers on a tokio runtime that should not hand a
//! round trip to another thread.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::attribution::{Attribution, ExitStatus, Words};
use crate::protocol::{BeginSpan, ErrorBody, ErrorCode, Query, Request};
use crate::store::SpanRow;

/// Why a call to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens at the socket, or we may not open it.
    #[error(
        "cannot connect to the probe daemon at {0}: {1} (is `probe run` running? use --socket to pick another)"
    )]
    Connect(PathBuf, std::io::Error),
    /// The connection broke mid-call.
    #[error("lost the connection to the probe daemon: {0}")]
    Io(#[from] std::io::Error),
    /// A bounded read or write ran out (see [`Client::set_timeout`]): the
    /// daemon accepts connections but does not answer on them.
    #[error(
        "the probe daemon did not answer within {} (it accepts connections but is stuck; `probe status` shows whether it answers anyone)",
        whole_seconds_or_ms(.0)
    )]
    NoAnswer(std::time::Duration),
    /// The daemon answered something that is not a response.
    #[error("the probe daemon answered nonsense: {0}")]
    Protocol(String),
    /// The daemon refused the request.
    #[error("the probe daemon refused: {} ({:?})", .0.message, .0.code)]
    Daemon(ErrorBody),
}

/// `5 s`, or `50 ms` below a second.
fn whole_seconds_or_ms(d: &std::time::Duration) -> String {
    if d.as_secs() == 0 {
        format!("{} ms", d.as_millis())
    } else {
        format!("{} s", d.as_secs())
    }
}

impl ClientError {
    /// The daemon's error code, when it answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Daemon(e) => Some(e.code),
            _ => None,
        }
    }
}

pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    /// What [`Client::set_timeout`] bounds reads and writes by.
    timeout: Option<std::time::Duration>,
}

/// A request line up to its `pid` value: the child writes `head`, its
/// pid in decimal, then [`PidRequest::TAIL`].
#[derive(Debug, Clone)]
pub struct PidRequest {
    pub id: u64,
    pub head: Vec<u8>,
}

impl PidRequest {
    pub const TAIL: &'static [u8] = b"}\n";
}

impl Client {
    pub fn connect(socket: &Path) -> Result<Client, ClientError> {
        let stream =
            UnixStream::connect(socket).map_err(|e| ClientError::Connect(socket.into(), e))?;
        Ok(Client::over(stream)?)
    }

    /// A client on a connected stream, its first request numbered 1.
    fn over(stream: UnixStream) -> std::io::Result<Client> {
        let writer = stream.try_clone()?;
        Ok(Client {
            reader: BufReader::new(stream),
            writer,
            next_id: 1,
            timeout: None,
        })
    }

    /// Sends `request` and reads its response.
    pub fn send(&mut self, request: &Request) -> Result<Value, ClientError> {
        self.call(request.to_value())
    }

    /// Sends one request object as it is (an `id` is added) and reads its
    /// response: for tests of the protocol itself; clients send
    /// [`Request`]s.
    pub fn call(&mut self, request: Value) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        self.writer
            .write_all(request_line(request, id).as_bytes())
            .map_err(|e| self.io_error(e))?;
        let response = self.read_line()?;
        check_response(response, id)
    }

    /// `request` with a fresh id and without its `pid`, for a child
    /// process that sends it itself, naming its own pid, between fork and
    /// exec (where it may not allocate): see [`PidRequest`].
    pub fn pid_request(&mut self, request: BeginSpan) -> PidRequest {
        let id = self.next_id;
        self.next_id += 1;
        let request = Request::BeginSpan(BeginSpan {
            pid: None,
            ..request
        });
        let mut head = request_line(request.to_value(), id).into_bytes();
        // `{…}\n` becomes `{…,"pid":` and the child adds `<pid>}\n`
        head.truncate(head.len() - 2);
        head.extend_from_slice(br#","pid":"#);
        PidRequest { id, head }
    }

    /// Bounds every read and write on this connection, and on any copy of
    /// its socket (a child's): past `timeout` they fail instead of waiting
    /// on a daemon that stopped answering.
    pub fn set_timeout(&mut self, timeout: std::time::Duration) -> std::io::Result<()> {
        self.writer.set_read_timeout(Some(timeout))?;
        self.writer.set_write_timeout(Some(timeout))?;
        self.timeout = Some(timeout);
        Ok(())
    }

    /// An I/O error of this connection; a bounded read or write that ran
    /// out says so (the kernel reports it as EAGAIN, which reads like a bug).
    fn io_error(&self, e: std::io::Error) -> ClientError {
        match (self.timeout, e.kind()) {
            (Some(t), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                ClientError::NoAnswer(t)
            }
            _ => ClientError::Io(e),
        }
    }

    /// The connection's socket, for the child that sends a
    /// [`Client::pid_request`] and reads its answer line.
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.writer)
    }

    /// The answer line a child read for the [`PidRequest`] `id`.
    pub fn pid_answer(&self, id: u64, line: &[u8]) -> Result<Value, ClientError> {
        let text = String::from_utf8_lossy(line);
        check_response(parse_line(line.len(), &text)?, id)
    }

    /// Reads one response or streamed line.
    pub fn read_line(&mut self) -> Result<Value, ClientError> {
        let mut buf = String::new();
        let n = self
            .reader
            .read_line(&mut buf)
            .map_err(|e| self.io_error(e))?;
        parse_line(n, &buf)
    }

    pub fn hello(&mut self) -> Result<Value, ClientError> {
        self.send(&Request::Hello)
    }

    pub fn begin_span(&mut self, session: Option<&str>, label: &str) -> Result<u64, ClientError> {
        self.begin_span_with(BeginSpan {
            session: session.map(str::to_owned),
            label: label.to_owned(),
            ..BeginSpan::default()
        })
    }

    /// Sends a `begin_span` request built by the caller (a cgroup to
    /// follow, `keep_events`…); answers the span.
    pub fn begin_span_with(&mut self, request: BeginSpan) -> Result<u64, ClientError> {
        let r = self.send(&Request::BeginSpan(request))?;
        r["span_id"]
            .as_u64()
            .ok_or_else(|| ClientError::Protocol(format!("no span_id: {r}")))
    }

    pub fn begin_span_attached(
        &mut self,
        session: Option<&str>,
        label: &str,
        pid: u32,
    ) -> Result<u64, ClientError> {
        self.begin_span_with(BeginSpan {
            session: session.map(str::to_owned),
            label: label.to_owned(),
            pid: Some(pid),
            ..BeginSpan::default()
        })
    }

    /// Opens a span and attaches a running process tree to it in one round
    /// trip: every thread of `pid` and of its descendants. Answers the span
    /// and how many threads were attached.
    pub fn begin_span_tree(
        &mut self,
        session: Option<&str>,
        label: &str,
        pid: u32,
    ) -> Result<(u64, u64), ClientError> {
        span_and_tids(self.send(&tree_request(session, label, pid))?)
    }

    pub fn attach(&mut self, span_id: u64, pid: u32) -> Result<(), ClientError> {
        self.send(&Request::Attach { span_id, pid }).map(drop)
    }

    pub fn end_span(
        &mut self,
        span_id: u64,
        exit: Option<&ExitStatus>,
        timed_out_ms: Option<u64>,
    ) -> Result<Attribution, ClientError> {
        self.end_span_with(span_id, exit, timed_out_ms, &Words::default())
    }

    /// [`Client::end_span`] with the workload's words: what it was asked
    /// and what it said, the witnesses a failed lookup needs to be named.
    pub fn end_span_with(
        &mut self,
        span_id: u64,
        exit: Option<&ExitStatus>,
        timed_out_ms: Option<u64>,
        words: &Words,
    ) -> Result<Attribution, ClientError> {
        attribution(self.send(&end_request(span_id, exit, timed_out_ms, words))?)
    }

    /// The daemon's status as it sent it (JSON), for callers that pass it on.
    pub fn status(&mut self) -> Result<Value, ClientError> {
        Ok(self.send(&Request::Status)?["status"].take())
    }

    /// The daemon's status, typed.
    pub fn daemon_status(&mut self) -> Result<crate::status::DaemonStatus, ClientError> {
        serde_json::from_value(self.status()?)
            .map_err(|e| ClientError::Protocol(format!("status: {e}")))
    }

    /// Stored spans, as `filter` asks.
    pub fn query(&mut self, filter: Query) -> Result<Vec<SpanRow>, ClientError> {
        let r = self.send(&Request::Query(filter))?;
        serde_json::from_value(r["spans"].clone())
            .map_err(|e| ClientError::Protocol(format!("spans: {e}")))
    }

    /// Starts a subscription; read events with [`Client::read_line`].
    pub fn subscribe(
        &mut self,
        span_id: Option<u64>,
        kind: Option<&str>,
    ) -> Result<(), ClientError> {
        self.send(&Request::Subscribe {
            span_id,
            kind: kind.map(str::to_owned),
        })
        .map(drop)
    }
}

/// Waits until a daemon answers `hello` at `socket` (one just started), or
/// `timeout` passes: then the last error.
pub fn wait_until_ready(socket: &Path, timeout: std::time::Duration) -> Result<(), ClientError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match Client::connect(socket).and_then(|mut c| c.hello()) {
            Ok(_) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// The blocking [`Client`]'s calls, on tokio.
pub struct AsyncClient {
    reader: tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
    next_id: u64,
}

impl AsyncClient {
    pub async fn connect(socket: &Path) -> Result<AsyncClient, ClientError> {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| ClientError::Connect(socket.into(), e))?;
        let (reader, writer) = stream.into_split();
        Ok(AsyncClient {
            reader: tokio::io::BufReader::new(reader),
            writer,
            next_id: 1,
        })
    }

    /// Sends `request` and reads its response.
    pub async fn send(&mut self, request: &Request) -> Result<Value, ClientError> {
        self.call(request.to_value()).await
    }

    /// Sends one request object as it is (an `id` is added) and reads its
    /// response (tests of the protocol itself).
    pub async fn call(&mut self, request: Value) -> Result<Value, ClientError> {
        use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
        let id = self.next_id;
        self.next_id += 1;
        self.writer
            .write_all(request_line(request, id).as_bytes())
            .await?;
        let mut buf = String::new();
        let n = self.reader.read_line(&mut buf).await?;
        check_response(parse_line(n, &buf)?, id)
    }

    /// [`Client::begin_span_tree`], on tokio.
    pub async fn begin_span_tree(
        &mut self,
        session: Option<&str>,
        label: &str,
        pid: u32,
    ) -> Result<(u64, u64), ClientError> {
        span_and_tids(self.send(&tree_request(session, label, pid)).await?)
    }

    pub async fn end_span(
        &mut self,
        span_id: u64,
        exit: Option<&ExitStatus>,
        timed_out_ms: Option<u64>,
        words: &Words,
    ) -> Result<Attribution, ClientError> {
        attribution(
            self.send(&end_request(span_id, exit, timed_out_ms, words))
                .await?,
        )
    }
}

fn request_line(mut request: Value, id: u64) -> String {
    if let Value::Object(m) = &mut request {
        m.insert("id".into(), Value::from(id));
    }
    let mut line = request.to_string();
    line.push('\n');
    line
}

/// One line read from the socket (`n` bytes; 0 is the daemon hanging up).
fn parse_line(n: usize, buf: &str) -> Result<Value, ClientError> {
    if n == 0 {
        return Err(ClientError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "daemon closed the connection",
        )));
    }
    serde_json::from_str(buf).map_err(|e| ClientError::Protocol(format!("{e}: {buf}")))
}

/// The response to request `id`: its body, or the daemon's refusal.
fn check_response(response: Value, id: u64) -> Result<Value, ClientError> {
    if response.get("id") != Some(&Value::from(id)) {
        return Err(ClientError::Protocol(format!(
            "response for another request: {response}"
        )));
    }
    if response.get("ok") == Some(&Value::Bool(true)) {
        return Ok(response);
    }
    let err = response
        .get("error")
        .cloned()
        .and_then(|e| serde_json::from_value::<ErrorBody>(e).ok())
        .ok_or_else(|| ClientError::Protocol(format!("error without a body: {response}")))?;
    Err(ClientError::Daemon(err))
}

fn tree_request(session: Option<&str>, label: &str, pid: u32) -> Request {
    Request::BeginSpan(BeginSpan {
        session: session.map(str::to_owned),
        label: label.to_owned(),
        pid: Some(pid),
        tree: true,
        ..BeginSpan::default()
    })
}

fn span_and_tids(r: Value) -> Result<(u64, u64), ClientError> {
    match (r["span_id"].as_u64(), r["tids"].as_u64()) {
        (Some(span), Some(tids)) => Ok((span, tids)),
        // a daemon from before `tree` ignores it: one thread attached
        (Some(span), None) => Ok((span, 1)),
        _ => Err(ClientError::Protocol(format!("no span_id: {r}"))),
    }
}

fn end_request(
    span_id: u64,
    exit: Option<&ExitStatus>,
    timed_out_ms: Option<u64>,
    words: &Words,
) -> Request {
    Request::EndSpan {
        span_id,
        exit: exit.cloned(),
        timed_out_ms,
        is_error: false,
        words: words.clone(),
    }
}

fn attribution(mut response: Value) -> Result<Attribution, ClientError> {
    serde_json::from_value(response["attribution"].take())
        .map_err(|e| ClientError::Protocol(format!("attribution: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_request_completed_by_the_child_is_the_request_with_its_pid() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut client = Client::over(a).unwrap();
        client.next_id = 7;
        let req = client.pid_request(BeginSpan {
            label: "exec: a}b".into(),
            ..BeginSpan::default()
        });
        assert_eq!(req.id, 7);
        let mut line = req.head.clone();
        line.extend_from_slice(b"4242");
        line.extend_from_slice(PidRequest::TAIL);
        assert_eq!(line.last(), Some(&b'\n'));
        let sent: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({"op": "begin_span", "label": "exec: a}b", "id": 7, "pid": 4242})
        );
        // the next request gets the next id; answers are checked against theirs
        assert_eq!(client.pid_request(BeginSpan::default()).id, 8);
        let answer = br#"{"id":7,"ok":true,"span_id":3}"#;
        assert_eq!(client.pid_answer(7, answer).unwrap()["span_id"], 3);
        assert!(matches!(
            client.pid_answer(8, answer),
            Err(ClientError::Protocol(_))
        ));
        assert!(matches!(client.pid_answer(7, b""), Err(ClientError::Io(_))));
    }

    #[test]
    fn a_bounded_call_to_a_silent_peer_says_it_got_no_answer() {
        let (a, _silent) = UnixStream::pair().unwrap();
        let mut client = Client::over(a).unwrap();
        client
            .set_timeout(std::time::Duration::from_millis(50))
            .unwrap();
        let e = client.hello().unwrap_err();
        assert!(matches!(e, ClientError::NoAnswer(_)), "{e:?}");
        assert!(e.code().is_none(), "the connection is to be dropped");
        assert!(e.to_string().contains("did not answer within 50 ms"), "{e}");
    }
}
