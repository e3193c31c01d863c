//! Reading just enough of a JSON-RPC message to route it, and adding the
//! kernel evidence to a `tools/call` result without re-encoding it: the
//! rest of the line passes byte for byte.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use sonic_rs::JsonValueTrait as _;

/// The key `_meta` gains on every `tools/call` result.
pub const META_KEY: &str = "probe/kernel";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    Response,
}

/// A client's message, as far as the proxy needs it.
#[derive(Debug, Clone)]
pub struct ClientHead {
    pub kind: Kind,
    /// The id in canonical JSON (the key answers are matched by).
    pub id: Option<String>,
    pub method: Option<String>,
    /// `params.name` of a `tools/call`.
    pub tool: Option<String>,
    /// `params._meta.progressToken`, canonical JSON.
    pub progress_token: Option<String>,
    /// `params.requestId` of `notifications/cancelled`, canonical JSON.
    pub cancelled: Option<String>,
    /// W3C trace context in `params._meta` (`traceparent`, `tracestate`),
    /// for the daemon's OpenTelemetry export.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    // `id: null` is Some: a request with a null id is not a notification
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// A field that is there, `null` included (serde reads `null` as None).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize, Default)]
struct RawParams<'a> {
    // any type here: only a tools/call's name must be a string (see `tool`)
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "requestId")]
    request_id: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct RawMeta<'a> {
    #[serde(borrow, default, rename = "progressToken")]
    progress_token: Option<&'a RawValue>,
    #[serde(borrow, default)]
    traceparent: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tracestate: Option<&'a RawValue>,
}

/// An id (or token) in canonical JSON: `1`, `"a"`. A number stays as
/// written (an id of 2^97 is not a float's rounding of it, and two such ids
/// stay two); None for `null`, a number no float holds (`1e400`), or a
/// string JSON cannot carry (a lone surrogate).
pub fn canonical(raw: &str) -> Option<String> {
    let raw = raw.trim();
    if raw.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        return raw
            .parse::<f64>()
            .is_ok_and(f64::is_finite)
            .then(|| raw.to_string());
    }
    serde_json::from_str::<Value>(raw)
        .ok()
        .filter(|v| !v.is_null())
        .map(|v| v.to_string())
}

/// `v`, an answer object, serialized with `id` exactly as `canonical`
/// keeps it (a `Value` would round 2^97 to a float).
pub fn with_raw_id(mut v: Value, id: &str) -> Vec<u8> {
    if let Some(o) = v.as_object_mut() {
        o.remove("id");
    }
    let rest = serde_json::to_vec(&v).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = Vec::with_capacity(rest.len() + id.len() + 8);
    out.extend_from_slice(b"{\"id\":");
    out.extend_from_slice(id.as_bytes());
    if rest.len() > 2 {
        out.push(b',');
    }
    out.extend_from_slice(&rest[1..]);
    out
}

/// Reads a client's line: the head, or the JSON-RPC error answer it
/// deserves (the same answers as `serve`'s).
pub fn client_head(line: &[u8]) -> Result<ClientHead, Value> {
    // serde skips the strings of fields it ignores without checking them:
    // a message with invalid UTF-8 or a raw NUL anywhere is refused whole
    if std::str::from_utf8(line).is_err() || line.contains(&0) {
        return Err(crate::stdio::bad_line_answer(line, &"invalid bytes"));
    }
    let m: RawMessage<'_> =
        serde_json::from_slice(line).map_err(|e| crate::stdio::bad_line_answer(line, &e))?;
    let id = match m.id {
        None => None,
        Some(raw) => match canonical(raw.get()) {
            Some(id) => Some(id),
            // a request the proxy cannot answer with its own id: answered
            // here with id null, never passed on as a notification
            None => {
                return Err(crate::stdio::error_answer(
                    Value::Null,
                    -32600,
                    format!(
                        "Invalid Request: id {} is not an id (MCP: a string or an integer, never null)",
                        shorten(raw.get())
                    ),
                ));
            }
        },
    };
    let refuse = |code: i32, message: String| {
        crate::stdio::error_answer(
            // echoed only when it comes back as sent (see `stdio::exact_id`)
            id.as_deref()
                .and_then(|i| serde_json::from_str::<Value>(i).ok())
                .filter(|v| id.as_deref() == Some(v.to_string().as_str()))
                .unwrap_or(Value::Null),
            code,
            message,
        )
    };
    let invalid = |why: &str| refuse(-32600, format!("Invalid Request: {why}"));
    // a valid request whose params do not fit its method: JSON-RPC's -32602,
    // as `serve` answers it (`stdio::invalid_params`)
    let invalid_params = |why: &str| {
        let method = m.method.as_deref().unwrap_or_default();
        refuse(-32602, format!("Invalid params for `{method}`: {why}"))
    };
    let kind = match (&m.method, &id, m.result.is_some() || m.error.is_some()) {
        (Some(_), Some(_), _) => Kind::Request,
        (Some(_), None, _) => Kind::Notification,
        (None, Some(_), true) => Kind::Response,
        _ => {
            return Err(invalid(
                "not a JSON-RPC 2.0 message (a request needs `method` and `id`, a notification `method`, a response `id` and `result` or `error`)",
            ));
        }
    };
    let params: RawParams<'_> = match m.params {
        Some(p) if p.get().starts_with('{') => {
            serde_json::from_str(p.get()).map_err(|e| invalid_params(&e.to_string()))?
        }
        _ => RawParams::default(),
    };
    // the tool's name labels the call's span: a call's name that is not a
    // string is refused here; other methods' params are their server's to judge
    let tool = match params.name {
        Some(raw) if kind == Kind::Request && m.method.as_deref() == Some("tools/call") => Some(
            // through a Value: the error says what the name is, not where
            serde_json::from_str(raw.get())
                .and_then(serde_json::from_value::<String>)
                .map_err(|e| invalid_params(&format!("name: {e}")))?,
        ),
        _ => None,
    };
    let meta: RawMeta<'_> = match params.meta {
        Some(p) if p.get().starts_with('{') => serde_json::from_str(p.get()).unwrap_or_default(),
        _ => RawMeta::default(),
    };
    let method = m.method.map(Cow::into_owned);
    Ok(ClientHead {
        kind,
        tool,
        progress_token: meta.progress_token.and_then(|r| canonical(r.get())),
        // strings only; anything else is not trace context and is ignored
        traceparent: meta
            .traceparent
            .and_then(|r| serde_json::from_str(r.get()).ok()),
        tracestate: meta
            .tracestate
            .and_then(|r| serde_json::from_str(r.get()).ok()),
        cancelled: (method.as_deref() == Some("notifications/cancelled"))
            .then(|| params.request_id.and_then(|r| canonical(r.get())))
            .flatten(),
        id,
        method,
    })
}

/// At most 40 characters of `raw`, for an error message.
fn shorten(raw: &str) -> String {
    match raw.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &raw[..i]),
        None => raw.to_string(),
    }
}

/// A server's line, as far as the proxy needs it.
#[derive(Debug, Clone)]
pub struct ChildHead {
    pub kind: Kind,
    pub id: Option<String>,
    pub method: Option<String>,
    /// `params.progressToken` of `notifications/progress`, canonical JSON.
    pub progress_token: Option<String>,
    /// Where a result carries the evidence: `result._meta`.
    pub result: Slot,
    pub is_error: bool,
    /// The response is a JSON-RPC error.
    pub rpc_error: bool,
    /// Where an error carries the evidence: `error.data`.
    pub error: Slot,
}

/// Byte ranges, in the line, of an answer's `result` (or `error`), of its
/// `_meta` (or `data`) and of [`META_KEY`] in that, where they are. Of a
/// repeated key the last: parsers keep the last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slot {
    pub outer: Option<Range<usize>>,
    pub inner: Option<Range<usize>>,
    pub key: Option<Range<usize>>,
}

impl Slot {
    fn map(self, f: impl Fn(Range<usize>) -> Range<usize>) -> Slot {
        Slot {
            outer: self.outer.map(&f),
            inner: self.inner.map(&f),
            key: self.key.map(&f),
        }
    }
}

fn range(line: &[u8], raw: &str) -> Range<usize> {
    let start = raw.as_ptr() as usize - line.as_ptr() as usize;
    start..start + raw.len()
}

/// The [`Slot`] of `outer` (the raw `result` or `error`, a slice of
/// `line`) whose member `inner` (`_meta` or `data`) carries the evidence;
/// `isError: true` among its members sets `is_error`.
fn slot(line: &[u8], outer: &str, inner: &str, is_error: &mut bool) -> Result<Slot, String> {
    let mut slot = Slot {
        outer: Some(range(line, outer)),
        ..Slot::default()
    };
    if !outer.starts_with('{') {
        return Ok(slot);
    }
    for field in sonic_rs::to_object_iter(outer) {
        let (k, v) = field.map_err(|e| e.to_string())?;
        let raw = v.as_raw_str();
        if k == "isError" {
            *is_error = v.as_bool() == Some(true);
        } else if k == inner {
            slot.inner = Some(range(line, raw));
            slot.key = None;
            if raw.starts_with('{') {
                for f in sonic_rs::to_object_iter(raw).flatten() {
                    if f.0 == META_KEY {
                        slot.key = Some(range(line, f.1.as_raw_str()));
                    }
                }
            }
        }
    }
    Ok(slot)
}

/// Reads a server's line without parsing what it does not need (a 90 MB
/// base64 string inside `result` is skipped, not decoded).
pub fn child_head(line: &[u8]) -> Result<ChildHead, String> {
    let mut head = ChildHead {
        kind: Kind::Notification,
        id: None,
        method: None,
        progress_token: None,
        result: Slot::default(),
        is_error: false,
        rpc_error: false,
        error: Slot::default(),
    };
    let mut fields = 0;
    let mut null_id = false;
    for field in sonic_rs::to_object_iter(line) {
        let (key, value) = field.map_err(|e| e.to_string())?;
        fields += 1;
        match key.as_ref() {
            "id" => {
                head.id = canonical(value.as_raw_str());
                null_id = value.as_raw_str().trim() == "null";
            }
            "method" => head.method = value.as_str().map(str::to_owned),
            "error" => {
                head.rpc_error = true;
                head.error = slot(line, value.as_raw_str(), "data", &mut false)?;
            }
            "params" if value.as_raw_str().starts_with('{') => {
                if let Ok(t) = sonic_rs::get(value.as_raw_str(), &["progressToken"]) {
                    head.progress_token = canonical(t.as_raw_str());
                }
            }
            "result" => {
                head.is_error = false;
                head.result = slot(line, value.as_raw_str(), "_meta", &mut head.is_error)?;
            }
            _ => {}
        }
    }
    if fields == 0 {
        return Err("not a JSON object".into());
    }
    head.kind = match (&head.method, &head.id) {
        (Some(_), Some(_)) => Kind::Request,
        (Some(_), None) => Kind::Notification,
        (None, Some(_)) if head.result.outer.is_some() || head.rpc_error => Kind::Response,
        // the answer to a line the server could not read (JSON-RPC's
        // `id: null`): valid, and the client's to see
        (None, None) if null_id && head.rpc_error => Kind::Response,
        _ => return Err("not a JSON-RPC 2.0 message".into()),
    };
    Ok(head)
}

/// [`child_head`] of a line whose string contents in `cuts` were checked
/// already ([`super::lines`]): only the rest of the line is parsed, and the
/// ranges found are of `line`.
pub fn child_head_cut(line: &[u8], cuts: &[Range<usize>]) -> Result<ChildHead, String> {
    if cuts.is_empty() {
        return child_head(line);
    }
    let mut skeleton = Vec::with_capacity(line.len() - cuts.iter().map(|c| c.len()).sum::<usize>());
    let mut at = 0;
    for c in cuts {
        skeleton.extend_from_slice(&line[at..c.start]);
        at = c.end;
    }
    skeleton.extend_from_slice(&line[at..]);
    let mut head = child_head(&skeleton)?;
    // a skeleton offset, in the line: past every cut made before it
    let in_line = |s: usize| {
        let mut removed = 0;
        for c in cuts {
            if c.start - removed > s {
                break;
            }
            removed += c.len();
        }
        s + removed
    };
    let map = |r: Range<usize>| in_line(r.start)..in_line(r.end);
    head.result = head.result.map(map);
    head.error = head.error.map(map);
    Ok(head)
}

/// `line` with `kernel` as `result._meta["probe/kernel"]`, or as
/// `error.data["probe/kernel"]` of an error, in pieces that share the
/// line's memory: only the insertion is new. A `_meta` or `data` that is
/// not an object becomes one: `null` is dropped, another value is kept
/// under `value` (a key added beside it would be lost: parsers keep the last
/// of a repeated key). None when the `result` or `error` is not an object:
/// there is no place for the evidence.
pub fn splice_evidence(line: &Bytes, head: &ChildHead, kernel: &Value) -> Option<Vec<Bytes>> {
    let (slot, inner) = if head.rpc_error {
        (&head.error, "data")
    } else {
        (&head.result, "_meta")
    };
    let evidence = serde_json::to_string(kernel).unwrap_or_else(|_| "null".into());
    let key = format!("\"{META_KEY}\":{evidence}");
    let object = |r: &Range<usize>| line[r.start] == b'{';
    // `what` as the first member of object `r`
    let first = |r: &Range<usize>, what: String| {
        let empty = line[r.start + 1..r.end - 1]
            .iter()
            .all(u8::is_ascii_whitespace);
        let sep = if empty { "" } else { "," };
        vec![
            line.slice(..r.start + 1),
            Bytes::from(what + sep),
            line.slice(r.start + 1..),
        ]
    };
    let instead = |r: &Range<usize>, with: Vec<Bytes>| {
        [vec![line.slice(..r.start)], with, vec![line.slice(r.end..)]].concat()
    };
    Some(match (&slot.outer, &slot.inner, &slot.key) {
        // the server set the key itself: its value is replaced
        (_, _, Some(k)) => instead(k, vec![Bytes::from(evidence)]),
        (_, Some(i), None) if object(i) => first(i, key),
        (_, Some(i), None) if &line[i.clone()] == b"null" => {
            instead(i, vec![Bytes::from(format!("{{{key}}}"))])
        }
        (_, Some(i), None) => instead(
            i,
            vec![
                Bytes::from_static(b"{\"value\":"),
                line.slice(i.clone()),
                Bytes::from(format!(",{key}}}")),
            ],
        ),
        (Some(o), None, _) if object(o) => first(o, format!("\"{inner}\":{{{key}}}")),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_kept_as_written_and_the_unholdable_are_refused() {
        let big = "123456789012345678901234567890";
        assert_eq!(canonical(big).as_deref(), Some(big));
        assert_eq!(canonical(" 7 ").as_deref(), Some("7"));
        assert_eq!(canonical(r#""\u0061""#).as_deref(), Some(r#""a""#));
        for bad in ["null", "1e400", r#""\ud800""#] {
            assert_eq!(canonical(bad), None, "{bad}");
            let line = format!(r#"{{"jsonrpc":"2.0","id":{bad},"method":"ping"}}"#);
            let refused = client_head(line.as_bytes()).unwrap_err();
            assert_eq!(
                (refused["id"].clone(), refused["error"]["code"].clone()),
                (Value::Null, Value::from(-32600)),
                "{bad}"
            );
        }
        let v = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700}});
        let out = String::from_utf8(with_raw_id(v, big)).unwrap();
        assert!(out.starts_with(&format!(r#"{{"id":{big},"#)), "{out}");
        assert_eq!(
            String::from_utf8(with_raw_id(serde_json::json!({}), "1")).unwrap(),
            r#"{"id":1}"#
        );
    }
    use serde_json::json;

    fn spliced(line: &str) -> Value {
        let head = child_head(line.as_bytes()).unwrap();
        let line = Bytes::from(line.to_owned());
        let parts = splice_evidence(&line, &head, &json!({"available": false})).unwrap();
        serde_json::from_slice(&parts.concat()).unwrap()
    }

    #[test]
    fn meta_is_added_merged_or_created() {
        let v = spliced(r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":true}}"#);
        assert_eq!(v["result"]["_meta"][META_KEY]["available"], false);
        assert_eq!(v["result"]["isError"], true);
        let v = spliced(r#"{"jsonrpc":"2.0","id":1,"result":{"_meta":{"x":1},"content":[]}}"#);
        assert_eq!(v["result"]["_meta"]["x"], 1);
        assert_eq!(v["result"]["_meta"][META_KEY]["available"], false);
        let v = spliced(r#"{"jsonrpc":"2.0","id":1,"result":{ }}"#);
        assert_eq!(v["result"]["_meta"][META_KEY]["available"], false);
        let v = spliced(r#"{"jsonrpc":"2.0","id":1,"result":{"_meta":{}}}"#);
        assert_eq!(v["result"]["_meta"][META_KEY]["available"], false);
        let v = spliced(r#"{"jsonrpc":"2.0","id":1,"result":{"_meta":{"probe/kernel":7,"y":2}}}"#);
        assert_eq!(v["result"]["_meta"][META_KEY]["available"], false);
        assert_eq!(v["result"]["_meta"]["y"], 2);
    }

    /// A `_meta` or `data` of another shape, or repeated, still carries the
    /// key where a parser reads it; only a `result` or `error` that is not
    /// an object has no place for it.
    #[test]
    fn evidence_finds_a_place_in_every_shape_that_has_one() {
        let kept = json!({"available": false});
        for (line, at, value) in [
            (
                r#"{"id":1,"result":{"_meta":null,"content":[]}}"#,
                "/result/_meta",
                None,
            ),
            (
                r#"{"id":1,"result":{"_meta":"s"}}"#,
                "/result/_meta",
                Some(json!("s")),
            ),
            (
                r#"{"id":1,"result":{"_meta":{},"_meta":[1]}}"#,
                "/result/_meta",
                Some(json!([1])),
            ),
            (
                r#"{"id":1,"error":{"code":1,"message":"m"}}"#,
                "/error/data",
                None,
            ),
            (
                r#"{"id":1,"error":{"code":1,"data":null}}"#,
                "/error/data",
                None,
            ),
            (
                r#"{"id":1,"error":{"code":1,"data":"text"}}"#,
                "/error/data",
                Some(json!("text")),
            ),
            (
                r#"{"id":1,"error":{"data":[1,2],"code":1}}"#,
                "/error/data",
                Some(json!([1, 2])),
            ),
            (
                r#"{"id":1,"error":{"data":{"probe/kernel":1,"a":2}}}"#,
                "/error/data",
                None,
            ),
        ] {
            let head = child_head(line.as_bytes()).unwrap();
            let line = Bytes::from(line);
            let out = splice_evidence(&line, &head, &kept).unwrap().concat();
            // serde_json keeps the last of a repeated key, as JSON.parse does
            let v: Value = serde_json::from_slice(&out).unwrap();
            let slot = v.pointer(at).unwrap_or_else(|| panic!("{at} in {v}"));
            assert_eq!(slot[META_KEY], kept, "{}", String::from_utf8_lossy(&out));
            assert_eq!(slot.get("value").cloned(), value, "{v}");
        }
        for line in [r#"{"id":1,"result":"text"}"#, r#"{"id":1,"error":"boom"}"#] {
            let head = child_head(line.as_bytes()).unwrap();
            assert!(
                splice_evidence(&Bytes::from(line), &head, &kept).is_none(),
                "{line}"
            );
        }
    }

    #[test]
    fn a_skeleton_gives_the_heads_ranges_in_the_line() {
        let big = "x".repeat(1000);
        for line in [
            format!(
                r#"{{"id":1,"result":{{"content":[{{"text":"{big}"}},{{"text":"{big}"}}],"_meta":{{"a":"{big}"}}}}}}"#
            ),
            format!(
                r#"{{"id":1,"result":{{"_meta":{{"k":[{{"a":"{big}"}}]}},"content":[{{"text":"{big}"}}]}},"jsonrpc":"2.0"}}"#
            ),
        ] {
            let b = line.as_bytes();
            let cuts: Vec<Range<usize>> = b
                .windows(big.len())
                .enumerate()
                .filter(|(i, w)| *w == big.as_bytes() && b[i - 1] == b'"')
                .map(|(i, _)| i..i + big.len())
                .collect();
            assert!(cuts.len() >= 2);
            let whole = child_head(b).unwrap();
            let cut = child_head_cut(b, &cuts).unwrap();
            assert_eq!((whole.result, whole.error), (cut.result, cut.error));
            assert_eq!((whole.id, whole.kind), (cut.id, cut.kind));
        }
    }

    #[test]
    fn params_that_do_not_fit_are_invalid_params_and_a_non_request_invalid() {
        let a = client_head(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5,"arguments":{}}}"#,
        )
        .unwrap_err();
        assert_eq!((&a["id"], &a["error"]["code"]), (&json!(1), &json!(-32602)));
        assert_eq!(
            a["error"]["message"],
            "Invalid params for `tools/call`: name: invalid type: integer `5`, expected a string"
        );
        let dup = client_head(
            br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
        )
        .unwrap_err();
        assert_eq!(dup["error"]["code"], -32602, "{dup}");
        // another method's params, or a notification's, are the server's to judge
        for line in [
            r#"{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":{"name":5}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"name":5}}"#,
        ] {
            assert!(client_head(line.as_bytes()).is_ok(), "{line}");
        }
        // no method, no result: not a request at all
        let a = client_head(br#"{"jsonrpc":"2.0","id":4,"params":{"name":5}}"#).unwrap_err();
        assert_eq!(a["error"]["code"], -32600, "{a}");
    }

    #[test]
    fn heads_are_read_without_the_payload() {
        let h = child_head(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}"#).unwrap();
        assert_eq!(h.kind, Kind::Notification);
        assert_eq!(h.progress_token.as_deref(), Some("\"t\""));
        let h = child_head(
            br#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{}}"#,
        )
        .unwrap();
        assert_eq!(h.kind, Kind::Request);
        let h =
            child_head(br#"{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"x"}}"#).unwrap();
        assert!(h.rpc_error && h.kind == Kind::Response && h.id.as_deref() == Some("3"));
        // a server's answer to a line it could not parse: a response too
        let h = child_head(
            br#"{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}"#,
        )
        .unwrap();
        assert!(h.rpc_error && h.kind == Kind::Response && h.id.is_none());
        assert!(child_head(br#"{"jsonrpc":"2.0","id":null}"#).is_err());
        assert!(child_head(b"hello world").is_err());
        assert!(child_head(b"[1,2]").is_err());
        let c = client_head(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"stat","arguments":{},"_meta":{"progressToken":5}}}"#).unwrap();
        assert_eq!(
            (c.kind, c.tool.as_deref(), c.progress_token.as_deref()),
            (Kind::Request, Some("stat"), Some("5"))
        );
        let c = client_head(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#,
        )
        .unwrap();
        assert_eq!(c.cancelled.as_deref(), Some("7"));
        assert_eq!(client_head(b"nope").unwrap_err()["error"]["code"], -32700);
        assert_eq!(
            client_head(b"{\"id\":1}").unwrap_err()["error"]["code"],
            -32600
        );
        assert_eq!(
            client_head(b"{\"a\":\"\xff\"}").unwrap_err()["error"]["code"],
            -32700
        );
        let nul = client_head(b"{\"a\":\"\0\"}").unwrap_err();
        assert_eq!(nul["error"]["code"], -32700);
    }
}
