//! Reports over the results DB: one run (tables, JSON, CSV, HTML) and two
//! runs side by side. Everything is computed by SQL from the stored rows,
//! so a report can be made at any time, also of a run still going.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use anyhow::Context as _;
use rusqlite::Connection;
use serde::Serialize;

use super::db::{self, RunRow};
use super::spec::DOMAINS;

#[derive(Debug, Serialize)]
pub struct RunInfo {
    pub id: String,
    pub label: String,
    pub target: String,
    pub suite: String,
    pub tests_total: i64,
    pub recorded: i64,
    pub complete: bool,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
}

/// One failed test, as listed in reports.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub test_id: String,
    pub domain: String,
    pub title: String,
    pub layer: String,
    pub primitive: String,
    pub confidence: f64,
    pub explanation: String,
    pub evidence: serde_json::Value,
}

/// A group of failures with the same layer and primitive.
#[derive(Debug, Serialize)]
pub struct Explanation {
    pub layer: String,
    pub primitive: String,
    pub tests: i64,
    pub example_test: String,
    pub example: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub run: RunInfo,
    /// domain → (passed, failed)
    pub domains: BTreeMap<String, (i64, i64)>,
    /// (layer, primitive) → failed tests
    pub layers: BTreeMap<String, BTreeMap<String, i64>>,
    /// domain → primitive → failed tests (the heat map)
    pub heat: BTreeMap<String, BTreeMap<String, i64>>,
    pub top: Vec<Explanation>,
    pub failures: Vec<Failure>,
    pub passed: i64,
    pub failed: i64,
    /// Wall time from the first to the last recorded test.
    pub wall_s: f64,
    pub test_time_s: f64,
}

/// The run to report: the one named, else the newest.
pub fn pick_run(conn: &Connection, run: Option<&str>) -> anyhow::Result<RunRow> {
    match run {
        Some(id) => db::run(conn, id)?.with_context(|| {
            let known: Vec<String> = db::runs(conn)
                .unwrap_or_default()
                .into_iter()
                .map(|r| r.id)
                .collect();
            format!("no run `{id}` (runs: {})", known.join(", "))
        }),
        None => db::runs(conn)?
            .into_iter()
            .next()
            .context("the database has no campaign runs yet"),
    }
}

pub fn report(conn: &Connection, run: &RunRow) -> anyhow::Result<Report> {
    let mut domains: BTreeMap<String, (i64, i64)> =
        DOMAINS.iter().map(|d| (d.to_string(), (0, 0))).collect();
    let mut stmt = conn.prepare(
        "SELECT domain, SUM(outcome = 'pass'), SUM(outcome = 'fail') FROM campaign_tests WHERE run = ?1 GROUP BY domain",
    )?;
    for row in stmt.query_map([&run.id], |r| {
        Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?))
    })? {
        let (d, p, f) = row?;
        domains.insert(d, (p, f));
    }
    let failures = failures(conn, &run.id)?;
    let mut layers: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    let mut heat: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for f in &failures {
        *layers
            .entry(f.layer.clone())
            .or_default()
            .entry(f.primitive.clone())
            .or_default() += 1;
        *heat
            .entry(f.domain.clone())
            .or_default()
            .entry(f.primitive.clone())
            .or_default() += 1;
    }
    let mut top: Vec<Explanation> = Vec::new();
    for (layer, prims) in &layers {
        for (primitive, n) in prims {
            let ex = failures
                .iter()
                .find(|f| &f.layer == layer && &f.primitive == primitive)
                .expect("counted from the list");
            top.push(Explanation {
                layer: layer.clone(),
                primitive: primitive.clone(),
                tests: *n,
                example_test: ex.test_id.clone(),
                example: ex.explanation.clone(),
            });
        }
    }
    top.sort_by(|a, b| b.tests.cmp(&a.tests).then(a.primitive.cmp(&b.primitive)));
    let (passed, failed) = domains
        .values()
        .fold((0, 0), |(p, f), (a, b)| (p + a, f + b));
    let (first, last, test_ms): (Option<i64>, Option<i64>, Option<f64>) = conn.query_row(
        "SELECT MIN(finished_ms - CAST(duration_ms AS INTEGER)), MAX(finished_ms), SUM(duration_ms) FROM campaign_tests WHERE run = ?1",
        [&run.id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    Ok(Report {
        run: RunInfo {
            id: run.id.clone(),
            label: run.label.clone(),
            target: run.target.clone(),
            suite: run.suite.clone(),
            tests_total: run.tests_total,
            recorded: passed + failed,
            complete: run.finished_ms.is_some(),
            started_ms: run.started_ms,
            finished_ms: run.finished_ms,
        },
        domains,
        layers,
        heat,
        top,
        failures,
        passed,
        failed,
        wall_s: match (first, last) {
            (Some(a), Some(b)) => (b - a) as f64 / 1000.0,
            _ => 0.0,
        },
        test_time_s: test_ms.unwrap_or(0.0) / 1000.0,
    })
}

fn failures(conn: &Connection, run: &str) -> anyhow::Result<Vec<Failure>> {
    let mut stmt = conn.prepare(
        "SELECT test_id, domain, title, layer, primitive, confidence, explanation, evidence
         FROM campaign_tests WHERE run = ?1 AND outcome = 'fail' ORDER BY test_id",
    )?;
    let rows = stmt.query_map([run], |r| {
        Ok(Failure {
            test_id: r.get(0)?,
            domain: r.get(1)?,
            title: r.get(2)?,
            layer: r
                .get::<_, Option<String>>(3)?
                .unwrap_or_else(|| "test".into()),
            primitive: r
                .get::<_, Option<String>>(4)?
                .unwrap_or_else(|| "none".into()),
            confidence: r.get::<_, Option<f64>>(5)?.unwrap_or(0.0),
            explanation: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
            evidence: r
                .get::<_, Option<String>>(7)?
                .and_then(|e| serde_json::from_str(&e).ok())
                .unwrap_or_default(),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn cut(s: &str, max: usize) -> String {
    let one_line = s.replace('\n', " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        format!("{}…", one_line.chars().take(max - 1).collect::<String>())
    }
}

/// The terminal report.
pub fn text(r: &Report) -> String {
    let mut o = String::new();
    let run = &r.run;
    let _ = writeln!(
        o,
        "run {} ({}) against {}\n{} of {} tests recorded{}: {} passed, {} failed; {:.0} s wall, {:.0} s of test time\n",
        run.id,
        run.label,
        run.target,
        run.recorded,
        run.tests_total,
        if run.complete {
            ", complete"
        } else {
            ", INCOMPLETE (resume it with --resume)"
        },
        r.passed,
        r.failed,
        r.wall_s,
        r.test_time_s
    );
    let _ = writeln!(
        o,
        "{:<12} {:>6} {:>6} {:>6}",
        "DOMAIN", "PASS", "FAIL", "PASS%"
    );
    for (d, (p, f)) in &r.domains {
        let pct = if p + f > 0 {
            100.0 * *p as f64 / (p + f) as f64
        } else {
            0.0
        };
        let _ = writeln!(o, "{d:<12} {p:>6} {f:>6} {pct:>5.0}%");
    }
    let _ = writeln!(o, "{:<12} {:>6} {:>6}\n", "total", r.passed, r.failed);
    if r.failed == 0 {
        let _ = writeln!(o, "no failures");
        return o;
    }
    let _ = writeln!(o, "{:<10} {:<20} {:>6}", "LAYER", "PRIMITIVE", "TESTS");
    for (layer, prims) in &r.layers {
        for (p, n) in prims {
            let _ = writeln!(o, "{layer:<10} {p:<20} {n:>6}");
        }
    }
    let _ = writeln!(o, "\nTOP FAILURE EXPLANATIONS (one example each)");
    for e in r.top.iter().take(10) {
        let _ = writeln!(
            o,
            "{:>5} × {}/{}  e.g. {}: {}",
            e.tests,
            e.layer,
            e.primitive,
            e.example_test,
            cut(&e.example, 110)
        );
    }
    o
}

/// CSV of the tests of a run (one row each), for spreadsheets and pandas.
pub fn csv(conn: &Connection, run: &str) -> anyhow::Result<String> {
    let mut out = String::from(
        "run,test_id,domain,outcome,layer,primitive,confidence,duration_ms,explanation\n",
    );
    let mut stmt = conn.prepare(
        "SELECT test_id, domain, outcome, layer, primitive, confidence, duration_ms, explanation
         FROM campaign_tests WHERE run = ?1 ORDER BY test_id",
    )?;
    let mut rows = stmt.query([run])?;
    while let Some(r) = rows.next()? {
        let cells: Vec<String> = vec![
            run.to_string(),
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get::<_, Option<String>>(3)?.unwrap_or_default(),
            r.get::<_, Option<String>>(4)?.unwrap_or_default(),
            r.get::<_, Option<f64>>(5)?
                .map_or(String::new(), |c| format!("{c:.2}")),
            format!("{:.1}", r.get::<_, f64>(6)?),
            r.get::<_, Option<String>>(7)?.unwrap_or_default(),
        ];
        let line: Vec<String> = cells.iter().map(|c| csv_cell(c)).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    Ok(out)
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Every test of a run with its steps, as JSON lines (for other tools).
pub fn jsonl(conn: &Connection, run: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut tests = conn.prepare(
        "SELECT test_id, domain, title, outcome, layer, primitive, confidence, explanation, evidence,
                duration_ms, runner, mcp_session
         FROM campaign_tests WHERE run = ?1 ORDER BY test_id",
    )?;
    let mut steps = conn.prepare(
        "SELECT step, tool, request, response_sha256, response_bytes, duration_ms, is_error, verdict,
                failures, span_id, kernel_failed, kernel_primitive
         FROM campaign_steps WHERE run = ?1 AND test_id = ?2 ORDER BY step",
    )?;
    let json =
        |s: Option<String>| s.and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
    let mut rows = tests.query([run])?;
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let step_rows: Vec<serde_json::Value> = steps
            .query_map([run, &id], |s| {
                Ok(serde_json::json!({
                    "step": s.get::<_, i64>(0)?, "tool": s.get::<_, String>(1)?,
                    "request": json(s.get(2)?), "response_sha256": s.get::<_, Option<String>>(3)?,
                    "response_bytes": s.get::<_, Option<i64>>(4)?, "duration_ms": s.get::<_, f64>(5)?,
                    "is_error": s.get::<_, Option<bool>>(6)?, "verdict": s.get::<_, String>(7)?,
                    "failures": json(s.get(8)?), "span_id": s.get::<_, Option<i64>>(9)?,
                    "kernel_failed": s.get::<_, Option<bool>>(10)?, "kernel_primitive": s.get::<_, Option<String>>(11)?,
                }))
            })?
            .collect::<Result<_, _>>()?;
        let line = serde_json::json!({
            "run": run, "test_id": id, "domain": r.get::<_, String>(1)?, "title": r.get::<_, String>(2)?,
            "outcome": r.get::<_, String>(3)?, "layer": r.get::<_, Option<String>>(4)?,
            "primitive": r.get::<_, Option<String>>(5)?, "confidence": r.get::<_, Option<f64>>(6)?,
            "explanation": r.get::<_, Option<String>>(7)?, "evidence": json(r.get(8)?),
            "duration_ms": r.get::<_, f64>(9)?, "runner": r.get::<_, String>(10)?,
            "mcp_session": r.get::<_, Option<String>>(11)?, "steps": step_rows,
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    Ok(out)
}

/// Two runs side by side.
#[derive(Debug, Serialize)]
pub struct Comparison {
    pub a: RunInfo,
    pub b: RunInfo,
    /// Tests that passed in A and failed in B (with B's triage).
    pub broke: Vec<Failure>,
    /// Tests that failed in A and passed in B (with A's triage).
    pub fixed: Vec<Failure>,
    /// Failed in both, on a different layer/primitive: (test, A's, B's).
    pub moved: Vec<(String, String, String)>,
    /// primitive → (failed tests in A, in B)
    pub primitives: BTreeMap<String, (i64, i64)>,
    pub appeared: Vec<String>,
    pub vanished: Vec<String>,
    /// Tests recorded in only one of the runs.
    pub only_in_a: usize,
    pub only_in_b: usize,
}

pub fn compare(conn: &Connection, a: &RunRow, b: &RunRow) -> anyhow::Result<Comparison> {
    let ra = report(conn, a)?;
    let rb = report(conn, b)?;
    let outcomes = |run: &str| -> anyhow::Result<BTreeMap<String, bool>> {
        let mut stmt =
            conn.prepare("SELECT test_id, outcome = 'pass' FROM campaign_tests WHERE run = ?1")?;
        let rows = stmt.query_map([run], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    };
    let (oa, ob) = (outcomes(&a.id)?, outcomes(&b.id)?);
    let fa: BTreeMap<&str, &Failure> = ra
        .failures
        .iter()
        .map(|f| (f.test_id.as_str(), f))
        .collect();
    let fb: BTreeMap<&str, &Failure> = rb
        .failures
        .iter()
        .map(|f| (f.test_id.as_str(), f))
        .collect();
    let count = |r: &Report| -> BTreeMap<String, i64> {
        r.layers
            .iter()
            .flat_map(|(l, p)| p.iter().map(move |(p, n)| (format!("{l}/{p}"), *n)))
            .collect()
    };
    let (pa, pb) = (count(&ra), count(&rb));
    let mut c = Comparison {
        a: ra.run,
        b: rb.run,
        broke: vec![],
        fixed: vec![],
        moved: vec![],
        primitives: BTreeMap::new(),
        appeared: vec![],
        vanished: vec![],
        only_in_a: oa.keys().filter(|k| !ob.contains_key(*k)).count(),
        only_in_b: ob.keys().filter(|k| !oa.contains_key(*k)).count(),
    };
    for (id, pass_a) in &oa {
        let Some(pass_b) = ob.get(id) else { continue };
        match (pass_a, pass_b) {
            (true, false) => c.broke.push(fb[id.as_str()].clone()),
            (false, true) => c.fixed.push(fa[id.as_str()].clone()),
            (false, false) => {
                let (x, y) = (fa[id.as_str()], fb[id.as_str()]);
                if (x.layer.as_str(), x.primitive.as_str())
                    != (y.layer.as_str(), y.primitive.as_str())
                {
                    c.moved.push((
                        id.clone(),
                        format!("{}/{}", x.layer, x.primitive),
                        format!("{}/{}", y.layer, y.primitive),
                    ));
                }
            }
            (true, true) => {}
        }
    }
    let keys: BTreeSet<&String> = pa.keys().chain(pb.keys()).collect();
    for k in keys {
        let (x, y) = (
            pa.get(k).copied().unwrap_or(0),
            pb.get(k).copied().unwrap_or(0),
        );
        if x == 0 {
            c.appeared.push(k.clone());
        }
        if y == 0 {
            c.vanished.push(k.clone());
        }
        c.primitives.insert(k.clone(), (x, y));
    }
    Ok(c)
}

pub fn compare_text(c: &Comparison) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "A: {} ({}), {} tests, against {}",
        c.a.id, c.a.label, c.a.recorded, c.a.target
    );
    let _ = writeln!(
        o,
        "B: {} ({}), {} tests, against {}\n",
        c.b.id, c.b.label, c.b.recorded, c.b.target
    );
    let _ = writeln!(
        o,
        "{:<32} {:>6} {:>6} {:>7}",
        "LAYER/PRIMITIVE", "A", "B", "B-A"
    );
    for (k, (x, y)) in &c.primitives {
        let mark = if c.appeared.contains(k) {
            "  appeared"
        } else if c.vanished.contains(k) {
            "  vanished"
        } else {
            ""
        };
        let _ = writeln!(o, "{k:<32} {x:>6} {y:>6} {:>+7}{mark}", y - x);
    }
    let _ = writeln!(
        o,
        "\n{} broke (pass → fail), {} fixed (fail → pass), {} failed in both on another primitive",
        c.broke.len(),
        c.fixed.len(),
        c.moved.len()
    );
    if c.only_in_a + c.only_in_b > 0 {
        let _ = writeln!(
            o,
            "{} tests only in A, {} only in B",
            c.only_in_a, c.only_in_b
        );
    }
    for (title, list) in [("BROKE IN B", &c.broke), ("FIXED IN B", &c.fixed)] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(o, "\n{title}");
        for f in list.iter().take(15) {
            let _ = writeln!(
                o,
                "  {:<16} {}/{}  {}",
                f.test_id,
                f.layer,
                f.primitive,
                cut(&f.explanation, 90)
            );
        }
        if list.len() > 15 {
            let _ = writeln!(o, "  … and {} more (--json for all)", list.len() - 15);
        }
    }
    for (id, x, y) in c.moved.iter().take(15) {
        let _ = writeln!(o, "  moved {id:<16} {x} → {y}");
    }
    o
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One self-contained HTML file: heat map, per-domain bars, a searchable
/// failure list with evidence. No external assets.
pub fn html(r: &Report) -> String {
    let mut prims: BTreeSet<&String> = BTreeSet::new();
    for m in r.heat.values() {
        prims.extend(m.keys());
    }
    let max = r
        .heat
        .values()
        .flat_map(|m| m.values())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    let mut h = String::new();
    let run = &r.run;
    let _ = write!(
        h,
        r#"<!doctype html><html><head><meta charset="utf-8"><title>campaign {id}</title><style>
body{{font:14px system-ui,sans-serif;margin:2em;color:#222}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} th{{background:#f3f3f3}} td.l,th.l{{text-align:left}}
.bar{{display:flex;height:16px;width:400px;background:#eee}} .p{{background:#4caf50}} .f{{background:#e53935}}
pre{{white-space:pre-wrap;background:#f8f8f8;padding:6px;margin:0;font-size:12px}} details{{margin:2px 0}}
#q{{width:400px;padding:4px}} .muted{{color:#777}}
</style></head><body>
<h1>Campaign run <code>{id}</code></h1>
<p>{label} · target <code>{target}</code> · suite <code>{suite}</code><br>
<b>{rec}</b> of {total} tests recorded{complete} · <b style="color:#2e7d32">{pass} passed</b> · <b style="color:#c62828">{fail} failed</b> · {wall:.0} s wall</p>
"#,
        id = esc(&run.id),
        label = esc(&run.label),
        target = esc(&run.target),
        suite = esc(&run.suite),
        rec = run.recorded,
        total = run.tests_total,
        complete = if run.complete {
            " (complete)"
        } else {
            " (incomplete)"
        },
        pass = r.passed,
        fail = r.failed,
        wall = r.wall_s
    );
    h.push_str("<h2>Pass / fail per domain</h2><table><tr><th class=l>domain</th><th>pass</th><th>fail</th><th class=l></th></tr>");
    for (d, (p, f)) in &r.domains {
        let n = (p + f).max(1) as f64;
        let _ = write!(
            h,
            "<tr><td class=l>{d}</td><td>{p}</td><td>{f}</td><td class=l><div class=bar><div class=p style=\"width:{:.1}%\"></div><div class=f style=\"width:{:.1}%\"></div></div></td></tr>",
            100.0 * *p as f64 / n,
            100.0 * *f as f64 / n
        );
    }
    h.push_str("</table><h2>Failures: domain × primitive</h2>");
    if prims.is_empty() {
        h.push_str("<p>No failures.</p>");
    } else {
        h.push_str("<table><tr><th class=l>domain</th>");
        for p in &prims {
            let _ = write!(h, "<th>{}</th>", esc(p));
        }
        h.push_str("</tr>");
        for d in r.domains.keys() {
            let _ = write!(h, "<tr><td class=l>{d}</td>");
            for p in &prims {
                let n = r.heat.get(d).and_then(|m| m.get(*p)).copied().unwrap_or(0);
                let alpha = if n == 0 {
                    0.0
                } else {
                    0.15 + 0.85 * n as f64 / max as f64
                };
                let _ = write!(
                    h,
                    "<td style=\"background:rgba(229,57,53,{alpha:.2})\">{}</td>",
                    if n == 0 { String::new() } else { n.to_string() }
                );
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }
    h.push_str("<h2>Layers</h2><table><tr><th class=l>layer</th><th class=l>primitive</th><th>tests</th><th class=l>example</th></tr>");
    for e in &r.top {
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td class=l>{}</td><td>{}</td><td class=l><code>{}</code>: {}</td></tr>",
            esc(&e.layer),
            esc(&e.primitive),
            e.tests,
            esc(&e.example_test),
            esc(&cut(&e.example, 160))
        );
    }
    let _ = write!(
        h,
        "</table><h2>Failed tests ({})</h2><input id=q placeholder=\"filter: test id, domain, primitive, words of the explanation\" oninput=\"f()\"><div id=list>",
        r.failures.len()
    );
    for f in &r.failures {
        let _ = write!(
            h,
            "<details data-k=\"{key}\"><summary><code>{id}</code> {layer}/<b>{prim}</b> <span class=muted>({conf:.2})</span> — {expl}</summary><p>{title}</p><pre>{ev}</pre></details>",
            key = esc(&format!(
                "{} {} {} {} {}",
                f.test_id, f.domain, f.layer, f.primitive, f.explanation
            )
            .to_lowercase()),
            id = esc(&f.test_id),
            layer = esc(&f.layer),
            prim = esc(&f.primitive),
            conf = f.confidence,
            expl = esc(&cut(&f.explanation, 140)),
            title = esc(&f.title),
            ev = esc(&serde_json::to_string_pretty(&f.evidence).unwrap_or_default()),
        );
    }
    h.push_str(
        "</div><script>function f(){var q=document.getElementById('q').value.toLowerCase().split(/\\s+/).filter(Boolean);\
         document.querySelectorAll('#list details').forEach(function(d){var k=d.dataset.k;\
         d.style.display=q.every(function(w){return k.indexOf(w)>=0})?'':'none'})}</script></body></html>\n",
    );
    h
}

/// One row of the confusion matrix: a run with an injected fault against
/// the baseline run.
#[derive(Debug, Serialize)]
pub struct MatrixRow {
    pub run: String,
    pub label: String,
    pub injected: String,
    /// Tests that passed in the baseline and failed here.
    pub newly_failed: i64,
    /// `layer/primitive` → newly failed tests attributed there.
    pub attributed: BTreeMap<String, i64>,
    /// Share of the newly failed tests attributed to the injected fault.
    pub accuracy: Option<f64>,
    /// Tests that failed in the baseline too.
    pub failed_in_both: i64,
    /// Of those, blamed on the injected fault at an earlier step than the
    /// baseline failed at: the fault struck first (e.g. a read-only /tmp
    /// before the step that needs a browser).
    pub preempted: i64,
    /// Of those, blamed on the injected fault at the step where the
    /// baseline failed for another reason.
    pub wrongly_blamed: i64,
}

#[derive(Debug, Serialize)]
pub struct Matrix {
    pub baseline: String,
    pub columns: Vec<String>,
    pub rows: Vec<MatrixRow>,
}

fn attributed_to(injected: &str, f: &Failure) -> bool {
    if injected == "interface" {
        f.layer == "interface"
    } else {
        f.primitive == injected
    }
}

/// Injected fault × attributed layer/primitive, over every run of the DB
/// that injects one, against `baseline` (a run that injects nothing).
pub fn matrix(conn: &Connection, baseline: &RunRow) -> anyhow::Result<Matrix> {
    let base = report(conn, baseline)?;
    let base_failed: BTreeMap<&str, &Failure> = base
        .failures
        .iter()
        .map(|f| (f.test_id.as_str(), f))
        .collect();
    let base_passed: BTreeSet<String> = {
        let mut stmt =
            conn.prepare("SELECT test_id FROM campaign_tests WHERE run = ?1 AND outcome = 'pass'")?;
        let rows = stmt.query_map([&baseline.id], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    let mut rows = Vec::new();
    let mut columns = BTreeSet::new();
    let mut runs = db::runs(conn)?;
    runs.sort_by(|a, b| a.injected.cmp(&b.injected).then(a.label.cmp(&b.label)));
    for run in runs.iter().filter(|r| r.id != baseline.id) {
        let Some(injected) = run.injected.clone() else {
            continue;
        };
        let r = report(conn, run)?;
        let mut row = MatrixRow {
            run: run.id.clone(),
            label: run.label.clone(),
            injected: injected.clone(),
            newly_failed: 0,
            attributed: BTreeMap::new(),
            accuracy: None,
            failed_in_both: 0,
            preempted: 0,
            wrongly_blamed: 0,
        };
        let mut right = 0;
        for f in &r.failures {
            if base_passed.contains(&f.test_id) {
                row.newly_failed += 1;
                let key = format!("{}/{}", f.layer, f.primitive);
                columns.insert(key.clone());
                *row.attributed.entry(key).or_default() += 1;
                right += i64::from(attributed_to(&injected, f));
            } else if let Some(b) = base_failed.get(f.test_id.as_str()) {
                row.failed_in_both += 1;
                if attributed_to(&injected, f) && !attributed_to(&injected, b) {
                    let step = |x: &Failure| x.evidence["step"].as_i64().unwrap_or(0);
                    if step(f) < step(b) {
                        row.preempted += 1;
                    } else {
                        row.wrongly_blamed += 1;
                    }
                }
            }
        }
        row.accuracy = (row.newly_failed > 0).then(|| right as f64 / row.newly_failed as f64);
        rows.push(row);
    }
    Ok(Matrix {
        baseline: baseline.id.clone(),
        columns: columns.into_iter().collect(),
        rows,
    })
}

/// The matrix as a Markdown table (for docs/).
pub fn matrix_markdown(m: &Matrix) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| run | injected | newly failing | {} | accuracy | failing in both | of those, fault struck first | of those, blamed at the same step |",
        m.columns
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(
        o,
        "|---|---|---:|{}---:|---:|---:|---:|",
        "---:|".repeat(m.columns.len())
    );
    for r in &m.rows {
        let cells: Vec<String> = m
            .columns
            .iter()
            .map(|c| {
                r.attributed.get(c).map_or(String::new(), |n| {
                    if c.ends_with(&format!("/{}", r.injected))
                        || (r.injected == "interface" && c.starts_with("interface/"))
                    {
                        format!("**{n}**")
                    } else {
                        n.to_string()
                    }
                })
            })
            .collect();
        let _ = writeln!(
            o,
            "| {} | `{}` | {} | {} | {} | {} | {} | {} |",
            r.label,
            r.injected,
            r.newly_failed,
            cells.join(" | "),
            r.accuracy
                .map_or("–".into(), |a| format!("{:.1}%", a * 100.0)),
            r.failed_in_both,
            r.preempted,
            r.wrongly_blamed,
        );
    }
    o
}
