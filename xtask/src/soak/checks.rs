//! The planned moments and what each must show. After a `kill -9`: the DB
//! is intact and holds every span stored before (less what retention
//! logged removing), nothing the killed process started is left, and the
//! restarted process serves the next call with kernel evidence. Under a
//! full disk: the workload's own write gets the space, the daemon keeps
//! serving and counts what it could not store. At the end: every test of
//! every run once, every tool call with kernel evidence or a reason, and
//! no span left open once the load has stopped.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rusqlite::OpenFlags;

use super::fleet::{Fleet, Role, dies_with_the_soak};
use super::load::Load;
use super::sample;

/// The longest a call of the load runs (the bridges' default call timeout
/// is 60 s), and a margin.
const SPANS_END_WITHIN: Duration = Duration::from_secs(90);

pub enum Moment {
    Kill(Role),
    FullDisk,
}

impl Moment {
    pub fn name(&self) -> String {
        match self {
            Moment::Kill(r) => format!("kill -9 the {}", r.name()),
            Moment::FullDisk => "fill the DB's filesystem".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Check {
    /// Seconds into the soak.
    pub at: f64,
    pub what: String,
    pub passed: bool,
    pub detail: String,
}

/// (seconds into the soak, label) of each moment, for the plots.
pub struct Timeline {
    started: Instant,
    pub marks: Vec<(f64, String)>,
    pub checks: Vec<Check>,
}

impl Timeline {
    pub fn new(started: Instant) -> Timeline {
        Timeline {
            started,
            marks: Vec::new(),
            checks: Vec::new(),
        }
    }

    fn check(&mut self, what: impl Into<String>, passed: bool, detail: impl Into<String>) {
        self.checks.push(Check {
            at: self.started.elapsed().as_secs_f64(),
            what: what.into(),
            passed,
            detail: detail.into(),
        });
    }

    pub fn run(&mut self, fleet: &Fleet, moment: &Moment) {
        let t = self.started.elapsed().as_secs_f64();
        match moment {
            Moment::Kill(role) => {
                self.marks.push((t, format!("kill -9 {}", role.name())));
                self.kill(fleet, *role);
            }
            Moment::FullDisk => {
                self.marks.push((t, "disk full".into()));
                self.full_disk(fleet);
                let end = self.started.elapsed().as_secs_f64();
                self.marks.push((end, "disk freed".into()));
            }
        }
    }

    fn kill(&mut self, fleet: &Fleet, role: Role) {
        let name = role.name();
        let before = stored_spans(&fleet.db);
        let snapshot_ms = now_ms();
        let Some(pid) = fleet.pid(role) else {
            self.check(
                format!("{name}: running before its kill"),
                false,
                "it was not running",
            );
            return;
        };
        let left_behind = descendants(pid);
        fleet.kill(role);
        if role == Role::Daemon {
            // read with nobody writing: the DB as the kill left it
            match (before, integrity(&fleet.db), stored_spans(&fleet.db)) {
                (Ok(before), Ok(integrity), Ok(after)) => {
                    self.check(
                        "daemon killed: PRAGMA integrity_check",
                        integrity == "ok",
                        integrity,
                    );
                    let missing = before.difference(&after).count() as u64;
                    let retention = removed_since(&fleet.db, snapshot_ms).unwrap_or(0);
                    self.check(
                        "daemon killed: every span stored before the kill is there",
                        missing <= retention,
                        format!(
                            "{} spans before, {} after; {missing} missing, {retention} removed by retention meanwhile",
                            before.len(),
                            after.len()
                        ),
                    );
                }
                (b, i, a) => self.check(
                    "daemon killed: the DB can be read",
                    false,
                    format!("{:?} / {:?} / {:?}", b.err(), i.err(), a.err()),
                ),
            }
        }
        let restarted = fleet.spawn(role);
        self.check(
            format!("{name} restarted"),
            restarted.is_ok(),
            restarted
                .err()
                .map_or("answers".into(), |e| format!("{e:#}")),
        );
        // a supervisor's grace: what the killed process started must be
        // gone within it (the new bridge sweeps its predecessor's cgroups)
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut alive: Vec<Proc> = left_behind.clone();
        while Instant::now() < deadline {
            alive.retain(Proc::alive);
            if alive.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        self.check(
            format!("{name} killed: nothing it started is left running"),
            alive.is_empty(),
            if alive.is_empty() {
                format!("{} processes it had started are gone", left_behind.len())
            } else {
                format!(
                    "left running: {}",
                    alive
                        .iter()
                        .map(|p| format!("{} ({})", p.pid, p.comm))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
        );
        let call = next_call(fleet, role, &ECHO);
        self.check(
            format!("{name} restarted: the next call is served with kernel evidence"),
            call.served,
            call.detail,
        );
    }

    fn full_disk(&mut self, fleet: &Fleet) {
        let filler = fleet.fs.join("filler");
        let keep = 1 << 20;
        let free = sample::free_bytes(&fleet.fs);
        let errors_before = status_u64(fleet, "/db/store_errors");
        let budget_before = status_u64(fleet, "/db/budget_bytes");
        let filled = fill(&filler, free.saturating_sub(keep));
        self.check(
            "disk full: the DB's filesystem filled to its last megabyte",
            filled.is_ok(),
            match &filled {
                Ok(()) => format!(
                    "{} MiB filled, {} KiB left",
                    free.saturating_sub(keep) >> 20,
                    sample::free_bytes(&fleet.fs) >> 10
                ),
                Err(e) => e.to_string(),
            },
        );
        // the load runs on; the daemon must go on serving meanwhile
        std::thread::sleep(Duration::from_secs(10));
        // the workload's own write of half the space left gets it
        let wrote = std::fs::write(fleet.fs.join("workload-output"), vec![7u8; 512 << 10]);
        self.check(
            "disk full: the workload's own write gets the space",
            wrote.is_ok(),
            wrote
                .as_ref()
                .map_or_else(|e| e.to_string(), |()| "512 KiB written".into()),
        );
        std::thread::sleep(Duration::from_secs(10));
        let budget = status_u64(fleet, "/db/budget_bytes");
        self.check(
            "disk full: the evidence budget shrinks",
            matches!((budget_before, budget), (Some(b), Some(a)) if a < b),
            format!("budget {budget_before:?} bytes before, {budget:?} under the full disk"),
        );
        // a call whose span explains a failure: retention removes those
        // only when no span that explains nothing is left (RETENTION.md)
        let call_started_ms = now_ms() as i64;
        let call = next_call(fleet, Role::Bridge, &MISSING_FILE);
        self.check(
            "disk full: the daemon keeps serving calls",
            call.served,
            call.detail,
        );
        // the call's span, once the store thread has taken it: in the DB,
        // counted as not stored, or removed by retention once nothing but
        // spans that explain was left (logged); anything else is evidence
        // lost silently
        let drained = store_drained(fleet, Duration::from_secs(10));
        let errors = status_u64(fleet, "/db/store_errors");
        let in_db = call.span.map(|span| span_in_db(&fleet.db, span));
        let counted = matches!((errors_before, errors), (Some(b), Some(a)) if a > b);
        let explaining_removed = explaining_removed_since(&fleet.db, call_started_ms);
        self.check(
            "disk full: the call's span is stored, or counted as not stored",
            drained
                && (matches!(in_db, Some(Ok(true)))
                    || counted
                    || matches!(explaining_removed, Ok(n) if n > 0)),
            format!(
                "span {:?}: in the DB {in_db:?}; store errors {errors_before:?} before, {errors:?} after; spans that explained something removed by retention since the call: {explaining_removed:?}; store queue drained: {drained}",
                call.span
            ),
        );
        let _ = std::fs::remove_file(&filler);
        let _ = std::fs::remove_file(fleet.fs.join("workload-output"));
        std::thread::sleep(Duration::from_secs(5));
        let integrity = integrity(&fleet.db);
        self.check(
            "disk freed: PRAGMA integrity_check",
            integrity.as_deref().is_ok_and(|s| s == "ok"),
            format!("{integrity:?}"),
        );
    }

    /// The checks over the whole run: every run whole, every call judged.
    pub fn finish(&mut self, fleet: &Fleet, load: &Load) {
        for l in &load.loops {
            let whole = runs_whole(&l.results, load.tests_per_run);
            let ok = whole.as_ref().is_ok_and(|bad| bad.is_empty()) && l.errors.is_empty();
            self.check(
                format!("{} loop: every run holds every test once", l.name),
                ok && !l.runs.is_empty(),
                format!(
                    "{} runs of {} tests finished, {} resumed after a kill; {}{}",
                    l.runs.len(),
                    load.tests_per_run,
                    l.resumes,
                    match &whole {
                        Ok(bad) if bad.is_empty() => "none lost or duplicated".to_string(),
                        Ok(bad) => format!("wrong: {}", bad.join(", ")),
                        Err(e) => e.to_string(),
                    },
                    if l.errors.is_empty() {
                        String::new()
                    } else {
                        format!("; errors: {}", l.errors.join("; "))
                    }
                ),
            );
            let judged = calls_judged(&l.results);
            self.check(
                format!("{} loop: every tool call has kernel evidence or a stated reason", l.name),
                judged.as_ref().is_ok_and(|j| j.neither == 0 && j.calls > 0),
                match judged {
                    Ok(j) => format!(
                        "{} calls: {} with kernel evidence, {} with a reason it is unavailable, {} with neither",
                        j.calls, j.evidence, j.reason, j.neither
                    ),
                    Err(e) => e.to_string(),
                },
            );
        }
        // a span outlives its call only by a leak: with the load stopped
        // and its clients gone, every open span ends (a call still running
        // ends by its own timeout)
        let waited = Instant::now();
        let open = loop {
            let open = sample::status(fleet).and_then(|s| s["open_spans"].as_u64());
            if open == Some(0) || waited.elapsed() >= SPANS_END_WITHIN {
                break open;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        self.check(
            "once the load stops, no span stays open",
            open == Some(0),
            match open {
                Some(0) => format!(
                    "none open {:.1} s after the last client finished",
                    waited.elapsed().as_secs_f64()
                ),
                Some(n) => format!(
                    "{n} still open {} s after the last client finished",
                    SPANS_END_WITHIN.as_secs()
                ),
                None => "the daemon did not answer `probe status`".into(),
            },
        );
        let st = sample::status(fleet);
        let drops = st
            .as_ref()
            .and_then(|s| s["drops"]["kernel_total"].as_u64());
        self.check(
            "drops are counted, never silent",
            drops.is_some(),
            format!(
                "the daemon's last life: {} events, {} dropped and counted, {} late",
                st.as_ref()
                    .map_or(0, |s| s["events_total"].as_u64().unwrap_or(0)),
                drops.unwrap_or(0),
                st.as_ref()
                    .map_or(0, |s| s["late_events"].as_u64().unwrap_or(0))
            ),
        );
    }
}

/// Whether the wall clock was stepped, and why not.
pub fn clock_step() -> String {
    "not stepped. CLOCK_REALTIME is one clock for the whole machine: time \
     namespaces offset only CLOCK_MONOTONIC and CLOCK_BOOTTIME, so a step \
     cannot be confined to the soak's processes, and in CI the soak runs \
     beside the image tests, whose guests, ssh and dpkg read the same clock. \
     Spans time their calls and events with the monotonic clock (an event's \
     `ts_ns`); the wall clock stamps them (`started_ms`) and drives \
     retention by age, which a step forward would make remove spans early: \
     that is not tested here."
        .into()
}

/// A call through the restarted `role` (or through the bridge, for the
/// daemon): a one-test campaign, passed, its call with kernel evidence.
/// The next call's outcome, and its span when it had one.
struct NextCall {
    served: bool,
    detail: String,
    span: Option<u64>,
}

/// A call a check makes: its command and the exit code that passes.
struct Call {
    title: &'static str,
    command: &'static str,
    exit_code: i64,
}

/// A call that works.
const ECHO: Call = Call {
    title: "echo after a restart",
    command: "echo soak",
    exit_code: 0,
};

/// A call whose span explains a failure: a file that is not there.
const MISSING_FILE: Call = Call {
    title: "a missing file under the full disk",
    command: "cat /soak-no-such-file",
    exit_code: 1,
};

fn next_call(fleet: &Fleet, role: Role, call: &Call) -> NextCall {
    let dir = fleet.dir.join(format!("next-call-{}", now_ms()));
    let suite = dir.join("suite");
    let _ = std::fs::create_dir_all(&suite);
    let test = serde_json::json!({
        "id": "soak-0001", "domain": "process", "title": call.title,
        "steps": [{"tool": "exec", "arguments": {"command": call.command, "timeout_ms": 30000},
                   "expect": {"exit_code": call.exit_code}}]
    });
    let _ = std::fs::write(suite.join("soak-0001.json"), test.to_string());
    let (target, adapter) = match role {
        Role::Proxy => (
            fleet.proxy_url(),
            Some(crate::workspace_root().join("agent-bridge/adapters/agent-bridge.toml")),
        ),
        Role::Daemon | Role::Bridge => (fleet.bridge_url(), None),
    };
    let results = dir.join("results.db");
    let mut cmd = Command::new(fleet.agent_bridge());
    dies_with_the_soak(&mut cmd)
        .env_remove("LD_LIBRARY_PATH")
        .args(["campaign", "run", "--suite"])
        .arg(&suite)
        .args(["--target", &target, "--db"])
        .arg(&results)
        .args(["--run", "next", "--no-bar"]);
    if let Some(a) = adapter {
        cmd.arg("--adapter").arg(a);
    }
    let out = cmd.output();
    let row: Result<(String, Option<String>), String> = (|| {
        let out = out.map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        let db = rusqlite::Connection::open(&results).map_err(|e| e.to_string())?;
        db.query_row(
            "SELECT t.outcome, s.kernel FROM campaign_tests t JOIN campaign_steps s USING (run, test_id)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(|e| e.to_string())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    match row {
        Ok((outcome, kernel)) => {
            let kernel: serde_json::Value = kernel
                .and_then(|k| serde_json::from_str(&k).ok())
                .unwrap_or_default();
            let evidence = kernel["available"] == true;
            NextCall {
                served: outcome == "pass" && evidence,
                span: kernel["span"].as_u64(),
                detail: format!(
                    "the call {}, kernel evidence {}",
                    if outcome == "pass" {
                        "passed"
                    } else {
                        "failed"
                    },
                    if evidence {
                        "available".to_string()
                    } else {
                        format!("unavailable: {}", kernel["reason"])
                    }
                ),
            }
        }
        Err(detail) => NextCall {
            served: false,
            detail,
            span: None,
        },
    }
}

/// Waits until the daemon's store thread has taken every ended span.
fn store_drained(fleet: &Fleet, patience: Duration) -> bool {
    let until = Instant::now() + patience;
    while Instant::now() < until {
        if status_u64(fleet, "/db/store_queue") == Some(0) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// Spans that explained something which retention removed at or after
/// `since_ms` (its log).
fn explaining_removed_since(db: &Path, since_ms: i64) -> rusqlite::Result<i64> {
    read_only(db)?.query_row(
        "SELECT COALESCE(SUM(spans_removed), 0) FROM retention_log
         WHERE reason = 'size-explaining' AND at_ms >= ?1",
        [since_ms],
        |r| r.get(0),
    )
}

fn span_in_db(db: &Path, span: u64) -> rusqlite::Result<bool> {
    read_only(db)?.query_row(
        "SELECT count(*) FROM spans WHERE id = ?1",
        [span as i64],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )
}

/// The (probe, span id) pairs stored.
fn stored_spans(db: &Path) -> rusqlite::Result<BTreeSet<(String, i64)>> {
    let conn = read_only(db)?;
    let mut stmt = conn.prepare("SELECT probe_id, id FROM spans")?;
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect()
}

fn integrity(db: &Path) -> rusqlite::Result<String> {
    read_only(db)?.query_row("PRAGMA integrity_check", [], |r| r.get(0))
}

/// Spans retention logged removing since `ms`.
fn removed_since(db: &Path, ms: u64) -> rusqlite::Result<u64> {
    read_only(db)?.query_row(
        "SELECT IFNULL(SUM(spans_removed), 0) FROM retention_log WHERE at_ms >= ?1",
        [ms as i64 - 1000],
        |r| r.get::<_, i64>(0).map(|n| n as u64),
    )
}

fn read_only(db: &Path) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

/// A run's tests that are missing or there twice.
fn runs_whole(results: &Path, tests: usize) -> rusqlite::Result<Vec<String>> {
    let conn = read_only(results)?;
    let mut stmt = conn.prepare(
        "SELECT r.id, COUNT(t.test_id), COUNT(DISTINCT t.test_id) FROM campaign_runs r
         LEFT JOIN campaign_tests t ON t.run = r.id GROUP BY r.id",
    )?;
    let rows: Vec<(String, i64, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    Ok(rows
        .into_iter()
        // the run in progress when the load stopped is whole or resumable
        .filter(|(_, n, d)| *n != tests as i64 || *d != *n)
        .map(|(id, n, d)| format!("{id}: {n} rows, {d} distinct of {tests}"))
        .collect())
}

struct Judged {
    calls: u64,
    evidence: u64,
    reason: u64,
    neither: u64,
}

fn calls_judged(results: &Path) -> rusqlite::Result<Judged> {
    let conn = read_only(results)?;
    conn.query_row(
        "SELECT COUNT(*),
                SUM(json_extract(kernel, '$.available') = 1),
                SUM(json_extract(kernel, '$.available') = 0 AND json_extract(kernel, '$.reason') IS NOT NULL),
                SUM(kernel IS NULL OR (json_extract(kernel, '$.available') IS NOT 1
                    AND json_extract(kernel, '$.reason') IS NULL))
         FROM campaign_steps WHERE verdict != 'not-run' AND verdict != 'unsupported'",
        [],
        |r| {
            let n = |i| r.get::<_, Option<i64>>(i).map(|v| v.unwrap_or(0) as u64);
            Ok(Judged {
                calls: n(0)?,
                evidence: n(1)?,
                reason: n(2)?,
                neither: n(3)?,
            })
        },
    )
}

fn status_u64(fleet: &Fleet, pointer: &str) -> Option<u64> {
    sample::status(fleet)?.pointer(pointer)?.as_u64()
}

/// Writes `bytes` of allocated space (fallocate: no page is written).
fn fill(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let f = std::fs::File::create(path)?;
    // SAFETY: a valid fd; fallocate writes no memory of ours.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A process, by pid and start time (a pid may be reused).
#[derive(Clone)]
struct Proc {
    pid: u32,
    start: u64,
    comm: String,
}

impl Proc {
    fn read(pid: u32) -> Option<Proc> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (head, rest) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_string();
        // field 22 (starttime) is the 20th after the command name
        let start = rest.split_whitespace().nth(19)?.parse().ok()?;
        Some(Proc { pid, start, comm })
    }

    fn alive(&self) -> bool {
        Proc::read(self.pid).is_some_and(|p| p.start == self.start && !zombie(self.pid))
    }
}

fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Every process below `pid`, now.
fn descendants(pid: u32) -> Vec<Proc> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for task in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for c in children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                if let Some(proc) = Proc::read(c) {
                    out.push(proc);
                    queue.push(c);
                }
            }
        }
    }
    out
}
