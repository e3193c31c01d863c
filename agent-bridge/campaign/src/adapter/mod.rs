//! Target adapters: the campaign's steps on another MCP server's tools.
//!
//! An adapter is a TOML file (docs/ADAPTERS.md) that maps each step of the
//! campaign's vocabulary onto one of the target's tools, with argument
//! templates, and says where each value the judge needs is found in the
//! target's result. It never hides what the target does to bytes: what
//! comes back is judged as our own bridge's results are.
//!
//! Data flows one way: a step is [`Adapter::prepare`]d (the call to send,
//! or why the target cannot express it), sent, and its result is
//! [`Adapter::read`] into the shape of an agent-bridge result, which
//! [`super::verdict::judge`] checks as usual.
//!
//! The file's TOML schema is in `schema.rs`, the argument templates and
//! their filters in `template.rs`, the readers of results (and a step's
//! kernel evidence among its calls) in `reader.rs`; this file parses an
//! adapter and prepares and reads its calls.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::spec::{Expect, Step};
use contract::bytes::{Payload, base64_decode, base64_encode, sha256_hex};

mod reader;
mod schema;
mod template;

use reader::*;
pub use reader::{call_kernel, step_kernel};
pub use schema::STEPS;
use schema::*;
pub use template::shell_quote;
use template::*;

/// One tool call of a mapping.
#[derive(Debug)]
struct Call {
    tool: String,
    arguments: Map<String, Value>,
    until: Option<Regex>,
    result: BTreeMap<String, Readers>,
}

#[derive(Debug)]
struct Mapping {
    /// The first call, then the follow-ups.
    calls: Vec<Call>,
    /// Step arguments the templates use (directly or through `content`).
    used: BTreeSet<String>,
    ignore: BTreeSet<String>,
    accept: BTreeMap<String, Vec<Value>>,
}

impl Mapping {
    fn reads(&self, field: &str) -> bool {
        self.calls.iter().any(|c| c.result.contains_key(field))
    }
}

/// A loaded, checked adapter.
#[derive(Debug)]
pub struct Adapter {
    pub name: String,
    pub description: String,
    pub server: String,
    pub limits: Vec<String>,
    pub file: PathBuf,
    /// sha256 of the file, stored with a run.
    pub digest: String,
    steps: BTreeMap<String, Mapping>,
}

/// A tool and its arguments, ready to send.
pub type ToolCall = (String, Map<String, Value>);

/// A step the target cannot express, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Unsupported(pub String);

/// A step as the target will receive it.
#[derive(Debug)]
pub struct Prepared {
    pub tool: String,
    pub arguments: Map<String, Value>,
    /// The step to judge: expectations the target cannot report are left out…
    pub judged: Step,
    /// …and named here.
    pub unchecked: Vec<String>,
}

/// What the judge reads for one expectation, for the steps where it differs.
fn needs(step: &str, expect: &Expect) -> Vec<(&'static str, &'static str)> {
    // the steps whose result is bytes: their size and digest are the bytes'
    let read_file = matches!(
        step,
        "read_file" | "browser_screenshot" | "browser_pdf" | "browser_download"
    );
    let mut out = Vec::new();
    let mut need = |set: bool, what: &'static str, field: &'static str| {
        if set {
            out.push((what, field));
        }
    };
    need(expect.exit_code.is_some(), "exit_code", "exit_code");
    need(expect.signal.is_some(), "signal", "signal");
    for (set, what) in [
        (expect.stdout_equals.is_some(), "stdout_equals"),
        (expect.stdout_contains.is_some(), "stdout_contains"),
        (expect.stdout_base64.is_some(), "stdout_base64"),
        (expect.stdout_sha256.is_some(), "stdout_sha256"),
    ] {
        need(set, what, "stdout");
    }
    need(
        expect.stderr_contains.is_some(),
        "stderr_contains",
        "stderr",
    );
    let file = if read_file { "bytes" } else { "sha256" };
    need(expect.sha256.is_some(), "sha256", file);
    let size = if read_file { "bytes" } else { "size" };
    need(expect.size.is_some(), "size", size);
    need(expect.exists == Some(false), "exists", "errno");
    need(
        expect.sha256_from_step.is_some(),
        "sha256_from_step",
        "bytes",
    );
    need(expect.png.is_some(), "png", "bytes");
    need(expect.jpeg.is_some(), "jpeg", "bytes");
    need(expect.text_contains.is_some(), "text_contains", "page_text");
    need(expect.text_lacks.is_some(), "text_lacks", "page_text");
    need(expect.title.is_some(), "title", "title");
    need(expect.value_json.is_some(), "value_json", "value");
    need(expect.pdf_pages.is_some(), "pdf_pages", "bytes");
    out
}

/// Clears one expectation (named as in the test format).
fn clear(expect: &mut Expect, what: &str) {
    match what {
        "exit_code" => expect.exit_code = None,
        "signal" => expect.signal = None,
        "stdout_equals" => expect.stdout_equals = None,
        "stdout_contains" => expect.stdout_contains = None,
        "stdout_base64" => expect.stdout_base64 = None,
        "stdout_sha256" => expect.stdout_sha256 = None,
        "stderr_contains" => expect.stderr_contains = None,
        "sha256" => expect.sha256 = None,
        "size" => expect.size = None,
        "exists" => expect.exists = None,
        "sha256_from_step" => expect.sha256_from_step = None,
        "png" => expect.png = None,
        "jpeg" => expect.jpeg = None,
        "pdf_pages" => expect.pdf_pages = None,
        "text_contains" => expect.text_contains = None,
        "text_lacks" => expect.text_lacks = None,
        "title" => expect.title = None,
        "value_json" => expect.value_json = None,
        _ => {}
    }
}

/// Why an adapter file cannot be used; every error names the file.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("{}: cannot read: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The field at fault and what is wrong with it.
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

impl Adapter {
    /// Loads and checks an adapter; every error names the file and field.
    pub fn load(path: &Path) -> Result<Adapter, AdapterError> {
        let text = std::fs::read_to_string(path).map_err(|error| AdapterError::Read {
            path: path.to_owned(),
            error,
        })?;
        Adapter::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Adapter, AdapterError> {
        Adapter::parse_text(path, text).map_err(|reason| AdapterError::Invalid {
            path: path.to_owned(),
            reason,
        })
    }

    fn parse_text(path: &Path, text: &str) -> Result<Adapter, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut steps = BTreeMap::new();
        for (name, s) in file.steps {
            let at = format!("steps.{name}");
            let Some((_, known)) = STEPS.iter().find(|(n, _)| *n == name) else {
                let all: Vec<&str> = STEPS.iter().map(|(n, _)| *n).collect();
                return Err(format!(
                    "{at}: unknown step `{name}` (the campaign's steps: {})",
                    all.join(", ")
                ));
            };
            let mut calls = Vec::new();
            let mut used = BTreeSet::new();
            // what a template may name: the step's arguments, then the fields read so far
            let mut names: BTreeSet<String> = known.iter().map(|k| k.to_string()).collect();
            let first = FollowFile {
                tool: s.tool,
                arguments: s.arguments,
                until: None,
                result: s.result,
            };
            for (i, c) in std::iter::once(first).chain(s.then).enumerate() {
                let at = if i == 0 {
                    at.clone()
                } else {
                    format!("{at}.then[{}]", i - 1)
                };
                calls.push(Call::parse(&at, &name, c, &names, &mut used)?);
                names.extend(calls[i].result.keys().cloned());
            }
            for v in &s.ignore {
                if !known.contains(&v.as_str()) {
                    return Err(format!(
                        "{at}.ignore: `{v}` is not an argument of `{name}` (its arguments: {})",
                        known.join(", ")
                    ));
                }
            }
            if used.contains("content") {
                used.extend(["text".to_string(), "content_base64".to_string()]);
            }
            let mut accept = BTreeMap::new();
            for (arg, values) in s.accept {
                if !known.contains(&arg.as_str()) {
                    return Err(format!(
                        "{at}.accept: `{arg}` is not an argument of `{name}` (its arguments: {})",
                        known.join(", ")
                    ));
                }
                let values = serde_json::to_value(values)
                    .ok()
                    .and_then(|v| v.as_array().cloned())
                    .unwrap_or_default();
                used.insert(arg.clone());
                accept.insert(arg, values);
            }
            steps.insert(
                name,
                Mapping {
                    calls,
                    used,
                    ignore: s.ignore.into_iter().collect(),
                    accept,
                },
            );
        }
        if steps.is_empty() {
            return Err("steps: the adapter maps no step".into());
        }
        Ok(Adapter {
            name: file.name,
            description: file.description,
            server: file.server,
            limits: file.limits,
            file: path.to_path_buf(),
            digest: sha256_hex(text.as_bytes()),
            steps,
        })
    }

    /// (step, where in the file, tool, argument names) of every call of
    /// every mapping, for `adapter check`.
    pub fn mappings(&self) -> Vec<(&str, String, &str, Vec<&str>)> {
        let mut out = Vec::new();
        for (step, m) in &self.steps {
            for (i, c) in m.calls.iter().enumerate() {
                let at = if i == 0 {
                    format!("steps.{step}")
                } else {
                    format!("steps.{step}.then[{}]", i - 1)
                };
                out.push((
                    step.as_str(),
                    at,
                    c.tool.as_str(),
                    c.arguments.keys().map(String::as_str).collect(),
                ));
            }
        }
        out
    }

    /// Call `index` of `step` answered `result` without what its `until`
    /// waits for: make the same call again.
    pub fn again(&self, step: &str, index: usize, result: &Value) -> bool {
        let Some(call) = self.steps.get(step).and_then(|m| m.calls.get(index)) else {
            return false;
        };
        call.until.as_ref().is_some_and(|re| {
            result["isError"] != Value::Bool(true) && !re.is_match(&all_text(result))
        })
    }

    /// The next call for `step` after the calls that gave `results`
    /// (none after an error, or when the mapping has no more).
    pub fn follow_up(
        &self,
        step: &Step,
        results: &[Value],
    ) -> Option<Result<ToolCall, Unsupported>> {
        let m = self.steps.get(&step.tool)?;
        let call = m.calls.get(results.len())?;
        if results
            .last()
            .is_none_or(|r| r["isError"] == Value::Bool(true))
        {
            return None;
        }
        let mut vars = step_vars(step).ok()?;
        for (c, r) in m.calls.iter().zip(results) {
            for (field, reader) in &c.result {
                if let Ok(Some(v)) = reader.read(r) {
                    vars.insert(field.clone(), plain(field, v));
                }
            }
        }
        Some(
            match render_value(&Value::Object(call.arguments.clone()), &vars) {
                Ok(Some(Value::Object(o))) => Ok((call.tool.clone(), o)),
                Ok(_) => Ok((call.tool.clone(), Map::new())),
                Err(e) => Err(e),
            },
        )
    }

    /// The call to send for `step`, or why the target cannot express it.
    pub fn prepare(&self, step: &Step) -> Result<Prepared, Unsupported> {
        let Some(m) = self.steps.get(&step.tool) else {
            return Err(Unsupported(format!(
                "the adapter maps no `{}` step",
                step.tool
            )));
        };
        let tool = &m.calls[0].tool;
        for arg in step.arguments.keys() {
            if !m.used.contains(arg) && !m.ignore.contains(arg) {
                return Err(Unsupported(format!(
                    "`{tool}` has no way to take the step's `{arg}`"
                )));
            }
        }
        for (arg, allowed) in &m.accept {
            if let Some(v) = step.arguments.get(arg)
                && !allowed.contains(v)
            {
                return Err(Unsupported(format!(
                    "{} cannot express {arg} = {v} (it accepts {})",
                    self.name,
                    Value::Array(allowed.clone())
                )));
            }
        }
        let vars = step_vars(step)?;
        // the follow-ups too, with stand-ins for the values read on the way:
        // what the step's own arguments cannot express shows now
        let mut stand_in = vars.clone();
        for c in &m.calls {
            for field in c.result.keys() {
                stand_in.insert(field.clone(), TVal::Json(json!(0)));
            }
        }
        for c in &m.calls[1..] {
            render_value(&Value::Object(c.arguments.clone()), &stand_in)?;
        }
        let arguments = match render_value(&Value::Object(m.calls[0].arguments.clone()), &vars)? {
            Some(Value::Object(o)) => o,
            _ => Map::new(),
        };
        let mut judged = step.clone();
        let mut unchecked = Vec::new();
        let wanted = needs(&step.tool, &step.expect);
        for (what, field) in &wanted {
            if !m.reads(field) {
                clear(&mut judged.expect, what);
                unchecked.push(format!("{what} (the adapter reads no {field})"));
            }
        }
        // a write's point is the file, which a later read checks; any other
        // step whose every expectation is unreadable would check nothing
        let checks_nothing = !wanted.is_empty() && unchecked.len() == wanted.len();
        if checks_nothing && step.tool != "write_file" && !step.expect.is_error {
            return Err(Unsupported(format!(
                "nothing the step expects can be read from `{tool}`: {}",
                unchecked.join(", ")
            )));
        }
        Ok(Prepared {
            tool: tool.clone(),
            arguments,
            judged,
            unchecked,
        })
    }

    /// The target's result for `step`, in the shape of an agent-bridge
    /// result: what the adapter reads, plus the kernel evidence the proxy
    /// added (`_meta["probe/kernel"]`) or the bridge's own.
    pub fn read(&self, step: &str, results: &[Value]) -> Value {
        let mut s = Map::new();
        let mut is_error = results.iter().any(|r| r["isError"] == Value::Bool(true));
        let mut notes = Vec::new();
        let mut content = Vec::new();
        let calls = self.steps.get(step).map_or(&[][..], |m| &m.calls[..]);
        for (call, result) in calls.iter().zip(results) {
            for (field, reader) in &call.result {
                match reader.read(result) {
                    Ok(Some(v)) if field == "error" || field == "refused" => {
                        is_error = true;
                        let message = as_text_lossy(&v);
                        s.insert("error".into(), json!({ "message": message }));
                        if field == "refused" {
                            s.insert("refused".into(), Value::String(message));
                        }
                    }
                    Ok(Some(v)) => {
                        content.retain(|_| field != "bytes");
                        let v = shape(field, v, &mut content);
                        s.insert(field.clone(), v);
                    }
                    Ok(None) if field == "error" || field == "refused" => {}
                    // an error answer carries none of the values
                    Ok(None) if result["isError"] == Value::Bool(true) => {}
                    Ok(None) => notes.push(format!(
                        "adapter: {field} not found in the {} result ({})",
                        call.tool,
                        reader.describe()
                    )),
                    Err(e) => notes.push(format!("adapter: {field}: {e}")),
                }
            }
        }
        let result = results.last().unwrap_or(&Value::Null);
        if is_error && !s.contains_key("error") {
            s.insert("error".into(), json!({"message": all_text(result)}));
        }
        // bytes read back: their own length and digest, unless the target says
        if let Some(bytes) = s.get("bytes").cloned() {
            for (field, value) in [("size", &bytes["bytes"]), ("sha256", &bytes["sha256"])] {
                s.entry(field).or_insert_with(|| value.clone());
            }
        }
        // a call that answered an error is the last one: the step's failure
        let (failing, before) = match results.split_last() {
            Some((last, before)) if last["isError"] == Value::Bool(true) => {
                (call_kernel(last), before)
            }
            _ => (None, results),
        };
        let kernels: Vec<&Value> = before.iter().filter_map(call_kernel).collect();
        if let Some(k) = step_kernel(&kernels, failing) {
            s.insert("kernel".into(), k);
        }
        if !notes.is_empty() {
            s.insert("adapter_notes".into(), json!(notes));
        }
        json!({"content": content, "isError": is_error, "structuredContent": s})
    }
}

impl Call {
    fn parse(
        at: &str,
        step: &str,
        c: FollowFile,
        names: &BTreeSet<String>,
        used: &mut BTreeSet<String>,
    ) -> Result<Call, String> {
        if c.tool.trim().is_empty() {
            return Err(format!("{at}.tool: empty"));
        }
        let mut vars = BTreeSet::new();
        for (k, v) in &c.arguments {
            template_vars(v, &mut vars).map_err(|e| format!("{at}.arguments.{k}: {e}"))?;
        }
        for v in &vars {
            if !names.contains(v) {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                return Err(format!(
                    "{at}.arguments: `{{{{{v}}}}}` is not an argument of `{step}` nor a field read before (it may use: {})",
                    names.join(", ")
                ));
            }
        }
        used.extend(vars);
        let mut result = BTreeMap::new();
        for (field, r) in c.result {
            let at = format!("{at}.result.{field}");
            if !FIELDS.contains(&field.as_str()) {
                return Err(format!(
                    "{at}: unknown field (fields: {})",
                    FIELDS.join(", ")
                ));
            }
            let readers = match r {
                OneOrMany::One(r) => vec![Reader::parse(&at, r)?],
                OneOrMany::Many(all) => all
                    .into_iter()
                    .enumerate()
                    .map(|(i, r)| Reader::parse(&format!("{at}[{i}]"), r))
                    .collect::<Result<_, _>>()?,
            };
            result.insert(field, Readers(readers));
        }
        let arguments = serde_json::to_value(&c.arguments)
            .ok()
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default();
        let until = match c.until {
            None => None,
            Some(u) => {
                let re = Regex::new(&u.pattern).map_err(|e| format!("{at}.until.pattern: {e}"))?;
                if !re.is_match(&u.example) {
                    return Err(format!(
                        "{at}.until.pattern: {:?} never matches its example {:?}",
                        u.pattern, u.example
                    ));
                }
                Some(re)
            }
        };
        Ok(Call {
            tool: c.tool,
            arguments,
            until,
            result,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(text: &str) -> Result<Adapter, String> {
        Adapter::parse(Path::new("a.toml"), text).map_err(|e| e.to_string())
    }

    fn step(tool: &str, args: Value, expect: Value) -> Step {
        Step {
            tool: tool.into(),
            arguments: serde_json::from_value(args).unwrap(),
            expect: serde_json::from_value(expect).unwrap(),
        }
    }

    const SHELL: &str = r#"
name = "shell"
[steps.exec]
tool = "run"
arguments = { cmd = "{{command}}", wait = "{{timeout_ms|default:5000}}" }
result.stdout = { from = "text", pattern = '(?s)^out:\n(.*)$', example = "out:\nhi" }
result.exit_code = { from = "text", pattern = 'exit (\d+)', example = "exit 3" }
[steps.run_code]
tool = "run"
arguments = { cmd = "printf %s {{code|sh}} | {{language|interpreter}}" }
ignore = ["timeout_ms"]
[steps.write_file]
tool = "put"
arguments = { file = "{{path}}", body = "{{content|text}}", how = "{{append|map:true=append,*=rewrite}}" }
ignore = ["sha256"]
"#;

    #[test]
    fn every_bad_field_is_named_before_anything_runs() {
        let bad = |text: &str, want: &str| {
            let e = adapter(text).unwrap_err();
            assert!(e.contains(want), "{e}");
        };
        bad(
            "name='x'\n[steps.exek]\ntool='a'",
            "steps.exek: unknown step `exek`",
        );
        bad(
            "name='x'\n[steps.exec]\ntool='a'\narguments={c='{{command'}",
            "steps.exec.arguments.c: `{{` without `}}`",
        );
        bad(
            "name='x'\n[steps.exec]\ntool='a'\narguments={c='{{comand}}'}",
            "`{{comand}}` is not an argument of `exec`",
        );
        bad(
            "name='x'\n[steps.exec]\ntool='a'\narguments={c='{{command|upper}}'}",
            "unknown filter `upper`",
        );
        bad(
            "name='x'\n[steps.exec]\ntool='a'\nresult.exit_code={from='text', pattern='code (\\d+)', example='exit 3'}",
            "steps.exec.result.exit_code.pattern: \"code (\\\\d+)\" never matches its example",
        );
        bad(
            "name='x'\n[steps.exec]\ntool='a'\nresult.exit_code={from='text', pattern='('}",
            "steps.exec.result.exit_code.pattern",
        );
        bad(
            "name='x'\n[steps.exec]\ntool='a'\nresult.exit_code={from='text', pattern='x'}",
            "needs an example",
        );
        bad(
            "name='x'\n[steps.exec]\ntool='a'\nresult.exitcode={from='text'}",
            "steps.exec.result.exitcode: unknown field",
        );
        bad(
            "name='x'\n[steps.exec]\ntool='a'\nresult.stdout={from='structured'}",
            "needs a JSON pointer",
        );
        bad(
            "name='x'\n[steps.exec]\ntool='a'\nextra=1",
            "unknown field `extra`",
        );
    }

    #[test]
    fn templates_fill_quote_and_map_arguments() {
        let a = adapter(SHELL).unwrap();
        let p = a
            .prepare(&step(
                "exec",
                json!({"command": "echo hi", "timeout_ms": 100}),
                json!({"exit_code": 0}),
            ))
            .unwrap();
        assert_eq!(p.tool, "run");
        assert_eq!(
            p.arguments,
            *json!({"cmd": "echo hi", "wait": 100}).as_object().unwrap()
        );
        let p = a
            .prepare(&step("exec", json!({"command": "x"}), json!({})))
            .unwrap();
        assert_eq!(p.arguments["wait"], 5000);
        let p = a
            .prepare(&step(
                "run_code",
                json!({"language": "python", "code": "print('a')", "timeout_ms": 5}),
                json!({}),
            ))
            .unwrap();
        assert_eq!(
            p.arguments["cmd"],
            r#"printf %s 'print('\''a'\'')' | python3"#
        );
        let p = a
            .prepare(&step(
                "write_file",
                json!({"path": "/t/a", "content_base64": "aGk=", "sha256": "x", "append": true}),
                json!({}),
            ))
            .unwrap();
        assert_eq!(
            p.arguments,
            *json!({"file": "/t/a", "body": "hi", "how": "append"})
                .as_object()
                .unwrap()
        );
    }

    #[test]
    fn what_the_target_cannot_express_is_unsupported() {
        let a = adapter(SHELL).unwrap();
        let why = |s: Step| a.prepare(&s).unwrap_err().0;
        assert!(why(step("stat", json!({"path": "/"}), json!({}))).contains("maps no `stat`"));
        assert!(
            why(step("exec", json!({"command": "x", "cwd": "/"}), json!({})))
                .contains("no way to take the step's `cwd`")
        );
        assert!(
            why(step(
                "write_file",
                json!({"path": "/a", "content_base64": "/w=="}),
                json!({})
            ))
            .contains("not UTF-8")
        );
        // expectations the target cannot report are unchecked, not failed
        let p = a
            .prepare(&step(
                "exec",
                json!({"command": "x"}),
                json!({"exit_code": 0, "stderr_contains": "e"}),
            ))
            .unwrap();
        assert_eq!(
            p.unchecked,
            ["stderr_contains (the adapter reads no stderr)"]
        );
        assert_eq!(p.judged.expect.stderr_contains, None);
        assert_eq!(p.judged.expect.exit_code, Some(0));
        assert!(
            why(step(
                "exec",
                json!({"command": "x"}),
                json!({"stderr_contains": "e"})
            ))
            .contains("nothing the step expects")
        );
        let p = a
            .prepare(&step(
                "write_file",
                json!({"path": "/a", "text": "x"}),
                json!({"size": 1}),
            ))
            .unwrap();
        assert_eq!(p.unchecked, ["size (the adapter reads no size)"]);
    }

    #[test]
    fn results_are_read_into_the_bridges_shape() {
        let a = adapter(SHELL).unwrap();
        let r = a.read(
            "exec",
            &[
                json!({"content": [{"type": "text", "text": "out:\na\u{fffd}\nexit 3"}],
                    "_meta": {"probe/kernel": {"available": true, "failed": false}}}),
            ],
        );
        let s = &r["structuredContent"];
        assert_eq!(s["exit_code"], 3);
        assert_eq!(s["stdout"]["text"], "a\u{fffd}\nexit 3");
        assert_eq!(s["kernel"]["available"], true);
        assert_eq!(r["isError"], false);
        let r = a.read(
            "exec",
            &[json!({"content": [{"type": "text", "text": "boom"}], "isError": true})],
        );
        assert_eq!(r["structuredContent"]["error"]["message"], "boom");
        // a value missing from a real answer is said, not silently dropped
        let r = a.read(
            "exec",
            &[json!({"content": [{"type": "text", "text": "no header"}]})],
        );
        let notes = r["structuredContent"]["adapter_notes"].to_string();
        assert!(notes.contains("stdout not found in the run result"), "{r}");
    }

    /// browser_open as two calls, as chrome-devtools-mcp takes it.
    fn navigate_then_snapshot() -> Adapter {
        adapter(
            r#"name = "devtools"
[steps.browser_open]
tool = "navigate_page"
arguments = { url = "{{url}}" }
[[steps.browser_open.then]]
tool = "take_snapshot"
arguments = {}
"#,
        )
        .unwrap()
    }

    /// A call's answer with the proxy's evidence on it.
    fn answer(kernel: &Value, is_error: bool) -> Value {
        json!({"content": [{"type": "text", "text": "…"}], "isError": is_error,
            "_meta": {"probe/kernel": kernel}})
    }

    /// The navigation "succeeded", but the OOM killer took a tab in it.
    fn tab_died() -> Value {
        json!({"available": true, "failed": false, "primitive": "none", "label": "tools/call navigate_page",
            "explanation": "exited 0, but chromium (pid 7) was killed by the OOM killer",
            "hidden_failure": {"primitive": "mem.oom", "confidence": 0.9, "explanation": "chromium (pid 7) was killed by the OOM killer"}})
    }

    fn quiet() -> Value {
        json!({"available": true, "failed": false, "primitive": "none", "explanation": "exited 0; nothing failed"})
    }

    #[test]
    fn a_tab_the_oom_killer_took_is_why_a_later_call_of_the_step_failed() {
        let a = navigate_then_snapshot();
        let death = tab_died();
        let timeout = json!({"available": true, "failed": true, "primitive": "timeout", "label": "tools/call take_snapshot", "span": 9,
            "explanation": "the workload was still running after the time limit of 45.0s and was killed"});
        let calls = |first: &Value, second: &Value| [answer(first, false), answer(second, false)];
        let k = &a.read("browser_open", &calls(&death, &timeout))["structuredContent"]["kernel"];
        assert_eq!(k["primitive"], "mem.oom", "{k}");
        assert_eq!(k["failed"], true);
        assert_eq!(
            k["explanation"],
            "chromium (pid 7) was killed by the OOM killer; then tools/call take_snapshot: \
             the workload was still running after the time limit of 45.0s and was killed"
        );
        assert_eq!(k["followed_by"]["span"], 9);
        // the later call's whole evidence: how it ended, what died before it
        let mut killed = timeout.clone();
        killed["exit"] = json!({"code": null, "signal": "SIGKILL"});
        killed["outcome"] = json!("timeout");
        killed["before_call"] = json!({"primitive": "mem.oom", "explanation": "a tab"});
        let k = &a.read("browser_open", &calls(&death, &killed))["structuredContent"]["kernel"];
        assert_eq!(k["primitive"], "mem.oom", "{k}");
        assert_eq!(k["followed_by"]["exit"]["signal"], "SIGKILL", "{k}");
        assert_eq!(k["followed_by"]["outcome"], "timeout", "{k}");
        assert_eq!(
            k["followed_by"]["before_call"]["explanation"], "a tab",
            "{k}"
        );
        // a failure first, a death after it: the failure is the step's
        let k = &a.read("browser_open", &calls(&timeout, &death))["structuredContent"]["kernel"];
        assert_eq!(k["primitive"], "timeout", "{k}");
        // no failure: the death is kept over a first call with nothing
        let k = &a.read("browser_open", &calls(&quiet(), &death))["structuredContent"]["kernel"];
        assert_eq!(k["hidden_failure"]["primitive"], "mem.oom", "{k}");
    }

    #[test]
    fn a_follow_up_that_answered_an_error_gives_the_step_its_evidence() {
        let a = navigate_then_snapshot();
        // its span lost, but not what died before it: the error's evidence
        // is the step's, never the first call's
        let lost = json!({"available": false, "reason": "the probe daemon did not answer",
            "outcome": "error", "before_call": {"failed": true, "primitive": "mem.oom",
                "confidence": 0.97, "explanation": "chromium (pid 8) was killed by the OOM killer"}});
        let errored = |first: &Value| [answer(first, false), answer(&lost, true)];
        let k = &a.read("browser_open", &errored(&quiet()))["structuredContent"]["kernel"];
        assert_eq!(k["before_call"]["primitive"], "mem.oom", "{k}");
        assert_eq!(k["available"], false, "{k}");
        // after a death in the first call: the death, then the error's evidence
        let k = &a.read("browser_open", &errored(&tab_died()))["structuredContent"]["kernel"];
        assert_eq!(k["primitive"], "mem.oom", "{k}");
        assert_eq!(
            k["followed_by"]["before_call"]["explanation"],
            "chromium (pid 8) was killed by the OOM killer"
        );
        assert!(
            k["explanation"]
                .as_str()
                .unwrap()
                .ends_with("then the next call: the probe daemon did not answer"),
            "{k}"
        );
    }

    #[test]
    fn a_file_the_server_names_is_read_where_it_wrote_it() {
        let a = adapter(
            r#"name = "pdf"
[steps.browser_pdf]
tool = "save_pdf"
arguments = {}
result.bytes = [{ from = "image" }, { from = "text", pattern = 'saved to (\S+)', decode = "file", example = "saved to /tmp/x.pdf" }]
"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pdf = dir.path().join("page.pdf");
        std::fs::write(&pdf, b"%PDF-1.4 bytes").unwrap();
        let said =
            |path: &str| json!({"content": [{"type": "text", "text": format!("saved to {path}")}]});
        let r = a.read("browser_pdf", &[said(pdf.to_str().unwrap())]);
        let s = &r["structuredContent"];
        assert_eq!(s["size"], 14, "{r}");
        assert_eq!(s["sha256"], sha256_hex(b"%PDF-1.4 bytes"));
        assert_eq!(
            r["content"][0]["resource"]["blob"],
            base64_encode(b"%PDF-1.4 bytes")
        );
        // a file that is not there, or a relative name, is said
        let gone = dir.path().join("gone.pdf");
        let r = a.read("browser_pdf", &[said(gone.to_str().unwrap())]);
        let notes = r["structuredContent"]["adapter_notes"].to_string();
        assert!(notes.contains("which cannot be read"), "{r}");
        let r = a.read("browser_pdf", &[said("out/page.pdf")]);
        let notes = r["structuredContent"]["adapter_notes"].to_string();
        assert!(notes.contains("not an absolute path"), "{r}");
    }
}
