//! Fleets: one run over several targets, runners sharing a run in a real
//! PostgreSQL cluster (started here), the same schema and reports as SQLite.

mod common;
#[path = "../../xtask/src/pgcluster.rs"]
mod pg;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{BRIDGE, Bridge, Opts, campaign, ok, probe_socket, root};
use serde_json::{Value, json};

/// Deterministic domains: the same suite gives the same outcomes.
const DOMAINS: &[&str] = &["files", "encoding", "process", "compute", "persistence"];

static CLUSTER: OnceLock<pg::Cluster> = OnceLock::new();

/// The cluster the tests share, started on first use. A static is never
/// dropped, so the server is stopped (and its directory removed) when the
/// test binary exits, not left running.
fn cluster() -> &'static pg::Cluster {
    extern "C" fn stop_cluster() {
        if let Some(c) = CLUSTER.get() {
            c.stop_and_remove();
        }
    }
    CLUSTER.get_or_init(|| {
        let cluster = pg::Cluster::start(&std::env::temp_dir());
        // SAFETY: registers a plain function for exit(3).
        unsafe { libc::atexit(stop_cluster) };
        cluster
    })
}

/// A client of database `db` of `cluster`.
fn client_of(cluster: &pg::Cluster, db: &str) -> postgres::Client {
    postgres::Client::connect(&cluster.url(db), postgres::NoTls).unwrap()
}

/// Generates `count` tests and keeps those of [`DOMAINS`].
fn suite(dir: &Path, count: usize) -> (PathBuf, usize) {
    let base = format!(
        "/tmp/fleet-test-{}",
        dir.file_name().unwrap().to_string_lossy()
    );
    common::generated_suite(dir, count, &base, DOMAINS)
}

fn runner(suite: &Path, targets: &[&str], db: &str, more: &[&str]) -> Command {
    let mut c = Command::new(BRIDGE);
    c.args(["campaign", "run", "--suite", suite.to_str().unwrap()]);
    for t in targets {
        c.args(["--target", t]);
    }
    c.args(["--db", db, "--no-bar"]).args(more);
    c
}

fn run_json(suite: &Path, targets: &[&str], db: &str, more: &[&str]) -> Value {
    let out = runner(suite, targets, db, more)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "campaign run {more:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn pg_count(c: &mut postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// (test_id → (outcome, layer, primitive)) from `campaign export --format jsonl`.
fn outcomes(db: &str, run: &str) -> BTreeMap<String, (String, String, String)> {
    let out = ok(&["export", "--db", db, "--run", run, "--format", "jsonl"]);
    out.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
            (s("test_id"), (s("outcome"), s("layer"), s("primitive")))
        })
        .collect()
}

#[test]
fn sqlite_and_postgresql_have_the_same_tables_columns_and_keys() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sqlite = probe::store::Store::open(&dir.path().join("r.db"))
        .unwrap()
        .into_connection();
    let url = cluster().url("schema");
    campaign::pg::Pg::connect(&url).unwrap();
    let mut pgc = client_of(cluster(), "schema");

    // SQLite: (table, column) → (type as PostgreSQL names it, not null, in key)
    let mut lite = BTreeMap::new();
    let tables: Vec<String> = sqlite
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for t in &tables {
        let mut stmt = sqlite
            .prepare(&format!(
                "SELECT name, type, \"notnull\", pk FROM pragma_table_info('{t}')"
            ))
            .unwrap();
        for row in stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, bool>(2)?,
                    r.get::<_, i64>(3)? > 0,
                ))
            })
            .unwrap()
        {
            let (name, ty, notnull, pk) = row.unwrap();
            let ty = match ty.as_str() {
                "INTEGER" => "bigint",
                "REAL" => "double precision",
                "BLOB" => "bytea",
                "TEXT" => "text",
                other => panic!("{t}.{name}: type {other}"),
            };
            // a key column is NOT NULL in PostgreSQL whatever SQLite says
            lite.insert((t.clone(), name), (ty.to_string(), notnull || pk, pk));
        }
    }
    let mut post = BTreeMap::new();
    for r in pgc
        .query(
            "SELECT c.table_name::text, c.column_name::text, c.data_type::text, c.is_nullable = 'NO',
                    EXISTS (SELECT 1 FROM information_schema.table_constraints k
                            JOIN information_schema.key_column_usage u
                              ON u.constraint_name = k.constraint_name AND u.table_name = k.table_name
                            WHERE k.constraint_type = 'PRIMARY KEY' AND k.table_name = c.table_name
                              AND u.column_name = c.column_name)
             FROM information_schema.columns c
             WHERE c.table_schema = 'public' AND c.table_name <> 'bridge_schema'",
            &[],
        )
        .unwrap()
    {
        post.insert(
            (r.get::<_, String>(0), r.get::<_, String>(1)),
            (r.get::<_, String>(2), r.get::<_, bool>(3), r.get::<_, bool>(4)),
        );
    }
    assert!(lite.len() > 80, "{} columns", lite.len());
    assert_eq!(lite, post, "the two schemas differ");
    // migrated once: the version is the number of migrations
    let version = pg_count(&mut pgc, "SELECT MAX(version) FROM bridge_schema");
    assert_eq!(version as usize, probe::store::migration_sources().len());
}

#[test]
fn runners_sharing_a_postgres_run_lose_and_duplicate_nothing_through_a_kill_9() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, n) = suite(dir.path(), 120);
    let (_bridge, url) = Bridge::start_http(&Opts {
        probe: true,
        ..Opts::default()
    });
    let db = cluster().url("shared");
    // the same suite into SQLite, one runner: the reference
    let lite = dir.path().join("results.db");
    let lite = lite.to_str().unwrap();
    run_json(&suite, &[&url], lite, &["--run", "one", "--workers", "4"]);

    let spawn = |quiet: bool| {
        let mut c = runner(&suite, &[&url], &db, &["--run", "shared", "--workers", "2"]);
        c.stdout(Stdio::null());
        if quiet {
            c.stderr(Stdio::null());
        }
        c.spawn().unwrap()
    };
    let mut runners: Vec<_> = (0..3).map(|i| spawn(i != 0)).collect();
    let victim = runners[2].id();
    let mut pgc = client_of(cluster(), "shared");
    let deadline = Instant::now() + Duration::from_secs(120);
    let by_victim = format!(
        "SELECT COUNT(*) FROM campaign_tests WHERE run = 'shared' AND runner LIKE '{victim}/%'"
    );
    loop {
        let ready: bool = pgc
            .query_one("SELECT to_regclass('campaign_tests') IS NOT NULL", &[])
            .unwrap()
            .get(0);
        if ready && pg_count(&mut pgc, &by_victim) >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the third runner recorded nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    let kept = pg_count(&mut pgc, &by_victim);
    // the others take over what it held once its heartbeat stops
    for (i, r) in runners.iter_mut().enumerate() {
        let status = r.wait().unwrap();
        if i < 2 {
            assert!(status.success(), "runner {i}: {status}");
        }
    }
    let rows = pg_count(
        &mut pgc,
        "SELECT COUNT(*) FROM campaign_tests WHERE run = 'shared'",
    );
    let distinct = pg_count(
        &mut pgc,
        "SELECT COUNT(DISTINCT test_id) FROM campaign_tests WHERE run = 'shared'",
    );
    assert_eq!(
        (rows, distinct),
        (n as i64, n as i64),
        "lost or duplicated tests"
    );
    assert_eq!(
        pg_count(&mut pgc, &by_victim),
        kept,
        "the victim's rows stayed"
    );
    // every test has all its steps or none
    let partial = pg_count(
        &mut pgc,
        "SELECT COUNT(*) FROM campaign_tests t WHERE run = 'shared' AND NOT EXISTS
             (SELECT 1 FROM campaign_steps s WHERE s.run = t.run AND s.test_id = t.test_id)",
    );
    assert_eq!(partial, 0);
    assert_eq!(
        pg_count(
            &mut pgc,
            "SELECT COUNT(*) FROM campaign_runs WHERE id = 'shared' AND finished_ms IS NOT NULL"
        ),
        1,
        "the run is complete"
    );
    let runners_seen = pg_count(
        &mut pgc,
        "SELECT COUNT(*) FROM campaign_runners WHERE run = 'shared'",
    );
    assert_eq!(runners_seen, 3);
    // a resume finds nothing left
    let s = run_json(&suite, &[&url], &db, &["--resume", "shared"]);
    assert_eq!(s["already_recorded"].as_i64(), Some(n as i64));
    assert_eq!(s["recorded"].as_i64(), Some(0));
    assert_eq!(s["complete"], true);

    // the same outcomes as the SQLite run, through the same reports
    assert_eq!(outcomes(lite, "one"), outcomes(&db, "shared"));
    let report: Value =
        serde_json::from_str(&ok(&["report", "--db", &db, "--run", "shared", "--json"])).unwrap();
    assert_eq!(report["run"]["recorded"].as_i64(), Some(n as i64));
    let lite_report: Value =
        serde_json::from_str(&ok(&["report", "--db", lite, "--run", "one", "--json"])).unwrap();
    assert_eq!(report["domains"], lite_report["domains"]);
    assert_eq!(report["primitives"], lite_report["primitives"]);
    let runs = ok(&["runs", "--db", &db]);
    assert!(runs.contains("shared"), "{runs}");
    let cmp: Value =
        serde_json::from_str(&ok(&["compare", "--db", &db, "shared", "shared", "--json"])).unwrap();
    assert_eq!(cmp["broke"].as_array().map(Vec::len), Some(0), "{cmp}");
    assert_eq!(cmp["a"]["recorded"].as_i64(), Some(n as i64), "{cmp}");
    // the environment is stored with the run in PostgreSQL as in SQLite,
    // and a run compared with itself differs in nothing
    for r in [&report, &lite_report] {
        assert_eq!(
            r["environment"][0]["snapshot"]["format"], "probe-env",
            "{}",
            r["environment"]
        );
    }
    assert_eq!(cmp["environment"]["differences"], json!([]), "{cmp}");

    // the kernel evidence joins the steps in PostgreSQL too
    let export = dir.path().join("evidence.jsonl");
    let evidence_db = probe_socket().with_file_name("evidence.db");
    let out = Command::new(common::probe_binary())
        .args(["export", "--db"])
        .arg(&evidence_db)
        .arg("--out")
        .arg(&export)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let imported = ok(&["import", "--db", &db, export.to_str().unwrap()]);
    let joined = pg_count(
        &mut pgc,
        "SELECT COUNT(*) FROM campaign_steps s JOIN campaign_tests t USING (run, test_id)
         JOIN spans p ON p.session = t.mcp_session AND p.id = s.span_id WHERE s.run = 'shared'",
    );
    assert!(joined > 0, "{imported}");
    assert!(
        imported.contains("campaign steps now have their kernel spans"),
        "{imported}"
    );
    let with_events = pg_count(
        &mut pgc,
        "SELECT COUNT(*) FROM events e JOIN spans p ON e.probe_id = p.probe_id AND e.span_id = p.id
         JOIN campaign_tests t ON p.session = t.mcp_session WHERE t.run = 'shared'",
    );
    assert!(with_events > 0);
}

#[test]
fn a_wrong_password_a_newer_schema_and_a_database_that_goes_away_are_clear_errors() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = cluster().url("gone");
    // a wrong password: said, and never printed
    let wrong = url.replace(pg::PASSWORD, "not-the-password");
    let out = campaign(&["runs", "--db", &wrong]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(!err.contains("not-the-password"), "{err}");
    // not a URL we take
    let out = campaign(&["runs", "--db", "mysql://x@127.0.0.1/db"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("postgres:// URL"));

    // a schema from a newer version is refused
    let newer = cluster().url("newer");
    campaign::pg::Pg::connect(&newer).unwrap();
    cluster().psql("newer", "INSERT INTO bridge_schema VALUES (99, 0)");
    let out = campaign(&["runs", "--db", &newer]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("version 99, newer than this agent-bridge knows"),
        "{err}"
    );

    // the database goes away mid-run: the runner stops and says how to go on
    let gone = pg::Cluster::start(&std::env::temp_dir());
    let url = gone.url("results");
    let (suite, n) = suite(dir.path(), 120);
    let (_bridge, target) = Bridge::start_http(&Opts {
        probe: true,
        ..Opts::default()
    });
    let child = runner(
        &suite,
        &[&target],
        &url,
        &["--run", "cut", "--workers", "2"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut c = client_of(&gone, "results");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n: i64 = c
            .query_one("SELECT COUNT(*) FROM campaign_tests WHERE run = 'cut'", &[])
            .map(|r| r.get(0))
            .unwrap_or(0);
        if n >= 5 {
            break;
        }
        assert!(Instant::now() < deadline, "nothing recorded");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    gone.stop();
    let out: Output = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--resume cut"), "{err}");
    gone.start_again();
    let mut c = client_of(&gone, "results");
    let before = pg_count(
        &mut c,
        "SELECT COUNT(*) FROM campaign_tests WHERE run = 'cut'",
    );
    assert!(before >= 5);
    // everything acknowledged is there: the resume runs only the rest
    let s = run_json(
        &suite,
        &[&target],
        &url,
        &["--resume", "cut", "--workers", "2"],
    );
    assert_eq!(s["already_recorded"].as_i64(), Some(before));
    assert_eq!(s["complete"], true);
    let (rows, distinct) = (
        pg_count(
            &mut c,
            "SELECT COUNT(*) FROM campaign_tests WHERE run = 'cut'",
        ),
        pg_count(
            &mut c,
            "SELECT COUNT(DISTINCT test_id) FROM campaign_tests WHERE run = 'cut'",
        ),
    );
    assert_eq!((rows, distinct), (n as i64, n as i64));
}

#[test]
fn a_run_over_three_targets_goes_on_when_one_dies_and_one_stops_answering() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, n) = suite(dir.path(), 160);
    let start = || {
        Bridge::start_http(&Opts {
            probe: true,
            ..Opts::default()
        })
    };
    let (_a, url_a) = start();
    let (mut b, url_b) = start();
    let (c, url_c) = start();
    let targets_file = dir.path().join("targets");
    std::fs::write(&targets_file, format!("# the fleet\n{url_b}\n\n{url_c}\n")).unwrap();
    let results = dir.path().join("results.db");
    let results = results.to_str().unwrap();
    let child = runner(
        &suite,
        &[&url_a],
        results,
        &[
            "--targets",
            targets_file.to_str().unwrap(),
            "--run",
            "fleet",
            "--workers",
            "6",
            "--target-timeout",
            "2",
            "--json",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // once each target has run something: B dies, C stops answering
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let per: i64 = rusqlite::Connection::open(results)
            .and_then(|c| {
                c.query_row(
                    "SELECT COUNT(DISTINCT target) FROM campaign_tests WHERE run = 'fleet'",
                    [],
                    |r| r.get(0),
                )
            })
            .unwrap_or(0);
        if per == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "not every target ran a test");
        std::thread::sleep(Duration::from_millis(20));
    }
    b.0.kill().unwrap();
    let c_pid = nix::unistd::Pid::from_raw(c.0.id() as i32);
    nix::sys::signal::kill(c_pid, nix::sys::signal::SIGSTOP).unwrap();
    let out = child.wait_with_output().unwrap();
    nix::sys::signal::kill(c_pid, nix::sys::signal::SIGCONT).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["complete"], true, "{s}");
    assert_eq!(s["recorded"].as_i64(), Some(n as i64));
    let per: BTreeMap<String, Value> = s["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["target"].as_str().unwrap().to_string(), t.clone()))
        .collect();
    assert_eq!(per.len(), 3);
    assert!(per[&url_a]["down"].is_null(), "{s}");
    assert!(per[&url_b]["down"].is_string(), "{s}");
    assert!(per[&url_c]["down"].is_string(), "{s}");
    let sum: i64 = per.values().map(|t| t["recorded"].as_i64().unwrap()).sum();
    assert_eq!(sum, n as i64);
    // the tests in flight on the dead targets are transport failures
    let conn = rusqlite::Connection::open(results).unwrap();
    for url in [&url_b, &url_c] {
        let transport: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM campaign_tests WHERE run = 'fleet' AND target = ?1 AND primitive = 'interface.transport'",
                [url],
                |r| r.get(0),
            )
            .unwrap();
        assert!(
            transport >= 1,
            "{url}: no in-flight test recorded as interface.transport"
        );
    }
    let downs: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM campaign_target_downs WHERE run = 'fleet'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(downs, 2);
    // the report counts per target
    let report: Value = serde_json::from_str(&ok(&[
        "report", "--db", results, "--run", "fleet", "--json",
    ]))
    .unwrap();
    let targets = report["targets"].as_array().expect("per-target counts");
    assert_eq!(targets.len(), 3, "{report}");
    let text = ok(&["report", "--db", results, "--run", "fleet"]);
    assert!(text.contains(&url_b) && text.contains("down"), "{text}");
    // compare works across the targets of one run
    let cmp = campaign(&[
        "compare",
        "--db",
        results,
        &format!("fleet@{url_a}"),
        &format!("fleet@{url_b}"),
        "--json",
    ]);
    assert!(
        cmp.status.success(),
        "{}",
        String::from_utf8_lossy(&cmp.stderr)
    );
}

#[test]
fn shrink_and_matrix_work_on_postgresql_as_on_sqlite() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = cluster().url("shrink");
    let suite = dir.path().join("suite");
    std::fs::create_dir_all(&suite).unwrap();
    let test = serde_json::json!({"id": "encoding-0000", "domain": "encoding", "title": "bytes",
        "steps": [{"tool": "exec", "arguments": {"command": "printf 'abc\\000def'"},
                   "expect": {"exit_code": 0, "stdout_base64": "YWJjAGRlZg=="}}]});
    std::fs::write(suite.join("encoding-0000.json"), test.to_string()).unwrap();
    let target = |extra: &str| {
        format!(
            "stdio:{BRIDGE} serve --stdio --probe-socket {} {extra}",
            probe_socket().display()
        )
    };
    run_json(&suite, &[&target("")], &db, &["--run", "clean"]);
    run_json(
        &suite,
        &[&target("--interface-fault nul-truncate")],
        &db,
        &["--run", "lossy"],
    );
    let out = campaign(&["shrink", "--db", &db, "lossy", "encoding-0000", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        f["cause"]
            .as_str()
            .unwrap()
            .starts_with("one byte 0x00 is enough"),
        "{f}"
    );
    // the finding went back into the shared database, and reports show it
    let mut c = client_of(cluster(), "shrink");
    assert_eq!(
        pg_count(
            &mut c,
            "SELECT COUNT(*) FROM campaign_shrinks WHERE run = 'lossy'"
        ),
        1
    );
    let report = ok(&["report", "--db", &db, "--run", "lossy"]);
    assert!(report.contains("MINIMIZED CAUSES"), "{report}");
    // the matrix reads every run
    let m: Value = serde_json::from_str(&ok(&[
        "matrix",
        "--db",
        &db,
        "--baseline",
        "clean",
        "--json",
    ]))
    .unwrap();
    let rows = m["rows"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["label"] == "lossy"), "{m}");
}
