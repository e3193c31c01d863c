//! The campaign runner end to end: the real CLI, real bridges (stdio and
//! HTTP) with the probe attached, real SQLite files.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{BRIDGE, Bridge, Opts, campaign, ok, probe_socket, root};
use serde_json::Value;

/// `campaign run --suite SUITE --target TARGET --db DB MORE…`
fn run(suite: &Path, target: &str, db: &Path, more: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "--suite",
        suite.to_str().unwrap(),
        "--target",
        target,
        "--db",
        db.to_str().unwrap(),
    ];
    args.extend(more);
    campaign(&args)
}

fn run_ok(suite: &Path, target: &str, db: &Path, more: &[&str]) -> String {
    let out = run(suite, target, db, more);
    assert!(
        out.status.success(),
        "campaign run {more:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One run per (name, bridge arguments), 4 workers, each a stdio bridge
/// with the probe attached, all into `results`.
fn run_each(suite: &Path, results: &Path, runs: &[(&str, &str)]) {
    for (name, extra) in runs {
        run_ok(
            suite,
            &stdio_target(extra),
            results,
            &["--run", name, "--workers", "4", "--no-bar"],
        );
    }
}

fn stdio_target(extra: &str) -> String {
    format!(
        "stdio:{BRIDGE} serve --stdio --probe-socket {} {extra}",
        probe_socket().display()
    )
}

/// Generates `count` tests and keeps those of `domains` (all when empty).
fn suite(dir: &Path, count: usize, domains: &[&str]) -> (PathBuf, usize) {
    // tests of this binary run at once: each works in its own directory
    let base = format!(
        "/tmp/campaign-test-{}",
        dir.file_name().unwrap().to_string_lossy()
    );
    common::generated_suite(dir, count, &base, domains)
}

fn db(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

fn count(conn: &rusqlite::Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Every (run, test) has one row, with all its steps or none.
fn assert_whole(conn: &rusqlite::Connection, run: &str, suite: &Path, total: usize) {
    let rows = count(
        conn,
        &format!("SELECT COUNT(*) FROM campaign_tests WHERE run = '{run}'"),
    );
    let distinct = count(
        conn,
        &format!("SELECT COUNT(DISTINCT test_id) FROM campaign_tests WHERE run = '{run}'"),
    );
    assert_eq!(
        (rows, distinct),
        (total as i64, total as i64),
        "lost or duplicated tests"
    );
    // every valid test of the suite, with all its steps
    let valid = campaign::validate::load_dir(suite).unwrap().tests;
    assert_eq!(valid.len(), total);
    for t in valid {
        let steps = count(
            conn,
            &format!(
                "SELECT COUNT(*) FROM campaign_steps WHERE run = '{run}' AND test_id = '{}'",
                t.id
            ),
        );
        assert_eq!(steps as usize, t.steps.len(), "{}: partial steps", t.id);
    }
}

/// The run stopped on a DB error and said how to continue; returns how
/// many tests it had recorded.
fn assert_stopped(out: &Output, conn: &rusqlite::Connection, run: &str, cause: &str) -> i64 {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the run went on with {cause}: {stderr}"
    );
    assert!(
        stderr.contains("cannot record test") && stderr.contains(&format!("--resume {run}")),
        "{stderr}"
    );
    count(
        conn,
        &format!("SELECT COUNT(*) FROM campaign_tests WHERE run = '{run}'"),
    )
}

#[test]
fn a_stdio_campaign_records_every_test_and_reports_it() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, n) = suite(dir.path(), 40, &[]);
    // a file a coding agent got wrong: reported with file, field and reason, then skipped
    std::fs::write(
        suite.join("bad-0001.json"),
        r#"{"id":"bad-0001","domain":"files","title":"t","steps":[{"tool":"exec","arguments":{"argv":["true"],"timeout_ms":"soon"}}]}"#,
    )
    .unwrap();
    let results = dir.path().join("results.db");
    let out = run(
        &suite,
        &stdio_target(""),
        &results,
        &["--workers", "4", "--run", "clean", "--json"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("bad-0001.json: steps[0].arguments.timeout_ms:"),
        "{stderr}"
    );
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["recorded"], n as u64);
    assert_eq!(s["skipped_files"], 1);
    assert_eq!(s["complete"], true);
    assert_eq!(s["steps_without_kernel"], 0, "the probe was attached");
    let conn = db(&results);
    assert_whole(&conn, "clean", &suite, n);
    // on a machine `cargo xtask setup` prepared (Chromium installed) and
    // with the run's own upstream standing in for the internet, a clean
    // sandbox fails nothing
    let failures: Vec<String> = conn
        .prepare("SELECT test_id || ': ' || layer || '/' || primitive || ': ' || explanation FROM campaign_tests WHERE run = 'clean' AND outcome = 'fail'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        failures,
        Vec::<String>::new(),
        "failures on the clean profile"
    );
    // reports: JSON, text, HTML, CSV, JSONL, and a run compared with itself
    let html = dir.path().join("report.html");
    let r: Value = serde_json::from_str(&ok(&[
        "report",
        "--db",
        results.to_str().unwrap(),
        "--json",
        "--html",
        html.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(
        r["passed"].as_u64().unwrap()
            + r["degraded"].as_u64().unwrap()
            + r["failed"].as_u64().unwrap(),
        n as u64
    );
    assert_eq!(r["failed"].as_u64().unwrap() as usize, failures.len());
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!doctype html>") && page.trim_end().ends_with("</html>"));
    assert!(
        page.contains("<td class=l>browser</td>"),
        "the per-domain table"
    );
    let text = ok(&["report", "--db", results.to_str().unwrap()]);
    assert!(
        text.contains("DOMAIN") && text.contains("complete"),
        "{text}"
    );
    let csv = ok(&["export", "--db", results.to_str().unwrap()]);
    assert_eq!(csv.lines().count(), n + 1);
    let jsonl = ok(&[
        "export",
        "--db",
        results.to_str().unwrap(),
        "--format",
        "jsonl",
    ]);
    let first: Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    assert!(first["steps"][0]["span_id"].is_u64(), "{first}");
    let same: Value = serde_json::from_str(&ok(&[
        "compare",
        "--db",
        results.to_str().unwrap(),
        "clean",
        "clean",
        "--json",
    ]))
    .unwrap();
    assert_eq!(
        (
            same["broke"].as_array().unwrap().len(),
            same["fixed"].as_array().unwrap().len()
        ),
        (0, 0)
    );
    // the kernel evidence travels with the results: probe export, campaign import
    let session: String = conn
        .query_row(
            "SELECT mcp_session FROM campaign_tests WHERE run = 'clean' AND mcp_session IS NOT NULL LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let evidence = probe_socket().with_file_name("evidence.db");
    let deadline = Instant::now() + Duration::from_secs(30);
    while rusqlite::Connection::open(&evidence)
        .and_then(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM spans WHERE session = ?1",
                [&session],
                |r| r.get::<_, i64>(0),
            )
        })
        .unwrap_or(0)
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the daemon stored no span of {session}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let export = dir.path().join("evidence-export.db");
    let status = Command::new(common::probe_binary())
        .args([
            "export",
            "--format",
            "sqlite",
            "--session",
            &session,
            "--db",
        ])
        .arg(&evidence)
        .arg("--out")
        .arg(&export)
        .status()
        .unwrap();
    assert!(status.success());
    let imported = ok(&[
        "import",
        "--db",
        results.to_str().unwrap(),
        export.to_str().unwrap(),
    ]);
    assert!(imported.contains("spans imported"), "{imported}");
    let linked = count(
        &conn,
        &format!(
            "SELECT COUNT(*) FROM campaign_steps s JOIN campaign_tests t USING (run, test_id)
             JOIN spans p ON p.session = t.mcp_session AND p.id = s.span_id WHERE t.mcp_session = '{session}'"
        ),
    );
    assert!(linked >= 1, "no step of {session} joins its span");
    // a second run of the same name is refused, not mixed in
    let again = run(&suite, &stdio_target(""), &results, &["--run", "clean"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--resume clean"));
}

#[test]
fn four_shards_a_kill_9_and_a_resume_lose_and_duplicate_nothing() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, n) = suite(
        dir.path(),
        80,
        &[
            "files",
            "encoding",
            "process",
            "compute",
            "persistence",
            "memory",
            "documents",
            "packages",
        ],
    );
    let (_bridge, url) = Bridge::start_http(&Opts {
        probe: true,
        ..Opts::default()
    });
    let results = dir.path().join("results.db");
    let shard = |i: usize| {
        Command::new(BRIDGE)
            .args([
                "campaign",
                "run",
                "--suite",
                suite.to_str().unwrap(),
                "--target",
                &url,
            ])
            .args([
                "--db",
                results.to_str().unwrap(),
                "--run",
                "sharded",
                "--workers",
                "2",
            ])
            .args(["--shard", &format!("{i}/4"), "--no-bar"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut runners: Vec<_> = (1..=4).map(shard).collect();
    // kill -9 shard 4 once it has recorded something
    let victim = runners[3].id();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let recorded = if results.exists() {
            rusqlite::Connection::open(&results)
                .and_then(|c| {
                    c.query_row(
                        "SELECT COUNT(*) FROM campaign_tests WHERE runner LIKE ?1",
                        [format!("{victim}/%")],
                        |r| r.get::<_, i64>(0),
                    )
                })
                .unwrap_or(0)
        } else {
            0
        };
        if recorded >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "shard 4 recorded nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    for r in &mut runners {
        r.wait().unwrap();
    }
    let conn = db(&results);
    let before_resume = count(
        &conn,
        "SELECT COUNT(*) FROM campaign_tests WHERE run = 'sharded'",
    );
    assert!(
        before_resume < n as i64,
        "the killed shard left tests undone"
    );
    let kept_from_victim = count(
        &conn,
        &format!("SELECT COUNT(*) FROM campaign_tests WHERE runner LIKE '{victim}/%'"),
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM campaign_runs WHERE id = 'sharded' AND finished_ms IS NULL"
        ),
        1
    );
    let s: Value = serde_json::from_str(&run_ok(
        &suite,
        &url,
        &results,
        &["--resume", "sharded", "--json"],
    ))
    .unwrap();
    assert_eq!(s["already_recorded"].as_i64().unwrap(), before_resume);
    assert_eq!(s["recorded"].as_i64().unwrap(), n as i64 - before_resume);
    assert_eq!(s["complete"], true);
    assert_whole(&conn, "sharded", &suite, n);
    // what the killed runner recorded stayed, and was not run again
    assert_eq!(
        count(
            &conn,
            &format!("SELECT COUNT(*) FROM campaign_tests WHERE runner LIKE '{victim}/%'")
        ),
        kept_from_victim
    );
    // a resume of another suite is refused
    std::fs::remove_file(
        std::fs::read_dir(&suite)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap();
    let other = run(&suite, &url, &results, &["--resume", "sharded"]);
    assert!(!other.status.success());
    assert!(String::from_utf8_lossy(&other.stderr).contains("different suite"));
}

#[test]
fn injected_faults_land_on_their_layer_and_primitive() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 200: enough compile-and-run tests (6) for noexec to break
    let (suite, _) = suite(
        dir.path(),
        200,
        &["files", "encoding", "packages", "persistence"],
    );
    let results = dir.path().join("results.db");
    run_each(
        &suite,
        &results,
        &[
            ("clean", ""),
            ("crlf", "--interface-fault crlf"),
            ("lossy", "--interface-fault lossy-utf8"),
            ("noexec", "--profile noexec"),
            ("ephemeral", "--profile ephemeral"),
        ],
    );
    let m: Value = serde_json::from_str(&ok(&[
        "matrix",
        "--db",
        results.to_str().unwrap(),
        "--baseline",
        "clean",
        "--json",
    ]))
    .unwrap();
    let rows = m["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{m}");
    for row in rows {
        let newly = row["newly_failed"].as_i64().unwrap();
        assert!(newly >= 3, "{row}: the fault broke too few tests to judge");
        assert!(row["accuracy"].as_f64().unwrap() >= 0.95, "{row}");
        assert_eq!(row["wrongly_blamed"], 0, "{row}");
        assert_eq!(row["preempted"], 0, "{row}");
        let expected = match row["label"].as_str().unwrap() {
            "crlf" | "lossy" => "interface",
            "noexec" => "fs.noexec",
            _ => "fs.persistence",
        };
        assert_eq!(row["injected"], expected, "{row}");
    }
}

#[test]
fn a_bridge_that_dies_mid_test_is_an_interface_failure_and_the_worker_goes_on() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite");
    std::fs::create_dir(&suite).unwrap();
    let test = |id: &str, command: &str| {
        let t = serde_json::json!({"id": id, "domain": "process", "title": id, "steps": [
            {"tool": "exec", "arguments": {"command": command}, "expect": {"exit_code": 0}},
            {"tool": "exec", "arguments": {"command": "echo after"}, "expect": {"stdout_equals": "after\n"}}]});
        std::fs::write(suite.join(format!("{id}.json")), t.to_string()).unwrap();
    };
    test("a-dies", "kill -9 $PPID; sleep 5");
    test("b-lives", "true");
    test("c-lives", "echo fine");
    let results = dir.path().join("results.db");
    run_ok(
        &suite,
        &stdio_target(""),
        &results,
        &["--run", "r", "--workers", "1"],
    );
    let conn = db(&results);
    let (outcome, layer, primitive): (String, String, String) = conn
        .query_row(
            "SELECT outcome, layer, primitive FROM campaign_tests WHERE test_id = 'a-dies'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        (outcome.as_str(), layer.as_str(), primitive.as_str()),
        ("fail", "interface", "interface.transport")
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM campaign_steps WHERE test_id = 'a-dies' AND verdict = 'not-run'"
        ),
        1
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM campaign_tests WHERE outcome = 'pass'"
        ),
        2
    );
}

#[test]
fn a_locked_database_stops_the_run_and_keeps_what_was_recorded() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, n) = suite(dir.path(), 60, &["files", "process", "compute"]);
    let results = dir.path().join("results.db");
    let runner = Command::new(BRIDGE)
        .args([
            "campaign",
            "run",
            "--suite",
            suite.to_str().unwrap(),
            "--target",
            &stdio_target(""),
        ])
        .args([
            "--db",
            results.to_str().unwrap(),
            "--run",
            "locked",
            "--workers",
            "1",
            "--no-bar",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // once a few tests are in, another process takes the write lock for longer than the busy timeout
    let deadline = Instant::now() + Duration::from_secs(60);
    let locker = loop {
        if let Ok(c) = rusqlite::Connection::open(&results)
            && c.query_row("SELECT COUNT(*) FROM campaign_tests", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap_or(0)
                >= 3
        {
            c.execute_batch("BEGIN EXCLUSIVE").unwrap();
            break c;
        }
        assert!(Instant::now() < deadline, "nothing recorded");
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = runner.wait_with_output().unwrap();
    locker.execute_batch("ROLLBACK").unwrap();
    drop(locker);
    let conn = db(&results);
    let kept = assert_stopped(&out, &conn, "locked", "a locked DB");
    assert!(kept >= 3 && kept < n as i64, "{kept}");
    run_ok(&suite, &stdio_target(""), &results, &["--resume", "locked"]);
    assert_whole(&conn, "locked", &suite, n);
}

#[test]
fn a_full_disk_stops_the_run_and_keeps_what_was_recorded() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, n) = suite(dir.path(), 300, &["files", "process", "compute", "memory"]);
    // the results DB on a 512 KiB tmpfs: it fills up part of the way through
    let disk = dir.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tmpfs"])
        .arg(&disk)
        .status()
        .unwrap();
    assert!(mounted.success());
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(disk.clone());
    let results = disk.join("results.db");
    let out = run(
        &suite,
        &stdio_target(""),
        &results,
        &["--run", "full", "--workers", "4", "--no-bar"],
    );
    // what was recorded before is intact: whole tests, a sound database
    let conn = db(&results);
    let kept = assert_stopped(&out, &conn, "full", "a full disk");
    assert!(kept >= 1 && kept < n as i64, "{kept} of {n}");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let partial = count(
        &conn,
        "SELECT COUNT(*) FROM campaign_tests t WHERE run = 'full' AND NOT EXISTS
           (SELECT 1 FROM campaign_steps s WHERE s.run = t.run AND s.test_id = t.test_id)",
    );
    assert_eq!(partial, 0);
}

/// A suite of one test per file, written into `dir/suite`.
fn one_test(dir: &Path, test: Value) -> PathBuf {
    let suite = dir.join("suite");
    std::fs::create_dir_all(&suite).unwrap();
    let id = test["id"].as_str().unwrap().to_string();
    std::fs::write(suite.join(format!("{id}.json")), test.to_string()).unwrap();
    suite
}

#[test]
fn a_test_naming_a_host_off_this_machine_is_reported_and_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    // it only names the hosts (echo): even when allowed, nothing is sent
    let suite = one_test(
        dir.path(),
        serde_json::json!({"id": "network-9001", "domain": "network", "title": "names hosts",
            "steps": [{"tool": "exec", "arguments": {"command": "echo https://files.example.net/simple 192.0.2.10"},
                       "expect": {"exit_code": 0}}]}),
    );
    let out = campaign(&["validate", suite.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    for host in ["files.example.net", "192.0.2.10"] {
        assert!(
            text.contains(&format!(
                "steps[0].arguments.command: names {host}, which is outside this machine"
            )),
            "{text}"
        );
    }
    let results = dir.path().join("results.db");
    let target = format!("stdio:{BRIDGE} serve --stdio --no-probe");
    let out = run(&suite, &target, &results, &["--no-bar"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it ran: {stderr}");
    assert!(
        stderr.contains("refusing to run")
            && stderr.contains("names files.example.net")
            && stderr.contains("--allow-egress"),
        "{stderr}"
    );
    assert!(!results.exists() || count(&db(&results), "SELECT COUNT(*) FROM campaign_tests") == 0);
    // one host allowed is not enough; both are
    let out = run(
        &suite,
        &target,
        &results,
        &["--no-bar", "--allow-egress", "files.example.net"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("names 192.0.2.10"));
    run_ok(
        &suite,
        &target,
        &results,
        &[
            "--no-bar",
            "--allow-egress",
            "files.example.net,192.0.2.10",
            "--run",
            "allowed",
        ],
    );
    assert_eq!(
        count(
            &db(&results),
            "SELECT COUNT(*) FROM campaign_tests WHERE run = 'allowed' AND outcome = 'pass'"
        ),
        1
    );
    let out = campaign(&[
        "validate",
        suite.to_str().unwrap(),
        "--allow-egress",
        "Files.Example.NET,192.0.2.10",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn network_tests_reach_the_runs_upstream_and_not_under_no_network() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, n) = suite(dir.path(), 200, &["network"]);
    let results = dir.path().join("results.db");
    run_each(
        &suite,
        &results,
        &[("clean", ""), ("no-network", "--profile no-network")],
    );
    let conn = db(&results);
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM campaign_tests WHERE run = 'clean' AND outcome = 'pass'"
        ),
        n as i64,
        "every network test passes against the upstream"
    );
    // the tests that reach the upstream fail without a network, on net.egress,
    // with the real error named (never EINPROGRESS alone)
    let mut stmt = conn
        .prepare(
            "SELECT test_id, layer, primitive, explanation, json_remove(evidence, '$.kernel.events')
             FROM campaign_tests WHERE run = 'no-network' AND outcome = 'fail'",
        )
        .unwrap();
    let failed: Vec<(String, String, String, String, String)> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        failed.len() * 2 >= n,
        "only {} of {n} network tests need the network",
        failed.len()
    );
    for (id, layer, primitive, why, evidence) in &failed {
        // the stored evidence (events left out) says what the probe saw
        assert_eq!(
            (layer.as_str(), primitive.as_str()),
            ("sandbox", "net.egress"),
            "{id}: {why}\nevidence: {evidence}"
        );
        assert!(
            [
                "ECONNREFUSED",
                "ENETUNREACH",
                "EHOSTUNREACH",
                "ETIMEDOUT",
                "got no answer"
            ]
            .iter()
            .any(|e| why.contains(e)),
            "{id}: {why}"
        );
    }
}

#[test]
fn browser_tests_fail_on_the_primitive_a_profile_breaks_and_on_interface_faults() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, _) = suite(dir.path(), 600, &["browser"]);
    // every screenshot and PDF test, and the first ten of the other kinds
    let mut others = 0;
    for t in campaign::validate::load_dir(&suite).unwrap().tests {
        let binary = t.title.starts_with("screenshot") || t.title.starts_with("print");
        if !binary {
            others += 1;
            if others > 10 {
                std::fs::remove_file(suite.join(format!("{}.json", t.id))).unwrap();
            }
        }
    }
    let n = std::fs::read_dir(&suite).unwrap().count();
    // Chromium checks what its own syscalls return: a refused socketpair
    // (its IPC) makes it trap, after the setup step's mkdir went through
    let seccomp = dir.path().join("no-socketpair.toml");
    std::fs::write(
        &seccomp,
        "description = \"socketpair refused\"\nreproduces = \"seccomp\"\n[[seccomp]]\naction = \"errno\"\nsyscalls = [\"socketpair\"]\n",
    )
    .unwrap();
    let seccomp_arg = format!("--profile {}", seccomp.display());
    let results = dir.path().join("results.db");
    let mut runs = vec![
        ("clean", String::new()),
        ("pids-limit", "--profile pids-limit".to_string()),
        ("memory-limit", "--profile memory-limit".to_string()),
        ("no-socketpair", seccomp_arg),
    ];
    for f in ["lossy-utf8", "nul-truncate", "crlf", "trim", "drop-tail"] {
        runs.push((f, format!("--interface-fault {f}")));
    }
    let runs: Vec<(&str, &str)> = runs.iter().map(|(n, e)| (*n, e.as_str())).collect();
    run_each(&suite, &results, &runs);
    let conn = db(&results);
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM campaign_tests WHERE run = 'clean' AND outcome != 'fail'"
        ),
        n as i64,
        "every browser test passes in a clean sandbox"
    );
    let m: Value = serde_json::from_str(&ok(&[
        "matrix",
        "--db",
        results.to_str().unwrap(),
        "--baseline",
        "clean",
        "--json",
    ]))
    .unwrap();
    for row in m["rows"].as_array().unwrap() {
        let label = row["label"].as_str().unwrap();
        let want = match label {
            "pids-limit" => "proc.limit",
            "memory-limit" => "mem.oom",
            "no-socketpair" => "seccomp",
            _ => "interface",
        };
        assert_eq!(row["injected"], want, "{row}");
        assert!(row["accuracy"].as_f64().unwrap() >= 0.95, "{row}");
        if want != "interface" {
            assert_eq!(
                row["newly_failed"].as_i64().unwrap(),
                n as i64,
                "{row}: Chromium cannot run under it"
            );
        }
    }
    // the seed's corrupted image: every screenshot and PDF read back is
    // broken by every interface fault, and placed on interface.bytes
    let binary = count(
        &conn,
        "SELECT COUNT(*) FROM campaign_tests WHERE run = 'clean' AND (title LIKE 'screenshot%' OR title LIKE 'print%')",
    );
    assert!(
        binary >= 8,
        "only {binary} binary browser tests in the suite"
    );
    for f in ["lossy-utf8", "nul-truncate", "crlf", "trim", "drop-tail"] {
        let broken = count(
            &conn,
            &format!(
                "SELECT COUNT(*) FROM campaign_tests WHERE run = '{f}' AND (title LIKE 'screenshot%' OR title LIKE 'print%')
                 AND outcome = 'fail' AND layer = 'interface' AND primitive = 'interface.bytes'"
            ),
        );
        assert_eq!(broken, binary, "{f}");
    }
    // a failed screenshot test keeps the PNG that came back for the report
    let kept = count(
        &conn,
        "SELECT COUNT(*) FROM campaign_artifacts WHERE run = 'lossy-utf8' AND mime = 'image/png'",
    );
    let shots = count(
        &conn,
        "SELECT COUNT(*) FROM campaign_tests WHERE run = 'lossy-utf8' AND title LIKE 'screenshot%'",
    );
    assert_eq!(kept, shots);
}

const IDENTITY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/adapters/agent-bridge.toml");

/// (test, outcome, layer, primitive) of every test of a run, degraded as
/// passed (how long a step took is not the mapping's doing).
fn outcomes(conn: &rusqlite::Connection, run: &str) -> Vec<(String, String, String, String)> {
    conn.prepare(
        "SELECT test_id, REPLACE(outcome, 'degraded', 'pass'), IFNULL(layer, '-'), IFNULL(primitive, '-')
         FROM campaign_tests WHERE run = ?1 AND outcome != 'degraded' ORDER BY test_id",
    )
    .unwrap()
    .query_map([run], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

#[test]
fn the_identity_adapter_changes_nothing() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, total) = suite(
        dir.path(),
        150,
        &["files", "encoding", "process", "persistence", "compute"],
    );
    let results = dir.path().join("results.db");
    for (name, extra) in [
        ("clean", ""),
        ("nul", "--interface-fault nul-truncate"),
        ("readonly", "--profile readonly"),
    ] {
        let target = stdio_target(extra);
        for (run, more) in [
            (format!("{name}-direct"), vec![]),
            (format!("{name}-adapted"), vec!["--adapter", IDENTITY]),
        ] {
            let mut args = vec!["--run", &run, "--workers", "4", "--no-bar"];
            args.extend(more);
            run_ok(&suite, &target, &results, &args);
        }
    }
    let conn = db(&results);
    for name in ["clean", "nul", "readonly"] {
        let (direct, adapted) = (format!("{name}-direct"), format!("{name}-adapted"));
        assert_whole(&conn, &adapted, &suite, total);
        let (a, b) = (outcomes(&conn, &direct), outcomes(&conn, &adapted));
        assert_eq!(a.len(), b.len(), "{name}: different tests were degraded");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x, y, "{name}: the identity adapter changed a verdict");
        }
        let adapter: Option<String> = conn
            .query_row(
                "SELECT adapter FROM campaign_runs WHERE id = ?1",
                [&adapted],
                |r| r.get(0),
            )
            .unwrap();
        assert!(adapter.unwrap().starts_with("agent-bridge (sha256 "));
        // it reads everything the suite expects: nothing unchecked, nothing unsupported
        let skipped = count(
            &conn,
            &format!(
                "SELECT COUNT(*) FROM campaign_steps WHERE run = '{adapted}' AND (unchecked IS NOT NULL OR verdict = 'unsupported')"
            ),
        );
        assert_eq!(skipped, 0, "{name}");
        let sent = count(
            &conn,
            &format!(
                "SELECT COUNT(*) FROM campaign_steps WHERE run = '{adapted}' AND verdict != 'not-run' AND target_call IS NULL"
            ),
        );
        assert_eq!(sent, 0, "{name}: a step without the call the adapter sent");
    }
    // the comparison means something: the faults broke tests, on their layer
    let broken = |run: &str, layer: &str| {
        count(
            &conn,
            &format!(
                "SELECT COUNT(*) FROM campaign_tests WHERE run = '{run}' AND outcome = 'fail' AND layer = '{layer}'"
            ),
        )
    };
    assert!(broken("nul-adapted", "interface") >= 3);
    assert!(broken("readonly-adapted", "sandbox") >= 3);
}

/// A server that answers with the proxy's evidence, scripted (see the file).
const EVIDENCE_SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/evidence_server.py"
);

#[test]
fn the_evidence_an_answer_carries_is_stored_however_it_comes() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("stdio:python3 {EVIDENCE_SERVER}");
    let write = |suite: &str, id: &str, step: Value| {
        let domain = if suite == "browser" {
            "browser"
        } else {
            "process"
        };
        let t = serde_json::json!({"id": id, "domain": domain, "title": id, "steps": [step]});
        let dir = dir.path().join(suite);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{id}.json")), t.to_string()).unwrap();
    };
    let exec = |command: &str, timeout_ms: u64| {
        serde_json::json!({"tool": "exec", "arguments": {"command": command, "timeout_ms": timeout_ms},
            "expect": {"exit_code": 0}})
    };
    write("plain", "died-between", exec("died-between", 60_000));
    // answered 2.5 s into a step that may take 1 s, plus 0.5 s of --target-timeout
    write("plain", "late", exec("late", 1000));
    write("plain", "meta-only", exec("meta-only", 60_000));
    let open = |path: &str| {
        serde_json::json!({"tool": "browser_open", "arguments": {"url": format!("http://127.0.0.1:9/{path}")},
            "expect": {"text_contains": "page"}})
    };
    write("browser", "between", open("between"));
    write("browser", "heavy", open("heavy"));
    write("browser", "heavy-gone", open("heavy-gone"));
    let adapter = dir.path().join("two-calls.toml");
    std::fs::write(
        &adapter,
        r#"name = "two-calls"
[steps.browser_open]
tool = "navigate"
arguments = { url = "{{url}}" }
[[steps.browser_open.then]]
tool = "snapshot"
arguments = {}
result.page_text = { from = "text" }
"#,
    )
    .unwrap();
    let results = dir.path().join("results.db");
    let more = ["--target-timeout", "0.5", "--no-bar"];
    run_ok(
        &dir.path().join("plain"),
        &target,
        &results,
        &[&["--run", "plain"][..], &more].concat(),
    );
    run_ok(
        &dir.path().join("browser"),
        &target,
        &results,
        &[
            &["--run", "browser", "--adapter", adapter.to_str().unwrap()][..],
            &more,
        ]
        .concat(),
    );
    let conn = db(&results);
    let test = |id: &str| -> (String, String, Value) {
        conn.query_row(
            "SELECT t.layer || '/' || t.primitive, t.explanation, s.kernel
             FROM campaign_tests t JOIN campaign_steps s USING (run, test_id) WHERE test_id = ?1",
            [id],
            |r| {
                let k: Option<String> = r.get(2)?;
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    k.map_or(Value::Null, |k| serde_json::from_str(&k).unwrap()),
                ))
            },
        )
        .unwrap()
    };
    // an error without an attribution of its call still says what died before it
    for id in ["died-between", "between"] {
        let (cause, why, k) = test(id);
        assert_eq!(cause, "sandbox/mem.oom", "{id}: {why} {k}");
        assert!(why.contains("before its call, chromium (pid 41)"), "{why}");
        assert_eq!(k["before_call"]["primitive"], "mem.oom", "{k}");
        assert_eq!(k["reason"], "the probe daemon did not answer within 30 s");
    }
    // an answer that came after the step's time, but came
    let (cause, why, k) = test("late");
    assert_eq!(cause, "sandbox/timeout", "{why} {k}");
    assert_eq!(k["exit"]["signal"], "SIGKILL");
    // the proxy's evidence beside a structuredContent of the server's own
    let (cause, why, _) = test("meta-only");
    assert_eq!(cause, "sandbox/fs.readonly", "{why}");
    // a tab the OOM killer took, then a call killed at its time limit: all of both
    let (cause, why, k) = test("heavy");
    assert_eq!(cause, "sandbox/mem.oom", "{why}");
    assert_eq!(k["followed_by"]["exit"]["signal"], "SIGKILL", "{k}");
    assert_eq!(k["followed_by"]["outcome"], "timeout", "{k}");
    // the same tab, then a follow-up whose connection broke: the tab's
    // death is kept, and the broken call says why it has no evidence
    let (cause, why, k) = test("heavy-gone");
    assert_eq!(cause, "sandbox/mem.oom", "{why} {k}");
    assert!(
        k["followed_by"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("transport: ")),
        "{k}"
    );
}

#[test]
fn a_text_only_target_leaves_binary_writes_unsupported_never_passed_or_failed() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, total) = suite(dir.path(), 100, &["encoding", "files"]);
    let adapter = dir.path().join("text-only.toml");
    std::fs::write(
        &adapter,
        r#"
name = "text-only"
limits = ["write_file: UTF-8 text only", "exec: a shell command line only"]
[steps.exec]
tool = "exec"
arguments = { command = "{{command}}", timeout_ms = "{{timeout_ms}}" }
result.stdout = { from = "structured", path = "/stdout", decode = "payload" }
result.exit_code = { from = "structured", path = "/exit_code" }
[steps.write_file]
tool = "write_file"
arguments = { path = "{{path}}", text = "{{content|text}}", append = "{{append}}" }
ignore = ["sha256"]
[steps.read_file]
tool = "read_file"
arguments = { path = "{{path}}" }
result.bytes = { from = "resource" }
"#,
    )
    .unwrap();
    let results = dir.path().join("results.db");
    let summary: Value = serde_json::from_str(&run_ok(
        &suite,
        &stdio_target(""),
        &results,
        &[
            "--run",
            "text",
            "--adapter",
            adapter.to_str().unwrap(),
            "--json",
            "--no-bar",
        ],
    ))
    .unwrap();
    let unsupported = summary["unsupported"].as_u64().unwrap();
    assert!(unsupported >= 5, "{summary}");
    assert_eq!(
        summary["passed"].as_u64().unwrap()
            + summary["degraded"].as_u64().unwrap()
            + summary["failed"].as_u64().unwrap()
            + unsupported,
        total as u64
    );
    let conn = db(&results);
    // binary content cannot be sent as text: unsupported, and said why
    let why: String = conn
        .query_row(
            "SELECT explanation FROM campaign_tests WHERE run = 'text' AND outcome = 'unsupported' LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        why.contains("not UTF-8") && why.contains("text only"),
        "{why}"
    );
    // what it cannot report is unchecked, named per step
    let unchecked = count(
        &conn,
        "SELECT COUNT(*) FROM campaign_steps WHERE run = 'text' AND unchecked LIKE '%size (the adapter reads no size)%'",
    );
    assert!(unchecked > 0);
    let report = ok(&["report", "--db", results.to_str().unwrap(), "--run", "text"]);
    assert!(
        report.contains("UNSUPPORTED (steps the target cannot express"),
        "{report}"
    );
    assert!(report.contains("through adapter text-only"), "{report}");
}

#[test]
fn an_adapter_is_checked_against_the_servers_tools_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("stdio:{BRIDGE} serve --stdio --no-probe");
    let out = campaign(&["adapter", "check", IDENTITY, "--target", &target]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("every mapped tool and argument exists"),
        "{text}"
    );
    // one line per step the adapter maps, each found on the server
    let mapped = std::fs::read_to_string(IDENTITY)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("[steps.") && !l.contains(".then]"))
        .count();
    assert_eq!(mapped, 21);
    assert_eq!(text.matches(" ok\n").count(), mapped, "{text}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "name = 'bad'\n[steps.exec]\ntool = 'shell'\narguments = { cmd = '{{command}}' }\n\
         [steps.stat]\ntool = 'stat'\narguments = { path = '{{path}}', follow = true }\n",
    )
    .unwrap();
    let out = campaign(&[
        "adapter",
        "check",
        bad.to_str().unwrap(),
        "--target",
        &target,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let all = v["mappings"].to_string();
    assert!(
        all.contains("steps.exec.tool: the server has no tool `shell`"),
        "{all}"
    );
    assert!(
        all.contains("steps.stat.arguments.follow: `stat` takes no `follow`"),
        "{all}"
    );

    // a run refuses it before recording anything
    let (suite, _) = suite(dir.path(), 10, &["files"]);
    let results = dir.path().join("results.db");
    let out = run(
        &suite,
        &target,
        &results,
        &["--adapter", bad.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("the target lacks what the adapter maps") && stderr.contains("shell"),
        "{stderr}"
    );
    assert_eq!(
        count(&db(&results), "SELECT COUNT(*) FROM campaign_runs"),
        0
    );

    // a broken file is named with its field, before the server is even started
    std::fs::write(&bad, "name = 'bad'\n[steps.exek]\ntool = 'x'\n").unwrap();
    let out = campaign(&[
        "adapter",
        "check",
        bad.to_str().unwrap(),
        "--target",
        "stdio:false",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.toml: steps.exek: unknown step `exek`"),
        "{stderr}"
    );
}

#[test]
fn shrink_finds_the_smallest_input_that_fails_the_same_way() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.db");
    let base = format!(
        "/tmp/campaign-test-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let x100k = "x".repeat(100_000);
    // (fault, test steps, the finding)
    let cases = [
        (
            "nul-truncate",
            serde_json::json!([{"tool": "exec", "arguments": {"command": "printf 'abc\\000def'"},
                "expect": {"exit_code": 0, "stdout_base64": "YWJjAGRlZg=="}}]),
            "one byte 0x00 is enough: cut at the first NUL byte",
        ),
        (
            "lossy-utf8",
            serde_json::json!([{"tool": "exec", "arguments": {"command": "printf 'ok\\377\\376'"},
                "expect": {"exit_code": 0, "stdout_base64": "b2v//g=="}}]),
            "any byte ≥ 0x80 fails alone: lossy UTF-8 decode",
        ),
        (
            "drop-tail",
            serde_json::json!([{"tool": "exec", "arguments": {"command": "head -c 100000 /dev/zero | tr '\\0' x"},
                "expect": {"exit_code": 0, "stdout_equals": x100k}}]),
            "any 65,537 bytes fail: cut after 65,536 bytes of 65,537",
        ),
        (
            "nul-truncate",
            serde_json::json!([
                {"tool": "write_file", "arguments": {"path": format!("{base}/f"), "content_base64": "YQBi"}},
                {"tool": "read_file", "arguments": {"path": format!("{base}/f")},
                 "expect": {"sha256": "59b271ae1bbcb1d31d41929817f4b16fb439eb4f31520b5ad1d5ce98920a7138"}}]),
            "one byte 0x00 is enough: cut at the first NUL byte",
        ),
    ];
    for (i, (fault, steps, finding)) in cases.iter().enumerate() {
        let run = format!("shrink-{i}");
        let id = format!("encoding-{i:04}");
        let suite = one_test(
            &dir.path().join(&run),
            serde_json::json!({"id": id, "domain": "encoding", "title": "bytes", "steps": steps}),
        );
        run_ok(
            &suite,
            &stdio_target(&format!("--interface-fault {fault}")),
            &results,
            &["--run", &run, "--no-bar"],
        );
        let out = campaign(&[
            "shrink",
            "--db",
            results.to_str().unwrap(),
            &run,
            &id,
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let f: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            f["cause"].as_str().unwrap().starts_with(finding),
            "{fault}: {f}"
        );
        let report = ok(&["report", "--db", results.to_str().unwrap(), "--run", &run]);
        assert!(
            report.contains("MINIMIZED CAUSES") && report.contains(finding),
            "{report}"
        );
    }
    // a step that is not there, or that passed, says so
    let out = campaign(&[
        "shrink",
        "--db",
        results.to_str().unwrap(),
        "shrink-0",
        "encoding-0000",
        "--step",
        "9",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("encoding-0000 has no step 9"));
}

/// `campaign run --otlp`: the runner's run → test → step spans, linked
/// parent to child, and the probe daemon's span of each tool call in the
/// step's trace, a child of the step span (its traceparent went through
/// the bridge in `params._meta`).
#[test]
fn otlp_traces_run_test_step_and_the_kernel_spans_of_each_call() {
    use probe::otlp::{SpanKind, any_value};
    use probe::otlp_receiver::{Receiver, attr, attr_str};
    use std::collections::{HashMap, HashSet};
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (suite, n) = suite(dir.path(), 40, &["files"]);
    assert!(n >= 3, "{n} files tests");
    let rx = Receiver::start().unwrap();
    let (_probe, socket) = common::otlp_probe(&dir.path().join("probe"), &rx.url());
    let target = format!(
        "stdio:{BRIDGE} serve --stdio --probe-socket {}",
        socket.display()
    );
    let results = dir.path().join("results.db");
    let out = run(
        &suite,
        &target,
        &results,
        &["--workers", "2", "--no-bar", "--otlp", &rx.url()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("otlp: "), "{stderr}");
    let spans = rx.spans();
    let service = |r: &probe::otlp_receiver::Received| {
        attr_str(&r.resource, "service.name")
            .unwrap_or("")
            .to_owned()
    };
    let campaign: Vec<_> = spans
        .iter()
        .filter(|r| service(r) == "agent-bridge")
        .map(|r| &r.span)
        .collect();
    let runs: Vec<_> = campaign
        .iter()
        .filter(|s| s.name == "campaign run")
        .collect();
    assert_eq!(runs.len(), 1, "one run span per runner");
    let run_span = runs[0];
    assert!(run_span.parent_span_id.is_empty(), "the run is the root");
    let trace = run_span.trace_id.clone();
    assert!(campaign.iter().all(|s| s.trace_id == trace), "one trace");
    let tests: Vec<_> = campaign
        .iter()
        .filter(|s| s.name.starts_with("test "))
        .collect();
    assert_eq!(tests.len(), n, "a span per test");
    for t in &tests {
        assert_eq!(t.parent_span_id, run_span.span_id, "test under the run");
        assert_eq!(
            attr_str(&t.attributes, "campaign.test.domain"),
            Some("files")
        );
        assert!(attr_str(&t.attributes, "campaign.verdict").is_some());
    }
    let test_ids: HashSet<_> = tests.iter().map(|t| t.span_id.clone()).collect();
    let steps: Vec<_> = campaign
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect();
    assert!(steps.len() >= n, "{} steps", steps.len());
    // step spans by the probe span of their call
    let mut by_probe_span = HashMap::new();
    for s in &steps {
        assert!(test_ids.contains(&s.parent_span_id), "step under a test");
        assert!(s.name.starts_with("tools/call "), "{}", s.name);
        let tool = s.name.trim_start_matches("tools/call ");
        assert_eq!(attr_str(&s.attributes, "gen_ai.tool.name"), Some(tool));
        assert!(attr_str(&s.attributes, "campaign.test.id").is_some());
        assert!(attr_str(&s.attributes, "campaign.verdict").is_some());
        if let Some(any_value::Value::IntValue(id)) = attr(&s.attributes, "probe.span_id") {
            assert!(attr_str(&s.attributes, "probe.primitive").is_some());
            by_probe_span.insert(*id, s.span_id.clone());
        }
    }
    assert!(!by_probe_span.is_empty(), "steps name their kernel spans");
    // the daemon exports on its own clock, its other spans too (the
    // target's environment snapshot, the persistence markers): wait for
    // the kernel span of every step, not for a count
    let kernel_spans = || -> Vec<_> {
        rx.spans()
            .into_iter()
            .filter(|r| service(r) == "probe")
            .map(|r| r.span)
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut kernel = kernel_spans();
    while std::time::Instant::now() < deadline
        && by_probe_span.keys().any(|id| {
            !kernel.iter().any(|k| {
                matches!(attr(&k.attributes, "probe.span_id"), Some(any_value::Value::IntValue(i)) if i == id)
            })
        })
    {
        std::thread::sleep(Duration::from_millis(50));
        kernel = kernel_spans();
    }
    let mut linked = 0;
    for k in &kernel {
        let Some(any_value::Value::IntValue(id)) = attr(&k.attributes, "probe.span_id") else {
            panic!("a daemon span without probe.span_id")
        };
        let Some(step) = by_probe_span.get(id) else {
            continue;
        };
        assert_eq!(k.trace_id, trace, "the kernel span is in the run's trace");
        assert_eq!(&k.parent_span_id, step, "a child of its step span");
        assert_eq!(k.kind, SpanKind::Server as i32);
        assert!(k.name.starts_with("tools/call "));
        linked += 1;
    }
    assert_eq!(
        linked,
        by_probe_span.len(),
        "every step's kernel span arrived"
    );
}

/// TCP connections on this machine with one end on `port`, by their other
/// end's port (client sockets in TIME_WAIT too), from /proc/net/tcp.
fn client_ports_of(port: u16) -> std::collections::BTreeSet<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port_of = |addr: &str| u16::from_str_radix(addr.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut cols = line.split_whitespace().skip(1);
            let (local, remote) = (port_of(cols.next()?), port_of(cols.next()?));
            (remote == port).then_some(local)
        })
        .collect()
}

#[test]
fn the_runner_keeps_one_connection_for_a_sessions_calls() {
    if !root() {
        return;
    }
    // rmcp's default HTTP client opens a connection per call; the runner's
    // keeps its connection across calls that each end in a full answer
    let (_bridge, url) = Bridge::start_http(&Opts::default());
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let used = rt.block_on(async {
        let target = campaign::target::Target::Http(url.clone());
        let conn = target.connect().await.unwrap();
        for i in 0..20 {
            let args = serde_json::json!({"argv": ["sh", "-c", format!("echo {i}")]});
            let Value::Object(args) = args else {
                unreachable!()
            };
            let r = conn
                .call("exec", args, Duration::from_secs(30), None)
                .await
                .unwrap();
            let s = r.structured_content.unwrap();
            assert_eq!(s["exit_code"], 0, "{s}");
            assert_eq!(s["stdout"]["text"], format!("{i}\n"), "{s}");
        }
        let used = client_ports_of(port);
        conn.close().await;
        used
    });
    // the calls' connection, and at most the handshake's and the
    // session's event stream beside it; one per call would be 20 or more
    assert!(
        !used.is_empty() && used.len() <= 3,
        "20 calls used {} connections: {used:?}",
        used.len()
    );
}
