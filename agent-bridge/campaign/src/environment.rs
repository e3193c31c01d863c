//! The environment a run ran in: the target's snapshot (`sandbox_environment`,
//! answered by `agent-bridge serve` and by `agent-bridge proxy`), its MCP
//! surface, and whether what the run wrote at its start was still there at
//! its end; stored with the run, one per target.

use std::collections::BTreeSet;
use std::time::Duration;

use probe::env::{Snapshot, hash_of};
use serde_json::{Value, json};

use super::db::{Db, sql};
use super::spec::TestSpec;
use super::target::{Connection, Target};

/// At most this many command names from a suite are looked up.
const MAX_NAMES: usize = 256;
const PATIENCE: Duration = Duration::from_secs(60);

/// The programs a suite's steps run and the tests name as needed: what a
/// snapshot should look up besides its default set.
pub fn commands_of(tests: &[TestSpec]) -> Vec<String> {
    let mut names = BTreeSet::new();
    for t in tests {
        names.extend(t.requires.iter().cloned());
        for step in &t.steps {
            if let Some(argv0) = step
                .arguments
                .get("argv")
                .and_then(|a| a.get(0))
                .and_then(Value::as_str)
            {
                names.insert(argv0.rsplit('/').next().unwrap_or(argv0).to_string());
            }
            if let Some(line) = step.arguments.get("command").and_then(Value::as_str) {
                names.extend(shell_commands(line));
            }
        }
    }
    names
        .into_iter()
        .filter(|n| {
            contract::tools::command_name(n).is_ok() && !n.contains(['$', '{', '(', '`', '\'', '"'])
        })
        .take(MAX_NAMES)
        .collect()
}

/// The first word of each command of a shell line (`a && b | c; d`),
/// past variable assignments.
fn shell_commands(line: &str) -> Vec<String> {
    line.split(['&', '|', ';', '\n', '('])
        .filter_map(|segment| {
            segment
                .split_whitespace()
                .find(|w| !w.contains('='))
                .map(|w| w.rsplit('/').next().unwrap_or(w).to_string())
        })
        .filter(|w| {
            w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c))
        })
        .filter(|w| {
            !matches!(
                w.as_str(),
                "cd" | "then"
                    | "do"
                    | "if"
                    | "for"
                    | "while"
                    | "done"
                    | "fi"
                    | "else"
                    | "exec"
                    | "set"
                    | "export"
                    | "test"
                    | "["
                    | "true"
                    | "false"
                    | "echo"
                    | "printf"
                    | "read"
                    | "exit"
            )
        })
        .collect()
}

/// The snapshot a target takes of itself, with its tools as the `mcp`
/// facet; or why there is none.
pub async fn take(target: &Target, names: &[String]) -> Result<Snapshot, String> {
    let conn = tokio::time::timeout(PATIENCE, target.connect())
        .await
        .map_err(|_| "no answer in 60 s".to_string())?
        .map_err(|e| e.to_string())?;
    let result = take_on(&conn, names).await;
    conn.close().await;
    result
}

async fn take_on(conn: &Connection, names: &[String]) -> Result<Snapshot, String> {
    let mut args = serde_json::Map::new();
    args.insert("commands".into(), json!(names));
    let answer = conn
        .call(probe_tool(), args, PATIENCE, None)
        .await
        .map_err(|e| format!("sandbox_environment: {e}"))?;
    let structured = answer.structured_content.unwrap_or_default();
    if answer.is_error == Some(true) || structured.get("snapshot").is_none() {
        let said: Vec<String> = answer
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect();
        return Err(format!(
            "the target has no snapshot to give ({})",
            said.join(" ").chars().take(300).collect::<String>()
        ));
    }
    let mut snapshot = Snapshot::from_value(structured["snapshot"].clone())
        .map_err(|e| format!("the target's snapshot: {e}"))?;
    let mcp = snapshot.facet_mut(
        "mcp",
        "tools/list of the target: each tool's name and a hash of its input schema",
    );
    match conn.list_tools().await {
        Ok(tools) => {
            for t in tools {
                let schema = serde_json::to_vec(&t.input_schema).unwrap_or_default();
                mcp.set(t.name.to_string(), hash_of(&schema));
            }
        }
        Err(e) => mcp.cannot("tools", format!("tools/list: {e}")),
    }
    Ok(snapshot)
}

fn probe_tool() -> &'static str {
    "sandbox_environment"
}

/// Where a runner of the run leaves its persistence markers: the shared
/// /tmp and the target's working directory (a relative path). One name
/// per runner: runners sharing a run do not read each other's.
fn markers(run: &str, runner: &str) -> [(&'static str, String); 2] {
    let key = format!("{run}\n{runner}");
    let name = format!(
        "{MARKER_PREFIX}{}",
        hash_of(key.as_bytes()).trim_start_matches("sha256:")
    );
    [("tmp", format!("/tmp/{name}")), ("workdir", name)]
}

const MARKER_PREFIX: &str = ".probe-env-marker-";

/// A marker older than this belongs to a run that never read it back (one
/// killed, or resumed: a resumed run keeps its first snapshot). Longer
/// than any campaign runs, so a live run's markers are never taken.
const STALE_MARKER_MINUTES: u32 = 2 * 24 * 60;

/// Writes the markers through the target's `write_file` (a bridge's tool);
/// the places it could write. First sweeps the stale markers of runs that
/// never read theirs, so markers do not pile up over months of runs.
pub async fn leave_markers(target: &Target, run: &str, runner: &str) -> Vec<&'static str> {
    let Ok(Ok(conn)) = tokio::time::timeout(PATIENCE, target.connect()).await else {
        return vec![];
    };
    let mut sweep = serde_json::Map::new();
    sweep.insert(
        "argv".into(),
        json!([
            "find",
            "/tmp",
            ".",
            "-maxdepth",
            "1",
            "-type",
            "f",
            "-name",
            format!("{MARKER_PREFIX}*"),
            "-mmin",
            format!("+{STALE_MARKER_MINUTES}"),
            "-delete"
        ]),
    );
    // best effort: a target without `find` keeps its stale markers
    let _ = conn.call("exec", sweep, PATIENCE, None).await;
    let mut left = vec![];
    for (place, path) in markers(run, runner) {
        let mut args = serde_json::Map::new();
        args.insert("path".into(), json!(path));
        args.insert(
            "text".into(),
            json!("probe env marker: written at the start of the run\n"),
        );
        if let Ok(r) = conn.call("write_file", args, PATIENCE, None).await
            && r.is_error != Some(true)
        {
            left.push(place);
        }
    }
    conn.close().await;
    left
}

/// Reads back the markers left at the start (in a new session, as the
/// next call would) and records in the `persistence` facet whether each
/// is still there; then removes them.
pub async fn read_markers(
    target: &Target,
    (run, runner): (&str, &str),
    left: &[&str],
    snapshot: &mut Snapshot,
) {
    let facet = snapshot.facet_mut(
        "persistence",
        "a marker written through the target at the start of the run, looked for at its end",
    );
    facet.unreadable.clear();
    let conn = match tokio::time::timeout(PATIENCE, target.connect()).await {
        Ok(Ok(c)) => c,
        _ => {
            for (place, _) in markers(run, runner) {
                facet.cannot(place, "the target did not answer at the end of the run");
            }
            return;
        }
    };
    for (place, path) in markers(run, runner) {
        if !left.contains(&place) {
            facet.cannot(
                place,
                "the marker could not be written at the start (no write_file, or it failed)",
            );
            continue;
        }
        let mut args = serde_json::Map::new();
        args.insert("path".into(), json!(path));
        match conn.call("stat", args, PATIENCE, None).await {
            Ok(r) if r.is_error != Some(true) => {
                facet.set(place, "kept");
                let mut rm = serde_json::Map::new();
                rm.insert("argv".into(), json!(["rm", "-f", path]));
                let _ = conn.call("exec", rm, PATIENCE, None).await;
            }
            Ok(_) => facet.set(place, "lost"),
            Err(e) => facet.cannot(place, format!("stat: {e}")),
        }
    }
    conn.close().await;
}

/// A snapshot from a file (`campaign run --env FILE`): for a target that
/// cannot take its own.
pub fn from_file(path: &std::path::Path) -> anyhow::Result<Snapshot> {
    let bytes =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("--env {}: {e}", path.display()))?;
    Snapshot::parse(&bytes).map_err(|e| anyhow::anyhow!("--env {}: {e}", path.display()))
}

impl Db {
    /// Stores `target`'s snapshot with the run (replacing an earlier one:
    /// the end of a run adds what persisted).
    pub fn store_environment(
        &mut self,
        run: &str,
        target: &str,
        s: &Snapshot,
    ) -> anyhow::Result<()> {
        self.execute(
            "INSERT INTO campaign_environments (run, target, snapshot, taken_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (run, target) DO UPDATE SET snapshot = excluded.snapshot, taken_ms = excluded.taken_ms",
            &[
                sql(run),
                sql(target),
                sql(&serde_json::to_string(s)?),
                s.taken_at_ms.into(),
            ],
        )?;
        Ok(())
    }

    /// Whether the run has a snapshot for `target` already (a resumed run keeps it).
    pub fn has_environment(&mut self, run: &str, target: &str) -> anyhow::Result<bool> {
        Ok(!self
            .query(
                "SELECT 1 FROM campaign_environments WHERE run = ?1 AND target = ?2",
                &[sql(run), sql(target)],
            )?
            .is_empty())
    }
}

/// The snapshots stored with a run: (target, snapshot, or why it cannot be read).
pub fn stored(
    conn: &rusqlite::Connection,
    run: &str,
) -> rusqlite::Result<Vec<(String, Result<Snapshot, String>)>> {
    let mut stmt = conn.prepare(
        "SELECT target, snapshot FROM campaign_environments WHERE run = ?1 ORDER BY target",
    )?;
    let rows = stmt.query_map([run], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    rows.map(|r| {
        r.map(|(target, text)| {
            let s = Snapshot::parse(text.as_bytes()).map_err(|e| e.to_string());
            (target, s)
        })
    })
    .collect()
}

/// The one snapshot a run is compared by: its first target's.
pub fn of_run(conn: &rusqlite::Connection, run: &str) -> rusqlite::Result<Option<Snapshot>> {
    Ok(stored(conn, run)?.into_iter().find_map(|(_, s)| s.ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_a_suite_runs_are_read_from_its_steps() {
        let words = shell_commands("cd /tmp && FOO=1 python3 -c 'x' | sort -u; /usr/bin/gcc a.c");
        assert_eq!(words, ["python3", "sort", "gcc"]);
    }
}
