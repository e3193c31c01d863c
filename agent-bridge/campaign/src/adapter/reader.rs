//! Readers: where in a target's result each value the judge needs is found,
//! and the kernel evidence of a step made of several calls.

use super::*;

#[derive(Debug)]
pub(super) struct Reader {
    pub(super) source: Source,
    pub(super) path: String,
    pub(super) pattern: Option<Regex>,
    pub(super) decode: Decode,
    pub(super) value: Option<String>,
}

/// The readers of one field, tried in order.
#[derive(Debug)]
pub(super) struct Readers(pub(super) Vec<Reader>);

impl Readers {
    pub(super) fn read(&self, result: &Value) -> Result<Option<TVal>, String> {
        for r in &self.0 {
            if let Some(v) = r.read(result)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    pub(super) fn describe(&self) -> String {
        let all: Vec<String> = self.0.iter().map(Reader::describe).collect();
        all.join(" or ")
    }
}

/// The kernel evidence on one call's result: the proxy's, or the bridge's own.
pub fn call_kernel(result: &Value) -> Option<&Value> {
    result
        .pointer("/_meta/probe~1kernel")
        .or_else(|| result.pointer("/structuredContent/kernel"))
}

/// The kernel evidence of a step made of several calls: `calls` holds each
/// call's in order, `failing` that of a last call that answered an error.
/// Which call's verdict is the step's is the probe's rule
/// ([`probe::attribution::steps`]); a memory death before the failing call
/// becomes the step's verdict, with the later call's whole evidence in
/// `followed_by`.
pub fn step_kernel(calls: &[&Value], failing: Option<&Value>) -> Option<Value> {
    use probe::attribution::steps::{CallView, StepPick, pick_for_step};
    let kernels: Vec<&Value> = calls.iter().copied().chain(failing).collect();
    let views: Vec<CallView> = kernels
        .iter()
        .map(|k| CallView {
            failed: k["failed"] == Value::Bool(true),
            hidden: serde_json::from_value(k["hidden_failure"]["primitive"].clone())
                .ok()
                .map(|p| {
                    (
                        p,
                        k["hidden_failure"]["confidence"].as_f64().unwrap_or(0.0),
                        k["hidden_failure"]["explanation"]
                            .as_str()
                            .unwrap_or_default(),
                    )
                }),
            label: k["label"].as_str(),
            why: k["explanation"].as_str().or(k["reason"].as_str()),
        })
        .collect();
    match pick_for_step(&views, failing.is_some())? {
        StepPick::Call(i) => Some(kernels[i].clone()),
        StepPick::DeathThen {
            death,
            failed,
            primitive,
            layer,
            confidence,
            explanation,
        } => {
            let mut k = kernels[death].clone();
            k["failed"] = true.into();
            k["primitive"] = primitive.id().into();
            k["layer"] = layer.id().into();
            k["confidence"] = confidence.into();
            k["explanation"] = explanation.into();
            k["followed_by"] = kernels[failed].clone();
            Some(k)
        }
    }
}

/// The bytes of a file the server says it wrote: the target runs on this
/// machine (over stdio), so its own files are the ones it names.
pub(super) fn written_file(path: &str) -> Result<Vec<u8>, String> {
    if !path.starts_with('/') {
        return Err(format!(
            "the server named the file {path:?}, not an absolute path (start it so that it prints absolute paths)"
        ));
    }
    std::fs::read(path)
        .map_err(|e| format!("the server says it wrote {path}, which cannot be read: {e}"))
}

/// A read value as the judge expects it: bytes as payloads, read_file's
/// bytes as a resource blob too, numbers as numbers.
pub(super) fn shape(field: &str, v: TVal, content: &mut Vec<Value>) -> Value {
    match (field, v) {
        ("bytes", TVal::Bytes(b)) => {
            content.push(json!({"type": "resource", "resource": {"uri": "adapter:bytes", "blob": base64_encode(&b)}}));
            json!({"bytes": b.len(), "sha256": sha256_hex(&b)})
        }
        ("stdout" | "stderr", TVal::Bytes(b)) => {
            serde_json::to_value(Payload::new(&b, b.len() as u64)).unwrap_or(Value::Null)
        }
        ("exit_code" | "size" | "written" | "id", v) => {
            let text = as_text_lossy(&v);
            text.trim()
                .parse::<i64>()
                .map_or(Value::String(text), Value::from)
        }
        (_, TVal::Json(v)) => v,
        (_, b) => Value::String(as_text_lossy(&b)),
    }
}

/// Every text block of a result, joined by newlines.
pub(super) fn all_text(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// write_file's bytes: `text` or decoded `content_base64`.
pub(super) fn content(step: &Step) -> Option<Result<Vec<u8>, Unsupported>> {
    if step.tool != "write_file" {
        return None;
    }
    match (
        step.arguments.get("text"),
        step.arguments.get("content_base64"),
    ) {
        (Some(Value::String(t)), _) => Some(Ok(t.as_bytes().to_vec())),
        (_, Some(Value::String(b))) => {
            Some(base64_decode(b).map_err(|e| Unsupported(format!("content_base64: {e}"))))
        }
        _ => None,
    }
}

impl Reader {
    pub(super) fn parse(at: &str, r: ReaderFile) -> Result<Reader, String> {
        let source = match r.from.as_str() {
            "text" => Source::Text,
            "structured" => Source::Structured,
            "resource" => Source::Resource,
            "image" => Source::Image,
            other => {
                return Err(format!(
                    "{at}.from: unknown source `{other}` (sources: text, structured, resource, image)"
                ));
            }
        };
        let path = match (source, r.path) {
            (Source::Structured, Some(p)) if p.starts_with('/') => p,
            (Source::Structured, Some(p)) => {
                return Err(format!(
                    "{at}.path: `{p}` is not a JSON pointer (e.g. \"/stdout\")"
                ));
            }
            (Source::Structured, None) => {
                return Err(format!(
                    "{at}.path: `from = \"structured\"` needs a JSON pointer, e.g. path = \"/exit_code\""
                ));
            }
            (_, Some(_)) => {
                return Err(format!(
                    "{at}.path: only `from = \"structured\"` takes a path"
                ));
            }
            (_, None) => String::new(),
        };
        let decode = match r.decode.as_deref() {
            None => Decode::None,
            Some("base64") => Decode::Base64,
            Some("payload") => Decode::Payload,
            Some("file") => Decode::File,
            Some(other) => {
                return Err(format!(
                    "{at}.decode: unknown decoding `{other}` (base64, payload or file)"
                ));
            }
        };
        let pattern = match r.pattern {
            None => None,
            Some(p) => {
                let re = Regex::new(&p).map_err(|e| format!("{at}.pattern: {e}"))?;
                let example = r.example.ok_or_else(|| {
                    format!("{at}.example: a pattern needs an example of the text it matches")
                })?;
                if !re.is_match(&example) {
                    return Err(format!(
                        "{at}.pattern: {p:?} never matches its example {example:?}"
                    ));
                }
                Some(re)
            }
        };
        if r.value.is_some() && pattern.is_none() {
            return Err(format!(
                "{at}.value: a constant value needs a pattern that decides when"
            ));
        }
        Ok(Reader {
            source,
            path,
            pattern,
            decode,
            value: r.value,
        })
    }

    pub(super) fn describe(&self) -> String {
        let from = match self.source {
            Source::Text => "text".to_string(),
            Source::Structured => format!("structuredContent{}", self.path),
            Source::Resource => "resource".into(),
            Source::Image => "image".into(),
        };
        match &self.pattern {
            Some(p) => format!("{from} matching {:?}", p.as_str()),
            None => from,
        }
    }

    /// The value, `None` when the result does not have it.
    pub(super) fn read(&self, result: &Value) -> Result<Option<TVal>, String> {
        let blocks = result["content"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let raw: Option<TVal> = match self.source {
            Source::Text => blocks
                .iter()
                .any(|b| b["type"] == "text")
                .then(|| TVal::Bytes(all_text(result).into_bytes())),
            Source::Structured => result["structuredContent"]
                .pointer(&self.path)
                .filter(|v| !v.is_null())
                .cloned()
                .map(TVal::Json),
            Source::Resource => blocks
                .iter()
                .find_map(|b| {
                    let r = &b["resource"];
                    match (&r["blob"], &r["text"]) {
                        (Value::String(blob), _) => Some(
                            base64_decode(blob)
                                .map(TVal::Bytes)
                                .map_err(|e| format!("the resource blob is not base64: {e}")),
                        ),
                        (_, Value::String(t)) => Some(Ok(TVal::Bytes(t.clone().into_bytes()))),
                        _ => None,
                    }
                })
                .transpose()?,
            Source::Image => blocks
                .iter()
                .find(|b| b["type"] == "image")
                .and_then(|b| b["data"].as_str())
                .map(|d| {
                    base64_decode(d)
                        .map(TVal::Bytes)
                        .map_err(|e| format!("the image data is not base64: {e}"))
                })
                .transpose()?,
        };
        let Some(raw) = raw else { return Ok(None) };
        let value = match &self.pattern {
            None => raw,
            Some(re) => {
                let text = as_text_lossy(&raw);
                let Some(c) = re.captures(&text) else {
                    return Ok(None);
                };
                if let Some(v) = &self.value {
                    return Ok(Some(TVal::Json(Value::String(v.clone()))));
                }
                // with groups, group 1 (empty when it took no part); else the match
                let m = if re.captures_len() > 1 {
                    c.get(1).map_or("", |m| m.as_str())
                } else {
                    c.get(0).map_or("", |m| m.as_str())
                };
                TVal::Bytes(m.as_bytes().to_vec())
            }
        };
        Ok(Some(match (self.decode, value) {
            (Decode::None, TVal::Json(Value::String(s))) => TVal::Bytes(s.into_bytes()),
            (Decode::None, v) => v,
            (Decode::Base64, v) => TVal::Bytes(
                base64_decode(as_text_lossy(&v).trim()).map_err(|e| format!("not base64: {e}"))?,
            ),
            (Decode::Payload, TVal::Json(p)) => match (&p["text"], &p["base64"]) {
                (Value::String(t), _) => TVal::Bytes(t.clone().into_bytes()),
                (_, Value::String(b)) => {
                    TVal::Bytes(base64_decode(b).map_err(|e| format!("payload base64: {e}"))?)
                }
                _ => return Err("a payload without text or base64".into()),
            },
            (Decode::Payload, _) => return Err("a payload must be a JSON object".into()),
            (Decode::File, v) => TVal::Bytes(written_file(as_text_lossy(&v).trim())?),
        }))
    }
}
