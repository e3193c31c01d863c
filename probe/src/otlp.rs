//! OpenTelemetry export: finished spans go out as OTLP/HTTP protobuf
//! (`ExportTraceServiceRequest`), batched, through a bounded queue owned
//! here, on one exporter thread.
//!
//! The producer never waits: [`Exporter::submit`] puts a span in the queue
//! or, when the queue is full, drops it and counts it
//! (`dropped_queue_full`). A batch the collector refuses (an HTTP error, a
//! refused connection, a timeout) is counted as `dropped_export_failed`, with
//! the reason in `last_error`. Every submitted span ends up in exactly one
//! of `exported`, `dropped_queue_full`, `dropped_export_failed` (or is still
//! `queued`).
//!
//! Spans are built lazily: the producer hands over a closure, and the
//! exporter thread turns it into the protobuf [`Span`] (so the daemon's
//! span end path only moves what it has).
//!
//! Also here: W3C trace context ([`TraceParent`]), the settings with the
//! standard `OTEL_EXPORTER_OTLP_*` variables ([`OtlpConfig::resolve`]), and
//! the encoding of a probe span ([`probe_span`]) after the MCP semantic
//! conventions.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prost::Message as _;
use serde::Deserialize;
use serde_json::Value;

pub use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
pub use opentelemetry_proto::tonic::common::v1::{
    AnyValue, InstrumentationScope, KeyValue, any_value,
};
pub use opentelemetry_proto::tonic::resource::v1::Resource;
pub use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span, span::SpanKind, status::StatusCode,
};

use crate::attribution::Attribution;
use crate::event::KernelEvent;

/// Spans the queue holds before it drops new ones.
pub const QUEUE_CAPACITY: usize = 8192;
/// Spans per export request, at most.
pub const BATCH: usize = 512;
/// Export requests in flight at once: a collector's round trip does not
/// stall the queue behind it.
pub const EXPORT_THREADS: usize = 2;
/// A partial batch waits at most this long.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// One export request's deadline unless configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Span events exported per probe span (the decisive one and its neighbours).
pub const MAX_EVENTS: usize = 16;

/// The `[otlp]` table of the daemon's config file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpFile {
    /// The traces URL, e.g. `http://127.0.0.1:4318/v1/traces`.
    pub endpoint: Option<String>,
    /// Extra request headers (e.g. authorization).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// One export request's deadline.
    pub timeout_ms: Option<u64>,
    /// `service.name` of the resource.
    pub service_name: Option<String>,
    /// Spans the queue holds.
    pub queue_capacity: Option<usize>,
}

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// The full traces URL (`http://HOST:PORT/v1/traces`).
    pub endpoint: String,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub service_name: String,
    pub queue_capacity: usize,
}

impl OtlpConfig {
    /// Export to `endpoint` with the defaults.
    pub fn new(endpoint: impl Into<String>, service_name: impl Into<String>) -> OtlpConfig {
        OtlpConfig {
            endpoint: endpoint.into(),
            headers: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            service_name: service_name.into(),
            queue_capacity: QUEUE_CAPACITY,
        }
    }

    /// The settings from a flag, the config file and the environment, in
    /// that order of precedence; `None` when none of them names an
    /// endpoint (export is off). `env` reads a variable
    /// (`std::env::var(..).ok()` in production).
    ///
    /// Variables: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is),
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` appended),
    /// `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` (`k=v,k2=v2`, values
    /// percent-decoded), `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` (ms),
    /// `OTEL_SERVICE_NAME`.
    pub fn resolve(
        flag: Option<&str>,
        file: Option<&OtlpFile>,
        default_service: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<OtlpConfig>, String> {
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let endpoint = match flag
            .map(str::to_owned)
            .or_else(|| file.and_then(|f| f.endpoint.clone()))
        {
            Some(e) => e,
            None => match env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
                Some(e) => e,
                None => match env("OTEL_EXPORTER_OTLP_ENDPOINT") {
                    Some(base) => format!("{}/v1/traces", base.trim_end_matches('/')),
                    None => return Ok(None),
                },
            },
        };
        let endpoint = endpoint.trim().to_owned();
        if !endpoint.starts_with("http://") {
            return Err(format!(
                "OTLP endpoint {endpoint:?}: only http:// URLs are supported (OTLP/HTTP protobuf, no TLS in this build)"
            ));
        }
        let headers = match file.filter(|f| !f.headers.is_empty()) {
            Some(f) => f
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            None => env("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
                .or_else(|| env("OTEL_EXPORTER_OTLP_HEADERS"))
                .map(|h| parse_headers(&h))
                .transpose()?
                .unwrap_or_default(),
        };
        let timeout = match file.and_then(|f| f.timeout_ms) {
            Some(ms) => Duration::from_millis(ms),
            None => match env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
                .or_else(|| env("OTEL_EXPORTER_OTLP_TIMEOUT"))
            {
                Some(ms) => Duration::from_millis(ms.trim().parse().map_err(|_| {
                    format!("OTEL_EXPORTER_OTLP_TIMEOUT={ms:?} is not a number of milliseconds")
                })?),
                None => DEFAULT_TIMEOUT,
            },
        };
        let service_name = file
            .and_then(|f| f.service_name.clone())
            .or_else(|| env("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| default_service.to_owned());
        let queue_capacity = file
            .and_then(|f| f.queue_capacity)
            .unwrap_or(QUEUE_CAPACITY)
            .max(1);
        Ok(Some(OtlpConfig {
            endpoint,
            headers,
            timeout: timeout.max(Duration::from_millis(1)),
            service_name,
            queue_capacity,
        }))
    }
}

/// `k=v,k2=v2` (W3C baggage-like, values percent-encoded).
fn parse_headers(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("OTLP header {pair:?} is not key=value"))?;
            Ok((k.trim().to_owned(), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (digit(b[i + 1]), digit(b[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A W3C `traceparent`: the caller's trace and span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    /// The caller's span: the parent of ours.
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Parses `00-<32 hex>-<16 hex>-<2 hex>` (lowercase; ids not all
    /// zero). A later version is read by its first four fields, as the
    /// W3C recommendation asks; version `ff` is invalid.
    pub fn parse(s: &str) -> Option<TraceParent> {
        let s = s.trim();
        let b = s.as_bytes();
        if b.len() < 55 {
            return None;
        }
        let version = hex_exact::<1>(&s[0..2])?[0];
        if version == 0xff || (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let trace_id = hex_exact::<16>(&s[3..35])?;
        let parent_id = hex_exact::<8>(&s[36..52])?;
        let flags = hex_exact::<1>(&s[53..55])?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The header value (version 00).
    pub fn format(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(self.trace_id),
            hex(self.parent_id),
            self.flags
        )
    }
}

/// Exactly `N` bytes of lowercase hex (W3C trace context allows no other).
fn hex_exact<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.bytes().any(|c| c.is_ascii_uppercase()) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// Lowercase hex (the `hex` crate's).
pub use hex::encode as hex;

/// Random ids (not all zero), from a generator seeded by the kernel.
pub fn random_id<const N: usize>() -> [u8; N] {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut seed = [0u8; 8];
            // SAFETY: writes at most 8 bytes into `seed`
            let n = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), 8, 0) };
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            if n == 8 { u64::from_ne_bytes(seed) } else { nanos ^ (std::process::id() as u64) << 32 }
        });
    }
    loop {
        let mut out = [0u8; N];
        STATE.with(|s| {
            for chunk in out.chunks_mut(8) {
                // splitmix64
                let mut z = s.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
                s.set(z);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
            }
        });
        if out.iter().any(|&b| b != 0) {
            return out;
        }
    }
}

/// Nanoseconds since the Unix epoch, now.
pub fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A string attribute.
pub fn kv(key: &str, value: impl Into<String>) -> KeyValue {
    attr(key, any_value::Value::StringValue(value.into()))
}

/// An integer attribute.
pub fn kv_i64(key: &str, value: i64) -> KeyValue {
    attr(key, any_value::Value::IntValue(value))
}

/// A floating-point attribute.
pub fn kv_f64(key: &str, value: f64) -> KeyValue {
    attr(key, any_value::Value::DoubleValue(value))
}

/// A boolean attribute.
pub fn kv_bool(key: &str, value: bool) -> KeyValue {
    attr(key, any_value::Value::BoolValue(value))
}

fn attr(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// What a caller said about a span when it began it (`begin_span`'s
/// optional fields) and ended it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallMeta {
    /// The MCP tool the span runs for (`tools/call {tool}`).
    pub tool: Option<String>,
    /// The MCP method (`tools/call`).
    pub mcp_method: Option<String>,
    /// The MCP session id, where the transport has sessions.
    pub mcp_session: Option<String>,
    /// The caller's span (a valid `traceparent`).
    pub parent: Option<TraceParent>,
    pub tracestate: Option<String>,
    /// The tool's result was an error (`isError`), said at `end_span`.
    pub is_error: bool,
}

/// A finished probe span as OpenTelemetry sees it. `start_ns`/`end_ns`:
/// Unix nanoseconds. The span id is random; the trace id is the
/// caller's (with a parent) or random.
pub fn probe_span(meta: &CallMeta, a: &Attribution, start_ns: u64, end_ns: u64) -> Span {
    let (trace_id, parent) = match &meta.parent {
        Some(p) => (p.trace_id, p.parent_id.to_vec()),
        None => (random_id::<16>(), Vec::new()),
    };
    let mcp = meta.tool.is_some();
    let name = match &meta.tool {
        Some(tool) => format!(
            "{} {tool}",
            meta.mcp_method.as_deref().unwrap_or("tools/call")
        ),
        None => a.label.clone(),
    };
    let mut attributes = Vec::with_capacity(24);
    if let Some(tool) = &meta.tool {
        attributes.push(kv(
            "mcp.method.name",
            meta.mcp_method.as_deref().unwrap_or("tools/call"),
        ));
        attributes.push(kv("gen_ai.tool.name", tool.as_str()));
        attributes.push(kv("gen_ai.operation.name", "execute_tool"));
    } else if let Some(m) = &meta.mcp_method {
        attributes.push(kv("mcp.method.name", m.as_str()));
    }
    if let Some(s) = &meta.mcp_session {
        attributes.push(kv("mcp.session.id", s.as_str()));
    }
    if meta.is_error {
        attributes.push(kv("error.type", "tool_error"));
    }
    attributes.push(kv("probe.primitive", a.primitive.id()));
    if let Some(layer) = a.layer {
        attributes.push(kv("probe.layer", layer.id()));
    }
    attributes.push(kv_f64("probe.confidence", a.confidence));
    attributes.push(kv("probe.explanation", a.explanation.as_str()));
    if let Some(h) = &a.hint {
        attributes.push(kv("probe.hint", h.as_str()));
    }
    if let Some(s) = &a.session {
        attributes.push(kv("probe.session", s.as_str()));
    }
    attributes.push(kv_i64("probe.span_id", a.span as i64));
    // where the evidence came from: the kernel's eBPF or gVisor's points
    attributes.push(kv("probe.source", a.source.id()));
    attributes.push(kv("probe.label", a.label.as_str()));
    attributes.push(kv_bool("probe.failed", a.failed));
    if let Some(c) = a.exit.code {
        attributes.push(kv_i64("probe.exit.code", c as i64));
    }
    if let Some(s) = &a.exit.signal {
        attributes.push(kv("probe.exit.signal", s.as_str()));
    }
    if let Some(h) = &a.hidden_failure {
        attributes.push(kv("probe.hidden_failure.primitive", h.primitive.id()));
    }
    attributes.push(kv_i64("probe.drops.kernel", a.drops.kernel as i64));
    attributes.push(kv_i64("probe.drops.retention", a.drops.retention as i64));
    attributes.push(kv_i64(
        "probe.events.total",
        a.counts.values().sum::<u64>() as i64,
    ));
    let (events, dropped_events) = span_events(a, start_ns);
    let status = if meta.is_error || (!mcp && a.failed) {
        Some(Status {
            message: a.explanation.clone(),
            code: StatusCode::Error as i32,
        })
    } else {
        None
    };
    Span {
        trace_id: trace_id.to_vec(),
        span_id: random_id::<8>().to_vec(),
        trace_state: meta.tracestate.clone().unwrap_or_default(),
        parent_span_id: parent,
        flags: meta.parent.map_or(1, |p| p.flags as u32) | 0x100,
        name,
        kind: if mcp {
            SpanKind::Server as i32
        } else {
            SpanKind::Internal as i32
        },
        start_time_unix_nano: start_ns,
        end_time_unix_nano: end_ns.max(start_ns),
        attributes,
        events,
        dropped_events_count: dropped_events,
        status,
        ..Default::default()
    }
}

/// The decisive event and the evidence around it, at most [`MAX_EVENTS`],
/// in time order; and how many evidence events were left out.
fn span_events(a: &Attribution, start_ns: u64) -> (Vec<span::Event>, u32) {
    let evidence = &a.events;
    let at = a
        .decisive
        .as_ref()
        .and_then(|d| evidence.iter().position(|e| e == d));
    let mut chosen: Vec<(&KernelEvent, bool)> = Vec::with_capacity(MAX_EVENTS);
    let window = match at {
        Some(i) => {
            let from = i
                .saturating_sub(MAX_EVENTS / 2)
                .min(evidence.len().saturating_sub(MAX_EVENTS));
            from..(from + MAX_EVENTS).min(evidence.len())
        }
        None => {
            let keep = if a.decisive.is_some() {
                MAX_EVENTS - 1
            } else {
                MAX_EVENTS
            };
            0..keep.min(evidence.len())
        }
    };
    for (i, e) in evidence[window.clone()].iter().enumerate() {
        chosen.push((e, Some(window.start + i) == at));
    }
    if at.is_none()
        && let Some(d) = &a.decisive
    {
        chosen.push((d, true));
        chosen.sort_by_key(|(e, _)| e.ts_ns);
    }
    let shown = chosen.len();
    let total = evidence.len() + usize::from(at.is_none() && a.decisive.is_some());
    let events = chosen
        .into_iter()
        .map(|(e, decisive)| event(e, decisive, start_ns))
        .collect();
    (events, total.saturating_sub(shown) as u32)
}

fn event(e: &KernelEvent, decisive: bool, start_ns: u64) -> span::Event {
    let mut attributes = Vec::with_capacity(12);
    if decisive {
        attributes.push(kv_bool("probe.decisive", true));
    }
    if let Ok(Value::Object(fields)) = serde_json::to_value(e) {
        for (k, v) in fields {
            if k == "kind" || k == "ts_ns" {
                continue;
            }
            let key = format!("probe.event.{k}");
            attributes.push(match v {
                Value::String(s) => kv(&key, s),
                Value::Bool(b) => kv_bool(&key, b),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => kv_i64(&key, i),
                    None => kv_f64(&key, n.as_f64().unwrap_or(0.0)),
                },
                Value::Null => continue,
                other => kv(&key, other.to_string()),
            });
        }
    }
    span::Event {
        time_unix_nano: start_ns + e.ts_ns,
        name: e.kind.id().to_owned(),
        attributes,
        dropped_attributes_count: 0,
    }
}

/// A span the exporter thread builds when it takes it.
pub type PendingSpan = Box<dyn FnOnce() -> Span + Send>;

/// Counters, as `status` shows them.
#[derive(Default)]
struct Stats {
    exported: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_export_failed: AtomicU64,
    batches: AtomicU64,
    bytes: AtomicU64,
    last_error: Mutex<Option<String>>,
}

struct Queue {
    spans: VecDeque<PendingSpan>,
    /// Taken by the thread and not yet counted.
    in_flight: usize,
    stopping: bool,
    /// Export what is queued now, without waiting for a full batch.
    flush: bool,
}

struct Shared {
    config: OtlpConfig,
    queue: Mutex<Queue>,
    /// Wakes the exporter thread.
    work: Condvar,
    /// Wakes [`Exporter::flush`] callers.
    idle: Condvar,
    stats: Stats,
}

/// The bounded queue and its exporter thread. Dropping it exports what is
/// queued (within the request timeout) and stops the thread.
pub struct Exporter {
    shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Exporter {
    /// Starts the exporter thread.
    pub fn start(config: OtlpConfig) -> std::io::Result<Exporter> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                spans: VecDeque::with_capacity(config.queue_capacity.min(QUEUE_CAPACITY)),
                in_flight: 0,
                stopping: false,
                flush: false,
            }),
            config,
            work: Condvar::new(),
            idle: Condvar::new(),
            stats: Stats::default(),
        });
        let threads = (0..EXPORT_THREADS)
            .map(|_| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name("otlp".into())
                    .spawn(move || export_loop(&shared))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Exporter {
            shared,
            threads: Mutex::new(threads),
        })
    }

    pub fn config(&self) -> &OtlpConfig {
        &self.shared.config
    }

    /// Queues a span; never blocks. False: the queue was full and the span
    /// was dropped (and counted).
    pub fn submit(&self, span: PendingSpan) -> bool {
        let mut q = lock(&self.shared.queue);
        if q.spans.len() >= self.shared.config.queue_capacity || q.stopping {
            drop(q);
            self.shared
                .stats
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.spans.push_back(span);
        if q.spans.len() == BATCH {
            self.shared.work.notify_one();
        }
        true
    }

    /// Queues a span that is built already.
    pub fn submit_span(&self, span: Span) -> bool {
        self.submit(Box::new(move || span))
    }

    /// Exports everything queued now; waits until it is done (exported or
    /// failed), or `timeout`. True when nothing is left.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.shared.queue);
        q.flush = true;
        self.shared.work.notify_one();
        while !q.spans.is_empty() || q.in_flight > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = self
                .shared
                .idle
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if !q.spans.is_empty() {
                q.flush = true;
                self.shared.work.notify_one();
            }
        }
        true
    }

    /// The `otlp` block of `probe status`.
    pub fn status(&self) -> crate::status::OtlpStatus {
        let s = &self.shared.stats;
        let queued = {
            let q = lock(&self.shared.queue);
            q.spans.len() + q.in_flight
        };
        crate::status::OtlpStatus {
            endpoint: self.shared.config.endpoint.clone(),
            exported: s.exported.load(Ordering::Relaxed),
            dropped_queue_full: s.dropped_queue_full.load(Ordering::Relaxed),
            dropped_export_failed: s.dropped_export_failed.load(Ordering::Relaxed),
            queued,
            queue_capacity: self.shared.config.queue_capacity,
            batches: s.batches.load(Ordering::Relaxed),
            bytes_sent: s.bytes.load(Ordering::Relaxed),
            last_error: lock(&s.last_error).clone(),
            invalid_traceparents: 0,
        }
    }

    /// Stops the thread after exporting what is queued (each request
    /// within the timeout; what is left after one failure is dropped and
    /// counted).
    pub fn shutdown(&self) {
        {
            let mut q = lock(&self.shared.queue);
            q.stopping = true;
            self.shared.work.notify_all();
        }
        for t in std::mem::take(&mut *lock(&self.threads)) {
            let _ = t.join();
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn export_loop(shared: &Shared) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(shared.config.timeout))
        .http_status_as_error(false)
        // loopback collectors only by configuration, never a proxy from the environment
        .proxy(None)
        .max_redirects(0)
        .user_agent(concat!("probe-otlp/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let resource = Resource {
        attributes: vec![
            kv("service.name", shared.config.service_name.as_str()),
            kv("service.version", env!("CARGO_PKG_VERSION")),
            kv(
                "host.name",
                nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .unwrap_or_default(),
            ),
            kv("telemetry.sdk.name", "probe"),
            kv("telemetry.sdk.language", "rust"),
        ],
        ..Default::default()
    };
    let scope = InstrumentationScope {
        name: "probe".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    };
    let mut failed_since_stop = false;
    let mut body = Vec::with_capacity(64 * 1024);
    loop {
        let batch: Vec<PendingSpan> = {
            let mut q = lock(&shared.queue);
            let deadline = Instant::now() + FLUSH_INTERVAL;
            while q.spans.len() < BATCH && !q.stopping && !q.flush {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                q = shared
                    .work
                    .wait_timeout(q, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            if q.spans.is_empty() {
                q.flush = false;
                shared.idle.notify_all();
                if q.stopping {
                    return;
                }
                continue;
            }
            let n = q.spans.len().min(BATCH);
            q.in_flight += n;
            q.spans.drain(..n).collect()
        };
        let n = batch.len() as u64;
        let stopping = lock(&shared.queue).stopping;
        let result = if stopping && failed_since_stop {
            // shutting down and the collector failed already: do not wait
            // a timeout per batch
            Err("not sent: the exporter stopped after a failed export".to_owned())
        } else {
            let spans: Vec<Span> = batch.into_iter().map(|f| f()).collect();
            let request = ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(resource.clone()),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(scope.clone()),
                        spans,
                        schema_url: String::new(),
                    }],
                    schema_url: String::new(),
                }],
            };
            body.clear();
            request.encode(&mut body).expect("a Vec grows");
            post(&agent, &shared.config, &body)
        };
        let s = &shared.stats;
        match result {
            Ok(rejected) => {
                s.batches.fetch_add(1, Ordering::Relaxed);
                s.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                s.exported
                    .fetch_add(n.saturating_sub(rejected), Ordering::Relaxed);
                if rejected > 0 {
                    s.dropped_export_failed
                        .fetch_add(rejected.min(n), Ordering::Relaxed);
                    *lock(&s.last_error) =
                        Some(format!("the collector rejected {rejected} span(s)"));
                }
            }
            Err(e) => {
                if stopping {
                    failed_since_stop = true;
                }
                tracing::debug!("OTLP export of {n} span(s) failed: {e}");
                s.dropped_export_failed.fetch_add(n, Ordering::Relaxed);
                *lock(&s.last_error) = Some(e);
            }
        }
        let mut q = lock(&shared.queue);
        q.in_flight -= n as usize;
        if q.spans.is_empty() && q.in_flight == 0 {
            q.flush = false;
            shared.idle.notify_all();
        }
    }
}

/// One export request: Ok(spans the collector says it rejected).
fn post(agent: &ureq::Agent, config: &OtlpConfig, body: &[u8]) -> Result<u64, String> {
    let mut req = agent
        .post(&config.endpoint)
        .header("content-type", "application/x-protobuf");
    for (k, v) in &config.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let mut resp = req
        .send(body)
        .map_err(|e| format!("POST {}: {e}", config.endpoint))?;
    let status = resp.status();
    let answer = resp
        .body_mut()
        .with_config()
        .limit(1 << 20)
        .read_to_vec()
        .unwrap_or_default();
    if !status.is_success() {
        let text = String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned();
        return Err(format!(
            "POST {}: HTTP {}{}",
            config.endpoint,
            status.as_u16(),
            if text.trim().is_empty() {
                String::new()
            } else {
                format!(": {}", text.trim())
            }
        ));
    }
    let rejected = ExportTraceServiceResponse::decode(answer.as_slice())
        .ok()
        .and_then(|r| r.partial_success)
        .map_or(0, |p| p.rejected_spans.max(0) as u64);
    Ok(rejected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_validated() {
        let t =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(hex(t.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(t.parent_id), "00f067aa0ba902b7");
        assert_eq!(t.flags, 1);
        assert_eq!(
            t.format(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // a later version: its first four fields
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_some()
        );
    }

    #[test]
    fn settings_flag_over_file_over_env() {
        let env = |k: &str| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://env:4318/".to_owned()),
            "OTEL_EXPORTER_OTLP_HEADERS" => Some("a=b%20c, x-key = 1".to_owned()),
            "OTEL_EXPORTER_OTLP_TIMEOUT" => Some("2500".to_owned()),
            "OTEL_SERVICE_NAME" => Some("svc".to_owned()),
            _ => None,
        };
        let c = OtlpConfig::resolve(None, None, "probe", env)
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://env:4318/v1/traces");
        assert_eq!(
            c.headers,
            vec![("a".into(), "b c".into()), ("x-key".into(), "1".into())]
        );
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.service_name, "svc");
        let file = OtlpFile {
            endpoint: Some("http://file/v1/traces".into()),
            timeout_ms: Some(100),
            ..Default::default()
        };
        let c = OtlpConfig::resolve(None, Some(&file), "probe", env)
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://file/v1/traces");
        assert_eq!(c.timeout, Duration::from_millis(100));
        let c = OtlpConfig::resolve(Some("http://flag/x"), Some(&file), "probe", env)
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://flag/x");
        let traces = |k: &str| {
            (k == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").then(|| "http://t/custom".to_owned())
        };
        let c = OtlpConfig::resolve(None, None, "probe", traces)
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://t/custom");
        assert_eq!(c.service_name, "probe");
        assert_eq!(OtlpConfig::resolve(None, None, "probe", |_| None), Ok(None));
        assert!(OtlpConfig::resolve(Some("https://x"), None, "probe", |_| None).is_err());
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        // nothing listens on port 9 of loopback (discard is not served): every export fails
        let mut config = OtlpConfig::new("http://127.0.0.1:9/v1/traces", "t");
        config.queue_capacity = 4;
        config.timeout = Duration::from_millis(200);
        let e = Exporter::start(config).unwrap();
        let accepted = (0..10).filter(|_| e.submit_span(Span::default())).count() as u64;
        assert!(accepted >= 4);
        assert!(e.flush(Duration::from_secs(5)));
        let s = e.status();
        assert_eq!(s.dropped_queue_full, 10 - accepted);
        assert_eq!(s.dropped_export_failed, accepted);
        assert_eq!(s.exported, 0);
        assert!(s.last_error.is_some());
    }
}
