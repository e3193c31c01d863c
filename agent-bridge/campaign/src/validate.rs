//! `campaign validate DIR`: loads test files and explains every problem
//! with its file, field and reason. A bad file is reported and skipped; the
//! others load.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::spec::{DOMAINS, Step, TestSpec};
use contract::tools;

#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub file: PathBuf,
    /// e.g. `steps[2].arguments.timeout_ms`; empty for the whole file.
    pub field: String,
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let field = if self.field.is_empty() {
            "(file)"
        } else {
            &self.field
        };
        write!(f, "{}: {field}: {}", self.file.display(), self.reason)
    }
}

/// The tests that loaded, and the problems of those that did not.
#[derive(Debug, Default)]
pub struct Suite {
    pub tests: Vec<TestSpec>,
    pub problems: Vec<Problem>,
    /// Files read in all.
    pub files: usize,
    /// Hosts off this machine that valid tests name (see [`super::egress`]):
    /// `validate` reports them, `run` refuses them without `--allow-egress`.
    pub egress: Vec<(PathBuf, super::egress::Named)>,
}

impl Suite {
    /// The egress findings whose host is not in `allowed`, as problems.
    pub fn egress_problems(&self, allowed: &[String]) -> Vec<Problem> {
        self.egress
            .iter()
            .filter(|(_, n)| !allowed.iter().any(|a| a.eq_ignore_ascii_case(&n.host)))
            .map(|(file, n)| {
                let why = format!(
                    "names {}, which is outside this machine (no packet may leave it: use the upstream's {{{{upstream.…}}}} placeholders, or run with --allow-egress {})",
                    n.host, n.host
                );
                problem(file, &n.field, why)
            })
            .collect()
    }
}

/// Loads every `*.json` file of `dir` (sorted by name).
pub fn load_dir(dir: &Path) -> std::io::Result<Suite> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    let mut suite = Suite::default();
    let mut ids: HashMap<String, PathBuf> = HashMap::new();
    for path in paths {
        suite.files += 1;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                suite
                    .problems
                    .push(problem(&path, "", format!("cannot read: {e}")));
                continue;
            }
        };
        match load(&path, &bytes) {
            Ok(spec) => {
                if let Some(first) = ids.get(&spec.id) {
                    let why = format!("id `{}` is already used by {}", spec.id, first.display());
                    suite.problems.push(problem(&path, "id", why));
                    continue;
                }
                ids.insert(spec.id.clone(), path.clone());
                for n in super::egress::named_hosts(&spec, &[]) {
                    suite.egress.push((path.clone(), n));
                }
                suite.tests.push(spec);
            }
            Err(mut p) => suite.problems.append(&mut p),
        }
    }
    Ok(suite)
}

fn problem(file: &Path, field: &str, reason: impl Into<String>) -> Problem {
    Problem {
        file: file.into(),
        field: field.into(),
        reason: reason.into(),
    }
}

/// Parses and checks one file.
pub fn load(path: &Path, bytes: &[u8]) -> Result<TestSpec, Vec<Problem>> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        vec![problem(
            path,
            "",
            format!("not UTF-8 (invalid byte at offset {})", e.valid_up_to()),
        )]
    })?;
    let de = &mut serde_json::Deserializer::from_str(text);
    let spec: TestSpec = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let field = if field == "." { String::new() } else { field };
        vec![problem(path, &field, e.into_inner().to_string())]
    })?;
    let problems = check(path, &spec);
    if problems.is_empty() {
        Ok(spec)
    } else {
        Err(problems)
    }
}

/// Checks what the types cannot: names, known tools, the tools' own
/// argument rules, and expectations that fit the tool.
pub fn check(path: &Path, spec: &TestSpec) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut bad = |field: &str, reason: String| out.push(problem(path, field, reason));
    if spec.id.is_empty()
        || !spec
            .id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        bad(
            "id",
            format!("`{}`: use letters, digits, `-`, `_` and `.`", spec.id),
        );
    } else if path.file_stem().is_some_and(|s| s != spec.id.as_str()) {
        bad("id", format!("`{}` does not match the file name", spec.id));
    }
    if !DOMAINS.contains(&spec.domain.as_str()) {
        bad(
            "domain",
            format!("`{}` is not one of {}", spec.domain, DOMAINS.join(", ")),
        );
    }
    if spec.steps.is_empty() {
        bad("steps", "a test needs at least one step".into());
    }
    for (i, step) in spec.steps.iter().enumerate() {
        for (field, reason) in check_step(step) {
            let field = if field.is_empty() {
                format!("steps[{i}]")
            } else {
                format!("steps[{i}].{field}")
            };
            bad(&field, reason);
        }
    }
    out
}

/// (field within the step, reason) for each problem of one step.
fn check_step(step: &Step) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, v) in &step.arguments {
        let text = v.to_string();
        for p in super::upstream::unknown_placeholders(&text) {
            let known: Vec<&str> = super::upstream::PLACEHOLDERS
                .iter()
                .map(|(p, _)| *p)
                .collect();
            out.push((
                format!("arguments.{name}"),
                format!("unknown placeholder {p} (known: {})", known.join(", ")),
            ));
        }
    }
    if step.tool.starts_with("browser_") {
        out.extend(browser_arguments(step));
        return out;
    }
    let known: Vec<String> = tools::all().iter().map(|t| t.name.to_string()).collect();
    if !known.contains(&step.tool) {
        out.push((
            "tool".into(),
            format!(
                "`{}` is not a bridge tool ({})",
                step.tool,
                known.join(", ")
            ),
        ));
        return out;
    }
    let args = Some(
        step.arguments
            .clone()
            .into_iter()
            .collect::<serde_json::Map<String, Value>>(),
    );
    if let Err(e) = arguments_parse(&step.tool, args) {
        let field = if e.argument.is_empty() {
            "arguments".to_string()
        } else {
            format!("arguments.{}", e.argument)
        };
        out.push((field, e.message));
    }
    let e = &step.expect;
    let runs = matches!(step.tool.as_str(), "exec" | "run_code");
    for (name, given) in [
        ("exit_code", e.exit_code.is_some()),
        ("signal", e.signal.is_some()),
        ("stdout_equals", e.stdout_equals.is_some()),
        ("stdout_contains", e.stdout_contains.is_some()),
        ("stderr_contains", e.stderr_contains.is_some()),
        ("stdout_sha256", e.stdout_sha256.is_some()),
        ("stdout_base64", e.stdout_base64.is_some()),
    ] {
        if given && !runs {
            out.push((
                format!("expect.{name}"),
                format!("only exec and run_code have it, not {}", step.tool),
            ));
        }
    }
    if e.exists.is_some() && !matches!(step.tool.as_str(), "stat" | "read_file" | "list_dir") {
        out.push((
            "expect.exists".into(),
            format!(
                "only stat, read_file and list_dir have it, not {}",
                step.tool
            ),
        ));
    }
    if let Some(b) = &e.stdout_base64
        && let Err(why) = contract::bytes::base64_decode(b)
    {
        out.push(("expect.stdout_base64".into(), why));
    }
    for (name, hex) in [("sha256", &e.sha256), ("stdout_sha256", &e.stdout_sha256)] {
        if let Some(h) = hex
            && (h.len() != 64 || !h.chars().all(|c| c.is_ascii_hexdigit()))
        {
            out.push((
                format!("expect.{name}"),
                format!("`{h}` is not 64 hex digits"),
            ));
        }
    }
    out
}

/// A browser step's arguments: the vocabulary's names, the ones it needs,
/// as text (an index as a number).
fn browser_arguments(step: &Step) -> Vec<(String, String)> {
    let Some((_, known)) = super::adapter::STEPS.iter().find(|(n, _)| *n == step.tool) else {
        let browser: Vec<&str> = super::adapter::STEPS
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| n.starts_with("browser_"))
            .collect();
        return vec![(
            "tool".into(),
            format!(
                "`{}` is not a browser step ({})",
                step.tool,
                browser.join(", ")
            ),
        )];
    };
    let mut out = Vec::new();
    for (name, v) in &step.arguments {
        let ok = match name.as_str() {
            "index" => v.is_u64(),
            "format" => matches!(v.as_str(), Some("png" | "jpeg")),
            _ => v.is_string(),
        };
        if !known.contains(&name.as_str()) {
            out.push((
                format!("arguments.{name}"),
                format!("not an argument of {} ({})", step.tool, known.join(", ")),
            ));
        } else if !ok {
            out.push((
                format!("arguments.{name}"),
                "expected text (`index`: a number; `format`: png or jpeg)".into(),
            ));
        }
    }
    let needed: &[&str] = match step.tool.as_str() {
        "browser_open" | "browser_new_tab" => &["url"],
        "browser_eval" => &["script"],
        "browser_click" | "browser_download" => &["selector"],
        "browser_fill" => &["selector", "text"],
        _ => &[],
    };
    for n in needed {
        if !step.arguments.contains_key(*n) {
            out.push((format!("arguments.{n}"), format!("{} needs it", step.tool)));
        }
    }
    out
}

/// The tool's own argument parsing, as the bridge will do it.
fn arguments_parse(
    tool: &str,
    args: Option<serde_json::Map<String, Value>>,
) -> Result<(), tools::ArgError> {
    fn p<T: serde::de::DeserializeOwned>(
        a: Option<serde_json::Map<String, Value>>,
    ) -> Result<(), tools::ArgError> {
        tools::parse::<T>(a).map(drop)
    }
    match tool {
        "exec" => p::<tools::ExecArgs>(args),
        "run_code" => p::<tools::RunCodeArgs>(args),
        "write_file" => p::<tools::WriteFileArgs>(args),
        "read_file" => p::<tools::ReadFileArgs>(args),
        "list_dir" => p::<tools::ListDirArgs>(args),
        "stat" => p::<tools::PathArg>(args),
        "start_process" => p::<tools::StartProcessArgs>(args),
        "poll_process" => p::<tools::PollProcessArgs>(args),
        "write_stdin" => p::<tools::WriteStdinArgs>(args),
        "kill_process" => p::<tools::KillProcessArgs>(args),
        "kernel_evidence" => p::<tools::KernelEvidenceArgs>(args),
        "record_result" => p::<tools::RecordResultArgs>(args),
        _ => p::<tools::NoArgs>(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(name: &str, text: &str) -> Vec<String> {
        match load(Path::new(name), text.as_bytes()) {
            Ok(_) => vec![],
            Err(p) => p
                .iter()
                .map(|p| format!("{}: {}", p.field, p.reason))
                .collect(),
        }
    }

    #[test]
    fn browser_steps_are_checked_against_the_vocabulary() {
        let bad = problems(
            "b.json",
            r#"{"id":"b","domain":"browser","title":"t","steps":[
                {"tool":"browser_open","arguments":{}},
                {"tool":"browser_fly","arguments":{}},
                {"tool":"browser_close_tab","arguments":{"index":"one"}},
                {"tool":"browser_eval","arguments":{"script":"() => 1","code":"x"}}]}"#,
        );
        let all = bad.join("\n");
        assert!(
            all.contains("arguments.url: browser_open needs it"),
            "{all}"
        );
        assert!(all.contains("`browser_fly` is not a browser step"), "{all}");
        assert!(
            all.contains("arguments.index: expected text (`index`: a number"),
            "{all}"
        );
        assert!(
            all.contains("arguments.code: not an argument of browser_eval (script)"),
            "{all}"
        );
        let good = problems(
            "g.json",
            r#"{"id":"g","domain":"browser","title":"t","steps":[
                {"tool":"browser_open","arguments":{"url":"{{upstream.http}}/page/1"},"expect":{"title":"page 1"}},
                {"tool":"browser_close_tab","arguments":{"index":1}}]}"#,
        );
        assert_eq!(good, Vec::<String>::new());
    }

    #[test]
    fn a_good_test_loads() {
        let t = r#"{"id":"files-1","domain":"files","title":"t","steps":[
            {"tool":"write_file","arguments":{"path":"/tmp/x","text":"hi"},"expect":{"size":2}},
            {"tool":"exec","arguments":{"argv":["cat","/tmp/x"]},"expect":{"exit_code":0,"stdout_equals":"hi"}}]}"#;
        assert_eq!(problems("files-1.json", t), Vec::<String>::new());
    }

    #[test]
    fn every_problem_names_its_field() {
        let cases = [
            (
                r#"{"id":"a","domain":"files","title":"t","steps":[{"tool":"exec","arguments":{"argv":["x"],"timeout_ms":"soon"}}]}"#,
                "steps[0].arguments.timeout_ms",
            ),
            (
                r#"{"id":"a","domain":"files","title":"t","steps":[{"tool":"exec","arguments":{"argv":["x"]},"expect":{"exit_code":"zero"}}]}"#,
                "steps[0].expect.exit_code",
            ),
            (
                r#"{"id":"a","domain":"cooking","title":"t","steps":[{"tool":"exec","arguments":{"argv":["x"]}}]}"#,
                "domain",
            ),
            (
                r#"{"id":"a","domain":"files","title":"t","steps":[{"tool":"teleport","arguments":{}}]}"#,
                "steps[0].tool",
            ),
            (
                r#"{"id":"a","domain":"files","title":"t","steps":[{"tool":"stat","arguments":{"path":"/x"},"expect":{"exit_code":0}}]}"#,
                "steps[0].expect.exit_code",
            ),
            (
                r#"{"id":"a","domain":"files","title":"t","steps":[{"tool":"read_file","arguments":{"path":"/x"},"expect":{"sha256":"abc"}}]}"#,
                "steps[0].expect.sha256",
            ),
            (
                r#"{"id":"a","domain":"files","title":"t","steps":[]}"#,
                "steps",
            ),
            (
                r#"{"id":"b","domain":"files","title":"t","steps":[{"tool":"exec","arguments":{"argv":["x"]}}]}"#,
                "id",
            ),
            (r#"{"id":"a","domain":"files","steps":[]}"#, ""),
            (
                r#"{"id":"a","domain":"files","title":"t","colour":1,"steps":[]}"#,
                "colour",
            ),
            ("not json", ""),
        ];
        for (text, field) in cases {
            let p = problems("a.json", text);
            assert!(!p.is_empty(), "{text} passed");
            assert!(
                p.iter().any(|p| p.starts_with(&format!("{field}: "))),
                "{text}: {p:?} lacks `{field}`"
            );
        }
    }

    #[test]
    fn a_directory_reports_bad_files_and_keeps_the_good() {
        let dir = tempfile::tempdir().unwrap();
        let good = r#"{"id":"ok-1","domain":"files","title":"t","steps":[{"tool":"exec","arguments":{"argv":["true"]}}]}"#;
        std::fs::write(dir.path().join("ok-1.json"), good).unwrap();
        std::fs::write(dir.path().join("broken.json"), b"{\xff").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"ignored").unwrap();
        let s = load_dir(dir.path()).unwrap();
        assert_eq!((s.files, s.tests.len(), s.problems.len()), (2, 1, 1));
        assert!(
            s.problems[0]
                .to_string()
                .contains("broken.json: (file): not UTF-8"),
            "{}",
            s.problems[0]
        );
    }
}
