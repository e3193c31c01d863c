//! A minimal OTLP/HTTP protobuf receiver on loopback, for tests and
//! benchmarks: an HTTP/1.1 server (keep-alive, `Content-Length` bodies)
//! that decodes every POST as an `ExportTraceServiceRequest` and keeps
//! the spans. It can be told to answer 500, or to accept requests and
//! never answer.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;

use crate::otlp::{
    ExportTraceServiceRequest, ExportTraceServiceResponse, KeyValue, Span, any_value,
};

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200 with an empty `ExportTraceServiceResponse`.
    Accept = 0,
    /// 500, spans not kept.
    Fail = 1,
    /// Reads the request and never answers (the connection stays open).
    Hang = 2,
    /// Reads the request and answers it (as `Accept`) only once the mode
    /// changes: a collector that stalls, then catches up (benchmarks).
    Hold = 3,
}

/// One received span with its resource's attributes.
#[derive(Debug, Clone)]
pub struct Received {
    pub span: Span,
    pub resource: Vec<KeyValue>,
}

#[derive(Default)]
struct State {
    spans: Mutex<Vec<Received>>,
    arrived: Condvar,
    count: AtomicU64,
    requests: AtomicU64,
    bytes: AtomicU64,
    mode: AtomicU8,
    /// Keep only counts (benchmarks).
    counts_only: AtomicBool,
    stop: AtomicBool,
}

/// A running receiver; stops when dropped.
pub struct Receiver {
    addr: std::net::SocketAddr,
    state: Arc<State>,
}

impl Receiver {
    /// Listens on 127.0.0.1, a free port.
    pub fn start() -> std::io::Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let st = state.clone();
        std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if st.stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    let st = st.clone();
                    let _ = std::thread::Builder::new()
                        .name("otlp-conn".into())
                        .spawn(move || {
                            let _ = serve(stream, &st);
                        });
                }
            })?;
        Ok(Receiver { addr, state })
    }

    /// The traces URL (`http://127.0.0.1:PORT/v1/traces`).
    pub fn url(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.mode.store(mode as u8, Ordering::Release);
    }

    /// Keep counts and bytes only, not the spans (benchmarks).
    pub fn counts_only(&self, yes: bool) {
        self.state.counts_only.store(yes, Ordering::Release);
    }

    /// Spans received (accepted) so far.
    pub fn span_count(&self) -> u64 {
        self.state.count.load(Ordering::Acquire)
    }

    /// Export requests received (answered or not).
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Acquire)
    }

    /// Request body bytes received.
    pub fn bytes(&self) -> u64 {
        self.state.bytes.load(Ordering::Acquire)
    }

    pub fn spans(&self) -> Vec<Received> {
        self.state.spans.lock().unwrap().clone()
    }

    /// Waits until at least `n` spans arrived; false on timeout.
    pub fn wait_for(&self, n: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = self.state.spans.lock().unwrap();
        while self.span_count() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self.state.arrived.wait_timeout(g, left).unwrap().0;
        }
        true
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
    }
}

fn serve(stream: TcpStream, st: &State) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut rd = BufReader::new(stream);
    let mut line = String::new();
    loop {
        // the request line, then headers up to the empty line
        let mut length = 0usize;
        let mut first = true;
        loop {
            line.clear();
            if rd.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let l = line.trim_end();
            if first {
                first = l.is_empty();
                continue;
            }
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        rd.read_exact(&mut body)?;
        st.requests.fetch_add(1, Ordering::AcqRel);
        st.bytes.fetch_add(length as u64, Ordering::AcqRel);
        while st.mode.load(Ordering::Acquire) == Mode::Hold as u8 {
            std::thread::sleep(Duration::from_millis(1));
        }
        match st.mode.load(Ordering::Acquire) {
            1 => {
                let msg = b"collector says no";
                write!(
                    writer,
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
                    msg.len()
                )?;
                writer.write_all(msg)?;
                continue;
            }
            2 => {
                // never answer: hold the connection until the client gives up
                let mut sink = [0u8; 4096];
                while rd.read(&mut sink)? > 0 {}
                return Ok(());
            }
            _ => {}
        }
        let decoded = ExportTraceServiceRequest::decode(body.as_slice());
        let (status, n) = match decoded {
            Ok(req) => {
                let mut n = 0u64;
                let keep = !st.counts_only.load(Ordering::Acquire);
                let mut received = Vec::new();
                for rs in req.resource_spans {
                    let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
                    for ss in rs.scope_spans {
                        n += ss.spans.len() as u64;
                        if keep {
                            received.extend(ss.spans.into_iter().map(|span| Received {
                                span,
                                resource: resource.clone(),
                            }));
                        }
                    }
                }
                let mut g = st.spans.lock().unwrap();
                g.extend(received);
                st.count.fetch_add(n, Ordering::AcqRel);
                st.arrived.notify_all();
                ("200 OK", n)
            }
            Err(_) => ("400 Bad Request", 0),
        };
        let _ = n;
        let answer = ExportTraceServiceResponse::default().encode_to_vec();
        write!(
            writer,
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        )?;
        writer.write_all(&answer)?;
    }
}

/// The value of attribute `key` of a span (or event), if any.
pub fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

/// A string attribute's value.
pub fn attr_str<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attributes, key) {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}
