//! Results ingest (`cargo bench -p agent-bridge-campaign --bench ingest`, run by
//! `cargo xtask bench --only fleet`): the campaign writer's own code path
//! (`Db::insert`) storing synthetic tests of 3 steps, into SQLite and into
//! a PostgreSQL cluster started here, from 1 and from 4 writers (runner
//! processes) at once, one test per transaction and 16 at a time (the
//! writer groups tests that queue up). Prints a Markdown section.

#[path = "../../../xtask/src/pgcluster.rs"]
#[allow(dead_code)]
mod pgcluster;

use std::time::Instant;

use campaign::db::{Db, Location, RunRow};
use campaign::record::{Cause, Layer, Primitive, StepOutcome, TestRecord, Triage};
use serde_json::json;

const TESTS: usize = 3000;
const STEPS: usize = 3;

/// A test like the campaign's: 3 steps with their requests and kernel
/// attributions; every fifth fails with its triage evidence.
fn record(run: &str, i: usize, writer: usize) -> TestRecord {
    let failed = i.is_multiple_of(5);
    let kernel = json!({
        "available": true, "session": format!("{run}-{writer}-{i}"), "span": i, "failed": failed,
        "primitive": if failed { "fs.readonly" } else { "none" }, "layer": "sandbox", "confidence": 0.95,
        "explanation": "openat(\"/data/out.txt\") failed with EROFS in sh (pid 4242): the path is on a read-only mount",
        "decisive": {"ts_ns": 123456789, "kind": "syscall_failed", "pid": 4242, "comm": "sh", "syscall": "openat", "errno": "EROFS", "path": "/data/out.txt"},
        "drops": {"kernel": 0, "retention": 0}
    });
    let steps = (0..STEPS)
        .map(|s| {
            (
                "exec".to_string(),
                json!({"command": format!("printf '%s' step-{s} > /data/out-{i}.txt && cat /data/out-{i}.txt"), "timeout_ms": 10000}),
                Some(StepOutcome {
                    kernel: Some(kernel.clone()),
                    response_sha256: Some(format!("{:064x}", i * 7 + s)),
                    response_bytes: Some(412),
                    duration_ms: 14.5,
                    is_error: Some(failed && s == STEPS - 1),
                    failures: if failed && s == STEPS - 1 {
                        vec!["exit_code: expected 0, got 1".into()]
                    } else {
                        vec![]
                    },
                    ..Default::default()
                }),
            )
        })
        .collect();
    TestRecord {
        test_id: format!("files-{writer}-{i:05}"),
        domain: "files".into(),
        title: "write a file and read it back".into(),
        triage: failed.then(|| Triage {
            layer: Layer::Sandbox,
            primitive: Cause::Kernel(Primitive::FsReadonly),
            confidence: 0.95,
            explanation: "the path is on a read-only mount".into(),
            evidence: json!({"step": 2, "kernel": kernel}),
        }),
        degraded: None,
        unsupported: None,
        duration_ms: 45.0,
        runner: format!("{writer}/w0"),
        mcp_session: Some(format!("{run}-{writer}-{i}")),
        target: None,
        steps,
    }
}

fn new_run(db: &mut Db, run: &str, total: usize) {
    let row = RunRow {
        id: run.into(),
        label: run.into(),
        target: "bench".into(),
        suite: "synthetic".into(),
        suite_digest: "0".repeat(64),
        tests_total: total as i64,
        profile: None,
        injected: None,
        started_ms: 0,
        finished_ms: None,
        adapter: None,
    };
    db.create_run(&row, &[]).unwrap();
}

/// `writers` threads, each with its own connection, insert `TESTS /
/// writers` tests each, `batch` per transaction. Step rows per second.
fn ingest(at: &Location, run: &str, writers: usize, batch: usize) -> f64 {
    new_run(&mut Db::open(at).unwrap(), run, TESTS);
    let per = TESTS / writers;
    let started = Instant::now();
    std::thread::scope(|s| {
        for w in 0..writers {
            s.spawn(move || {
                let mut db = Db::open(at).unwrap();
                let records: Vec<TestRecord> = (0..per).map(|i| record(run, i, w)).collect();
                for chunk in records.chunks(batch) {
                    let fresh = db.insert(run, chunk).unwrap();
                    assert!(fresh.iter().all(|f| *f));
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    (per * writers * STEPS) as f64 / secs
}

fn main() {
    let scratch = std::env::temp_dir().join(format!("ingest-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let cluster = pgcluster::Cluster::start(&scratch);
    let pg = Location::Postgres(cluster.url("ingest"));
    let lite_file = scratch.join("results.db");
    let lite = Location::Sqlite(lite_file.clone());

    let rows = [
        ("SQLite (WAL, synchronous=NORMAL)", &lite, 1, 1),
        ("SQLite (WAL, synchronous=NORMAL)", &lite, 1, 16),
        ("PostgreSQL 15 (loopback, fsync=off)", &pg, 1, 1),
        ("PostgreSQL 15 (loopback, fsync=off)", &pg, 4, 1),
        ("PostgreSQL 15 (loopback, fsync=off)", &pg, 4, 16),
    ];
    let mut table = String::new();
    let mut pg_best: f64 = 0.0;
    let mut sqlite_one = 0.0;
    for (i, (name, at, writers, batch)) in rows.iter().enumerate() {
        let run = format!("ingest-{i}");
        let rate = ingest(at, &run, *writers, *batch);
        eprintln!("ingest: {name}, {writers} writers, {batch}/tx: {rate:.0} step rows/s");
        if matches!(at, Location::Postgres(_)) {
            pg_best = pg_best.max(rate);
        } else if *batch == 1 {
            sqlite_one = rate;
        }
        table.push_str(&format!(
            "| {name} | {writers} | {batch} | {rate:.0} | {:.0} |\n",
            rate / STEPS as f64
        ));
    }
    // growth: bytes per 1,000 tests (3 steps each), tables and indexes
    let pg_bytes: f64 = cluster
        .psql(
            "ingest",
            "SELECT SUM(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname LIKE 'campaign_%'",
        )
        .trim()
        .parse()
        .unwrap_or(0.0);
    let pg_tests: f64 = cluster
        .psql("ingest", "SELECT COUNT(*) FROM campaign_tests")
        .trim()
        .parse()
        .unwrap_or(1.0);
    let conn = rusqlite::Connection::open(&lite_file).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let lite_tests: f64 = conn
        .query_row("SELECT COUNT(*) FROM campaign_tests", [], |r| r.get(0))
        .unwrap();
    let lite_bytes = std::fs::metadata(&lite_file).map_or(0, |m| m.len()) as f64;
    drop(conn);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&scratch);
    let mib_per_k = |bytes: f64, tests: f64| bytes / tests * 1000.0 / (1 << 20) as f64;
    println!(
        "### PostgreSQL ingest\n\n\
         `cargo bench -p agent-bridge-campaign --bench ingest`: the campaign writer's own code (`Db::insert`, one \
         statement per row, prepared once) storing {TESTS} synthetic tests of {STEPS} steps (requests, \
         kernel attributions, a triage on every fifth) per row below; a writer is a thread with its own \
         connection, as a runner process has. PostgreSQL is a cluster the benchmark starts on loopback \
         (fsync off: the disk of this VM is not what is measured). Target: ≥ 5,000 step rows/s into \
         PostgreSQL.\n\n\
         | store | writers | tests per transaction | step rows/s | tests/s |\n|---|---:|---:|---:|---:|\n\
         {table}\n\
         Best PostgreSQL rate: **{pg_best:.0} step rows/s** ({}; {:.2}× SQLite's one-writer rate). \
         Growth per 1,000 tests (3,000 steps): PostgreSQL {:.2} MiB (tables and indexes), SQLite {:.2} MiB.\n",
        if pg_best >= 5000.0 {
            "target met"
        } else {
            "target MISSED"
        },
        pg_best / sqlite_one.max(1.0),
        mib_per_k(pg_bytes, pg_tests),
        mib_per_k(lite_bytes, lite_tests),
    );
}
