//! The campaign's results in SQLite (tables in `migrations/03-campaign`,
//! next to the probe's evidence so `probe export` files merge in).
//!
//! One transaction per test: a test is recorded with all its steps or not
//! at all, so a runner killed mid-test leaves nothing half-written and
//! `--resume` simply runs the tests that have no row.

use std::collections::HashSet;
use std::path::Path;

use rusqlite::{Connection, OptionalExtension as _, params};
use serde_json::Value;

use super::triage::Triage;
use super::verdict::StepOutcome;

/// Opens (creating and migrating) a results DB.
pub fn open(path: &Path) -> anyhow::Result<Connection> {
    Ok(probe::store::Store::open(path)?.into_connection())
}

/// Opens an existing results DB for reading.
pub fn open_existing(path: &Path) -> anyhow::Result<Connection> {
    if !path.exists() {
        anyhow::bail!("{}: no such results database", path.display());
    }
    open(path)
}

#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: String,
    pub label: String,
    pub target: String,
    pub suite: String,
    pub suite_digest: String,
    pub tests_total: i64,
    pub profile: Option<String>,
    pub injected: Option<String>,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    /// The target adapter: `NAME (sha256 …)`, when the target is not an agent-bridge.
    pub adapter: Option<String>,
}

pub fn run(conn: &Connection, id: &str) -> rusqlite::Result<Option<RunRow>> {
    conn.query_row(
        "SELECT id, label, target, suite, suite_digest, tests_total, profile, injected, started_ms, finished_ms, adapter
         FROM campaign_runs WHERE id = ?1",
        [id],
        |r| {
            Ok(RunRow {
                id: r.get(0)?,
                label: r.get(1)?,
                target: r.get(2)?,
                suite: r.get(3)?,
                suite_digest: r.get(4)?,
                tests_total: r.get(5)?,
                profile: r.get(6)?,
                injected: r.get(7)?,
                started_ms: r.get(8)?,
                finished_ms: r.get(9)?,
                adapter: r.get(10)?,
            })
        },
    )
    .optional()
}

/// Every run, newest first.
pub fn runs(conn: &Connection) -> rusqlite::Result<Vec<RunRow>> {
    let ids: Vec<String> = conn
        .prepare("SELECT id FROM campaign_runs ORDER BY started_ms DESC, id DESC")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    ids.iter()
        .filter_map(|id| run(conn, id).transpose())
        .collect()
}

/// Creates the run, or returns the existing one of that id.
pub fn create_run(conn: &Connection, r: &RunRow) -> rusqlite::Result<(RunRow, bool)> {
    let created = conn.execute(
        "INSERT INTO campaign_runs (id, label, target, suite, suite_digest, tests_total, profile, injected, started_ms, adapter)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT (id) DO NOTHING",
        params![r.id, r.label, r.target, r.suite, r.suite_digest, r.tests_total, r.profile, r.injected, r.started_ms, r.adapter],
    )? == 1;
    Ok((run(conn, &r.id)?.expect("just inserted"), created))
}

/// Test ids already recorded for a run.
pub fn recorded(conn: &Connection, run: &str) -> rusqlite::Result<HashSet<String>> {
    conn.prepare("SELECT test_id FROM campaign_tests WHERE run = ?1")?
        .query_map([run], |r| r.get(0))?
        .collect()
}

/// Marks the run finished when every test of its suite has a row.
pub fn finish_if_complete(conn: &Connection, run: &str) -> rusqlite::Result<bool> {
    let n = conn.execute(
        "UPDATE campaign_runs SET finished_ms = ?2
         WHERE id = ?1 AND finished_ms IS NULL
           AND tests_total = (SELECT COUNT(*) FROM campaign_tests WHERE run = ?1)",
        params![run, probe::clock::now_ms() as i64],
    )?;
    Ok(n == 1
        || conn.query_row(
            "SELECT finished_ms IS NOT NULL FROM campaign_runs WHERE id = ?1",
            [run],
            |r| r.get(0),
        )?)
}

/// One test's outcome, ready to store.
#[derive(Debug, Clone)]
pub struct TestRecord {
    pub test_id: String,
    pub domain: String,
    pub title: String,
    pub triage: Option<Triage>,
    /// Passed, but degraded (only when `triage` is `None`).
    pub degraded: Option<super::triage::Degraded>,
    /// A step the target cannot express stopped the test: why.
    pub unsupported: Option<String>,
    pub duration_ms: f64,
    pub runner: String,
    pub mcp_session: Option<String>,
    /// (tool, stored request, outcome); `None` for steps not run.
    pub steps: Vec<(String, Value, Option<StepOutcome>)>,
}

/// Records one test and its steps in one transaction.
pub fn insert(conn: &mut Connection, run: &str, t: &TestRecord) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    let outcome = match (&t.triage, &t.degraded) {
        _ if t.unsupported.is_some() => "unsupported",
        (Some(_), _) => "fail",
        (None, Some(_)) => "degraded",
        (None, None) => "pass",
    };
    let tr = t.triage.as_ref();
    let dg = t.degraded.as_ref();
    tx.execute(
        "INSERT INTO campaign_tests (run, test_id, domain, title, outcome, layer, primitive, confidence,
             explanation, evidence, duration_ms, runner, mcp_session, finished_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        params![
            run,
            t.test_id,
            t.domain,
            t.title,
            outcome,
            tr.map(|x| x.layer)
                .or(dg.and_then(|d| d.primitive.map(|_| "sandbox"))),
            tr.map(|x| x.primitive.as_str())
                .or(dg.and_then(|d| d.primitive)),
            tr.map(|x| x.confidence),
            tr.map(|x| &x.explanation)
                .or(dg.map(|d| &d.explanation))
                .or(t.unsupported.as_ref()),
            tr.map(|x| x.evidence.to_string()),
            t.duration_ms,
            t.runner,
            t.mcp_session,
            probe::clock::now_ms() as i64,
        ],
    )?;
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO campaign_steps (run, test_id, step, tool, request, response_sha256, response_bytes,
                 duration_ms, is_error, verdict, failures, span_id, kernel_failed, kernel_primitive, kernel, degraded,
                 unchecked, target_call)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
        )?;
        for (i, (tool, request, o)) in t.steps.iter().enumerate() {
            let (verdict, failures) = match o {
                None => ("not-run", None),
                Some(o) if o.unsupported.is_some() => (
                    "unsupported",
                    Some(serde_json::to_string(&[&o.unsupported]).expect("JSON")),
                ),
                Some(o) if o.passed() => ("pass", None),
                Some(o) => {
                    let all: Vec<&String> = o.interface.iter().chain(&o.failures).collect();
                    ("fail", Some(serde_json::to_string(&all).expect("JSON")))
                }
            };
            let k = o.as_ref().and_then(|o| o.kernel.as_ref());
            stmt.execute(params![
                run,
                t.test_id,
                i as i64,
                tool,
                request.to_string(),
                o.as_ref().and_then(|o| o.response_sha256.as_deref()),
                o.as_ref().and_then(|o| o.response_bytes.map(|b| b as i64)),
                o.as_ref().map_or(0.0, |o| o.duration_ms),
                o.as_ref().and_then(|o| o.is_error),
                verdict,
                failures,
                k.and_then(|k| k["span"].as_i64()),
                k.and_then(|k| k["failed"].as_bool()),
                k.and_then(|k| k["primitive"].as_str()),
                k.map(Value::to_string),
                o.as_ref()
                    .filter(|o| !o.degraded.is_empty())
                    .map(|o| serde_json::to_string(&o.degraded).expect("JSON")),
                o.as_ref()
                    .filter(|o| !o.unchecked.is_empty())
                    .map(|o| serde_json::to_string(&o.unchecked).expect("JSON")),
                o.as_ref()
                    .and_then(|o| o.target_call.as_ref())
                    .map(Value::to_string),
            ])?;
        }
        let mut art = tx.prepare_cached(
            "INSERT INTO campaign_artifacts (run, test_id, step, mime, data) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        // kept for the tests a report lists (failed or degraded) only
        let listed = outcome != "pass";
        for (i, (_, _, o)) in t.steps.iter().enumerate().filter(|_| listed) {
            if let Some((mime, data)) = o.as_ref().and_then(|o| o.artifact.as_ref()) {
                art.execute(params![run, t.test_id, i as i64, mime, data])?;
            }
        }
    }
    tx.commit()
}
