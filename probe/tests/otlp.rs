//! OpenTelemetry export tests: a real `probe run --otlp` exporting to a real
//! OTLP/HTTP receiver on loopback (which decodes every request with the
//! `opentelemetry-proto` types), real workloads on the real kernel. Root
//! needed (never skipped under CI=true).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use probe::client::Client;
use probe::otlp::{SpanKind, StatusCode, any_value, hex};
use probe::otlp_receiver::{Mode, Receiver, attr, attr_str};
use serde_json::{Value, json};

mod common;
use common::{PROBE, run_attached};
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
        "OTLP daemon tests need root; CI=true forbids skipping"
    );
    eprintln!("SKIPPED: OTLP daemon test needs root");
    false
}

/// A daemon on a fresh temp dir, stopped (SIGTERM) on drop.
struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
}

impl Daemon {
    /// `probe run` with `args`, and only the OTEL_* variables in `env`.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("probe-otlp-")
            .tempdir()
            .unwrap();
        let mut cmd = Command::new(PROBE);
        cmd.args(["run", "--socket"])
            .arg(dir.path().join("probe.sock"))
            .arg("--db")
            .arg(dir.path().join("evidence.db"))
            .args(args)
            .stderr(Stdio::inherit());
        for (k, _) in std::env::vars() {
            if k.starts_with("OTEL_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().unwrap();
        let socket = dir.path().join("probe.sock");
        if let Err(e) = probe::client::wait_until_ready(&socket, Duration::from_secs(20)) {
            let _ = child.kill();
            panic!("daemon did not come up: {e} ({:?})", child.wait());
        }
        Daemon { child, dir }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("probe.sock")
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket()).unwrap()
    }

    fn otlp_status(&self) -> Value {
        self.client().status().unwrap()["otlp"].clone()
    }

    /// Polls `status` until the exporter accounted for `n` spans
    /// (exported + dropped); returns the `otlp` block.
    fn wait_accounted(&self, n: u64, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let o = self.otlp_status();
            let done = o["exported"].as_u64().unwrap()
                + o["dropped_queue_full"].as_u64().unwrap()
                + o["dropped_export_failed"].as_u64().unwrap();
            if done >= n {
                return o;
            }
            assert!(
                Instant::now() < deadline,
                "{done} of {n} spans accounted for: {o}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// Begins a span with `fields` (begin_span's optional ones), runs `cmd`
/// attached to it, ends it with `is_error`; the attribution.
fn traced(
    client: &mut Client,
    fields: Value,
    cmd: &[&str],
    is_error: bool,
) -> probe::attribution::Attribution {
    let mut begin = json!({"session": "t-otel"});
    for (k, v) in fields.as_object().unwrap() {
        begin[k] = v.clone();
    }
    let (span, exit) = run_attached(client, begin, cmd);
    let words = json!({"command": cmd.join(" ")});
    let r = client
        .call(json!({"op": "end_span", "span_id": span, "exit": exit, "is_error": is_error, "words": words}))
        .unwrap();
    serde_json::from_value(r["attribution"].clone()).unwrap()
}

/// begin_span + end_span with nothing attached: the cheapest span.
fn empty_span(client: &mut Client, i: usize) {
    let span = client
        .call(json!({"op": "begin_span", "session": "t-load", "label": format!("s{i}"), "tool": "exec"}))
        .unwrap()["span_id"]
        .as_u64()
        .unwrap();
    client.end_span(span, None, None).unwrap();
}

#[test]
fn tool_call_spans_carry_mcp_conventions_trace_context_and_evidence() {
    if !root() {
        return;
    }
    let rx = Receiver::start().unwrap();
    let d = Daemon::start(
        &["--otlp", &rx.url()],
        &[("OTEL_SERVICE_NAME", "probe-test")],
    );
    let mut c = d.client();
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    // a tool call that fails on a missing file, in the caller's trace
    let failed = traced(
        &mut c,
        json!({"tool": "exec", "mcp_method": "tools/call", "mcp_session": "sess-42",
               "traceparent": traceparent, "tracestate": "vendor=abc"}),
        &["sh", "-c", "cat /nonexistent-otlp/data.csv"],
        true,
    );
    assert_eq!(failed.primitive.id(), "fs.missing");
    // a plain span (no tool): named by its label, a trace of its own
    let plain = traced(&mut c, json!({}), &["true"], false);
    // an invalid traceparent is ignored, not an error
    let invalid = traced(
        &mut c,
        json!({"tool": "read_file", "traceparent": "00-zz-not-valid-01"}),
        &["true"],
        false,
    );
    assert!(rx.wait_for(3, Duration::from_secs(10)), "3 spans exported");
    let spans = rx.spans();
    assert_eq!(spans.len(), 3, "one OTLP span per ended span");
    let by_probe_id = |id: u64| {
        spans
            .iter()
            .find(|r| {
                matches!(attr(&r.span.attributes, "probe.span_id"),
                    Some(any_value::Value::IntValue(v)) if *v as u64 == id)
            })
            .unwrap_or_else(|| panic!("span {id} exported"))
    };

    let r = by_probe_id(failed.span);
    let s = &r.span;
    assert_eq!(s.name, "tools/call exec");
    assert_eq!(s.kind, SpanKind::Server as i32);
    assert_eq!(hex(&s.trace_id), TRACE_ID, "the caller's trace");
    assert_eq!(
        hex(&s.parent_span_id),
        PARENT_ID,
        "a child of the caller's span"
    );
    assert_eq!(s.span_id.len(), 8);
    assert_ne!(hex(&s.span_id), PARENT_ID);
    assert_eq!(s.trace_state, "vendor=abc");
    let a = &s.attributes;
    assert_eq!(attr_str(a, "mcp.method.name"), Some("tools/call"));
    assert_eq!(attr_str(a, "gen_ai.tool.name"), Some("exec"));
    assert_eq!(attr_str(a, "mcp.session.id"), Some("sess-42"));
    assert_eq!(attr_str(a, "error.type"), Some("tool_error"));
    assert_eq!(attr_str(a, "probe.primitive"), Some("fs.missing"));
    assert_eq!(attr_str(a, "probe.layer"), Some("sandbox"));
    assert_eq!(attr_str(a, "probe.session"), Some("t-otel"));
    assert_eq!(
        attr_str(a, "probe.explanation"),
        Some(failed.explanation.as_str())
    );
    assert!(
        matches!(attr(a, "probe.confidence"), Some(any_value::Value::DoubleValue(c)) if *c > 0.5)
    );
    assert!(matches!(
        attr(a, "probe.drops.kernel"),
        Some(any_value::Value::IntValue(0))
    ));
    assert_eq!(
        s.status.as_ref().map(|st| st.code),
        Some(StatusCode::Error as i32)
    );
    // wall-clock times around now, in order
    let now = probe::otlp::now_unix_ns();
    assert!(
        s.start_time_unix_nano > now - 60_000_000_000
            && s.start_time_unix_nano <= s.end_time_unix_nano
    );
    assert!(s.end_time_unix_nano <= now);
    // the decisive event, with its fields, among the span events
    let decisive = failed.decisive.as_ref().unwrap();
    let ev = s
        .events
        .iter()
        .find(|e| {
            matches!(
                attr(&e.attributes, "probe.decisive"),
                Some(any_value::Value::BoolValue(true))
            )
        })
        .expect("the decisive event is a span event");
    assert_eq!(ev.name, decisive.kind.id());
    assert_eq!(ev.time_unix_nano, s.start_time_unix_nano + decisive.ts_ns);
    assert_eq!(
        attr_str(&ev.attributes, "probe.event.errno"),
        Some("ENOENT")
    );
    assert_eq!(
        attr_str(&ev.attributes, "probe.event.path"),
        decisive.path.as_deref()
    );
    assert!(s.events.len() <= probe::otlp::MAX_EVENTS);
    assert_eq!(attr_str(&r.resource, "service.name"), Some("probe-test"));
    assert!(attr_str(&r.resource, "host.name").is_some_and(|h| !h.is_empty()));

    let s = &by_probe_id(plain.span).span;
    assert_eq!(s.name, "true");
    assert_eq!(s.kind, SpanKind::Internal as i32);
    assert!(s.parent_span_id.is_empty());
    assert_ne!(hex(&s.trace_id), TRACE_ID);
    assert_eq!(attr_str(&s.attributes, "probe.primitive"), Some("none"));
    assert!(attr(&s.attributes, "mcp.method.name").is_none());
    assert!(attr(&s.attributes, "error.type").is_none());

    let s = &by_probe_id(invalid.span).span;
    assert_eq!(s.name, "tools/call read_file");
    assert!(s.parent_span_id.is_empty(), "invalid traceparent ignored");
    assert_ne!(hex(&s.trace_id), TRACE_ID);
    assert_eq!(s.trace_id.len(), 16);

    let o = d.wait_accounted(3, Duration::from_secs(5));
    assert_eq!(o["endpoint"], rx.url());
    assert_eq!(o["exported"], 3);
    assert_eq!(o["dropped_queue_full"], 0);
    assert_eq!(o["dropped_export_failed"], 0);
    assert_eq!(o["invalid_traceparents"], 1);
    assert_eq!(o["last_error"], Value::Null);
    // the human status has the block too
    let out = Command::new(PROBE)
        .arg("status")
        .arg("--socket")
        .arg(d.socket())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("otlp") && text.contains(&rx.url()) && text.contains("exported 3"),
        "{text}"
    );
}

/// A collector that answers 500, then one that never answers: spans are
/// dropped and counted, the daemon answers promptly throughout, and
/// exported + dropped equals spans ended; then a healthy collector gets
/// the next spans.
#[test]
fn a_failing_or_hung_collector_never_blocks_the_daemon() {
    if !root() {
        return;
    }
    let rx = Receiver::start().unwrap();
    rx.set_mode(Mode::Fail);
    let d = Daemon::start(
        &["--otlp", &rx.url()],
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "300")],
    );
    let mut c = d.client();
    let mut slowest = Duration::ZERO;
    let mut timed = |c: &mut Client, i: usize| {
        let t = Instant::now();
        empty_span(c, i);
        slowest = slowest.max(t.elapsed());
    };
    for i in 0..50 {
        timed(&mut c, i);
    }
    let o = d.wait_accounted(50, Duration::from_secs(10));
    assert_eq!(o["exported"], 0);
    assert_eq!(o["dropped_export_failed"], 50, "{o}");
    assert!(
        o["last_error"].as_str().unwrap().contains("HTTP 500"),
        "{o}"
    );
    assert!(rx.requests() >= 1);

    // never answers: each request times out after 300 ms
    rx.set_mode(Mode::Hang);
    let before = rx.requests();
    for i in 50..100 {
        timed(&mut c, i);
    }
    // begin/end keep being answered while the exporter waits on the collector
    let t = Instant::now();
    for i in 100..120 {
        timed(&mut c, i);
    }
    // waiting on the exporter would take 20 × 300 ms = 6 s; the margin
    // is for a loaded machine, not the daemon's speed
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let o = d.wait_accounted(120, Duration::from_secs(15));
    assert!(rx.requests() > before, "the hung collector got requests");
    assert_eq!(o["exported"], 0);
    assert_eq!(o["dropped_export_failed"], 120, "{o}");
    let err = o["last_error"].as_str().unwrap();
    assert!(
        err.to_lowercase().contains("timeout") || err.to_lowercase().contains("timed out"),
        "{err}"
    );

    // healthy again
    rx.set_mode(Mode::Accept);
    for i in 120..130 {
        timed(&mut c, i);
    }
    let o = d.wait_accounted(130, Duration::from_secs(10));
    assert_eq!(o["exported"], 10, "{o}");
    assert_eq!(rx.span_count(), 10);
    let status = d.client().status().unwrap();
    let o = &status["otlp"];
    assert_eq!(
        o["exported"].as_u64().unwrap()
            + o["dropped_queue_full"].as_u64().unwrap()
            + o["dropped_export_failed"].as_u64().unwrap(),
        status["spans_ended"].as_u64().unwrap(),
        "every ended span is exported or counted as dropped: {o}"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "a begin/end pair took {slowest:?} while the collector failed"
    );
}

/// The config file's `[otlp]` table names the endpoint and a small queue;
/// a collector that hangs makes the queue overflow: those spans are dropped
/// and counted, not waited for.
#[test]
fn config_file_endpoint_and_a_full_queue() {
    if !root() {
        return;
    }
    let rx = Receiver::start().unwrap();
    rx.set_mode(Mode::Hang);
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        cfg.path(),
        format!(
            "[otlp]\nendpoint = \"{}\"\ntimeout_ms = 1500\nqueue_capacity = 16\nservice_name = \"from-config\"\n",
            rx.url()
        ),
    )
    .unwrap();
    // the environment is outranked by the file
    let d = Daemon::start(
        &["--config", cfg.path().to_str().unwrap()],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")],
    );
    let mut c = d.client();
    for i in 0..200 {
        empty_span(&mut c, i);
    }
    let o = d.otlp_status();
    assert_eq!(o["endpoint"], rx.url());
    assert!(
        o["dropped_queue_full"].as_u64().unwrap() >= 200 - 16 - 16,
        "{o}"
    );
    let o = d.wait_accounted(200, Duration::from_secs(15));
    assert_eq!(o["exported"], 0);
    assert_eq!(
        o["dropped_queue_full"].as_u64().unwrap() + o["dropped_export_failed"].as_u64().unwrap(),
        200,
        "{o}"
    );
    rx.set_mode(Mode::Accept);
    empty_span(&mut c, 200);
    assert!(rx.wait_for(1, Duration::from_secs(10)));
    let r = &rx.spans()[0];
    assert_eq!(attr_str(&r.resource, "service.name"), Some("from-config"));
}

/// With no flag and no config, OTEL_EXPORTER_OTLP_ENDPOINT (a base URL)
/// turns export on, to its /v1/traces.
#[test]
fn the_standard_environment_variables_turn_export_on() {
    if !root() {
        return;
    }
    let rx = Receiver::start().unwrap();
    let base = rx.url().trim_end_matches("/v1/traces").to_owned();
    let d = Daemon::start(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &base),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-probe-test=1"),
        ],
    );
    let mut c = d.client();
    empty_span(&mut c, 0);
    assert!(rx.wait_for(1, Duration::from_secs(10)));
    assert_eq!(d.otlp_status()["endpoint"], rx.url());
    assert_eq!(
        attr_str(&rx.spans()[0].resource, "service.name"),
        Some("probe")
    );
    // and without any of them, export is off
    let off = Daemon::start(&[], &[]);
    assert_eq!(off.otlp_status(), Value::Null);
}
