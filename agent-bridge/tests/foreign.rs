//! The campaign against MCP servers nobody here wrote, from npm (pinned in
//! agent-bridge/adapters/npm, installed by `cargo xtask setup`), behind
//! `agent-bridge proxy` with the probe attached: their interface bugs are
//! found and named, and their sandbox failures placed on a primitive.

mod common;

use std::path::{Path, PathBuf};

use common::{BRIDGE, campaign, ok, probe_socket, root};
use serde_json::Value;

const ADAPTERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/adapters");

/// The installed server's entry point must exist: CI installs it, and a
/// missing server is a failure there, never a silent skip.
fn installed(name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/foreign")
        .join(name);
    assert!(
        dir.join("node_modules").is_dir(),
        "{name} is not installed in {}: run `cargo xtask setup` (or `cargo xtask test`)",
        dir.display()
    );
}

/// A state directory for a server, outside /tmp and /var/tmp (which the
/// `readonly` profile makes read-only; a checkout may live under /tmp).
fn state(name: &str) -> PathBuf {
    let dir =
        Path::new("/run/agent-bridge-foreign-tests").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn proxied(profile: &str, server: &str) -> String {
    format!(
        "stdio:{BRIDGE} proxy --stdio --profile {profile} --probe-socket {} -- {server}",
        probe_socket().display()
    )
}

/// A generated suite working under `base`, keeping `domains`.
fn suite(dir: &Path, count: usize, base: &str, domains: &[&str]) -> PathBuf {
    common::generated_suite(dir, count, base, domains).0
}

fn run(suite: &Path, target: &str, adapter: &str, db: &Path, name: &str) -> Value {
    run_with(suite, target, adapter, db, name, true)
}

/// `run`, with one session per worker (`--reuse-sessions`) or one per test
/// (a browser's page ids count from 1 in each).
fn run_with(
    suite: &Path,
    target: &str,
    adapter: &str,
    db: &Path,
    name: &str,
    reuse_sessions: bool,
) -> Value {
    let mut args = vec![
        "run",
        "--suite",
        suite.to_str().unwrap(),
        "--target",
        target,
        "--adapter",
        adapter,
        "--db",
        db.to_str().unwrap(),
        "--run",
        name,
        "--workers",
        "4",
        "--no-bar",
        "--json",
    ];
    if reuse_sessions {
        args.push("--reuse-sessions");
    }
    serde_json::from_str(&ok(&args)).unwrap()
}

fn count(db: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

fn explanations(db: &Path, run: &str) -> String {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT test_id || ': ' || IFNULL(layer, '-') || '/' || IFNULL(primitive, '-') || ' ' || IFNULL(explanation, '') FROM campaign_tests WHERE run = ?1 AND outcome != 'pass'")
        .unwrap();
    let rows: Vec<String> = stmt
        .query_map([run], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    rows.join("\n")
}

#[test]
fn desktop_commander_through_the_proxy_shows_its_interface_bugs_and_the_sandboxs() {
    if !root() {
        return;
    }
    installed("desktop-commander");
    let dir = tempfile::tempdir().unwrap();
    let base = format!("/tmp/foreign-dc-{}", std::process::id());
    let suite = suite(
        dir.path(),
        200,
        &base,
        &["files", "encoding", "process", "documents", "persistence"],
    );
    let adapter = format!("{ADAPTERS}/desktop-commander.toml");
    let db = dir.path().join("results.db");
    let launcher =
        |name: &str| format!("{ADAPTERS}/desktop-commander.sh {}", state(name).display());

    let s = run(
        &suite,
        &proxied("clean", &launcher("clean")),
        &adapter,
        &db,
        "clean",
    );
    let total = s["recorded"].as_u64().unwrap();
    assert_eq!(total, 100, "{s}");
    let all = explanations(&db, "clean");
    // binary content cannot go through its text-only write_file
    assert!(s["unsupported"].as_u64().unwrap() >= 5, "{s}\n{all}");
    assert!(
        all.contains("is not UTF-8") && all.contains("takes text only"),
        "{all}"
    );
    // its read_file mangles what the file holds; named, on the interface
    let interface = count(
        &db,
        "SELECT COUNT(*) FROM campaign_tests WHERE run = 'clean' AND layer = 'interface'",
    );
    assert!(interface >= 5, "{all}");
    assert!(
        all.contains("CRLF became LF") || all.contains("trimmed"),
        "{all}"
    );
    assert!(all.contains("Cannot read binary file as text"), "{all}");
    // a clean sandbox: nothing placed on a sandbox primitive
    let sandbox = count(
        &db,
        "SELECT COUNT(*) FROM campaign_tests WHERE run = 'clean' AND layer = 'sandbox'",
    );
    assert_eq!(sandbox, 0, "{all}");
    // every call that ran carried the proxy's kernel evidence
    let without = count(
        &db,
        "SELECT COUNT(*) FROM campaign_steps WHERE run = 'clean' AND verdict IN ('pass', 'fail') AND (kernel IS NULL OR kernel NOT LIKE '%\"available\":true%')",
    );
    assert_eq!(without, 0, "steps without kernel evidence");

    // the same server under a read-only /tmp: the writes fail, on fs.readonly
    let s = run(
        &suite,
        &proxied("readonly", &launcher("readonly")),
        &adapter,
        &db,
        "readonly",
    );
    let all = explanations(&db, "readonly");
    let readonly = count(
        &db,
        "SELECT COUNT(*) FROM campaign_tests WHERE run = 'readonly' AND layer = 'sandbox' AND primitive = 'fs.readonly'",
    );
    assert!(readonly >= 20, "{s}\n{all}");

    // the smallest input its command output mangles: any byte ≥ 0x80 alone
    let lossy: String = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT t.test_id FROM campaign_tests t JOIN campaign_steps s USING (run, test_id)
             WHERE t.run = 'clean' AND s.verdict = 'fail' AND s.tool = 'exec' AND t.explanation LIKE '%lossy-utf8%' LIMIT 1",
            [],
            |r| r.get(0),
        )
        .expect("an exec whose stdout came back lossy");
    let f: Value = serde_json::from_str(&ok(&[
        "shrink",
        "--db",
        db.to_str().unwrap(),
        "clean",
        &lossy,
        "--adapter",
        &adapter,
        "--target",
        &proxied("clean", &launcher("shrink")),
        "--json",
    ]))
    .unwrap();
    assert!(
        f["cause"]
            .as_str()
            .unwrap()
            .starts_with("any byte ≥ 0x80 fails alone"),
        "{f}"
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// A file-only suite (the generated tests start by preparing their
/// directory with a command, which a file-only server cannot run).
fn file_suite(dir: &Path, base: &str) -> PathBuf {
    let suite = dir.join("files-only");
    std::fs::create_dir_all(&suite).unwrap();
    let sha = |b: &[u8]| common::sha256(b);
    let round_trip = |id: &str, text: &str| {
        serde_json::json!({"id": id, "domain": "files", "title": format!("round trip of {text:?}"), "steps": [
            {"tool": "write_file", "arguments": {"path": format!("{base}/{id}/f.txt"), "text": text}},
            {"tool": "read_file", "arguments": {"path": format!("{base}/{id}/f.txt")},
             "expect": {"sha256": sha(text.as_bytes()), "size": text.len()}},
            {"tool": "stat", "arguments": {"path": format!("{base}/{id}/f.txt")}, "expect": {"size": text.len()}},
        ]})
    };
    let tests = [
        round_trip("files-0001", "plain text\n"),
        round_trip("files-0002", "crlf\r\nlines\r\n"),
        round_trip("files-0003", "a lone\rcr"),
        round_trip("files-0004", "nul\u{0}inside"),
        round_trip("files-0005", &"long line ".repeat(20_000)),
        serde_json::json!({"id": "encoding-0001", "domain": "encoding", "title": "binary bytes", "steps": [
            {"tool": "write_file", "arguments": {"path": format!("{base}/encoding-0001/b.bin"), "content_base64": "gP8A"}},
        ]}),
        serde_json::json!({"id": "files-0006", "domain": "files", "title": "a missing path", "steps": [
            {"tool": "stat", "arguments": {"path": format!("{base}/nothing-here")}, "expect": {"exists": false}},
        ]}),
        serde_json::json!({"id": "files-0007", "domain": "files", "title": "append", "steps": [
            {"tool": "write_file", "arguments": {"path": format!("{base}/files-0007/a"), "text": "x", "append": true}},
        ]}),
    ];
    for t in tests {
        let id = t["id"].as_str().unwrap().to_string();
        std::fs::write(suite.join(format!("{id}.json")), t.to_string()).unwrap();
    }
    suite
}

#[test]
fn server_filesystem_runs_what_it_can_and_the_rest_is_unsupported() {
    if !root() {
        return;
    }
    installed("server-filesystem");
    let dir = tempfile::tempdir().unwrap();
    let base = format!("/tmp/foreign-fs-{}", std::process::id());
    let adapter = format!("{ADAPTERS}/server-filesystem.toml");
    let server = format!("{ADAPTERS}/server-filesystem.sh {base}");
    let out = campaign(&[
        "adapter",
        "check",
        &adapter,
        "--target",
        &format!("stdio:{server}"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let db = dir.path().join("results.db");

    // the generated suite: every test prepares its directory with a command
    let generated = suite(dir.path(), 100, &base, &["files"]);
    let s = run(
        &generated,
        &proxied("clean", &server),
        &adapter,
        &db,
        "generated",
    );
    assert_eq!(s["unsupported"], 10, "{s}");
    assert!(explanations(&db, "generated").contains("the adapter maps no `exec` step"));

    // what it can express: byte-exact text round trips (CRLF, lone CR, NUL, 200 KB)
    let files = file_suite(dir.path(), &base);
    let s = run(&files, &proxied("clean", &server), &adapter, &db, "files");
    let all = explanations(&db, "files");
    assert_eq!(s["passed"], 6, "{s}\n{all}");
    assert_eq!(s["unsupported"], 2, "{s}\n{all}");
    assert!(
        all.contains("encoding-0001: -/- step 0 (write_file): `content` is not UTF-8"),
        "{all}"
    );
    assert!(
        all.contains(
            "files-0007: -/- step 0 (write_file): server-filesystem cannot express append = true"
        ),
        "{all}"
    );
    // and each of its calls carried the proxy's kernel evidence
    let with = count(
        &db,
        "SELECT COUNT(*) FROM campaign_steps WHERE run = 'files' AND kernel LIKE '%\"available\":true%'",
    );
    assert_eq!(with, 16);
    let _ = std::fs::remove_dir_all(&base);
}

/// `count` browser-vocabulary tests (`campaign generate --browser-tools`).
fn browser_suite(dir: &Path, count: usize, heavy_mib: u64) -> PathBuf {
    let out = dir.join(format!("browser-{heavy_mib}"));
    ok(&[
        "generate",
        "--browser-tools",
        "--count",
        &count.to_string(),
        "--heavy-mib",
        &heavy_mib.to_string(),
        "--out",
        out.to_str().unwrap(),
    ]);
    out
}

/// The browser as agents drive it: agent-bridge's own browser tools (its
/// identity adapter) and the browser MCP servers agents use (Debian's
/// chromium under them, through the proxy), the same suite meaning the
/// same thing. Clean, each passes every browser step it can express and
/// the rest is unsupported, with kernel evidence on every step; under a
/// memory limit, a tab the OOM killer took is `sandbox/mem.oom` with the
/// victim and its cgroup named.
#[test]
fn browser_servers_pass_clean_and_name_a_tab_the_oom_killer_took() {
    if !root() {
        return;
    }
    installed("playwright-mcp");
    installed("chrome-devtools-mcp");
    let dir = tempfile::tempdir().unwrap();
    let suite = browser_suite(dir.path(), 12, 16);
    let bridge = format!(
        "stdio:{BRIDGE} serve --stdio --probe-socket {}",
        probe_socket().display()
    );
    let foreign = |server: &str, profile: &str, state_name: &str| {
        let launcher = format!("{ADAPTERS}/{server}.sh {}", state(state_name).display());
        proxied(profile, &launcher)
    };
    for (server, unsupported) in [
        ("agent-bridge", 0),
        ("playwright-mcp", 0),
        // browser_fill twice (uid only), browser_pdf and browser_download (no such tools)
        ("chrome-devtools-mcp", 4),
    ] {
        let db = dir.path().join(format!("{server}.db"));
        let target = match server {
            "agent-bridge" => bridge.clone(),
            _ => foreign(server, "clean", server),
        };
        let adapter = format!("{ADAPTERS}/{server}.toml");
        let s = run_with(&suite, &target, &adapter, &db, "clean", false);
        let all = explanations(&db, "clean");
        assert_eq!(s["recorded"], 12, "{server}: {s}");
        assert_eq!(s["unsupported"], unsupported, "{server}: {s}\n{all}");
        assert_eq!(s["passed"], 12 - unsupported, "{server}: {s}\n{all}");
        assert_eq!(s["steps_without_kernel"], 0, "{server}: {s}");
        if unsupported > 0 {
            for step in ["browser_fill", "browser_pdf", "browser_download"] {
                assert!(all.contains(step), "{step}: {all}");
            }
        }
    }
    // 8 frames of 64 MiB in one renderer: 600 MiB for agent-bridge's
    // browser, 700 MiB for a foreign server and its browser
    let heavy = browser_suite(dir.path(), 6, 64);
    for (server, mib, unsupported) in [
        ("agent-bridge", 600, 0),
        ("playwright-mcp", 700, 0),
        // its snapshot of the tab whose renderer died waits out its own
        // 180 s: the proxy's --call-timeout stops it, and the death in the
        // navigation before is why
        ("chrome-devtools-mcp", 700, 1),
    ] {
        let profile = dir.path().join(format!("browser-{mib}m.toml"));
        std::fs::write(
            &profile,
            format!("description = \"{mib} MiB for a browser\"\nmemory_limit = \"{mib}M\"\n"),
        )
        .unwrap();
        let profile = profile.to_str().unwrap();
        let target = match server {
            "agent-bridge" => format!("{bridge} --profile {profile}"),
            _ => {
                let t = foreign(server, profile, &format!("{server}-memory"));
                t.replacen(" proxy --stdio ", " proxy --stdio --call-timeout 45 ", 1)
            }
        };
        let db = dir.path().join(format!("{server}-memory.db"));
        let adapter = format!("{ADAPTERS}/{server}.toml");
        let s = run_with(&heavy, &target, &adapter, &db, "memory", false);
        let all = explanations(&db, "memory");
        assert_eq!(s["recorded"], 6, "{server}: {s}");
        // the light tests still pass; the tab-heavy one lost its tab
        assert_eq!(s["unsupported"], unsupported, "{server}: {s}\n{all}");
        assert_eq!(s["passed"], 5 - unsupported, "{server}: {s}\n{all}");
        let heavy_test = all
            .lines()
            .find(|l| l.starts_with("browser-tools-0006"))
            .unwrap_or_else(|| panic!("{server}: the tab-heavy test passed:\n{all}"));
        assert!(
            heavy_test.contains("sandbox/mem.oom")
                && heavy_test.contains("chromium (pid ")
                && heavy_test.contains("was killed by the OOM killer at ")
                && heavy_test.contains(&format!("(memory limit {mib} MiB)")),
            "{server}: {heavy_test}"
        );
    }
}

/// A navigation to a loopback port nothing listens on: the server says
/// `net::ERR_CONNECTION_REFUSED` (Playwright as a tool error,
/// chrome-devtools-mcp in text its adapter reads as one) while Chromium's
/// network service lives on; the call's kernel evidence is `net.egress`,
/// naming the address, not "nothing failed".
#[test]
fn a_browser_servers_refused_navigation_is_net_egress() {
    if !root() {
        return;
    }
    installed("playwright-mcp");
    installed("chrome-devtools-mcp");
    let dir = tempfile::tempdir().unwrap();
    // a port of the upstream's address that was free a moment ago
    let port = std::net::TcpListener::bind("127.66.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let suite = dir.path().join("refused");
    std::fs::create_dir_all(&suite).unwrap();
    let url = format!("http://{{{{upstream.host}}}}:{port}/");
    std::fs::write(
        suite.join("browser-refused.json"),
        serde_json::json!({"id": "browser-refused", "domain": "browser", "title": "a closed port",
            "steps": [{"tool": "browser_open", "arguments": {"url": url}, "expect": {"is_error": true}}]})
        .to_string(),
    )
    .unwrap();
    for server in ["playwright-mcp", "chrome-devtools-mcp"] {
        let db = dir.path().join(format!("{server}.db"));
        let launcher = format!("{ADAPTERS}/{server}.sh {}", state(server).display());
        let adapter = format!("{ADAPTERS}/{server}.toml");
        let s = run_with(
            &suite,
            &proxied("clean", &launcher),
            &adapter,
            &db,
            "refused",
            false,
        );
        assert_eq!(
            s["passed"],
            1,
            "{server}: {s}\n{}",
            explanations(&db, "refused")
        );
        let (primitive, kernel): (Option<String>, String) = rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(
                "SELECT kernel_primitive, kernel FROM campaign_steps WHERE run = 'refused' AND step = 0",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        let k: Value = serde_json::from_str(&kernel).unwrap();
        if server == "playwright-mcp" {
            // a tool error: the call failed, on net.egress
            assert_eq!(
                primitive.as_deref(),
                Some("net.egress"),
                "{server}: {kernel}"
            );
        } else {
            // not a tool error to the server: the call "succeeded", and hid it
            assert_eq!(primitive.as_deref(), Some("none"), "{server}: {kernel}");
            assert_eq!(
                k["hidden_failure"]["primitive"], "net.egress",
                "{server}: {kernel}"
            );
        }
        assert!(
            kernel.contains(&format!("127.66.0.1:{port}")),
            "{server}: {kernel}"
        );
    }
}
