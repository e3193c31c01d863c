//! Reports over the results DB: one run as data, as terminal tables
//! ([`text`]), as HTML ([`html`]), exported ([`export`]); two runs side by
//! side and the confusion matrix ([`compare`]). Everything is computed from
//! the stored rows, so a report can be made at any time, also of a run
//! still going.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Context as _;
use rusqlite::Connection;
use serde::Serialize;

use super::db::{self, RunRow};
use super::record::{Layer, Outcome, Primitive};
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
    /// The target adapter, when the target is not an agent-bridge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
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
    /// What `campaign shrink` found: the smallest input that fails the same way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minimized: Option<String>,
}

/// One domain's outcomes.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Outcomes {
    pub passed: i64,
    /// Passed, but slowed past max_duration_ms or stalled on memory.
    pub degraded: i64,
    pub failed: i64,
    /// A step the target cannot express (through its adapter).
    pub unsupported: i64,
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

/// One target's share of a run (a run spread over several sandboxes).
#[derive(Debug, Clone, Serialize)]
pub struct TargetOutcomes {
    pub target: String,
    #[serde(flatten)]
    pub outcomes: Outcomes,
    /// Why the target was marked down during the run, if it was.
    pub down: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub run: RunInfo,
    pub domains: BTreeMap<String, Outcomes>,
    /// Per target, in the order they first recorded a test.
    pub targets: Vec<TargetOutcomes>,
    /// (layer, primitive) → failed tests
    pub layers: BTreeMap<String, BTreeMap<String, i64>>,
    /// domain → primitive → failed tests (the heat map)
    pub heat: BTreeMap<String, BTreeMap<String, i64>>,
    pub top: Vec<Explanation>,
    pub failures: Vec<Failure>,
    /// The degraded tests (primitive `mem.pressure` or none; explanation says why).
    pub degraded_tests: Vec<Failure>,
    /// The tests the target cannot run (explanation: the step and why).
    pub unsupported_tests: Vec<Failure>,
    /// The image each listed (failed or degraded) test read back, as a
    /// `data:` URL, for the HTML report (the last one when a test has several).
    #[serde(skip)]
    pub images: BTreeMap<String, String>,
    pub passed: i64,
    pub degraded: i64,
    pub failed: i64,
    pub unsupported: i64,
    /// Wall time from the first to the last recorded test.
    pub wall_s: f64,
    pub test_time_s: f64,
    /// The environment each target ran in (`probe env`'s snapshot).
    pub environment: Vec<RunEnvironment>,
}

/// One target's stored snapshot, or why it cannot be read.
#[derive(Debug, Clone, Serialize)]
pub struct RunEnvironment {
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<probe::env::Snapshot>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RunEnvironment {
    /// One line: where it was taken and what kind of place it is.
    pub fn line(&self) -> String {
        match (&self.snapshot, &self.error) {
            (Some(s), _) => {
                let item = |facet: &str, key: &str| {
                    s.facet(facet)
                        .and_then(|f| f.items.get(key))
                        .and_then(|v| v.as_str())
                        .unwrap_or("?")
                        .to_string()
                };
                format!(
                    "{}: {} facets ({} on {} {}, kernel {}), taken by {}",
                    self.target,
                    s.facets.len(),
                    item("runtime", "kind"),
                    item("runtime", "arch"),
                    item("identity", "locale"),
                    item("runtime", "kernel"),
                    s.source
                )
            }
            (None, Some(e)) => format!("{}: unreadable snapshot ({e})", self.target),
            (None, None) => format!("{}: none", self.target),
        }
    }
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
    let mut domains: BTreeMap<String, Outcomes> = DOMAINS
        .iter()
        .map(|d| (d.to_string(), Outcomes::default()))
        .collect();
    let mut stmt = conn.prepare(
        "SELECT domain, SUM(outcome = 'pass'), SUM(outcome = 'degraded'), SUM(outcome = 'fail'),
                SUM(outcome = 'unsupported')
         FROM campaign_tests WHERE run = ?1 GROUP BY domain",
    )?;
    for row in stmt.query_map([&run.id], |r| {
        Ok((
            r.get::<_, String>(0)?,
            Outcomes {
                passed: r.get(1)?,
                degraded: r.get(2)?,
                failed: r.get(3)?,
                unsupported: r.get(4)?,
            },
        ))
    })? {
        let (d, o) = row?;
        domains.insert(d, o);
    }
    let targets = targets(conn, run)?;
    let failures = tests_with(conn, &run.id, Outcome::Fail)?;
    let degraded_tests = tests_with(conn, &run.id, Outcome::Degraded)?;
    let unsupported_tests = tests_with(conn, &run.id, Outcome::Unsupported)?;
    let mut images = BTreeMap::new();
    let mut stmt = conn.prepare(
        "SELECT a.test_id, a.mime, a.data FROM campaign_artifacts a JOIN campaign_tests t
           ON t.run = a.run AND t.test_id = a.test_id
         WHERE a.run = ?1 AND t.outcome != 'pass' ORDER BY a.test_id, a.step",
    )?;
    for row in stmt.query_map([&run.id], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Vec<u8>>(2)?,
        ))
    })? {
        let (test, mime, data) = row?;
        images.insert(
            test,
            format!(
                "data:{mime};base64,{}",
                contract::bytes::base64_encode(&data)
            ),
        );
    }
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
    let (passed, degraded, failed, unsupported) =
        domains.values().fold((0, 0, 0, 0), |(p, d, f, u), o| {
            (
                p + o.passed,
                d + o.degraded,
                f + o.failed,
                u + o.unsupported,
            )
        });
    let (first, last, test_ms): (Option<i64>, Option<i64>, Option<f64>) = conn.query_row(
        "SELECT MIN(finished_ms - CAST(duration_ms AS INTEGER)), MAX(finished_ms), SUM(duration_ms) FROM campaign_tests WHERE run = ?1",
        [&run.id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let environment = super::environment::stored(conn, &run.id)?
        .into_iter()
        .map(|(target, s)| match s {
            Ok(s) => RunEnvironment {
                target,
                snapshot: Some(s),
                error: None,
            },
            Err(e) => RunEnvironment {
                target,
                snapshot: None,
                error: Some(e),
            },
        })
        .collect();
    Ok(Report {
        environment,
        run: RunInfo {
            id: run.id.clone(),
            label: run.label.clone(),
            target: run.target.clone(),
            suite: run.suite.clone(),
            tests_total: run.tests_total,
            recorded: passed + degraded + failed + unsupported,
            complete: run.finished_ms.is_some(),
            started_ms: run.started_ms,
            finished_ms: run.finished_ms,
            adapter: run.adapter.clone(),
        },
        domains,
        targets,
        layers,
        heat,
        top,
        failures,
        degraded_tests,
        unsupported_tests,
        images,
        passed,
        degraded,
        failed,
        unsupported,
        wall_s: match (first, last) {
            (Some(a), Some(b)) => (b - a) as f64 / 1000.0,
            _ => 0.0,
        },
        test_time_s: test_ms.unwrap_or(0.0) / 1000.0,
    })
}

/// Outcomes per target (a test without one ran on the run's only target),
/// and the targets that went down.
fn targets(conn: &Connection, run: &RunRow) -> anyhow::Result<Vec<TargetOutcomes>> {
    let mut stmt = conn.prepare(
        "SELECT COALESCE(target, ?2), SUM(outcome = 'pass'), SUM(outcome = 'degraded'), SUM(outcome = 'fail'),
                SUM(outcome = 'unsupported'),
                (SELECT GROUP_CONCAT(reason, '; ') FROM campaign_target_downs d
                  WHERE d.run = ?1 AND d.target = COALESCE(t.target, ?2))
         FROM campaign_tests t WHERE run = ?1 GROUP BY COALESCE(target, ?2) ORDER BY MIN(finished_ms)",
    )?;
    let mut all: Vec<TargetOutcomes> = stmt
        .query_map([&run.id, &run.target], |r| {
            Ok(TargetOutcomes {
                target: r.get(0)?,
                outcomes: Outcomes {
                    passed: r.get(1)?,
                    degraded: r.get(2)?,
                    failed: r.get(3)?,
                    unsupported: r.get(4)?,
                },
                down: r.get(5)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    // a target that went down before it recorded anything
    let mut stmt = conn.prepare(
        "SELECT target, GROUP_CONCAT(reason, '; ') FROM campaign_target_downs WHERE run = ?1 GROUP BY target",
    )?;
    for row in stmt.query_map([&run.id], |r| Ok((r.get::<_, String>(0)?, r.get(1)?)))? {
        let (target, down) = row?;
        if !all.iter().any(|t| t.target == target) {
            all.push(TargetOutcomes {
                target,
                outcomes: Outcomes::default(),
                down,
            });
        }
    }
    Ok(all)
}

/// The tests of `run` with `outcome` (fail, degraded or unsupported).
fn tests_with(conn: &Connection, run: &str, outcome: Outcome) -> anyhow::Result<Vec<Failure>> {
    let mut stmt = conn.prepare(
        "SELECT t.test_id, domain, title, layer, primitive, confidence, explanation, evidence,
                (SELECT cause FROM campaign_shrinks s
                  WHERE s.run = t.run AND s.test_id = t.test_id ORDER BY step LIMIT 1)
         FROM campaign_tests t WHERE t.run = ?1 AND outcome = ?2 ORDER BY t.test_id",
    )?;
    let rows = stmt.query_map([run, outcome.id()], |r| {
        Ok(Failure {
            test_id: r.get(0)?,
            domain: r.get(1)?,
            title: r.get(2)?,
            // a failure without a layer is the test's own; a degraded test
            // has one only when memory pressure slowed it
            layer: r
                .get::<_, Option<String>>(3)?
                .unwrap_or_else(|| match outcome {
                    Outcome::Degraded => "-".into(),
                    _ => Layer::Test.id().into(),
                }),
            primitive: r
                .get::<_, Option<String>>(4)?
                .unwrap_or_else(|| Primitive::None.id().into()),
            confidence: r.get::<_, Option<f64>>(5)?.unwrap_or(0.0),
            explanation: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
            evidence: r
                .get::<_, Option<String>>(7)?
                .and_then(|e| serde_json::from_str(&e).ok())
                .unwrap_or_default(),
            minimized: r.get(8)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(super) fn cut(s: &str, max: usize) -> String {
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
        "run {} ({}) against {}{}\n{} of {} tests recorded{}: {} passed, {} degraded, {} failed, {} unsupported; {:.0} s wall, {:.0} s of test time\n",
        run.id,
        run.label,
        run.target,
        run.adapter
            .as_ref()
            .map_or(String::new(), |a| format!(" through adapter {a}")),
        run.recorded,
        run.tests_total,
        if run.complete {
            ", complete"
        } else {
            ", INCOMPLETE (resume it with --resume)"
        },
        r.passed,
        r.degraded,
        r.failed,
        r.unsupported,
        r.wall_s,
        r.test_time_s
    );
    let _ = writeln!(
        o,
        "{:<12} {:>6} {:>8} {:>6} {:>6} {:>6}",
        "DOMAIN", "PASS", "DEGRADED", "FAIL", "UNSUP", "PASS%"
    );
    for (d, c) in &r.domains {
        // unsupported tests say nothing of the target: not in the share
        let all = c.passed + c.degraded + c.failed;
        let pct = if all > 0 {
            100.0 * c.passed as f64 / all as f64
        } else {
            0.0
        };
        let _ = writeln!(
            o,
            "{d:<12} {:>6} {:>8} {:>6} {:>6} {pct:>5.0}%",
            c.passed, c.degraded, c.failed, c.unsupported
        );
    }
    let _ = writeln!(
        o,
        "{:<12} {:>6} {:>8} {:>6} {:>6}\n",
        "total", r.passed, r.degraded, r.failed, r.unsupported
    );
    for e in &r.environment {
        let _ = writeln!(o, "environment {}", e.line());
    }
    if !r.environment.is_empty() {
        o.push('\n');
    }
    if r.targets.len() > 1 || r.targets.iter().any(|t| t.down.is_some()) {
        let _ = writeln!(
            o,
            "{:>6} {:>8} {:>6} {:>6}  TARGET",
            "PASS", "DEGRADED", "FAIL", "UNSUP"
        );
        for t in &r.targets {
            let c = &t.outcomes;
            let _ = writeln!(
                o,
                "{:>6} {:>8} {:>6} {:>6}  {}{}",
                c.passed,
                c.degraded,
                c.failed,
                c.unsupported,
                t.target,
                t.down
                    .as_ref()
                    .map_or(String::new(), |d| format!("  (down: {})", cut(d, 80)))
            );
        }
        o.push('\n');
    }
    if !r.unsupported_tests.is_empty() {
        let _ = writeln!(
            o,
            "UNSUPPORTED (steps the target cannot express; neither pass nor fail)"
        );
        let mut reasons: BTreeMap<String, (usize, &str)> = BTreeMap::new();
        for t in &r.unsupported_tests {
            // "step N (tool): why" → grouped by tool and why
            let why = t
                .explanation
                .split_once(' ')
                .map_or(&*t.explanation, |(_, rest)| rest);
            let why = why.split_once(' ').map_or(why, |(_, rest)| rest);
            reasons.entry(why.to_string()).or_insert((0, &t.test_id)).0 += 1;
        }
        let mut reasons: Vec<_> = reasons.into_iter().collect();
        reasons.sort_by_key(|r| std::cmp::Reverse(r.1.0));
        for (why, (n, example)) in reasons.iter().take(10) {
            let _ = writeln!(o, "{n:>5} × {}  e.g. {example}", cut(why, 100));
        }
        let _ = writeln!(o);
    }
    if !r.degraded_tests.is_empty() {
        let _ = writeln!(o, "DEGRADED (passed, but slowed or under memory pressure)");
        for t in r.degraded_tests.iter().take(10) {
            let _ = writeln!(o, "  {}: {}", t.test_id, cut(&t.explanation, 110));
        }
        if r.degraded_tests.len() > 10 {
            let _ = writeln!(o, "  … and {} more", r.degraded_tests.len() - 10);
        }
        let _ = writeln!(o);
    }
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
    let minimized: Vec<&Failure> = r
        .failures
        .iter()
        .filter(|f| f.minimized.is_some())
        .collect();
    if !minimized.is_empty() {
        let _ = writeln!(o, "\nMINIMIZED CAUSES (campaign shrink)");
        for f in minimized.iter().take(10) {
            let _ = writeln!(
                o,
                "  {} {}/{}: {}",
                f.test_id,
                f.layer,
                f.primitive,
                cut(f.minimized.as_deref().unwrap_or_default(), 100)
            );
        }
    }
    o
}
