//! The campaign's results: SQLite by default (tables in
//! `migrations/03-campaign` and later, next to the probe's evidence so
//! `probe export` files merge in), or PostgreSQL ([`super::pg`]) shared by
//! runners on several machines.
//!
//! One transaction per test: a test is recorded with all its steps or not
//! at all, so a runner killed mid-test leaves nothing half-written and
//! `--resume` simply runs the tests that have no row. A row is keyed by
//! run and test: a test recorded twice (a claim taken over from a runner
//! that was only slow) is kept once.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rusqlite::types::Value as Sql;
use rusqlite::{Connection, OptionalExtension as _};
use serde_json::Value;

use super::pg::Pg;
use super::record::{Outcome, StepOutcome, TestRecord};

/// Where results live: a SQLite file, or a PostgreSQL URL.
#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

impl std::str::FromStr for Location {
    type Err = String;

    fn from_str(s: &str) -> Result<Location, String> {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Ok(Location::Postgres(s.to_string()))
        } else if s.contains("://") {
            Err(format!(
                "`{}`: --db is a SQLite file or a postgres:// URL",
                super::pg::redact(s)
            ))
        } else if s.is_empty() {
            Err("--db needs a file or a postgres:// URL".into())
        } else {
            Ok(Location::Sqlite(PathBuf::from(s)))
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(p) => write!(f, "{}", p.display()),
            Location::Postgres(url) => f.write_str(&super::pg::redact(url)),
        }
    }
}

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

/// Makes `RUN@TARGET` names readable on this connection: temp tables
/// (which shadow the stored ones here, and only here) hold the runs
/// named, each `RUN@TARGET` being the tests that target ran, so a run split
/// over two sandboxes compares with itself.
pub fn with_splits(conn: &Connection, names: &[&str]) -> anyhow::Result<()> {
    if !names.iter().any(|n| n.contains('@')) {
        return Ok(());
    }
    const TABLES: [&str; 6] = [
        "campaign_runs",
        "campaign_tests",
        "campaign_steps",
        "campaign_artifacts",
        "campaign_shrinks",
        "campaign_environments",
    ];
    for t in TABLES {
        conn.execute_batch(&format!(
            "CREATE TEMP TABLE {t} AS SELECT * FROM main.{t} WHERE 0"
        ))?;
    }
    for name in names {
        let (run, target) = match name.split_once('@') {
            Some((r, t)) => (r, Some(t)),
            None => (*name, None),
        };
        for t in TABLES {
            let key = if t == "campaign_runs" { "id" } else { "run" };
            conn.execute(
                &format!("INSERT INTO temp.{t} SELECT * FROM main.{t} WHERE {key} = ?1"),
                [run],
            )?;
            conn.execute(
                &format!("UPDATE temp.{t} SET {key} = ?2 WHERE {key} = ?1"),
                [run, name],
            )?;
        }
        let Some(target) = target else { continue };
        conn.execute(
            "DELETE FROM temp.campaign_environments WHERE run = ?1 AND target <> ?2",
            [name, target],
        )?;
        conn.execute(
            "DELETE FROM temp.campaign_tests WHERE run = ?1
               AND COALESCE(target, (SELECT target FROM temp.campaign_runs WHERE id = ?1)) <> ?2",
            [name, target],
        )?;
        for t in ["campaign_steps", "campaign_artifacts", "campaign_shrinks"] {
            conn.execute(
                &format!(
                    "DELETE FROM temp.{t} WHERE run = ?1
                       AND test_id NOT IN (SELECT test_id FROM temp.campaign_tests WHERE run = ?1)"
                ),
                [name],
            )?;
        }
        let n = conn.execute(
            "UPDATE temp.campaign_runs SET target = ?2, label = label || '@' || ?2,
                 tests_total = (SELECT COUNT(*) FROM temp.campaign_tests WHERE run = ?1)
             WHERE id = ?1 AND EXISTS (SELECT 1 FROM temp.campaign_tests WHERE run = ?1)",
            [name, target],
        )?;
        if n == 0 {
            let known: Vec<String> = conn
                .prepare(
                    "SELECT DISTINCT COALESCE(target, '?') FROM main.campaign_tests WHERE run = ?1",
                )?
                .query_map([run], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            anyhow::bail!(
                "`{name}`: run `{run}` has no tests from target {target} (its targets: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            );
        }
    }
    Ok(())
}

/// Which runs a reader needs.
pub enum Needs<'a> {
    /// The newest run (when `None`) or the one named.
    Run(Option<&'a str>),
    These(&'a [&'a str]),
    All,
}

/// The results to read, as SQLite: the file itself, or a snapshot of the
/// runs needed from PostgreSQL (see [`super::pg`]).
pub fn reader(at: &Location, needs: Needs) -> anyhow::Result<Connection> {
    match at {
        Location::Sqlite(path) => open_existing(path),
        Location::Postgres(url) => {
            let mut pg = Pg::connect(url)?;
            let runs: Option<Vec<String>> = match needs {
                Needs::All => None,
                Needs::These(ids) => {
                    let mut runs: Vec<String> = ids
                        .iter()
                        .map(|s| s.split_once('@').map_or(*s, |(run, _)| run).to_string())
                        .collect();
                    runs.sort();
                    runs.dedup();
                    Some(runs)
                }
                Needs::Run(Some(id)) => Some(vec![id.to_string()]),
                Needs::Run(None) => Some(
                    pg.query(
                        "SELECT id FROM campaign_runs ORDER BY started_ms DESC, id DESC LIMIT 1",
                        &[],
                    )?
                    .into_iter()
                    .filter_map(|r| match r.into_iter().next() {
                        Some(Sql::Text(id)) => Some(id),
                        _ => None,
                    })
                    .collect(),
                ),
            };
            pg.snapshot(runs.as_deref())
        }
    }
}

/// A results DB open for writing, either backend.
pub enum Db {
    Sqlite(Connection),
    Postgres(Box<Pg>),
}

impl Db {
    /// Opens (creating and migrating) the results DB at `at`.
    pub fn open(at: &Location) -> anyhow::Result<Db> {
        Ok(match at {
            Location::Sqlite(path) => Db::Sqlite(open(path)?),
            Location::Postgres(url) => Db::Postgres(Box::new(Pg::connect(url)?)),
        })
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, Db::Postgres(_))
    }

    /// One statement, written with SQLite placeholders; rows affected.
    pub fn execute(&mut self, sql: &str, values: &[Sql]) -> anyhow::Result<u64> {
        Ok(match self {
            Db::Sqlite(c) => {
                c.prepare_cached(sql)?
                    .execute(rusqlite::params_from_iter(values.iter()))? as u64
            }
            Db::Postgres(pg) => pg.execute(sql, values)?,
        })
    }

    /// One query, written with SQLite placeholders.
    pub fn query(&mut self, sql: &str, values: &[Sql]) -> anyhow::Result<Vec<Vec<Sql>>> {
        match self {
            Db::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let n = stmt.column_count();
                let rows = stmt
                    .query_map(rusqlite::params_from_iter(values.iter()), |r| {
                        (0..n).map(|i| r.get::<_, Sql>(i)).collect()
                    })?
                    .collect::<Result<_, _>>()?;
                Ok(rows)
            }
            Db::Postgres(pg) => pg.query(sql, values),
        }
    }

    fn batch(&mut self, sql: &str) -> anyhow::Result<()> {
        match self {
            Db::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Db::Postgres(pg) => pg.batch(sql),
        }
    }

    /// Runs `f` in one transaction: all of it is committed, or none.
    pub fn transaction<T>(
        &mut self,
        f: impl FnOnce(&mut Db) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        self.batch(if self.is_postgres() {
            "BEGIN"
        } else {
            "BEGIN IMMEDIATE"
        })?;
        match f(self) {
            Ok(v) => {
                self.batch("COMMIT")?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.batch("ROLLBACK");
                Err(e)
            }
        }
    }
}

pub fn sql(s: &str) -> Sql {
    Sql::Text(s.to_string())
}

fn text(v: &Sql) -> Option<String> {
    match v {
        Sql::Text(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(v: &Sql) -> Option<i64> {
    match v {
        Sql::Integer(i) => Some(*i),
        _ => None,
    }
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

const RUN_COLUMNS: &str = "id, label, target, suite, suite_digest, tests_total, profile, injected, started_ms, finished_ms, adapter";

fn run_from(r: &[Sql]) -> RunRow {
    RunRow {
        id: text(&r[0]).unwrap_or_default(),
        label: text(&r[1]).unwrap_or_default(),
        target: text(&r[2]).unwrap_or_default(),
        suite: text(&r[3]).unwrap_or_default(),
        suite_digest: text(&r[4]).unwrap_or_default(),
        tests_total: int(&r[5]).unwrap_or_default(),
        profile: text(&r[6]),
        injected: text(&r[7]),
        started_ms: int(&r[8]).unwrap_or_default(),
        finished_ms: int(&r[9]),
        adapter: text(&r[10]),
    }
}

/// How long a runner may stay silent before its claims are taken over.
pub const STALE_MS: i64 = 5_000;

impl Db {
    pub fn run_row(&mut self, id: &str) -> anyhow::Result<Option<RunRow>> {
        let rows = self.query(
            &format!("SELECT {RUN_COLUMNS} FROM campaign_runs WHERE id = ?1"),
            &[Sql::Text(id.into())],
        )?;
        Ok(rows.first().map(|r| run_from(r)))
    }

    /// Creates the run (with its claim queue: the suite's test ids in
    /// order), or returns the existing one of that id.
    pub fn create_run(
        &mut self,
        r: &RunRow,
        test_ids: &[String],
    ) -> anyhow::Result<(RunRow, bool)> {
        let created = self.transaction(|db| {
            let created = db.execute(
                "INSERT INTO campaign_runs (id, label, target, suite, suite_digest, tests_total, profile, injected, started_ms, adapter)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT (id) DO NOTHING",
                &[
                    r.id.clone().into(),
                    r.label.clone().into(),
                    r.target.clone().into(),
                    r.suite.clone().into(),
                    r.suite_digest.clone().into(),
                    r.tests_total.into(),
                    r.profile.clone().into(),
                    r.injected.clone().into(),
                    r.started_ms.into(),
                    r.adapter.clone().into(),
                ],
            )? == 1;
            if created && db.is_postgres() {
                for (seq, id) in test_ids.iter().enumerate() {
                    db.execute(
                        "INSERT INTO campaign_claims (run, test_id, seq) VALUES (?1, ?2, ?3)",
                        &[r.id.clone().into(), id.clone().into(), (seq as i64).into()],
                    )?;
                }
            }
            Ok(created)
        })?;
        Ok((self.run_row(&r.id)?.expect("just inserted"), created))
    }

    /// Test ids already recorded for a run.
    pub fn recorded(&mut self, run: &str) -> anyhow::Result<HashSet<String>> {
        Ok(self
            .query(
                "SELECT test_id FROM campaign_tests WHERE run = ?1",
                &[sql(run)],
            )?
            .iter()
            .filter_map(|r| text(&r[0]))
            .collect())
    }

    /// Marks the run finished when every test of its suite has a row.
    pub fn finish_if_complete(&mut self, run: &str) -> anyhow::Result<bool> {
        self.execute(
            "UPDATE campaign_runs SET finished_ms = ?2
             WHERE id = ?1 AND finished_ms IS NULL
               AND tests_total = (SELECT COUNT(*) FROM campaign_tests WHERE run = ?1)",
            &[sql(run), (probe::clock::now_ms() as i64).into()],
        )?;
        let rows = self.query(
            "SELECT finished_ms FROM campaign_runs WHERE id = ?1",
            &[sql(run)],
        )?;
        Ok(rows.first().is_some_and(|r| int(&r[0]).is_some()))
    }

    /// Says this runner is alive (and which targets it drives).
    pub fn heartbeat(&mut self, run: &str, runner: &str, targets: &str) -> anyhow::Result<()> {
        let now = probe::clock::now_ms() as i64;
        self.execute(
            "INSERT INTO campaign_runners (run, runner, targets, started_ms, heartbeat_ms) VALUES (?1, ?2, ?3, ?4, ?4)
             ON CONFLICT (run, runner) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms",
            &[sql(run), sql(runner), sql(targets), now.into()],
        )?;
        Ok(())
    }

    /// This runner is done.
    pub fn runner_finished(&mut self, run: &str, runner: &str) -> anyhow::Result<()> {
        self.execute(
            "UPDATE campaign_runners SET finished_ms = ?3 WHERE run = ?1 AND runner = ?2",
            &[
                sql(run),
                sql(runner),
                (probe::clock::now_ms() as i64).into(),
            ],
        )?;
        Ok(())
    }

    /// Claims the next test of the run for `runner`: the first in suite
    /// order that nobody holds, or that a silent runner held and never
    /// recorded. PostgreSQL only (row locks skipped, not waited on). A
    /// recorded test's claim is deleted with the recording, so the queue
    /// holds only what is left and in flight.
    pub fn claim(&mut self, run: &str, runner: &str) -> anyhow::Result<Option<String>> {
        let now = probe::clock::now_ms() as i64;
        let rows = self.query(
            "UPDATE campaign_claims SET runner = ?2, claimed_ms = ?3
             WHERE run = ?1 AND test_id = (
                 SELECT c.test_id FROM campaign_claims c
                 WHERE c.run = ?1
                   AND NOT EXISTS (SELECT 1 FROM campaign_tests t WHERE t.run = c.run AND t.test_id = c.test_id)
                   AND (c.runner IS NULL OR (c.runner <> ?2 AND NOT EXISTS (
                        SELECT 1 FROM campaign_runners r WHERE r.run = c.run AND r.runner = c.runner
                          AND r.finished_ms IS NULL AND r.heartbeat_ms >= ?4)))
                 ORDER BY c.seq LIMIT 1 FOR UPDATE SKIP LOCKED)
             RETURNING test_id",
            &[sql(run), sql(runner), now.into(), (now - STALE_MS).into()],
        )?;
        Ok(rows.first().and_then(|r| text(&r[0])))
    }

    /// Tests of the run that no row records yet and that another runner
    /// still holds (it may record them, or go silent and give them up).
    pub fn held_elsewhere(&mut self, run: &str, runner: &str) -> anyhow::Result<i64> {
        let rows = self.query(
            "SELECT COUNT(*) FROM campaign_claims c
             WHERE c.run = ?1 AND c.runner IS NOT NULL AND c.runner <> ?2
               AND NOT EXISTS (SELECT 1 FROM campaign_tests t WHERE t.run = c.run AND t.test_id = c.test_id)",
            &[sql(run), sql(runner)],
        )?;
        Ok(rows.first().and_then(|r| int(&r[0])).unwrap_or(0))
    }

    /// Records that `target` went down for this runner.
    pub fn target_down(
        &mut self,
        run: &str,
        runner: &str,
        target: &str,
        reason: &str,
    ) -> anyhow::Result<()> {
        self.execute(
            "INSERT INTO campaign_target_downs (run, runner, target, down_ms, reason) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (run, runner, target) DO NOTHING",
            &[
                sql(run),
                sql(runner),
                sql(target),
                (probe::clock::now_ms() as i64).into(),
                sql(reason),
            ],
        )?;
        Ok(())
    }
}

fn json(v: &impl serde::Serialize) -> Sql {
    Sql::Text(serde_json::to_string(v).expect("JSON"))
}

impl Db {
    /// Records tests with their steps in one transaction. A test another
    /// runner recorded already is left as it is: `false` in its place.
    pub fn insert(&mut self, run: &str, tests: &[TestRecord]) -> anyhow::Result<Vec<bool>> {
        self.transaction(|db| tests.iter().map(|t| db.insert_one(run, t)).collect())
    }

    fn insert_one(&mut self, run: &str, t: &TestRecord) -> anyhow::Result<bool> {
        let outcome = t.outcome();
        let tr = t.triage.as_ref();
        let dg = t.degraded.as_ref();
        let inserted = self.execute(
            "INSERT INTO campaign_tests (run, test_id, domain, title, outcome, layer, primitive, confidence,
                 explanation, evidence, duration_ms, runner, mcp_session, finished_ms, target)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)
             ON CONFLICT (run, test_id) DO NOTHING",
            &[
                sql(run),
                sql(&t.test_id),
                sql(&t.domain),
                sql(&t.title),
                sql(outcome.id()),
                tr.map(|x| x.layer)
                    .or(dg.and_then(|d| d.primitive.map(|p| p.layer())))
                    .map(|l| sql(l.id()))
                    .into(),
                tr.map(|x| x.primitive.id())
                    .or(dg.and_then(|d| d.primitive.map(|p| p.id())))
                    .map(sql)
                    .into(),
                tr.map(|x| x.confidence).into(),
                tr.map(|x| x.explanation.as_str())
                    .or(dg.map(|d| d.explanation.as_str()))
                    .or(t.unsupported.as_deref())
                    .map(sql)
                    .into(),
                tr.map(|x| x.evidence.to_string()).into(),
                t.duration_ms.into(),
                sql(&t.runner),
                t.mcp_session.clone().into(),
                (probe::clock::now_ms() as i64).into(),
                t.target.clone().into(),
            ],
        )? == 1;
        if self.is_postgres() {
            // the queue keeps only outstanding work, so claiming stays cheap
            // however many tests the run has
            self.execute(
                "DELETE FROM campaign_claims WHERE run = ?1 AND test_id = ?2",
                &[sql(run), sql(&t.test_id)],
            )?;
        }
        if !inserted {
            return Ok(false);
        }
        for (i, (tool, request, o)) in t.steps.iter().enumerate() {
            let (verdict, failures) = match o {
                None => ("not-run", Sql::Null),
                Some(o) if o.unsupported.is_some() => ("unsupported", json(&[&o.unsupported])),
                Some(o) if o.passed() => ("pass", Sql::Null),
                Some(o) => {
                    let all: Vec<&String> = o.interface.iter().chain(&o.failures).collect();
                    ("fail", json(&all))
                }
            };
            // the columns name the attribution; the JSON keeps any evidence
            let k = o.as_ref().and_then(StepOutcome::attribution);
            self.execute(
                "INSERT INTO campaign_steps (run, test_id, step, tool, request, response_sha256, response_bytes,
                     duration_ms, is_error, verdict, failures, span_id, kernel_failed, kernel_primitive, kernel, degraded,
                     unchecked, target_call)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
                &[
                    sql(run),
                    sql(&t.test_id),
                    (i as i64).into(),
                    sql(tool),
                    Sql::Text(request.to_string()),
                    o.as_ref().and_then(|o| o.response_sha256.clone()).into(),
                    o.as_ref()
                        .and_then(|o| o.response_bytes.map(|b| b as i64))
                        .into(),
                    o.as_ref().map_or(0.0, |o| o.duration_ms).into(),
                    o.as_ref().and_then(|o| o.is_error).into(),
                    sql(verdict),
                    failures,
                    k.and_then(|k| k["span"].as_i64()).into(),
                    k.and_then(|k| k["failed"].as_bool()).into(),
                    k.and_then(|k| k["primitive"].as_str()).map(sql).into(),
                    o.as_ref()
                        .and_then(|o| o.kernel.as_ref())
                        .map(Value::to_string)
                        .into(),
                    o.as_ref()
                        .filter(|o| !o.degraded.is_empty())
                        .map(|o| json(&o.degraded))
                        .unwrap_or(Sql::Null),
                    o.as_ref()
                        .filter(|o| !o.unchecked.is_empty())
                        .map(|o| json(&o.unchecked))
                        .unwrap_or(Sql::Null),
                    o.as_ref()
                        .and_then(|o| o.target_call.as_ref())
                        .map(Value::to_string)
                        .into(),
                ],
            )?;
        }
        // kept for the tests a report lists (failed or degraded) only
        if outcome != Outcome::Pass {
            for (i, (_, _, o)) in t.steps.iter().enumerate() {
                if let Some((mime, data)) = o.as_ref().and_then(|o| o.artifact.as_ref()) {
                    self.execute(
                        "INSERT INTO campaign_artifacts (run, test_id, step, mime, data) VALUES (?1, ?2, ?3, ?4, ?5)",
                        &[
                            sql(run),
                            sql(&t.test_id),
                            (i as i64).into(),
                            sql(mime),
                            Sql::Blob(data.clone()),
                        ],
                    )?;
                }
            }
        }
        Ok(true)
    }
}
