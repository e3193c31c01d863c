//! CSV and JSON-lines exports of a run, for spreadsheets and other tools.

use rusqlite::Connection;

/// CSV of the tests of a run (one row each), for spreadsheets and pandas.
pub fn csv(conn: &Connection, run: &str) -> anyhow::Result<String> {
    let mut out = String::from(
        "run,test_id,domain,outcome,layer,primitive,confidence,duration_ms,explanation\n",
    );
    let mut stmt = conn.prepare(
        "SELECT test_id, domain, outcome, layer, primitive, confidence, duration_ms, explanation
         FROM campaign_tests WHERE run = ?1 ORDER BY test_id",
    )?;
    let mut rows = stmt.query([run])?;
    while let Some(r) = rows.next()? {
        let cells: Vec<String> = vec![
            run.to_string(),
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get::<_, Option<String>>(3)?.unwrap_or_default(),
            r.get::<_, Option<String>>(4)?.unwrap_or_default(),
            r.get::<_, Option<f64>>(5)?
                .map_or(String::new(), |c| format!("{c:.2}")),
            format!("{:.1}", r.get::<_, f64>(6)?),
            r.get::<_, Option<String>>(7)?.unwrap_or_default(),
        ];
        let line: Vec<String> = cells.iter().map(|c| csv_cell(c)).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    Ok(out)
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Every test of a run with its steps, as JSON lines (for other tools).
pub fn jsonl(conn: &Connection, run: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut tests = conn.prepare(
        "SELECT test_id, domain, title, outcome, layer, primitive, confidence, explanation, evidence,
                duration_ms, runner, mcp_session
         FROM campaign_tests WHERE run = ?1 ORDER BY test_id",
    )?;
    let mut steps = conn.prepare(
        "SELECT step, tool, request, response_sha256, response_bytes, duration_ms, is_error, verdict,
                failures, span_id, kernel_failed, kernel_primitive
         FROM campaign_steps WHERE run = ?1 AND test_id = ?2 ORDER BY step",
    )?;
    let json =
        |s: Option<String>| s.and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
    let mut rows = tests.query([run])?;
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let step_rows: Vec<serde_json::Value> = steps
            .query_map([run, &id], |s| {
                Ok(serde_json::json!({
                    "step": s.get::<_, i64>(0)?, "tool": s.get::<_, String>(1)?,
                    "request": json(s.get(2)?), "response_sha256": s.get::<_, Option<String>>(3)?,
                    "response_bytes": s.get::<_, Option<i64>>(4)?, "duration_ms": s.get::<_, f64>(5)?,
                    "is_error": s.get::<_, Option<bool>>(6)?, "verdict": s.get::<_, String>(7)?,
                    "failures": json(s.get(8)?), "span_id": s.get::<_, Option<i64>>(9)?,
                    "kernel_failed": s.get::<_, Option<bool>>(10)?, "kernel_primitive": s.get::<_, Option<String>>(11)?,
                }))
            })?
            .collect::<Result<_, _>>()?;
        let line = serde_json::json!({
            "run": run, "test_id": id, "domain": r.get::<_, String>(1)?, "title": r.get::<_, String>(2)?,
            "outcome": r.get::<_, String>(3)?, "layer": r.get::<_, Option<String>>(4)?,
            "primitive": r.get::<_, Option<String>>(5)?, "confidence": r.get::<_, Option<f64>>(6)?,
            "explanation": r.get::<_, Option<String>>(7)?, "evidence": json(r.get(8)?),
            "duration_ms": r.get::<_, f64>(9)?, "runner": r.get::<_, String>(10)?,
            "mcp_session": r.get::<_, Option<String>>(11)?, "steps": step_rows,
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    Ok(out)
}
