//! The evidence benchmark (`cargo xtask bench --only evidence`): what
//! leaving the probe on costs in disk and I/O, measured in one run against
//! today's behaviour (every event of every span kept, the cap cut by
//! whole-file VACUUMs).
//!
//! Three campaigns of the same generated suite, each with a fresh daemon:
//! `keep_events = "all"` (what the store kept before), the default, and the
//! default under a small cap. Sizes are read from the files, the store's
//! work from `probe status`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::campaign::Lab;

/// The small cap of the third run.
const SMALL_CAP: u64 = 1 << 20;

/// What one campaign left in the evidence DB.
struct Evidence {
    bytes: u64,
    spans: u64,
    /// (spans, bytes apportioned) of the successful spans, and of the
    /// failed ones.
    plain: (u64, f64),
    explaining: (u64, f64),
    events: u64,
    /// Events the store counted instead of keeping (`drops.not_kept`).
    not_kept: u64,
    status: Value,
}

impl Evidence {
    fn per_span(class: (u64, f64)) -> f64 {
        class.1 / class.0.max(1) as f64
    }
}

fn file_bytes(db: &Path) -> u64 {
    let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    len(db) + len(&db.with_extension("db-wal"))
}

/// `probe status --json` once the store queue is empty.
fn settled_status(lab: &Lab) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new(lab.probe_bin())
            .args(["status", "--json", "--socket"])
            .arg(lab.socket())
            .output()?;
        let status: Value = serde_json::from_slice(&out.stdout).context("probe status --json")?;
        if status["db"]["store_queue"] == 0 {
            return Ok(status);
        }
        if Instant::now() > deadline {
            bail!("the store queue never emptied: {}", status["db"]);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the suite against a fresh daemon with `config` (TOML) and reads
/// what its evidence DB holds.
fn campaign(name: &str, config: &str, suite_tests: usize) -> anyhow::Result<Evidence> {
    let lab = Lab::start_with(name, config)?;
    let suite = lab.generate(suite_tests)?;
    let results = lab.dir.join("results.db");
    eprintln!("\n== evidence: {suite_tests} tests, daemon config {config:?}");
    lab.run(&suite, &results, "clean", &[], 8)?;
    let status = settled_status(&lab)?;
    let db = lab.dir.join("evidence.db");
    let bytes = file_bytes(&db);
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    // each span's rows as stored (payload bytes); the file's bytes are
    // shared out in proportion, so indexes and free space are counted
    let classes: Vec<(bool, u64, f64)> = conn
        .prepare(
            "SELECT a.failed AS x, COUNT(*),
                    SUM(length(a.object) + COALESCE(length(a.decisive), 0) + length(s.label)
                        + (SELECT COALESCE(SUM(length(e.detail) + length(e.comm) + length(e.kind)
                                              + COALESCE(length(e.path), 0) + 24), 0)
                           FROM events e WHERE e.probe_id = s.probe_id AND e.span_id = s.id))
             FROM spans s JOIN attributions a ON a.probe_id = s.probe_id AND a.span_id = s.id
             GROUP BY x",
        )?
        .query_map([], |r| {
            Ok((
                r.get::<_, bool>(0)?,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, f64>(2)?,
            ))
        })?
        .collect::<Result<_, _>>()?;
    let payload: f64 = classes.iter().map(|c| c.2).sum::<f64>().max(1.0);
    let class = |x: bool| {
        classes
            .iter()
            .find(|c| c.0 == x)
            .map_or((0, 0.0), |c| (c.1, c.2 / payload * bytes as f64))
    };
    let events: i64 = conn.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))?;
    let spans: i64 = conn.query_row("SELECT COUNT(*) FROM spans", [], |r| r.get(0))?;
    let not_kept: i64 = conn.query_row(
        "SELECT COALESCE(SUM(json_extract(object, '$.drops.not_kept')), 0) FROM attributions",
        [],
        |r| r.get(0),
    )?;
    Ok(Evidence {
        bytes,
        spans: spans as u64,
        plain: class(false),
        explaining: class(true),
        events: events as u64,
        not_kept: not_kept as u64,
        status,
    })
}

/// Seconds a whole-file VACUUM of a copy of `db` takes: what the old
/// retention ran in the store thread after each cut (up to 20 a pass).
fn vacuum_seconds(db: &Path) -> anyhow::Result<f64> {
    let copy = db.with_extension("vacuum-copy.db");
    let _ = std::fs::remove_file(&copy);
    {
        let src = rusqlite::Connection::open(db)?;
        src.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
    }
    std::fs::copy(db, &copy)?;
    let conn = rusqlite::Connection::open(&copy)?;
    let t = Instant::now();
    conn.execute_batch("VACUUM")?;
    let s = t.elapsed().as_secs_f64();
    drop(conn);
    std::fs::remove_file(&copy)?;
    Ok(s)
}

fn mib(bytes: f64) -> f64 {
    bytes / (1u64 << 20) as f64
}

pub fn bench(count: usize) -> anyhow::Result<String> {
    let before = campaign(
        "evidence-all",
        "[retention]\nkeep_events = \"all\"\n",
        count,
    )?;
    let old_vacuum_s =
        vacuum_seconds(&crate::workspace_root().join("target/evidence-all/evidence.db"))?;
    let now = campaign("evidence-default", "", count)?;
    let small_tests = (count / 2).max(30);
    let capped = campaign(
        "evidence-capped",
        &format!("[retention]\nmax_db_bytes = {SMALL_CAP}\n"),
        small_tests,
    )?;
    let stat = |e: &Evidence, k: &str| e.status["db"][k].as_f64().unwrap_or(0.0);
    let busy_s = |e: &Evidence| (stat(e, "store_busy_ms") / 1e3).max(1e-9);
    // events the store handled: written, or counted as not kept
    let seen_rate = |e: &Evidence| (stat(e, "events_stored") + e.not_kept as f64) / busy_s(e);
    let span_rate = |e: &Evidence| stat(e, "stored_spans") / busy_s(e);
    let plain_now = Evidence::per_span(now.plain);
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let capped_explaining_removed = capped.status["db"]["retention_removed"]["explaining_spans"]
        .as_u64()
        .unwrap_or(0);
    Ok(format!(
        "## Evidence on disk\n\n\
         `cargo xtask bench --only evidence`: the campaign's {count} generated tests (seed 1, clean \
         profile, 8 workers, one bridge over Streamable HTTP on loopback) three times, each against \
         a fresh probe daemon: with `keep_events = \"all\"` (every event of every span, as the store \
         kept before), with the defaults (a span that explains nothing keeps its figures, no event; one \
         that explains keeps its lineage and its evidence's failures, not the lookups it got past), and {small_tests} tests under a cap of \
         {cap} MiB. Bytes per span: the DB file and WAL shared out over the spans in proportion to \
         their rows; the WAL is checkpointed at 1000 pages (4 MiB) under the default 1 GiB budget. \
         Store-thread time: what `probe status` counts as `store_busy_ms` (writing batches and making \
         room). Targets: a successful call ≤ 2 KB, a clean {count}-test campaign's evidence \
         ≤ 10 MB, the cap held with no stall of a second.\n\n\
         | measure | keep every event (before) | default (now) | ratio | target |\n|---|---:|---:|---:|---|\n\
         | evidence DB after the campaign | {:.1} MiB | {:.2} MiB | {:.3}× | ≤ 10 MB: {} |\n\
         | spans / events stored | {} / {} | {} / {} | | |\n\
         | bytes per successful span | {:.0} B ({} spans) | {plain_now:.0} B ({} spans) | {:.3}× | ≤ 2 KB: {} |\n\
         | bytes per failed span | {:.0} B ({} spans) | {:.0} B ({} spans) | | lineage and evidence |\n\
         | events handled (stored, or counted as not kept) per second of store-thread time | {:.0} | {:.0} | {:.2}× | |\n\
         | spans stored per second of store-thread time | {:.0} | {:.0} | {:.2}× | |\n\
         | longest store-thread step (write + retention) | {:.1} ms | {:.1} ms | | |\n\n\
         **Under a {cap} MiB cap** ({small_tests} tests, defaults): the DB ended at {:.2} MiB \
         (file and WAL; {}), retention removed {} spans of which {capped_explaining_removed} \
         explained something, and the longest store-thread step was **{:.1} ms**. Before, each \
         cut of the cap ran a whole-file `VACUUM` in the store thread, up to 20 a pass: on the \
         evidence of the first run ({:.1} MiB) one VACUUM took **{old_vacuum_s:.2} s** here, and \
         needed as much free disk again as the file.\n",
        mib(before.bytes as f64),
        mib(now.bytes as f64),
        now.bytes as f64 / before.bytes.max(1) as f64,
        verdict(now.bytes <= 10_000_000),
        before.spans,
        before.events,
        now.spans,
        now.events,
        Evidence::per_span(before.plain),
        before.plain.0,
        now.plain.0,
        plain_now / Evidence::per_span(before.plain).max(1.0),
        verdict(plain_now <= 2048.0),
        Evidence::per_span(before.explaining),
        before.explaining.0,
        Evidence::per_span(now.explaining),
        now.explaining.0,
        seen_rate(&before),
        seen_rate(&now),
        seen_rate(&now) / seen_rate(&before),
        span_rate(&before),
        span_rate(&now),
        span_rate(&now) / span_rate(&before),
        stat(&before, "longest_write_ms"),
        stat(&now, "longest_write_ms"),
        mib(capped.bytes as f64),
        verdict(capped.bytes <= SMALL_CAP),
        capped.status["db"]["retention_removed"]["spans"],
        stat(&capped, "longest_write_ms"),
        mib(before.bytes as f64),
        cap = SMALL_CAP >> 20,
    ))
}
