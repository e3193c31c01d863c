//! The campaign run as OpenTelemetry traces (`campaign run --otlp URL`):
//! one root span per runner process (the run), a child per test, and per
//! step a CLIENT span `tools/call {tool}` whose context goes to the bridge
//! as `traceparent` (and `tracestate`) in the request's `params._meta`
//! (SEP-414), so the bridge's and the probe daemon's spans for that call
//! land in the step's trace, as its children.
//!
//! Spans go out through the probe's exporter ([`probe::otlp::Exporter`]):
//! the same bounded queue, batching and drop counts as the daemon.
//!
//! The runner's code stays unaware of this module but for three hooks:
//! [`scope`] around a test (carries the tracer into the worker's task),
//! [`test_begin`]/[`test_end`] around the test and [`step`] around each step;
//! [`Connection::call`](super::target::Connection::call) asks [`step_meta`]
//! for the `_meta` to send.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use probe::otlp::{
    Exporter, KeyValue, OtlpConfig, Span, SpanKind, Status, StatusCode, TraceParent, kv, kv_bool,
    kv_f64, kv_i64, now_unix_ns, random_id,
};
use serde_json::Value;

use probe::status::OtlpStatus;

use super::record::{StepOutcome, TestRecord};
use super::spec::{Step, TestSpec};

/// The run's root span and the exporter.
pub struct Tracer {
    exporter: Exporter,
    trace_id: [u8; 16],
    run_span: [u8; 8],
    started_ns: u64,
}

/// An open span: its ids and when it began.
#[derive(Debug, Clone, Copy)]
pub struct Open {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: [u8; 8],
    pub started_ns: u64,
}

impl Open {
    /// Its context as a W3C `traceparent` (sampled).
    pub fn traceparent(&self) -> String {
        TraceParent {
            trace_id: self.trace_id,
            parent_id: self.span_id,
            flags: 1,
        }
        .format()
    }
}

/// The tracer and test span a worker's task is running under.
#[derive(Clone)]
struct Current {
    tracer: Arc<Tracer>,
    test: Option<Open>,
}

tokio::task_local! {
    static CURRENT: std::cell::RefCell<Current>;
    /// The step being sent (its span's context).
    static STEP: Open;
}

impl Tracer {
    /// Starts the exporter and the run span. `endpoint`: the traces URL;
    /// the standard `OTEL_EXPORTER_OTLP_*` variables fill in headers and
    /// timeout, `OTEL_SERVICE_NAME` the service (default `agent-bridge`).
    pub fn start(endpoint: &str) -> anyhow::Result<Tracer> {
        let config = OtlpConfig::resolve(Some(endpoint), None, "agent-bridge", |k| {
            std::env::var(k).ok()
        })
        .map_err(anyhow::Error::msg)?
        .expect("an endpoint was given");
        Ok(Tracer {
            exporter: Exporter::start(config)?,
            trace_id: random_id(),
            run_span: random_id(),
            started_ns: now_unix_ns(),
        })
    }

    /// The run span's context.
    pub fn run_span(&self) -> Open {
        Open {
            trace_id: self.trace_id,
            span_id: self.run_span,
            parent: [0; 8],
            started_ns: self.started_ns,
        }
    }

    fn open(&self, parent: [u8; 8]) -> Open {
        Open {
            trace_id: self.trace_id,
            span_id: random_id(),
            parent,
            started_ns: now_unix_ns(),
        }
    }

    fn emit(
        &self,
        open: &Open,
        name: String,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
        error: Option<String>,
    ) {
        let span = Span {
            trace_id: open.trace_id.to_vec(),
            span_id: open.span_id.to_vec(),
            parent_span_id: if open.parent == [0; 8] {
                Vec::new()
            } else {
                open.parent.to_vec()
            },
            flags: 0x101,
            name,
            kind: kind as i32,
            start_time_unix_nano: open.started_ns,
            end_time_unix_nano: now_unix_ns().max(open.started_ns),
            attributes,
            status: error.map(|message| Status {
                message,
                code: StatusCode::Error as i32,
            }),
            ..Default::default()
        };
        self.exporter.submit_span(span);
    }

    /// Ends the run span (`summary`: the runner's summary as JSON) and
    /// exports what is queued, waiting at most `timeout`. The exporter's
    /// counts (`exported`, `dropped_*`, `last_error`).
    pub fn finish(&self, summary: &Value, timeout: Duration) -> OtlpStatus {
        let mut attributes = vec![kv("campaign.runner.pid", std::process::id().to_string())];
        for (key, field) in [
            ("campaign.run", "run"),
            ("campaign.tests.recorded", "recorded"),
            ("campaign.tests.passed", "passed"),
            ("campaign.tests.failed", "failed"),
            ("campaign.tests.degraded", "degraded"),
        ] {
            match &summary[field] {
                Value::String(s) => attributes.push(kv(key, s.as_str())),
                Value::Number(n) => attributes.push(kv_i64(key, n.as_i64().unwrap_or(0))),
                _ => {}
            }
        }
        let run = self.run_span();
        self.emit(
            &run,
            "campaign run".into(),
            SpanKind::Internal,
            attributes,
            None,
        );
        self.exporter.flush(timeout);
        self.exporter.status()
    }

    /// The exporter's counts so far.
    pub fn status(&self) -> OtlpStatus {
        self.exporter.status()
    }
}

/// Runs `fut` (one test) with `tracer` in reach of [`test_begin`] and
/// [`step`]; without a tracer, just runs it.
pub async fn scope<F: Future>(tracer: Option<Arc<Tracer>>, fut: F) -> F::Output {
    match tracer {
        Some(tracer) => {
            CURRENT
                .scope(std::cell::RefCell::new(Current { tracer, test: None }), fut)
                .await
        }
        None => fut.await,
    }
}

/// Opens the test's span (a child of the run), when tracing.
pub fn test_begin() {
    let _ = CURRENT.try_with(|c| {
        let mut c = c.borrow_mut();
        let parent = c.tracer.run_span;
        c.test = Some(c.tracer.open(parent));
    });
}

/// Ends the test's span with its verdict.
pub fn test_end(test: &TestSpec, record: &TestRecord) {
    let _ = CURRENT.try_with(|c| {
        let mut c = c.borrow_mut();
        let Some(open) = c.test.take() else { return };
        let verdict = test_verdict(record);
        let mut attributes = vec![
            kv("campaign.test.id", test.id.as_str()),
            kv("campaign.test.domain", test.domain.as_str()),
            kv("campaign.test.title", test.title.as_str()),
            kv("campaign.verdict", verdict),
        ];
        if let Some(t) = &record.triage {
            attributes.push(kv("campaign.layer", t.layer.id()));
            attributes.push(kv("probe.primitive", t.primitive.id()));
            attributes.push(kv_f64("probe.confidence", t.confidence));
            attributes.push(kv("probe.explanation", t.explanation.as_str()));
        }
        if let Some(s) = &record.mcp_session {
            attributes.push(kv("probe.session", s.as_str()));
        }
        let error = record.triage.as_ref().map(|t| t.explanation.clone());
        c.tracer.emit(
            &open,
            format!("test {}", test.id),
            SpanKind::Internal,
            attributes,
            error,
        );
    });
}

fn test_verdict(record: &TestRecord) -> &'static str {
    if record.unsupported.is_some() {
        "unsupported"
    } else if record.triage.is_some() {
        "fail"
    } else if record.degraded.is_some() {
        "degraded"
    } else {
        "pass"
    }
}

/// Runs one step (`fut`) in a CLIENT span `tools/call {tool}`, a child of
/// the test's, whose context [`step_meta`] hands to the call; ends it with
/// the step's verdict and the kernel primitive the bridge returned.
pub async fn step<F>(test: &TestSpec, step: &Step, fut: F) -> Result<StepOutcome, String>
where
    F: Future<Output = Result<StepOutcome, String>>,
{
    let opened = CURRENT
        .try_with(|c| {
            let c = c.borrow();
            let parent = c.test.map_or(c.tracer.run_span, |t| t.span_id);
            (c.tracer.clone(), c.tracer.open(parent))
        })
        .ok();
    let Some((tracer, open)) = opened else {
        return fut.await;
    };
    let result = STEP.scope(open, fut).await;
    let mut attributes = vec![
        kv("mcp.method.name", "tools/call"),
        kv("gen_ai.tool.name", step.tool.as_str()),
        kv("gen_ai.operation.name", "execute_tool"),
        kv("campaign.test.id", test.id.as_str()),
        kv("campaign.test.domain", test.domain.as_str()),
    ];
    let mut error = None;
    match &result {
        Ok(o) => {
            let verdict = if o.unsupported.is_some() {
                "unsupported"
            } else if o.passed() {
                "pass"
            } else {
                "fail"
            };
            attributes.push(kv("campaign.verdict", verdict));
            if o.is_error == Some(true) {
                attributes.push(kv("error.type", "tool_error"));
            }
            if let Some(e) = &o.call_error {
                attributes.push(kv(
                    "error.type",
                    if o.transport_lost {
                        "transport"
                    } else {
                        "call_error"
                    },
                ));
                error = Some(e.clone());
            }
            if let Some(k) = &o.kernel {
                for (key, field) in [
                    ("probe.primitive", "primitive"),
                    ("probe.layer", "layer"),
                    ("probe.session", "session"),
                ] {
                    if let Some(v) = k[field].as_str() {
                        attributes.push(kv(key, v));
                    }
                }
                if let Some(id) = k["span"].as_i64() {
                    attributes.push(kv_i64("probe.span_id", id));
                }
            }
            if !o.failures.is_empty() {
                attributes.push(kv("campaign.failures", o.failures.join("; ")));
                error.get_or_insert_with(|| o.failures.join("; "));
            }
            attributes.push(kv_bool("campaign.passed", o.passed()));
        }
        Err(why) => {
            attributes.push(kv("campaign.verdict", "unsupported"));
            attributes.push(kv("campaign.unsupported", why.as_str()));
        }
    }
    tracer.emit(
        &open,
        format!("tools/call {}", step.tool),
        SpanKind::Client,
        attributes,
        error,
    );
    result
}

/// The `_meta` for the tools/call being sent: the step span's
/// `traceparent` (None outside a traced step).
pub fn step_meta() -> Option<rmcp::model::RequestMetaObject> {
    STEP.try_with(|open| {
        let mut meta = rmcp::model::MetaObject::new();
        meta.set_traceparent(open.traceparent());
        meta.into()
    })
    .ok()
}
