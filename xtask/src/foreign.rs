//! `cargo xtask foreign`: the default campaign against desktop-commander,
//! a server nobody here wrote, behind `agent-bridge proxy` with the probe
//! attached, clean and under two hardening profiles; the findings (each
//! interface bug with the smallest input `campaign shrink` finds, the
//! failures the kernel placed on a primitive) written to docs/FOREIGN.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Context as _;
use serde_json::Value;

use crate::campaign::Lab;

const PROFILES: [&str; 3] = ["clean", "readonly", "no-network"];

pub fn foreign(count: usize, write: bool) -> anyhow::Result<()> {
    crate::clients::install_foreign()?;
    let lab = Lab::start("foreign-campaign")?;
    let suite = lab.generate(count)?;
    let db = lab.dir.join("results.db");
    let dbs = db.to_str().unwrap().to_string();
    let root = crate::workspace_root();
    let adapter = root.join("agent-bridge/adapters/desktop-commander.toml");
    let adapter = adapter.to_str().unwrap();
    let target = |profile: &str, state: &str| {
        format!(
            "stdio:{} proxy --stdio --profile {profile} --probe-socket {} -- {} {}",
            lab.bridge_bin().display(),
            lab.socket().display(),
            root.join("agent-bridge/adapters/desktop-commander.sh")
                .display(),
            // outside /tmp, which the readonly profile makes read-only
            std::path::Path::new("/run/agent-bridge-foreign")
                .join(state)
                .display()
        )
    };
    let mut summaries = BTreeMap::new();
    for p in PROFILES {
        eprintln!("\n== desktop-commander, profile {p}");
        let out = lab.campaign(&[
            "run",
            "--suite",
            suite.to_str().unwrap(),
            "--target",
            &target(p, &format!("state-{p}")),
            "--adapter",
            adapter,
            "--db",
            &dbs,
            "--run",
            p,
            "--label",
            p,
            "--workers",
            "4",
            "--reuse-sessions",
            "--json",
            "--no-bar",
        ])?;
        summaries.insert(
            p,
            serde_json::from_str::<Value>(&out).context("runner summary")?,
        );
    }
    let reports: BTreeMap<&str, Value> = PROFILES
        .iter()
        .map(|p| {
            let r = lab.campaign(&["report", "--db", &dbs, "--run", p, "--json"])?;
            Ok((*p, serde_json::from_str(&r)?))
        })
        .collect::<anyhow::Result<_>>()?;
    let conn = rusqlite::Connection::open(&db)?;

    // the interface bugs of the clean run: one example per way of failing
    let mut bugs: BTreeMap<String, (String, String, usize)> = BTreeMap::new();
    let mut stmt = conn.prepare(
        "SELECT test_id, explanation FROM campaign_tests WHERE run = 'clean' AND layer = 'interface' ORDER BY test_id",
    )?;
    for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
        let (test, why) = row?;
        let e = bugs.entry(bug_kind(&why)).or_insert((test, why, 0));
        e.2 += 1;
    }
    let mut shrunk = BTreeMap::new();
    for (kind, (test, _, _)) in &bugs {
        eprintln!("\n== shrinking {test} ({kind})");
        let out = std::process::Command::new(lab.bridge_bin())
            .args([
                "campaign",
                "shrink",
                "--db",
                &dbs,
                "clean",
                test,
                "--adapter",
                adapter,
                "--json",
                "--target",
            ])
            .arg(target("clean", "state-shrink"))
            .output()?;
        let said = if out.status.success() {
            serde_json::from_slice::<Value>(&out.stdout).ok()
        } else {
            None
        };
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        shrunk.insert(kind.clone(), (said, err));
    }

    let mut d = String::new();
    let _ = writeln!(
        d,
        "# desktop-commander under the campaign\n\n\
         Regenerate with `cargo xtask foreign` ({count} generated tests, seed 1, 4 workers, one MCP session \
         per worker). The server is `@wonderwhy-er/desktop-commander` 0.2.52 from npm (pinned in \
         `agent-bridge/adapters/npm/desktop-commander`), started by `agent-bridge/adapters/desktop-commander.sh` \
         behind `agent-bridge proxy --profile P` with the probe attached, and driven through the adapter \
         `agent-bridge/adapters/desktop-commander.toml` (docs/ADAPTERS.md). Nobody here wrote it: every \
         interface finding below is its own, not an injected fault. The browser MCP servers \
         (`@playwright/mcp`, `chrome-devtools-mcp`), clean and under a memory sweep, per server and limit: \
         docs/BROWSER-RUNS.md (`cargo xtask browser-demo`).\n\n\
         ```\nagent-bridge campaign run --suite suite --adapter agent-bridge/adapters/desktop-commander.toml \\\n  \
         --target stdio:'agent-bridge proxy --stdio --profile readonly -- agent-bridge/adapters/desktop-commander.sh STATE' \\\n  \
         --reuse-sessions --db results.db\n```\n"
    );
    let _ = writeln!(d, "## Outcomes per domain\n");
    let _ = writeln!(
        d,
        "| domain | {} |",
        PROFILES
            .map(|p| format!("{p}: pass / degraded / fail / unsupported"))
            .join(" | ")
    );
    let _ = writeln!(d, "|---|{}", "---|".repeat(PROFILES.len()));
    let domains: Vec<String> = reports["clean"]["domains"]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    for dom in domains.iter().map(String::as_str).chain(["total"]) {
        let cells: Vec<String> = PROFILES
            .iter()
            .map(|p| {
                let r = &reports[p];
                let o = if dom == "total" {
                    r.clone()
                } else {
                    r["domains"][dom].clone()
                };
                format!(
                    "{} / {} / {} / {}",
                    o["passed"], o["degraded"], o["failed"], o["unsupported"]
                )
            })
            .collect();
        let _ = writeln!(d, "| {dom} | {} |", cells.join(" | "));
    }
    let _ = writeln!(
        d,
        "\n*Unsupported* tests have a step the server cannot express (binary content for its text-only \
         `write_file`); they are neither passed nor failed. Wall time: {}.\n",
        PROFILES
            .iter()
            .map(|p| format!(
                "{p} {:.0} s",
                summaries[p]["wall_s"].as_f64().unwrap_or(0.0)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(d, "## Layer × primitive of the failed tests\n");
    let _ = writeln!(d, "| layer / primitive | {} |", PROFILES.join(" | "));
    let _ = writeln!(d, "|---|{}", "---|".repeat(PROFILES.len()));
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in reports.values() {
        for (layer, prims) in r["layers"].as_object().into_iter().flatten() {
            for p in prims.as_object().into_iter().flatten().map(|(p, _)| p) {
                if !keys.contains(&(layer.clone(), p.clone())) {
                    keys.push((layer.clone(), p.clone()));
                }
            }
        }
    }
    keys.sort();
    for (layer, p) in &keys {
        let cells: Vec<String> = PROFILES
            .iter()
            .map(|run| {
                reports[run]["layers"][layer][p]
                    .as_i64()
                    .unwrap_or(0)
                    .to_string()
            })
            .collect();
        let _ = writeln!(d, "| {layer} / {p} | {} |", cells.join(" | "));
    }
    let _ = writeln!(
        d,
        "\n## The interface bugs found (clean run), one example each\n\n\
         Each row is one way the server's tools lost bytes or refused them; *smallest input* is what \
         `campaign shrink` found by re-running the step through the same proxy and adapter with smaller \
         and simpler payloads, with the exact bytes sent and the bytes that came back.\n"
    );
    for (kind, (test, why, n)) in &bugs {
        let _ = writeln!(
            d,
            "### {kind} ({n} tests)\n\n`{test}`: {}\n",
            why.replace('`', "'")
        );
        match &shrunk[kind] {
            (Some(f), _) => {
                let _ = writeln!(
                    d,
                    "smallest input ({} channel, {} calls): **{}**  \nsent `{}`, came back `{}`\n",
                    f["channel"].as_str().unwrap_or(""),
                    f["calls"],
                    f["cause"].as_str().unwrap_or(""),
                    f["minimal"].as_str().unwrap_or(""),
                    f["came_back"].as_str().unwrap_or("")
                );
            }
            (None, err) => {
                let _ = writeln!(
                    d,
                    "no smaller input: {}\n",
                    err.trim_start_matches("agent-bridge: ")
                );
            }
        }
    }
    let _ = writeln!(
        d,
        "## What the kernel evidence placed on a sandbox primitive\n"
    );
    for p in PROFILES {
        let mut stmt = conn.prepare(
            "SELECT primitive, COUNT(*), MIN(test_id), MIN(explanation) FROM campaign_tests
             WHERE run = ?1 AND layer = 'sandbox' GROUP BY primitive ORDER BY COUNT(*) DESC",
        )?;
        let rows: Vec<(String, i64, String, String)> = stmt
            .query_map([p], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<Result<_, _>>()?;
        if rows.is_empty() {
            let _ = writeln!(d, "- **{p}**: none.");
        }
        for (prim, n, test, why) in rows {
            let _ = writeln!(
                d,
                "- **{p}**: {n} tests on `{prim}`, e.g. `{test}`: {}",
                why.replace('`', "'")
            );
        }
    }
    let with: i64 = conn.query_row(
        "SELECT COUNT(*) FROM campaign_steps WHERE verdict IN ('pass', 'fail') AND kernel LIKE '%\"available\":true%'",
        [],
        |r| r.get(0),
    )?;
    let all: i64 = conn.query_row(
        "SELECT COUNT(*) FROM campaign_steps WHERE verdict IN ('pass', 'fail')",
        [],
        |r| r.get(0),
    )?;
    let _ = writeln!(
        d,
        "\n{with} of {all} steps that ran carried the proxy's kernel evidence (`_meta[\"probe/kernel\"]`): \
         a span over the server's whole process tree (Node's libuv threads and every shell it starts) for \
         the call's duration.\n"
    );
    d.push_str(NOTES);
    print!("{d}");
    if write {
        std::fs::write(root.join("docs/FOREIGN.md"), &d)?;
        eprintln!("xtask: wrote docs/FOREIGN.md");
    }
    Ok(())
}

/// The way a test failed on the interface, without its particulars.
fn bug_kind(explanation: &str) -> String {
    let why = explanation.split_once(": ").map_or(explanation, |(_, w)| w);
    if let Some(k) = why.rsplit_once(" (").and_then(|(_, k)| k.strip_suffix(')'))
        && !k.contains(' ')
    {
        let tool = why.split(':').next().unwrap_or("");
        return format!("{tool}: {k}");
    }
    if let Some(f) = why
        .split("came back as `")
        .nth(1)
        .and_then(|r| r.split('`').next())
    {
        let tool = why.split(':').next().unwrap_or("");
        return format!("{tool}: {f}");
    }
    if let Some((tool, refusal)) = why.split_once(": the server refused: ") {
        let first: String = refusal
            .split_whitespace()
            .take(5)
            .collect::<Vec<_>>()
            .join(" ");
        return format!("{tool}: refused ({first}…)");
    }
    why.split_whitespace().take(6).collect::<Vec<_>>().join(" ")
}

const NOTES: &str = "## Notes on the server

- **It phones home by default**, by four paths: install telemetry (its npm install script), usage \
telemetry on every tool call, a feature-flag fetch every 30 minutes, and a Chrome download when it \
finds none. The launcher switches each off (`--ignore-scripts` at install, \
`DESKTOP_COMMANDER_DISABLE_TELEMETRY=1`, a `data:` URL for `DC_FLAG_URL`, a placeholder Chrome); \
with them, strace saw no connect or send of any kind. A model can turn telemetry back on through its \
`set_config_value` tool; the campaign never calls it.
- **Its command output is text**: stdout and stderr merged, every chunk decoded as UTF-8 (invalid \
bytes become U+FFFD; a character split across a 64 KiB pipe read is lost), and the exit code only \
from a second tool (`read_process_output`), with `null` for a signal. The adapter polls that tool \
until the process is done, as an agent would.
- **It can lose output**: a session is finalized on the child's exit, not when its pipe is drained, \
so output still in the pipe is dropped (seen as an empty or short stdout with exit code 0).
- **Its `read_file` is line-based text**: a header line (which the adapter strips), the last newline \
dropped, CRLF and lone CR turned into LF, files it deems binary refused with a message (not an error), \
FF FE at the start read as UTF-16.
- **Its `write_file` looks at the extension**: `.pdf` content is rendered through a browser (here: \
refused, no Chrome), image extensions are base64-decoded before writing; it does not create parent \
directories (the adapter calls `create_directory` first) and refuses to replace a file without an \
explicit mode.
- **What the evidence still gets wrong here**: under `no-network`, a few browser tests are put on \
`fs.persistence` instead of `net.egress`: Chromium looks for a fontconfig cache temp file that \
another Chromium, in an earlier test of the same session, wrote and then renamed into place. The \
probe sees failed syscalls and writes, not renames, and with one MCP session per worker \
(`--reuse-sessions`) a probe session spans many tests. (The same rule no longer fires on files a \
process misses that it wrote itself: desktop-commander's own config lock and temp files.)
";
