//! `campaign preflight`: before running, what a suite's tests need (the
//! programs their steps run, the paths they write, a browser, files that
//! must survive from one call to the next, the local upstream) read
//! against an environment snapshot: the tests at risk and why. After a
//! run, how the prediction held.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use probe::env::Snapshot;
use serde::Serialize;
use serde_json::Value;

use super::spec::TestSpec;

/// A test the snapshot says will likely fail, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Risk {
    pub test: String,
    pub domain: String,
    /// One sentence per need the environment does not meet.
    pub reasons: Vec<String>,
    /// The facet items behind the reasons (`commands/chromium`).
    pub items: Vec<String>,
}

/// How the prediction held against a run of the same suite.
#[derive(Debug, Clone, Serialize)]
pub struct Held {
    pub run: String,
    /// Predicted at risk, and failed.
    pub at_risk_failed: Vec<String>,
    /// Predicted at risk, and passed.
    pub at_risk_passed: Vec<String>,
    /// Failed without being predicted.
    pub failed_unpredicted: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Preflight {
    pub tests: usize,
    pub at_risk: Vec<Risk>,
    /// facet/key → tests at risk through it.
    pub by_item: BTreeMap<String, usize>,
    /// facet/key → tests that need it, where the snapshot did not measure
    /// it (a command it was not asked to look up; persistence, which only
    /// a campaign run measures): not predicted either way.
    pub unmeasured: BTreeMap<String, usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
}

fn item<'a>(s: &'a Snapshot, facet: &str, key: &str) -> Option<&'a Value> {
    s.facet(facet).and_then(|f| f.items.get(key))
}

/// The place of `writable` holding `path` (the longest path prefix).
fn place_of<'a>(s: &'a Snapshot, path: &str) -> Option<(&'a str, &'a Value)> {
    let places = &s.facet("writable")?.items;
    places
        .iter()
        .filter_map(|(k, v)| {
            let p = v.get("path")?.as_str()?;
            let holds =
                p == "/" || path == p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/'));
            holds.then_some((k.as_str(), v, p.len()))
        })
        .max_by_key(|(_, _, n)| *n)
        .map(|(k, v, _)| (k, v))
}

/// Paths a step writes: write_file's path, `> PATH` in a command, and the
/// output options of the programs the suite uses.
fn written(step: &super::spec::Step) -> Vec<String> {
    let mut out = vec![];
    if step.tool == "write_file"
        && let Some(p) = step.arguments.get("path").and_then(Value::as_str)
    {
        out.push(p.to_string());
    }
    if let Some(cmd) = step.arguments.get("command").and_then(Value::as_str) {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let target = match *w {
                ">" | ">>" | "-o" => words.get(i + 1).copied(),
                _ => w.strip_prefix('>').or_else(|| {
                    w.split_once('=')
                        .filter(|(k, _)| k.starts_with("--"))
                        .map(|(_, v)| v)
                }),
            };
            if let Some(t) = target.filter(|t| t.starts_with('/')) {
                out.push(t.trim_matches(['\'', '"', ';']).to_string());
            }
        }
    }
    out
}

/// Absolute paths a step mentions at all.
fn mentioned(step: &super::spec::Step) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for v in step.arguments.values() {
        if let Some(text) = v.as_str() {
            for w in text.split(|c: char| c.is_whitespace() || "'\"=;|&<>()".contains(c)) {
                if w.starts_with('/') && w.len() > 1 {
                    out.insert(w.to_string());
                }
            }
        }
    }
    out
}

/// Paths a step reads that an earlier step of the test wrote (a later
/// call needs what an earlier one left), with the persistence key of the
/// place that holds each (`tmp`, `workdir`…).
fn read_again(test: &TestSpec, env: &Snapshot) -> Vec<(String, String)> {
    let mut out = vec![];
    let mut earlier: BTreeSet<String> = BTreeSet::new();
    for step in &test.steps {
        let here = written(step);
        let again = mentioned(step)
            .into_iter()
            .find(|p| earlier.contains(p) && !here.contains(p));
        if let Some(p) = again
            && let Some((place, _)) = place_of(env, &p)
        {
            let key = if place == "cwd" { "workdir" } else { place };
            out.push((p, key.to_string()));
        }
        earlier.extend(here);
    }
    out
}

/// What `test` needs that `env` does not give.
pub fn risks_of(test: &TestSpec, env: &Snapshot) -> Option<Risk> {
    let mut r = Risk {
        test: test.id.clone(),
        domain: test.domain.clone(),
        reasons: vec![],
        items: vec![],
    };
    let mut note = |reason: String, facet_key: String| {
        if !r.items.contains(&facet_key) {
            r.reasons.push(reason);
            r.items.push(facet_key);
        }
    };
    for name in super::environment::commands_of(std::slice::from_ref(test)) {
        match item(env, "commands", &name).or_else(|| item(env, "browser", &name)) {
            Some(v) if v.get("path") == Some(&Value::Null) => note(
                format!("runs `{name}`, which is not installed"),
                format!("commands/{name}"),
            ),
            Some(v) => {
                let libs: Vec<&str> = v
                    .get("missing_libs")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if !libs.is_empty() {
                    note(
                        format!("runs `{name}`, which lacks {}", libs.join(", ")),
                        format!("commands/{name}"),
                    );
                }
            }
            None => {}
        }
    }
    if test.steps.iter().any(|s| s.tool.starts_with("browser_")) {
        let browsers = env.facet("browser").map(|f| &f.items);
        let any = browsers.is_some_and(|b| {
            b.values()
                .any(|v| v.get("path").is_some_and(|p| !p.is_null()))
        });
        if browsers.is_some() && !any {
            note(
                "drives a browser, and none is installed".into(),
                "browser/*".into(),
            );
        }
    }
    for step in &test.steps {
        for path in written(step) {
            if let Some((place, v)) = place_of(env, &path) {
                let can = v.get("writable").and_then(Value::as_str).unwrap_or("ok");
                if can != "ok" || v.get("read_only") == Some(&Value::Bool(true)) {
                    note(
                        format!("writes {path}, and {place} is not writable ({can})"),
                        format!("writable/{place}"),
                    );
                }
            }
        }
    }
    for (p, key) in read_again(test, env) {
        if item(env, "persistence", &key).and_then(Value::as_str) == Some("lost") {
            note(
                format!(
                    "reads {p} in a later call than the one that wrote it, and {key} does not keep files between calls"
                ),
                format!("persistence/{key}"),
            );
        }
    }
    let upstream = test.steps.iter().any(|s| {
        s.arguments
            .values()
            .any(|v| v.to_string().contains("{{upstream."))
    });
    if upstream
        && let Some(bind) = item(env, "network", "loopback_bind").and_then(Value::as_str)
        && bind != "ok"
    {
        note(
            format!("reaches the run's local upstream, and a loopback socket fails here ({bind})"),
            "network/loopback_bind".into(),
        );
    }
    (!r.reasons.is_empty()).then_some(r)
}

/// What `test` needs that `env` did not measure.
pub fn unmeasured_of(test: &TestSpec, env: &Snapshot) -> Vec<String> {
    let mut out = vec![];
    for name in super::environment::commands_of(std::slice::from_ref(test)) {
        if item(env, "commands", &name).is_none() && item(env, "browser", &name).is_none() {
            out.push(format!("commands/{name}"));
        }
    }
    for (_, key) in read_again(test, env) {
        if item(env, "persistence", &key).is_none() {
            out.push(format!("persistence/{key}"));
        }
    }
    out.dedup();
    out
}

pub fn preflight(tests: &[TestSpec], env: &Snapshot) -> Preflight {
    let at_risk: Vec<Risk> = tests.iter().filter_map(|t| risks_of(t, env)).collect();
    let mut by_item = BTreeMap::new();
    for r in &at_risk {
        for i in &r.items {
            *by_item.entry(i.clone()).or_insert(0) += 1;
        }
    }
    let mut unmeasured = BTreeMap::new();
    for t in tests {
        for i in unmeasured_of(t, env) {
            *unmeasured.entry(i).or_insert(0) += 1;
        }
    }
    Preflight {
        tests: tests.len(),
        at_risk,
        by_item,
        unmeasured,
        held: None,
    }
}

/// Sets how the prediction held, from a run's outcomes (test → failed).
pub fn held(p: &mut Preflight, run: &str, failed: &BTreeMap<String, bool>) {
    let risky: BTreeSet<&str> = p.at_risk.iter().map(|r| r.test.as_str()).collect();
    let mut h = Held {
        run: run.into(),
        at_risk_failed: vec![],
        at_risk_passed: vec![],
        failed_unpredicted: vec![],
    };
    for (test, &did_fail) in failed {
        match (risky.contains(test.as_str()), did_fail) {
            (true, true) => h.at_risk_failed.push(test.clone()),
            (true, false) => h.at_risk_passed.push(test.clone()),
            (false, true) => h.failed_unpredicted.push(test.clone()),
            (false, false) => {}
        }
    }
    p.held = Some(h);
}

pub fn text(p: &Preflight) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} of {} tests at risk in this environment",
        p.at_risk.len(),
        p.tests
    );
    if !p.by_item.is_empty() {
        let _ = writeln!(o, "\n{:>6}  BECAUSE OF", "TESTS");
        let mut items: Vec<_> = p.by_item.iter().collect();
        items.sort_by_key(|(k, n)| (std::cmp::Reverse(**n), (*k).clone()));
        for (k, n) in items {
            let _ = writeln!(o, "{n:>6}  {k}");
        }
        let _ = writeln!(o, "\nAT RISK");
        for r in p.at_risk.iter().take(30) {
            let _ = writeln!(o, "  {:<18} {}", r.test, r.reasons.join("; "));
        }
        if p.at_risk.len() > 30 {
            let _ = writeln!(o, "  … and {} more (--json for all)", p.at_risk.len() - 30);
        }
    }
    if !p.unmeasured.is_empty() {
        let _ = writeln!(
            o,
            "\nNOT MEASURED by this snapshot (neither predicted to pass nor to fail):"
        );
        for (k, n) in &p.unmeasured {
            let _ = writeln!(o, "{n:>6}  {k}");
        }
        let _ = writeln!(
            o,
            "  (a snapshot from `campaign report --json` of a run has them; `probe env --command NAME` looks a command up)"
        );
    }
    if let Some(h) = &p.held {
        let _ = writeln!(
            o,
            "\nHOW IT HELD against run {}: {} at risk and failed, {} at risk but passed, {} failed unpredicted",
            h.run,
            h.at_risk_failed.len(),
            h.at_risk_passed.len(),
            h.failed_unpredicted.len()
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn test(id: &str, steps: Value) -> TestSpec {
        serde_json::from_value(json!({"id": id, "domain": "files", "title": id, "steps": steps}))
            .unwrap()
    }

    fn env() -> Snapshot {
        Snapshot::from_value(json!({
            "format": "probe-env", "version": 1, "probe_version": "t", "taken_at_ms": 0,
            "took_ms": 0, "source": "t",
            "facets": {
                "commands": {"how": "h", "items": {
                    "gcc": {"path": null}, "python3": {"path": "/usr/bin/python3", "missing_libs": []}}},
                "writable": {"how": "h", "items": {
                    "tmp": {"path": "/tmp", "writable": "ok"},
                    "cwd": {"path": "/work", "writable": "EROFS", "read_only": true}}},
                "persistence": {"how": "h", "items": {"tmp": "lost", "workdir": "kept"}},
            }
        }))
        .unwrap()
    }

    #[test]
    fn each_unmet_need_is_a_reason() {
        let e = env();
        let compile = test(
            "c-1",
            json!([{"tool": "exec", "arguments": {"command": "gcc -o /tmp/a /tmp/a.c"}}]),
        );
        let r = risks_of(&compile, &e).unwrap();
        assert_eq!(r.items, ["commands/gcc"]);
        let ro = test(
            "w-1",
            json!([{"tool": "write_file", "arguments": {"path": "/work/out.txt", "text": "x"}}]),
        );
        assert_eq!(risks_of(&ro, &e).unwrap().items, ["writable/cwd"]);
        let later = test(
            "p-1",
            json!([
                {"tool": "exec", "arguments": {"command": "echo 1 > /tmp/t/token.txt"}},
                {"tool": "exec", "arguments": {"command": "cat /tmp/t/token.txt"}}
            ]),
        );
        assert_eq!(risks_of(&later, &e).unwrap().items, ["persistence/tmp"]);
        let fine = test(
            "ok-1",
            json!([{"tool": "exec", "arguments": {"command": "python3 -c 1 > /tmp/x"}}]),
        );
        assert!(risks_of(&fine, &e).is_none());
        let unknown = test(
            "u-1",
            json!([{"tool": "exec", "arguments": {"command": "terraform plan"}}]),
        );
        assert!(risks_of(&unknown, &e).is_none());
        assert_eq!(unmeasured_of(&unknown, &e), ["commands/terraform"]);
        let mut p = preflight(&[compile, ro, later, fine], &e);
        assert_eq!(p.at_risk.len(), 3);
        // `cat` of the persistence test was never looked up in this snapshot
        assert_eq!(
            p.unmeasured,
            BTreeMap::from([("commands/cat".to_string(), 1)])
        );
        let outcomes: BTreeMap<String, bool> =
            [("c-1", true), ("w-1", false), ("p-1", true), ("ok-1", true)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
        held(&mut p, "r", &outcomes);
        let h = p.held.unwrap();
        assert_eq!(h.at_risk_failed, ["c-1", "p-1"]);
        assert_eq!(h.at_risk_passed, ["w-1"]);
        assert_eq!(h.failed_unpredicted, ["ok-1"]);
    }
}
