//! `cargo xtask browser-demo`: the source article's cloud-browser story as
//! a run. The browser suite (`campaign generate --browser-tools`) against
//! agent-bridge's own browser tools and against the browser MCP servers
//! agents use (through `agent-bridge proxy`), clean and under a sweep of
//! memory limits with tab-heavy pages; outcomes per server and per limit,
//! with what each tab death was placed on, written to docs/BROWSER-RUNS.md.

use std::fmt::Write as _;

use anyhow::Context as _;
use serde_json::Value;

use crate::campaign::Lab;

const SERVERS: [&str; 3] = ["agent-bridge", "playwright-mcp", "chrome-devtools-mcp"];
/// MiB of the cgroup each browser (and its server) runs in; 0: no limit.
const LIMITS: [u64; 4] = [0, 1024, 700, 500];
/// Every frame of a tab-heavy page holds this much; 8 frames, one renderer.
const HEAVY_MIB: u64 = 64;

pub fn browser_demo(count: usize, write: bool) -> anyhow::Result<()> {
    crate::clients::install_foreign()?;
    let lab = Lab::start("browser-demo")?;
    let root = crate::workspace_root();
    let adapters = root.join("agent-bridge/adapters");
    let suite = lab.dir.join("browser-suite");
    let count_s = count.to_string();
    let heavy = HEAVY_MIB.to_string();
    lab.campaign(&[
        "generate",
        "--browser-tools",
        "--count",
        &count_s,
        "--heavy-mib",
        &heavy,
        "--out",
        suite.to_str().unwrap(),
    ])?;
    let db = lab.dir.join("results.db");
    let dbs = db.to_str().unwrap().to_string();
    let bridge = lab.bridge_bin();
    let mut rows = Vec::new();
    for limit in LIMITS {
        let profile = match limit {
            0 => "clean".to_string(),
            mib => {
                let p = lab.dir.join(format!("browser-{mib}m.toml"));
                std::fs::write(
                    &p,
                    format!(
                        "description = \"{mib} MiB for a browser and its server\"\nmemory_limit = \"{mib}M\"\n"
                    ),
                )?;
                p.to_str().unwrap().to_string()
            }
        };
        for server in SERVERS {
            let state = std::path::Path::new("/run/agent-bridge-browser-demo")
                .join(format!("{server}-{limit}"));
            let target = match server {
                "agent-bridge" => format!(
                    "stdio:{} serve --stdio --profile {profile} --probe-socket {}",
                    bridge.display(),
                    lab.socket().display()
                ),
                // chrome-devtools-mcp waits 180 s on a tab whose renderer
                // died: the proxy stops it sooner
                _ => format!(
                    "stdio:{} proxy --stdio --call-timeout 45 --profile {profile} --probe-socket {} -- {} {}",
                    bridge.display(),
                    lab.socket().display(),
                    adapters.join(format!("{server}.sh")).display(),
                    state.display()
                ),
            };
            let run = format!("{server}-{limit}");
            eprintln!("\n== {server}, {}", limit_name(limit));
            let out = lab.campaign(&[
                "run",
                "--suite",
                suite.to_str().unwrap(),
                "--target",
                &target,
                "--adapter",
                adapters.join(format!("{server}.toml")).to_str().unwrap(),
                "--db",
                &dbs,
                "--run",
                &run,
                "--label",
                &run,
                "--workers",
                "2",
                "--json",
                "--no-bar",
            ])?;
            let summary: Value = serde_json::from_str(&out).context("runner summary")?;
            rows.push((server, limit, run, summary));
        }
    }
    let conn = rusqlite::Connection::open(&db)?;
    let mut d = String::new();
    let _ = writeln!(
        d,
        "# The browser suite against three browser servers, clean and under memory limits\n\n\
         Regenerate with `cargo xtask browser-demo` ({count} tests of `campaign generate \
         --browser-tools --heavy-mib {HEAVY_MIB}`, 2 workers, one MCP session per test). \
         agent-bridge runs its own browser tools (`serve --profile P`); `@playwright/mcp` and \
         `chrome-devtools-mcp` run on Debian's chromium behind `agent-bridge proxy --profile P \
         --call-timeout 45`. A limit is a memory cgroup around the browser (and the server, for the \
         foreign ones). Every eighth test opens a page of 8 frames of {HEAVY_MIB} MiB in one \
         renderer. See docs/BROWSERS.md for how to read it.\n"
    );
    let _ = writeln!(
        d,
        "| server | memory | passed | degraded | failed | unsupported | steps without kernel evidence | failures and degradations by layer/primitive |\n|---|---|---|---|---|---|---|---|"
    );
    for (server, limit, run, s) in &rows {
        let mut stmt = conn.prepare(
            "SELECT IFNULL(layer, '-') || '/' || IFNULL(primitive, '-'), COUNT(*) FROM campaign_tests \
             WHERE run = ?1 AND outcome IN ('fail', 'degraded') GROUP BY 1 ORDER BY 2 DESC",
        )?;
        let by: Vec<String> = stmt
            .query_map([run], |r| {
                Ok(format!(
                    "{} × {}",
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(0)?
                ))
            })?
            .collect::<Result<_, _>>()?;
        let _ = writeln!(
            d,
            "| {server} | {} | {} | {} | {} | {} | {} | {} |",
            limit_name(*limit),
            s["passed"],
            s["degraded"],
            s["failed"],
            s["unsupported"],
            s["steps_without_kernel"],
            if by.is_empty() {
                "—".into()
            } else {
                by.join(", ")
            }
        );
    }
    let _ = writeln!(d, "\n## One explanation per server and limit\n");
    for (server, limit, run, _) in &rows {
        let example: Option<(String, String)> = conn
            .query_row(
                "SELECT test_id, explanation FROM campaign_tests WHERE run = ?1 \
                 AND outcome IN ('fail', 'degraded') ORDER BY test_id LIMIT 1",
                [run],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .ok();
        if let Some((test, why)) = example {
            let _ = writeln!(d, "- {server}, {}: `{test}`: {why}", limit_name(*limit));
        }
    }
    println!("{d}");
    if write {
        std::fs::write(root.join("docs/BROWSER-RUNS.md"), &d)?;
        eprintln!("xtask: wrote docs/BROWSER-RUNS.md");
    }
    Ok(())
}

fn limit_name(limit: u64) -> String {
    match limit {
        0 => "no limit".into(),
        mib => format!("{mib} MiB"),
    }
}
