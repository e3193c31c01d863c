//! One step's verdict: the tool result checked against the step's
//! expectations, plus the interface evidence found on the way (payloads
//! whose bytes do not hash to what they claim, bytes that came back as a
//! known corruption of what was sent, protocol and transport errors).

use std::collections::HashMap;
use std::time::Duration;

use clap::ValueEnum as _;
use serde_json::{Value, json};

use super::record::{CallError, InterfacePrimitive, Primitive, StepOutcome};
use super::spec::{Expect, Step};
use contract::bytes::{base64_decode, sha256_hex};
use contract::fault::InterfaceFault;

/// What a test's earlier steps left to compare later ones with: the bytes
/// it sent, by sha256 (what came back is compared against them), and the
/// sha256 each step's workload printed (for `sha256_from_step`).
#[derive(Default)]
pub struct Sent {
    bytes: HashMap<String, Vec<u8>>,
    printed_sha256: Vec<Option<String>>,
}

impl Sent {
    fn remember(&mut self, data: Vec<u8>) -> String {
        let sha = sha256_hex(&data);
        self.bytes.insert(sha.clone(), data);
        sha
    }
}

/// How many kernel events a stored step keeps: the decisive one and its
/// neighbours in time, the timeline a report shows (all of them live in
/// the probe's own evidence DB).
const EVENTS_KEPT: usize = 12;

/// The `EVENTS_KEPT` events nearest the decisive one, in time order; the
/// last ones when there is no decisive event.
fn around_decisive(events: Vec<Value>, decisive: &Value) -> Vec<Value> {
    if events.len() <= EVENTS_KEPT {
        return events;
    }
    let at = decisive["ts_ns"]
        .as_u64()
        .and_then(|ts| events.iter().position(|e| e["ts_ns"].as_u64() >= Some(ts)))
        .unwrap_or(events.len() - 1);
    let start = at
        .saturating_sub(EVENTS_KEPT / 2)
        .min(events.len() - EVENTS_KEPT);
    events.into_iter().skip(start).take(EVENTS_KEPT).collect()
}

/// The first word of 64 hex digits in `out` (`sha256sum`'s, `hashlib`'s).
fn printed_sha256(out: &[u8]) -> Option<String> {
    String::from_utf8_lossy(out)
        .split(|c: char| !c.is_ascii_hexdigit())
        .find(|w| w.len() == 64)
        .map(str::to_ascii_lowercase)
}

/// A step that passed is degraded when it stalled in memory reclaim for at
/// least this share of its time…
const RECLAIM_SHARE: f64 = 0.05;
/// …and at least this long (a few ms of reclaim are routine).
const RECLAIM_MIN_MS: f64 = 50.0;

/// The content a write_file step sends.
fn sent_content(step: &Step) -> Option<Vec<u8>> {
    if step.tool != "write_file" {
        return None;
    }
    match (
        step.arguments.get("text"),
        step.arguments.get("content_base64"),
    ) {
        (Some(Value::String(t)), _) => Some(t.as_bytes().to_vec()),
        (_, Some(Value::String(b))) => base64_decode(b).ok(),
        _ => None,
    }
}

/// Judges one step from the bridge's answer.
pub fn judge(
    step: &Step,
    answer: Result<Value, CallError>,
    took: Duration,
    sent: &mut Sent,
) -> StepOutcome {
    let mut out = StepOutcome {
        duration_ms: took.as_secs_f64() * 1000.0,
        expects_failure: step.expect.is_error
            || step.expect.exists == Some(false)
            || step.expect.exit_code.is_some_and(|c| c != 0)
            || step.expect.signal.is_some(),
        ..StepOutcome::default()
    };
    let result = match answer {
        Ok(r) => r,
        Err(e) => {
            sent.printed_sha256.push(None);
            out.transport_lost = !matches!(e, CallError::Protocol { .. });
            out.call_error = Some(e.to_string());
            keep_kernel(&mut out, e.kernel());
            // the server died on the call, or a process of its died just
            // before it, and the kernel says why (the proxy's evidence on
            // its error): the sandbox's failure, not the interface's
            if out
                .kernel_failure()
                .is_some_and(|c| c.primitive != Primitive::None)
                || out.died_before_call().is_some()
            {
                out.failures.push(e.to_string());
                return out;
            }
            let primitive = if out.transport_lost {
                InterfacePrimitive::Transport
            } else {
                InterfacePrimitive::Protocol
            };
            out.blame(primitive, 0.95, e.to_string());
            return out;
        }
    };
    let raw = serde_json::to_vec(&result).unwrap_or_default();
    out.response_sha256 = Some(sha256_hex(&raw));
    out.response_bytes = Some(raw.len() as u64);
    out.is_error = Some(result["isError"] == Value::Bool(true));
    let Some(s) = result.get("structuredContent").filter(|s| s.is_object()) else {
        sent.printed_sha256.push(None);
        keep_kernel(&mut out, result["_meta"].get("probe/kernel"));
        out.blame(
            InterfacePrimitive::Protocol,
            0.9,
            "the result has no structuredContent object".into(),
        );
        return out;
    };
    // agent-bridge's own evidence, else the proxy's (a server behind
    // `agent-bridge proxy` whose results have a structuredContent of their own)
    let proxied = result["_meta"].get("probe/kernel");
    keep_kernel(
        &mut out,
        match s.get("kernel") {
            Some(own) if own["available"] == Value::Bool(true) => Some(own),
            own => proxied.or(own),
        },
    );
    let e = &step.expect;
    let is_error = out.is_error == Some(true);
    let message = || s["error"]["message"].as_str().unwrap_or("").to_string();
    match e.exists {
        Some(true) if is_error => out
            .failures
            .push(format!("expected the path to exist: {}", message())),
        Some(false) if !is_error => out
            .failures
            .push("expected the path to be absent, but it exists".into()),
        Some(false) if s["errno"] != "ENOENT" => out
            .failures
            .push(format!("expected ENOENT, got: {}", message())),
        _ if e.exists.is_none() && is_error != e.is_error => out.failures.push(if is_error {
            format!("unexpected tool error: {}", message())
        } else {
            "expected a tool error, the call succeeded".into()
        }),
        _ => {}
    }
    // a foreign server that will not carry the bytes (through its adapter's `refused`)
    if let Some(why) = s["refused"].as_str() {
        out.blame(
            InterfacePrimitive::Bytes,
            0.9,
            format!("{}: the server refused: {why}", step.tool),
        );
    }
    payloads(step, &result, s, sent, &mut out);
    if let Some(data) = sent_content(step) {
        let len = data.len() as u64;
        let sha = sent.remember(data);
        // the bridge reports what it wrote: it must be what was sent
        if !is_error && s["written"].as_u64().is_some_and(|w| w != len) {
            out.blame(
                InterfacePrimitive::Bytes,
                0.95,
                format!(
                    "write_file sent {len} bytes (sha256 {sha}), the bridge wrote {}",
                    s["written"]
                ),
            );
        }
    }
    scalar_checks(e, s, &mut out);
    degradation(e, &mut out);
    // why an adapter found no value, beside the expectation that missed it
    if !out.failures.is_empty()
        && let Some(notes) = s["adapter_notes"].as_array()
    {
        out.failures
            .extend(notes.iter().filter_map(Value::as_str).map(String::from));
    }
    out
}

/// Keeps the probe's evidence for the call, whatever it says (its events,
/// and those of the spans it carries, cut to those around the decisive
/// one): evidence that is not available still holds what the proxy knows
/// beside it (`before_call`: a death between calls; `outcome`,
/// `server_pid`), and its reason is stored with it. A step without an
/// attribution is counted as one, whatever the reason.
fn keep_kernel(out: &mut StepOutcome, kernel: Option<&Value>) {
    let Some(k) = kernel else {
        let reason = match &out.call_error {
            Some(e) => format!("the call got no result and no evidence ({e})"),
            None => "the answer carries no kernel evidence (run the server behind \
                     `agent-bridge proxy`)"
                .into(),
        };
        // stored with the step, as evidence the probe gave no reason for is
        out.kernel = Some(json!({"available": false, "reason": reason}));
        out.kernel_unavailable = Some(reason);
        return;
    };
    let mut k = k.clone();
    trim_events(&mut k);
    for nested in ["before_call", "followed_by"] {
        if let Some(n) = k.get_mut(nested) {
            trim_events(n);
        }
    }
    if k["available"] != Value::Bool(true) {
        let reason = k["reason"].as_str().unwrap_or("no reason given");
        out.kernel_unavailable = Some(reason.to_string());
    }
    out.kernel = Some(k);
}

/// Cuts an attribution's events to those around its decisive one.
fn trim_events(k: &mut Value) {
    let Some(o) = k.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(events)) = o.remove("events") {
        let kept = around_decisive(events, o.get("decisive").unwrap_or(&Value::Null));
        o.insert("events".into(), Value::Array(kept));
    }
}

/// Notes what slowed a step down: past its `max_duration_ms`, or stalled
/// in memory reclaim (the probe's `memory.reclaim_ms` for the call).
fn degradation(e: &Expect, out: &mut StepOutcome) {
    if let Some(max) = e.max_duration_ms
        && out.duration_ms > max as f64
    {
        out.degraded.push(format!(
            "took {:.0} ms, more than max_duration_ms {max}",
            out.duration_ms
        ));
    }
    // a process of the call the OOM killer took while the call succeeded
    // (a browser's tab): never "nothing failed"
    if let Some(death) = out
        .hidden_failure()
        .filter(|h| h.primitive == Primitive::MemOom)
    {
        out.degraded_on = Some(Primitive::MemOom);
        out.degraded
            .push(format!("the call succeeded, but {}", death.explanation));
    }
    let reclaim = out
        .kernel
        .as_ref()
        .and_then(|k| k["memory"]["reclaim_ms"].as_f64())
        .unwrap_or(0.0);
    if reclaim >= RECLAIM_MIN_MS && reclaim >= out.duration_ms * RECLAIM_SHARE {
        out.degraded_on.get_or_insert(Primitive::MemPressure);
        out.degraded.push(format!(
            "memory pressure: {reclaim:.0} ms of its {:.0} ms stalled in memory reclaim ({:.0}%)",
            out.duration_ms,
            reclaim * 100.0 / out.duration_ms.max(1.0)
        ));
    }
}

fn scalar_checks(e: &Expect, s: &Value, out: &mut StepOutcome) {
    if let Some(want) = e.exit_code
        && s["exit_code"].as_i64() != Some(want as i64)
    {
        let got = match (&s["exit_code"], &s["signal"]) {
            (Value::Number(n), _) => format!("exit code {n}"),
            (_, Value::String(sig)) => format!("killed by {sig}"),
            _ if s["timed_out"] == Value::Bool(true) => "a timeout".into(),
            _ => "no exit code".into(),
        };
        out.failures
            .push(format!("expected exit code {want}, got {got}"));
    }
    if let Some(want) = &e.signal
        && s["signal"].as_str() != Some(want)
    {
        out.failures.push(format!(
            "expected death by {want}, got signal {}",
            s["signal"]
        ));
    }
    if let Some(want) = e.size
        && s["size"].as_u64() != Some(want)
    {
        out.failures
            .push(format!("expected size {want}, got {}", s["size"]));
    }
}

/// Checks every payload's own integrity and the byte expectations.
fn payloads(step: &Step, result: &Value, s: &Value, sent: &mut Sent, out: &mut StepOutcome) {
    let e = &step.expect;
    let stdout = decode_payload("stdout", &s["stdout"], out);
    let stderr = decode_payload("stderr", &s["stderr"], out);
    sent.printed_sha256
        .push(stdout.as_deref().and_then(printed_sha256));
    if let Some(stdout) = &stdout {
        if let Some(want) = &e.stdout_equals
            && stdout != want.as_bytes()
        {
            out.failures.push(format!(
                "stdout: expected {}, got {}",
                preview(want.as_bytes()),
                preview(stdout)
            ));
            corruption("stdout", want.as_bytes(), stdout, out);
        }
        if let Some(want) = &e.stdout_contains
            && !contains(stdout, want.as_bytes())
        {
            out.failures.push(format!(
                "stdout does not contain {}: got {}",
                preview(want.as_bytes()),
                preview(stdout)
            ));
        }
        if let Some(want) = e.stdout_base64.as_deref().map(base64_decode) {
            let want = want.unwrap_or_default();
            if stdout != &want {
                out.failures.push(format!(
                    "stdout: expected {} bytes {}, got {} bytes {}",
                    want.len(),
                    preview(&want),
                    stdout.len(),
                    preview(stdout)
                ));
                corruption("stdout", &want, stdout, out);
            }
        }
        if let Some(want) = &e.stdout_sha256 {
            compare_sha("stdout", want, stdout, sent, out);
        }
    } else if e.stdout_equals.is_some()
        || e.stdout_contains.is_some()
        || e.stdout_sha256.is_some()
        || e.stdout_base64.is_some()
    {
        out.failures
            .push("expected stdout, the result has none".into());
    }
    if let Some(want) = &e.stderr_contains
        && !stderr
            .as_deref()
            .is_some_and(|b| contains(b, want.as_bytes()))
    {
        out.failures.push(format!(
            "stderr does not contain {}: got {}",
            preview(want.as_bytes()),
            preview(stderr.as_deref().unwrap_or_default())
        ));
    }
    browser_checks(e, s, out);
    let browser_bytes = matches!(
        step.tool.as_str(),
        "browser_screenshot" | "browser_pdf" | "browser_download"
    );
    let checks_bytes = e.png.is_some()
        || e.jpeg.is_some()
        || e.pdf_pages.is_some()
        || e.sha256.is_some()
        || e.size.is_some();
    if browser_bytes && out.is_error == Some(false) && checks_bytes {
        // the bytes the server returned (or wrote), as the adapter carried them
        let blob = result["content"].as_array().and_then(|c| {
            c.iter()
                .find_map(|b| b["resource"]["blob"].as_str())
                .map(base64_decode)
        });
        match blob {
            Some(Ok(data)) => {
                if let Some(want) = &e.sha256 {
                    compare_sha(&step.tool, want, &data, sent, out);
                }
                file_checks(e, &data, sent, out);
            }
            _ => out
                .failures
                .push(format!("{}: the result carries no bytes", step.tool)),
        }
    }
    if step.tool == "read_file" && out.is_error == Some(false) {
        let blob = result["content"].as_array().and_then(|c| {
            c.iter()
                .find_map(|b| b["resource"]["blob"].as_str())
                .map(base64_decode)
        });
        match blob {
            Some(Ok(data)) => {
                let said = s["sha256"].as_str().unwrap_or("");
                let got = sha256_hex(&data);
                if got != said {
                    out.blame(
                        InterfacePrimitive::Bytes,
                        0.95,
                        format!(
                            "read_file: the {} bytes carried hash to {got}, the bridge says {said}",
                            data.len()
                        ),
                    );
                }
                if let Some(want) = &e.sha256 {
                    compare_sha("read_file bytes", want, &data, sent, out);
                }
                file_checks(e, &data, sent, out);
            }
            Some(Err(err)) => out.blame(
                InterfacePrimitive::Protocol,
                0.9,
                format!("read_file: the resource blob is not base64: {err}"),
            ),
            None => out.blame(
                InterfacePrimitive::Protocol,
                0.9,
                "read_file: the result carries no resource blob".into(),
            ),
        }
    } else if let Some(want) = &e.sha256
        && !browser_bytes
        && out.is_error == Some(false)
        && s["sha256"].as_str() != Some(want.as_str())
    {
        out.failures.push(format!(
            "expected sha256 {want}, the bridge reports {}",
            s["sha256"]
        ));
    }
}

/// Decodes a `{text|base64, bytes, sha256}` payload and checks it against
/// its own length and digest.
fn decode_payload(name: &str, p: &Value, out: &mut StepOutcome) -> Option<Vec<u8>> {
    if p.is_null() {
        return None;
    }
    let data = match (&p["text"], &p["base64"]) {
        (Value::String(t), _) => t.as_bytes().to_vec(),
        (_, Value::String(b)) => match base64_decode(b) {
            Ok(d) => d,
            Err(e) => {
                out.blame(InterfacePrimitive::Protocol, 0.9, format!("{name}: {e}"));
                return None;
            }
        },
        _ => {
            out.blame(
                InterfacePrimitive::Protocol,
                0.9,
                format!("{name}: a payload without text or base64"),
            );
            return None;
        }
    };
    let got = sha256_hex(&data);
    if p["sha256"].as_str() != Some(got.as_str()) || p["bytes"].as_u64() != Some(data.len() as u64)
    {
        out.blame(
            InterfacePrimitive::Bytes,
            0.95,
            format!(
                "{name}: carries {} bytes hashing to {got}, but says {} bytes, sha256 {}",
                data.len(),
                p["bytes"],
                p["sha256"]
            ),
        );
    }
    Some(data)
}

fn compare_sha(what: &str, want: &str, got: &[u8], sent: &Sent, out: &mut StepOutcome) {
    let sha = sha256_hex(got);
    if sha.eq_ignore_ascii_case(want) {
        return;
    }
    out.failures.push(format!(
        "{what}: expected sha256 {want}, got {sha} ({} bytes)",
        got.len()
    ));
    if let Some(original) = sent.bytes.get(&want.to_ascii_lowercase()) {
        out.blame(
            InterfacePrimitive::Bytes,
            0.8,
            format!(
                "{what}: {} bytes were sent, {} came back different",
                original.len(),
                got.len()
            ),
        );
        corruption(what, original, got, out);
    }
}

/// The checks of a file the workload made: the hash it printed, PNG and
/// PDF structure.
fn file_checks(e: &Expect, data: &[u8], sent: &Sent, out: &mut StepOutcome) {
    if let Some(n) = e.sha256_from_step {
        match sent.printed_sha256.get(n).cloned().flatten() {
            Some(want) if want != sha256_hex(data) => out.failures.push(format!(
                "read_file bytes: the workload hashed the file to {want} (step {n}), the {} bytes returned hash to {}",
                data.len(),
                sha256_hex(data)
            )),
            Some(_) => {}
            None => out
                .failures
                .push(format!("sha256_from_step: step {n} printed no sha256")),
        }
    }
    if let Some(want) = e.png {
        // kept as it came back, so the report shows what the agent would see
        if data.len() <= MAX_ARTIFACT {
            out.artifact = Some(("image/png", data.to_vec()));
        }
        match png_size(data) {
            Some(got) if (got.width, got.height) == (want.width, want.height) => {}
            Some(got) => out.failures.push(format!(
                "expected a {}x{} PNG, got {}x{}",
                want.width, want.height, got.width, got.height
            )),
            None => out.failures.push(format!(
                "expected a PNG, the bytes start {}",
                preview(&data[..data.len().min(16)])
            )),
        }
    }
    if let Some(want) = e.jpeg {
        if data.len() <= MAX_ARTIFACT {
            out.artifact = Some(("image/jpeg", data.to_vec()));
        }
        match jpeg_size(data) {
            Some(got) if (got.width, got.height) == (want.width, want.height) => {}
            Some(got) => out.failures.push(format!(
                "expected a {}x{} JPEG, got {}x{}",
                want.width, want.height, got.width, got.height
            )),
            None => out.failures.push(format!(
                "expected a JPEG, the bytes start {}",
                preview(&data[..data.len().min(16)])
            )),
        }
    }
    if let Some(want) = e.pdf_pages {
        match pdf_pages(data) {
            Some(n) if n == want => {}
            Some(n) => out
                .failures
                .push(format!("expected a PDF of {want} pages, it has {n}")),
            None => out.failures.push(format!(
                "expected a PDF, the bytes start {}",
                preview(&data[..data.len().min(16)])
            )),
        }
    }
}

/// What a browser step expects of the page: its text, its title, the
/// value a script computed.
fn browser_checks(e: &Expect, s: &Value, out: &mut StepOutcome) {
    let text = s["page_text"].as_str();
    if let Some(want) = &e.text_contains {
        match text {
            Some(t) if t.contains(want.as_str()) => {}
            Some(t) => out.failures.push(format!(
                "the page's text does not contain {want:?}: got {}",
                preview(t.as_bytes())
            )),
            None => out.failures.push(format!(
                "expected text containing {want:?}, the result has none"
            )),
        }
    }
    if let Some(want) = &e.text_lacks
        && let Some(t) = text.filter(|t| t.contains(want.as_str()))
    {
        out.failures.push(format!(
            "the text still contains {want:?}: {}",
            preview(t.as_bytes())
        ));
    }
    if let Some(want) = &e.title
        && s["title"].as_str().map(str::trim) != Some(want.as_str())
    {
        out.failures
            .push(format!("expected the title {want:?}, got {}", s["title"]));
    }
    if let Some(want) = &e.value_json {
        // servers print the value as JSON text (`42`, `"Page 3"`)
        let got = match &s["value"] {
            Value::String(t) => serde_json::from_str::<Value>(t.trim()).ok(),
            Value::Null => None,
            v => Some(v.clone()),
        };
        if got.as_ref() != Some(want) {
            out.failures.push(format!(
                "expected the script's value {want}, got {}",
                s["value"]
            ));
        }
    }
}

/// The largest image kept for the report.
const MAX_ARTIFACT: usize = 4 << 20;

/// An image's size in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSize {
    pub width: u32,
    pub height: u32,
}

/// The size of a PNG: its signature, then IHDR as the first chunk.
pub fn png_size(d: &[u8]) -> Option<ImageSize> {
    if d.len() < 24 || &d[..8] != b"\x89PNG\r\n\x1a\n" || &d[12..16] != b"IHDR" {
        return None;
    }
    let be = |i: usize| u32::from_be_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
    Some(ImageSize {
        width: be(16),
        height: be(20),
    })
}

/// The size of a JPEG: SOI, then segments up to the first start-of-frame
/// marker (SOF0..SOF15 but DHT, JPG and DAC), which holds height and width.
pub fn jpeg_size(d: &[u8]) -> Option<ImageSize> {
    if d.get(..2)? != [0xFF, 0xD8] {
        return None;
    }
    let mut i = 2;
    while i + 4 <= d.len() {
        if d[i] != 0xFF {
            return None;
        }
        let marker = d[i + 1];
        let len = usize::from(u16::from_be_bytes([d[i + 2], d[i + 3]]));
        if (0xC0..=0xCF).contains(&marker) && !matches!(marker, 0xC4 | 0xC8 | 0xCC) {
            let f = d.get(i + 5..i + 9)?;
            return Some(ImageSize {
                height: u32::from(u16::from_be_bytes([f[0], f[1]])),
                width: u32::from(u16::from_be_bytes([f[2], f[3]])),
            });
        }
        i += 2 + len;
    }
    None
}

/// The page count of a PDF: `%PDF-` header, then its page objects
/// (`/Type /Page`, not `/Pages`), which Chromium writes uncompressed.
pub fn pdf_pages(d: &[u8]) -> Option<u32> {
    if !d.starts_with(b"%PDF-") {
        return None;
    }
    let needle = b"/Type /Page";
    let pages = d
        .windows(needle.len() + 1)
        .filter(|w| &w[..needle.len()] == needle && !w[needle.len()].is_ascii_alphanumeric())
        .count();
    Some(pages as u32)
}

/// Names the interface bug when `got` is a known corruption of `want`
/// (the seed's: lossy UTF-8, cut at NUL, CRLF, trimmed, tail dropped).
fn corruption(what: &str, want: &[u8], got: &[u8], out: &mut StepOutcome) {
    for f in InterfaceFault::value_variants() {
        if f.corrupt(want.to_vec()) == got {
            out.blame(
                InterfacePrimitive::Bytes,
                0.95,
                format!(
                    "{what}: the bytes came back as `{}` would leave them",
                    f.name()
                ),
            );
            return;
        }
    }
    // a transform or added text is an encoding layer's doing; bytes cut
    // short or changed may as well be a full disk or a failed command
    match super::mangle::describe(want, got) {
        Some(m) if !matches!(m.kind.as_str(), "truncated" | "changed") => out.blame(
            InterfacePrimitive::Bytes,
            0.9,
            format!("{what}: {} ({})", m.description, m.kind),
        ),
        Some(m) if m.kind == "truncated" => out.failures.push(format!("{what}: {}", m.description)),
        _ => {}
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// A short, escaped view of bytes for an assertion diff.
fn preview(b: &[u8]) -> String {
    const MAX: usize = 120;
    let s = String::from_utf8_lossy(&b[..b.len().min(MAX)]);
    let more = if b.len() > MAX {
        format!("… ({} bytes)", b.len())
    } else {
        String::new()
    };
    format!("{:?}{more}", s)
}

/// The arguments as stored: strings over 4 KiB replaced by their length and digest.
pub fn stored_request(step: &Step) -> Value {
    let args = step
        .arguments
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) if s.len() > 4096 => {
                    json!({"elided_bytes": s.len(), "sha256": sha256_hex(s.as_bytes())})
                }
                v => v.clone(),
            };
            (k.clone(), v)
        })
        .collect::<serde_json::Map<_, _>>();
    json!({"tool": step.tool, "arguments": args})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Primitive;
    use std::collections::BTreeMap;

    fn step(tool: &str, args: Value, expect: Value) -> Step {
        Step {
            tool: tool.into(),
            arguments: serde_json::from_value::<BTreeMap<String, Value>>(args).unwrap(),
            expect: serde_json::from_value(expect).unwrap(),
        }
    }

    fn payload(data: &[u8]) -> Value {
        serde_json::to_value(contract::bytes::Payload::new(data, data.len() as u64)).unwrap()
    }

    fn exec_result(stdout: &[u8], code: i32) -> Value {
        json!({"content": [], "isError": false, "structuredContent": {
            "exit_code": code, "stdout": payload(stdout), "stderr": payload(b""),
            "kernel": {"available": true, "failed": code != 0, "primitive": "fs.readonly", "confidence": 0.9, "explanation": "EROFS", "events": [1,2]}}})
    }

    #[test]
    fn a_matching_result_passes_and_keeps_the_kernel_without_events() {
        let s = step(
            "exec",
            json!({"argv": ["echo"]}),
            json!({"exit_code": 0, "stdout_equals": "hi\n"}),
        );
        let o = judge(
            &s,
            Ok(exec_result(b"hi\n", 0)),
            Duration::from_millis(3),
            &mut Sent::default(),
        );
        assert!(o.passed(), "{o:?}");
        assert_eq!(o.kernel.as_ref().unwrap()["events"], json!([1, 2]));
        let mut r = exec_result(b"hi\n", 0);
        r["structuredContent"]["kernel"] = json!({"available": false, "reason": "no daemon"});
        let o = judge(&s, Ok(r), Duration::ZERO, &mut Sent::default());
        assert_eq!(o.kernel_unavailable.as_deref(), Some("no daemon"));
        assert_eq!(o.kernel_failure(), None);
    }

    #[test]
    fn a_long_timeline_keeps_the_events_around_the_decisive_one() {
        let events: Vec<Value> = (0..40u64)
            .map(|i| json!({"ts_ns": i * 10, "n": i}))
            .collect();
        let kept = around_decisive(events.clone(), &json!({"ts_ns": 200}));
        let ns: Vec<u64> = kept.iter().map(|e| e["n"].as_u64().unwrap()).collect();
        assert_eq!(
            ns,
            (14..26).collect::<Vec<u64>>(),
            "six before the decisive event, five after"
        );
        let kept = around_decisive(events.clone(), &json!({"ts_ns": 5}));
        assert_eq!(kept[0]["n"], 0);
        let kept = around_decisive(events, &Value::Null);
        assert_eq!(kept.len(), EVENTS_KEPT);
        assert_eq!(
            kept[EVENTS_KEPT - 1]["n"],
            39,
            "without a decisive event: the last ones"
        );
    }

    #[test]
    fn a_tab_the_oom_killer_took_in_a_call_that_passed_is_degraded_on_mem_oom() {
        let s = step("exec", json!({"argv": ["x"]}), json!({"exit_code": 0}));
        let mut r = exec_result(b"", 0);
        r["structuredContent"]["kernel"] = json!({"available": true, "failed": false,
            "primitive": "none", "explanation": "exited 0, but …",
            "hidden_failure": {"primitive": "mem.oom", "confidence": 0.9,
                "explanation": "chromium (pid 12) was killed by the OOM killer at 300 MiB anon RSS"}});
        let o = judge(
            &s,
            Ok(r.clone()),
            Duration::from_millis(900),
            &mut Sent::default(),
        );
        assert!(o.passed(), "{o:?}");
        assert_eq!(o.degraded_on, Some(Primitive::MemOom));
        assert_eq!(
            o.degraded,
            vec![
                "the call succeeded, but chromium (pid 12) was killed by the OOM killer at 300 MiB anon RSS"
            ]
        );
        let d = crate::triage::degraded(&[o]).expect("degraded");
        assert_eq!(d.primitive, Some(Primitive::MemOom));
        // a hidden failure that is not a memory death leaves a pass a pass
        r["structuredContent"]["kernel"]["hidden_failure"]["primitive"] = json!("fs.missing");
        let o = judge(&s, Ok(r), Duration::from_millis(900), &mut Sent::default());
        assert!(o.passed() && o.degraded.is_empty(), "{o:?}");
    }

    #[test]
    fn browser_expectations_hold_or_say_what_the_page_had() {
        let s = step(
            "browser_eval",
            json!({"script": "() => 1"}),
            json!({"value_json": "frames loaded 8", "title": "8 tabs", "text_contains": "frames"}),
        );
        let answer = |value: &str, title: &str, text: &str| {
            json!({"isError": false, "content": [],
                "structuredContent": {"value": value, "title": title, "page_text": text}})
        };
        let o = judge(
            &s,
            Ok(answer("\"frames loaded 8\"", " 8 tabs", "frames loaded 8")),
            Duration::ZERO,
            &mut Sent::default(),
        );
        assert!(o.passed(), "{o:?}");
        let o = judge(
            &s,
            Ok(answer("\"loading\"", "about:blank", "")),
            Duration::ZERO,
            &mut Sent::default(),
        );
        assert_eq!(o.failures.len(), 3, "{o:?}");
        assert!(
            o.failures[0].contains("does not contain \"frames\""),
            "{o:?}"
        );
        assert!(
            o.failures[2].contains("expected the script's value \"frames loaded 8\""),
            "{o:?}"
        );
        let lacks = step("browser_tabs", json!({}), json!({"text_lacks": "/page/9"}));
        let o = judge(
            &lacks,
            Ok(answer("", "", "- 1: [page 9](http://h/page/9)")),
            Duration::ZERO,
            &mut Sent::default(),
        );
        assert!(o.failures[0].contains("still contains"), "{o:?}");
    }

    #[test]
    fn an_errors_evidence_without_an_attribution_keeps_what_died_before_the_call() {
        let s = step("exec", json!({"argv": ["x"]}), json!({"exit_code": 0}));
        let events: Vec<Value> = (0..30u64).map(|i| json!({"ts_ns": i})).collect();
        // what the proxy sends when the daemon lost the call's span but
        // the server had been OOM-killed between two calls
        let died = CallError::Protocol {
            message: "the foreign server exited during the call (code -32000)".into(),
            kernel: Some(
                json!({"available": false, "reason": "the probe daemon did not answer within 30 s",
                "outcome": "exited", "server_pid": 41,
                "before_call": {"available": true, "failed": true, "primitive": "mem.oom", "confidence": 0.97,
                    "explanation": "node (pid 41) was killed by the OOM killer at 900 MiB anon RSS",
                    "events": events}}),
            ),
        };
        let o = judge(&s, Err(died), Duration::ZERO, &mut Sent::default());
        let k = o.kernel.as_ref().expect("the evidence is kept");
        assert_eq!(k["server_pid"], 41, "{k}");
        assert_eq!(
            k["before_call"]["events"].as_array().unwrap().len(),
            EVENTS_KEPT
        );
        // still counted as a step without an attribution, and its reason stored
        assert_eq!(
            o.kernel_unavailable.as_deref(),
            Some("the probe daemon did not answer within 30 s")
        );
        assert_eq!(k["reason"], "the probe daemon did not answer within 30 s");
        assert_eq!(o.kernel_failure(), None);
        assert_eq!(o.died_before_call().unwrap().primitive, Primitive::MemOom);
        assert!(o.interface.is_empty(), "the kernel explains it: {o:?}");
        let t = crate::triage::triage(&[o]).expect("failed");
        assert_eq!(t.primitive, crate::record::Cause::Kernel(Primitive::MemOom));
        assert!(
            t.explanation
                .starts_with("step 0: before its call, node (pid 41) was killed by the OOM killer"),
            "{}",
            t.explanation
        );
        assert_eq!(t.evidence["kernel"]["server_pid"], 41);
        // evidence that is not available never names a cause of its own
        let odd = CallError::Protocol {
            message: "boom (code -32000)".into(),
            kernel: Some(json!({"available": false, "reason": "r", "failed": true,
                "primitive": "fs.readonly", "hidden_failure": {"primitive": "mem.oom", "confidence": 0.9}})),
        };
        let o = judge(&s, Err(odd), Duration::ZERO, &mut Sent::default());
        assert_eq!((o.kernel_failure(), o.hidden_failure()), (None, None));
        let t = crate::triage::triage(&[o]).expect("failed");
        assert_eq!(
            t.primitive,
            crate::record::Cause::Interface(InterfacePrimitive::Protocol)
        );
        let mut r = exec_result(b"", 1);
        r["structuredContent"]["kernel"] = json!({"available": false, "reason": "no daemon",
            "failed": true, "primitive": "fs.readonly", "confidence": 0.9});
        let t = crate::triage::triage(&[judge(&s, Ok(r), Duration::ZERO, &mut Sent::default())])
            .expect("failed");
        assert_eq!((t.layer.id(), t.primitive.id()), ("test", "none"));
        assert_eq!(t.confidence, 0.4, "no attribution: {t:?}");
    }

    #[test]
    fn the_proxys_evidence_is_read_beside_a_structured_content_of_the_servers_own() {
        let s = step("exec", json!({"argv": ["x"]}), json!({"exit_code": 0}));
        let proxied = json!({"available": true, "failed": true, "primitive": "fs.readonly",
            "confidence": 0.9, "explanation": "EROFS from the proxy"});
        let mut r = exec_result(b"", 1);
        r["structuredContent"]
            .as_object_mut()
            .unwrap()
            .remove("kernel");
        r["_meta"] = json!({"probe/kernel": proxied});
        let o = judge(&s, Ok(r.clone()), Duration::ZERO, &mut Sent::default());
        assert_eq!(o.kernel_unavailable, None, "{o:?}");
        assert_eq!(
            o.kernel_failure().unwrap().explanation,
            "EROFS from the proxy"
        );
        // a server whose own probe is off: the proxy's; both there: its own
        r["structuredContent"]["kernel"] = json!({"available": false, "reason": "--no-probe"});
        let o = judge(&s, Ok(r.clone()), Duration::ZERO, &mut Sent::default());
        assert_eq!(
            o.kernel.as_ref().unwrap()["explanation"],
            "EROFS from the proxy"
        );
        r["structuredContent"]["kernel"] =
            exec_result(b"", 1)["structuredContent"]["kernel"].clone();
        let o = judge(&s, Ok(r), Duration::ZERO, &mut Sent::default());
        assert_eq!(o.kernel.as_ref().unwrap()["explanation"], "EROFS");
    }

    #[test]
    fn a_json_rpc_error_with_the_proxys_kernel_evidence_is_triaged_on_it() {
        let s = step("exec", json!({"argv": ["x"]}), json!({"exit_code": 0}));
        let died = CallError::Protocol {
            message: "the server exited during the call (code -32603)".into(),
            kernel: Some(
                json!({"available": true, "failed": true, "primitive": "mem.oom",
                "layer": "sandbox", "confidence": 0.97,
                "explanation": "node (pid 40) was killed by the OOM killer at 900 MiB anon RSS"}),
            ),
        };
        let o = judge(&s, Err(died), Duration::ZERO, &mut Sent::default());
        assert!(!o.passed());
        assert!(o.interface.is_empty(), "the kernel explains it: {o:?}");
        assert_eq!(o.kernel_unavailable, None);
        let t = crate::triage::triage(&[o]).expect("failed");
        assert_eq!(t.layer, crate::record::Layer::Sandbox);
        assert_eq!(t.primitive, crate::record::Cause::Kernel(Primitive::MemOom));
        // an error whose evidence says nothing failed stays the interface's,
        // and one with no evidence is counted as a step without it
        let plain = CallError::Protocol {
            message: "unknown tool (code -32602)".into(),
            kernel: Some(json!({"available": true, "failed": false, "primitive": "none"})),
        };
        let o = judge(&s, Err(plain), Duration::ZERO, &mut Sent::default());
        assert_eq!(
            o.interface_primitive.map(|p| p.0),
            Some(InterfacePrimitive::Protocol)
        );
        let o = judge(
            &s,
            Err(CallError::protocol("bad".into())),
            Duration::ZERO,
            &mut Sent::default(),
        );
        assert!(
            o.kernel_unavailable
                .as_deref()
                .unwrap()
                .contains("no evidence"),
            "{o:?}"
        );
        let mut r = exec_result(b"", 0);
        r["structuredContent"]
            .as_object_mut()
            .unwrap()
            .remove("kernel");
        let o = judge(&s, Ok(r), Duration::ZERO, &mut Sent::default());
        assert!(
            o.kernel_unavailable
                .as_deref()
                .unwrap()
                .contains("agent-bridge proxy"),
            "{o:?}"
        );
    }

    #[test]
    fn a_slow_or_reclaiming_step_is_degraded_not_failed() {
        let s = step(
            "exec",
            json!({"argv": ["x"]}),
            json!({"exit_code": 0, "max_duration_ms": 100}),
        );
        let o = judge(
            &s,
            Ok(exec_result(b"", 0)),
            Duration::from_millis(250),
            &mut Sent::default(),
        );
        assert!(o.passed(), "slowness is not a failure: {o:?}");
        assert_eq!(
            o.degraded,
            vec!["took 250 ms, more than max_duration_ms 100"]
        );
        assert_eq!(o.degraded_on, None);
        // 120 ms of 1 s in reclaim: memory pressure; 20 ms is routine
        for (reclaim, pressure) in [(120.0, true), (20.0, false)] {
            let mut r = exec_result(b"", 0);
            r["structuredContent"]["kernel"]["memory"] = json!({"reclaim_ms": reclaim});
            let s = step("exec", json!({"argv": ["x"]}), json!({"exit_code": 0}));
            let o = judge(&s, Ok(r), Duration::from_millis(1000), &mut Sent::default());
            assert!(o.passed());
            assert_eq!(o.degraded_on.is_some(), pressure, "{reclaim} ms");
            assert_eq!(o.degraded.len(), usize::from(pressure));
        }
    }

    #[test]
    fn a_file_the_workload_made_is_checked_against_its_own_hash_and_format() {
        let png = super::super::generate::png(7, 5, 1);
        let read = |data: &[u8]| {
            json!({"isError": false, "content": [{"type": "resource", "resource": {"uri": "file:///s.png", "blob": contract::bytes::base64_encode(data)}}],
                "structuredContent": {"sha256": sha256_hex(data), "size": data.len()}})
        };
        let hashed = step(
            "exec",
            json!({"argv": ["sha256sum"]}),
            json!({"exit_code": 0}),
        );
        let check = step(
            "read_file",
            json!({"path": "/s.png"}),
            json!({"sha256_from_step": 0, "png": {"width": 7, "height": 5}}),
        );
        let mut sent = Sent::default();
        let printed = format!("{}  /s.png\n", sha256_hex(&png));
        assert!(
            judge(
                &hashed,
                Ok(exec_result(printed.as_bytes(), 0)),
                Duration::ZERO,
                &mut sent
            )
            .passed()
        );
        let o = judge(&check, Ok(read(&png)), Duration::ZERO, &mut sent);
        assert!(o.passed(), "{o:?}");
        assert_eq!(
            o.artifact.as_ref().map(|(m, d)| (*m, d.len())),
            Some(("image/png", png.len()))
        );
        // other bytes than the workload hashed; the wrong size; not a PNG
        let mut other = png.clone();
        other.push(0);
        let o = judge(&check, Ok(read(&other)), Duration::ZERO, &mut sent);
        assert!(
            o.failures[0].contains("the workload hashed the file to"),
            "{o:?}"
        );
        let small = super::super::generate::png(3, 5, 1);
        let o = judge(&check, Ok(read(&small)), Duration::ZERO, &mut sent);
        assert!(
            o.failures
                .iter()
                .any(|f| f == "expected a 7x5 PNG, got 3x5"),
            "{o:?}"
        );
        let o = judge(&check, Ok(read(b"GIF89a")), Duration::ZERO, &mut sent);
        assert!(
            o.failures.iter().any(|f| f.starts_with("expected a PNG")),
            "{o:?}"
        );
        // PDF pages: page objects, not the page tree
        let pdf = b"%PDF-1.4\n1 0 obj << /Type /Pages /Count 2 >>\n2 0 obj << /Type /Page >>\n3 0 obj << /Type /Page>>\n%%EOF\n";
        assert_eq!(pdf_pages(pdf), Some(2));
        assert_eq!(pdf_pages(b"not a pdf"), None);
    }

    #[test]
    fn a_browsers_bytes_are_checked_for_size_digest_and_format() {
        // SOI, an APP0 segment, then SOF0: 8-bit, 5 high, 7 wide
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0x4A, 0x46];
        jpeg.extend([0xFF, 0xC0, 0x00, 0x11, 0x08, 0x00, 0x05, 0x00, 0x07, 0x03]);
        assert_eq!(
            jpeg_size(&jpeg),
            Some(ImageSize {
                width: 7,
                height: 5
            })
        );
        assert_eq!(jpeg_size(&super::super::generate::png(7, 5, 1)), None);
        assert_eq!(jpeg_size(&[0xFF, 0xD8, 0xFF]), None);
        let carried = |data: &[u8]| {
            json!({"isError": false, "content": [{"type": "resource", "resource": {"uri": "browser://downloads/x", "blob": contract::bytes::base64_encode(data)}}],
                "structuredContent": {"sha256": sha256_hex(data), "size": data.len()}})
        };
        let file = b"0123456789";
        let download = step(
            "browser_download",
            json!({"selector": "#dl"}),
            json!({"sha256": sha256_hex(file), "size": 10}),
        );
        let mut sent = Sent::default();
        let o = judge(&download, Ok(carried(file)), Duration::ZERO, &mut sent);
        assert!(o.passed(), "{o:?}");
        let o = judge(
            &download,
            Ok(carried(b"012345678")),
            Duration::ZERO,
            &mut sent,
        );
        assert!(
            o.failures
                .iter()
                .any(|f| f.starts_with("browser_download: expected sha256"))
                && o.failures.iter().any(|f| f == "expected size 10, got 9"),
            "{o:?}"
        );
        let shot = step(
            "browser_screenshot",
            json!({"format": "jpeg"}),
            json!({"jpeg": {"width": 7, "height": 5}}),
        );
        assert!(judge(&shot, Ok(carried(&jpeg)), Duration::ZERO, &mut sent).passed());
        let o = judge(
            &shot,
            Ok(
                json!({"isError": false, "content": [{"type": "text", "text": "done"}], "structuredContent": {}}),
            ),
            Duration::ZERO,
            &mut sent,
        );
        assert!(
            o.failures
                .iter()
                .any(|f| f == "browser_screenshot: the result carries no bytes"),
            "{o:?}"
        );
    }

    #[test]
    fn a_crlf_corruption_is_interface_evidence() {
        let s = step(
            "exec",
            json!({"argv": ["echo"]}),
            json!({"stdout_equals": "a\nb\n"}),
        );
        let o = judge(
            &s,
            Ok(exec_result(b"a\r\nb\r\n", 0)),
            Duration::ZERO,
            &mut Sent::default(),
        );
        assert_eq!(o.failures.len(), 1, "{o:?}");
        assert!(o.interface[0].contains("`crlf`"), "{o:?}");
    }

    #[test]
    fn an_unrelated_mismatch_is_only_a_failed_expectation() {
        let s = step(
            "exec",
            json!({"argv": ["echo"]}),
            json!({"exit_code": 0, "stdout_equals": "yes"}),
        );
        let o = judge(
            &s,
            Ok(exec_result(b"no", 1)),
            Duration::ZERO,
            &mut Sent::default(),
        );
        assert_eq!(o.failures.len(), 2, "{o:?}");
        assert!(o.interface.is_empty(), "{o:?}");
        assert_eq!(o.kernel_failure().unwrap().primitive, Primitive::FsReadonly);
    }

    #[test]
    fn a_payload_that_lies_about_its_digest_is_interface_evidence() {
        let mut r = exec_result(b"hi", 0);
        r["structuredContent"]["stdout"]["text"] = json!("ho");
        let s = step("exec", json!({"argv": ["x"]}), json!({}));
        let o = judge(&s, Ok(r), Duration::ZERO, &mut Sent::default());
        assert!(
            o.interface[0].starts_with("stdout: carries 2 bytes"),
            "{o:?}"
        );
    }

    #[test]
    fn bytes_read_back_are_compared_with_what_was_written() {
        let data = b"\x89PNG\r\n\x1a\n\xff\xfe";
        let sha = sha256_hex(data);
        let mut sent = Sent::default();
        let w = step(
            "write_file",
            json!({"path": "/tmp/x", "content_base64": contract::bytes::base64_encode(data)}),
            json!({"sha256": sha}),
        );
        let wrote = json!({"isError": false, "structuredContent": {"sha256": sha, "written": data.len(), "size": data.len()}});
        assert!(judge(&w, Ok(wrote), Duration::ZERO, &mut sent).passed());
        let lossy = String::from_utf8_lossy(data).into_owned().into_bytes();
        let r = step(
            "read_file",
            json!({"path": "/tmp/x"}),
            json!({"sha256": sha}),
        );
        let read = json!({"isError": false, "content": [{"type": "resource", "resource": {"uri": "file:///tmp/x", "blob": contract::bytes::base64_encode(&lossy)}}],
            "structuredContent": {"sha256": sha, "size": data.len()}});
        let o = judge(&r, Ok(read), Duration::ZERO, &mut sent);
        assert!(!o.passed());
        assert!(
            o.interface.iter().any(|i| i.contains("the bridge says")),
            "{o:?}"
        );
        assert!(
            o.interface.iter().any(|i| i.contains("`lossy-utf8`")),
            "{o:?}"
        );
    }

    #[test]
    fn a_short_write_is_interface_evidence() {
        let w = step(
            "write_file",
            json!({"path": "/tmp/x", "text": "a\u{0}b"}),
            json!({}),
        );
        let wrote = json!({"isError": false, "structuredContent": {"written": 1}});
        let o = judge(&w, Ok(wrote), Duration::ZERO, &mut Sent::default());
        assert!(o.interface[0].contains("sent 3 bytes"), "{o:?}");
    }

    #[test]
    fn protocol_and_transport_errors() {
        let s = step("exec", json!({"argv": ["x"]}), json!({}));
        let o = judge(
            &s,
            Err(CallError::protocol("bad".into())),
            Duration::ZERO,
            &mut Sent::default(),
        );
        assert!(!o.passed() && !o.transport_lost);
        let o = judge(
            &s,
            Err(CallError::transport("closed".into())),
            Duration::ZERO,
            &mut Sent::default(),
        );
        assert!(o.transport_lost);
    }

    #[test]
    fn absent_paths_need_enoent() {
        let s = step("stat", json!({"path": "/x"}), json!({"exists": false}));
        let gone = json!({"isError": true, "structuredContent": {"errno": "ENOENT", "error": {"message": "no"}}});
        assert!(judge(&s, Ok(gone), Duration::ZERO, &mut Sent::default()).passed());
        let denied = json!({"isError": true, "structuredContent": {"errno": "EACCES", "error": {"message": "denied"}}});
        assert!(!judge(&s, Ok(denied), Duration::ZERO, &mut Sent::default()).passed());
    }

    #[test]
    fn big_request_strings_are_elided() {
        let s = step(
            "write_file",
            json!({"path": "/x", "text": "a".repeat(5000)}),
            json!({}),
        );
        let r = stored_request(&s);
        assert_eq!(r["arguments"]["text"]["elided_bytes"], 5000);
        assert_eq!(r["arguments"]["path"], "/x");
    }
}
