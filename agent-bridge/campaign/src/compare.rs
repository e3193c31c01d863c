//! Runs side by side: two runs ([`compare`]) and every fault run against
//! a baseline ([`matrix`], the confusion matrix).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use probe::env::diff::diff;
use probe::env::explain::{Environment, Failed, explain};
use rusqlite::Connection;
use serde::Serialize;

use super::db::{self, RunRow};
use super::report::{Failure, Report, RunInfo, cut, report};

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
    /// Degraded tests (passed, but slowed or under memory pressure) in A and in B.
    pub degraded: (i64, i64),
    /// Tests degraded in B that were not in A (with B's reason).
    pub newly_degraded: Vec<Failure>,
    /// Tests the target could not express, in A and in B.
    pub unsupported: (i64, i64),
    /// What differs between the two runs' environments, and which broken
    /// tests each difference explains.
    pub environment: Option<probe::env::explain::Environment>,
    /// Why there is no environment section (a run without a snapshot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment_missing: Option<String>,
}

pub fn compare(conn: &Connection, a: &RunRow, b: &RunRow) -> anyhow::Result<Comparison> {
    let ra = report(conn, a)?;
    let rb = report(conn, b)?;
    let outcomes = |run: &str| -> anyhow::Result<BTreeMap<String, bool>> {
        let mut stmt =
            conn.prepare("SELECT test_id, outcome != 'fail' FROM campaign_tests WHERE run = ?1 AND outcome != 'unsupported'")?;
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
        degraded: (ra.degraded, rb.degraded),
        unsupported: (ra.unsupported, rb.unsupported),
        newly_degraded: rb
            .degraded_tests
            .iter()
            .filter(|t| !ra.degraded_tests.iter().any(|a| a.test_id == t.test_id))
            .cloned()
            .collect(),
        environment: None,
        environment_missing: None,
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
    match (
        super::environment::of_run(conn, &a.id)?,
        super::environment::of_run(conn, &b.id)?,
    ) {
        (Some(x), Some(y)) => {
            let flipped: Vec<Failed> = c
                .broke
                .iter()
                .map(|f| Failed::from_evidence(&f.test_id, &f.primitive, &f.evidence["kernel"]))
                .collect();
            c.environment = Some(explain(&diff(&x, &y), &flipped));
        }
        (x, y) => {
            let missing: Vec<&str> = [(&x, "A"), (&y, "B")]
                .into_iter()
                .filter(|(s, _)| s.is_none())
                .map(|(_, n)| n)
                .collect();
            c.environment_missing = Some(format!(
                "no environment stored with {} (a run before environments were kept, or a target that could not take one: campaign run --env FILE)",
                missing.join(" and ")
            ));
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
    if c.degraded != (0, 0) {
        let _ = writeln!(
            o,
            "degraded (passed, but slowed or under memory pressure): {} in A, {} in B, {} newly in B",
            c.degraded.0,
            c.degraded.1,
            c.newly_degraded.len()
        );
    }
    if c.unsupported != (0, 0) {
        let _ = writeln!(
            o,
            "unsupported (steps the target cannot express; neither pass nor fail): {} in A, {} in B",
            c.unsupported.0, c.unsupported.1
        );
    }
    if c.only_in_a + c.only_in_b > 0 {
        let _ = writeln!(
            o,
            "{} tests only in A, {} only in B",
            c.only_in_a, c.only_in_b
        );
    }
    for (title, list) in [
        ("BROKE IN B", &c.broke),
        ("FIXED IN B", &c.fixed),
        ("DEGRADED IN B", &c.newly_degraded),
    ] {
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
    match (&c.environment, &c.environment_missing) {
        (Some(env), _) => o.push_str(&environment_text(env, &c.broke)),
        (None, Some(why)) => {
            let _ = writeln!(o, "\nENVIRONMENT\n  {why}");
        }
        (None, None) => {}
    }
    o
}

/// Up to `n` test ids, then how many more.
fn some_ids(ids: &[String], n: usize) -> String {
    let mut s = ids.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if ids.len() > n {
        let _ = write!(s, ", … {} more", ids.len() - n);
    }
    s
}

/// The environment section: each difference with the broken tests it
/// explains, those no failure touched collapsed, then the unexplained tests.
pub fn environment_text(env: &Environment, broke: &[Failure]) -> String {
    let mut o = String::new();
    let touched: Vec<_> = env
        .differences
        .iter()
        .filter(|e| !e.explains.is_empty() || !e.possible.is_empty())
        .collect();
    let untouched = env.differences.len() - touched.len();
    let _ = writeln!(
        o,
        "\nENVIRONMENT: {} difference(s); {} of {} broken test(s) explained by one, {} unexplained",
        env.differences.len(),
        broke.len() - env.unexplained.len(),
        broke.len(),
        env.unexplained.len()
    );
    if !touched.is_empty() {
        let _ = writeln!(
            o,
            "  {:<30} {:<44} {:>8} {:>8}",
            "FACET/KEY", "A → B", "EXPLAINS", "POSSIBLE"
        );
    }
    for e in &touched {
        let d = &e.difference;
        let _ = writeln!(
            o,
            "  {:<30} {:<44} {:>8} {:>8}",
            cut(&format!("{}/{}", d.facet, d.key), 30),
            cut(&d.change(), 44),
            e.explains.len(),
            e.possible.len()
        );
        if !e.explains.is_empty() {
            let _ = writeln!(o, "      explains {}", some_ids(&e.explains, 6));
        }
    }
    if untouched > 0 {
        let _ = writeln!(o, "  {untouched} difference(s) no failure touched:");
        for e in env
            .differences
            .iter()
            .filter(|e| e.explains.is_empty() && e.possible.is_empty())
            .take(12)
        {
            let d = &e.difference;
            let _ = writeln!(
                o,
                "    {:<28} {}",
                cut(&format!("{}/{}", d.facet, d.key), 28),
                cut(&d.change(), 60)
            );
        }
        if untouched > 12 {
            let _ = writeln!(o, "    … and {} more (--json for all)", untouched - 12);
        }
    }
    if !env.unexplained.is_empty() {
        let _ = writeln!(
            o,
            "  UNEXPLAINED (broke, and no difference touches its failure: a regression in the target, or a flake)"
        );
        for id in env.unexplained.iter().take(15) {
            let f = broke.iter().find(|f| &f.test_id == id);
            let _ = writeln!(
                o,
                "    {:<16} {}",
                id,
                f.map(|f| format!("{}/{}  {}", f.layer, f.primitive, cut(&f.explanation, 70)))
                    .unwrap_or_default()
            );
        }
        if env.unexplained.len() > 15 {
            let _ = writeln!(
                o,
                "    … and {} more (--json for all)",
                env.unexplained.len() - 15
            );
        }
    }
    if !env.unknown.is_empty() {
        let _ = writeln!(
            o,
            "  {} item(s) not compared (one side could not read them; --json lists them)",
            env.unknown.len()
        );
    }
    o
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
        let mut stmt = conn
            .prepare("SELECT test_id FROM campaign_tests WHERE run = ?1 AND outcome != 'fail'")?;
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
