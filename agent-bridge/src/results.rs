//! `record_result`: an outside agent's test outcome, into the campaign's
//! SQLite store (the shared schema in `migrations/`).

use std::path::Path;

use serde_json::{Value, json};

use contract::tools::{ArgError, RecordResultArgs, arg_error};

const STATUSES: &[&str] = &["pass", "fail", "error", "skip"];
const LAYERS: &[&str] = &["interface", "sandbox", "test"];

pub fn check(a: &RecordResultArgs) -> Result<(), ArgError> {
    for (name, value) in [("test_id", &a.test_id), ("domain", &a.domain)] {
        if value.trim().is_empty() {
            return Err(arg_error(name, "is empty"));
        }
    }
    if !STATUSES.contains(&a.status.as_str()) {
        return Err(arg_error(
            "status",
            format!("`{}` is not one of {}", a.status, STATUSES.join(", ")),
        ));
    }
    if let Some(layer) = &a.layer
        && !LAYERS.contains(&layer.as_str())
    {
        return Err(arg_error(
            "layer",
            format!("`{layer}` is not one of {}", LAYERS.join(", ")),
        ));
    }
    if let Some(p) = &a.primitive
        && !probe::primitive::Primitive::ALL.iter().any(|k| k.id() == p)
    {
        let known: Vec<&str> = probe::primitive::Primitive::ALL
            .iter()
            .map(|k| k.id())
            .collect();
        return Err(arg_error(
            "primitive",
            format!("`{p}` is not in the taxonomy ({})", known.join(", ")),
        ));
    }
    Ok(())
}

/// Upserts one outcome; the same (run, test_id) recorded again replaces it.
pub fn record(db: &Path, run: &str, session: &str, a: &RecordResultArgs) -> Result<Value, String> {
    let store = probe::store::Store::open(db).map_err(|e| e.to_string())?;
    let now = probe::clock::now_ms();
    store
        .connection()
        .execute(
            "INSERT INTO recorded_results (run, test_id, domain, status, layer, primitive, notes, mcp_session, recorded_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (run, test_id) DO UPDATE SET domain = ?3, status = ?4, layer = ?5,
                 primitive = ?6, notes = ?7, mcp_session = ?8, recorded_ms = ?9",
            rusqlite::params![run, a.test_id, a.domain, a.status, a.layer, a.primitive, a.notes, session, now as i64],
        )
        .map_err(|e| format!("{}: {e}", db.display()))?;
    Ok(json!({"run": run, "test_id": a.test_id, "status": a.status, "db": db}))
}
