//! `campaign adapter check`: an adapter against the tools a server lists.
//! Every mapped tool the server does not have, every mapped argument its
//! input schema does not name, and every argument it requires that the
//! mapping never sends is a problem, found before anything runs.

use rmcp::model::Tool;
use serde_json::{Value, json};

use super::adapter::Adapter;

/// One mapping as the server sees it.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    pub step: String,
    pub tool: String,
    pub problems: Vec<String>,
}

/// Each mapping with what is wrong with it (nothing: it fits).
pub fn rows(adapter: &Adapter, tools: &[Tool]) -> Vec<Row> {
    adapter
        .mappings()
        .into_iter()
        .map(|(_, at, tool, args)| {
            let mut problems = Vec::new();
            match tools.iter().find(|t| t.name == tool) {
                None => {
                    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
                    problems.push(format!(
                        "{at}.tool: the server has no tool `{tool}` (it has: {})",
                        names.join(", ")
                    ));
                }
                Some(t) => {
                    let schema = Value::Object(t.input_schema.as_ref().clone());
                    let properties = schema["properties"].as_object();
                    // a schema that allows any property names none
                    let open = properties.is_none_or(|p| p.is_empty())
                        && schema["additionalProperties"] != Value::Bool(false);
                    for a in &args {
                        if !open && !properties.is_some_and(|p| p.contains_key(*a)) {
                            let known: Vec<&String> =
                                properties.map(|p| p.keys().collect()).unwrap_or_default();
                            problems.push(format!(
                                "{at}.arguments.{a}: `{tool}` takes no `{a}` (it takes: {})",
                                known.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
                            ));
                        }
                    }
                    for r in schema["required"].as_array().into_iter().flatten() {
                        if let Some(r) = r.as_str()
                            && !args.contains(&r)
                        {
                            problems.push(format!(
                                "{at}.arguments: `{tool}` requires `{r}`, which the mapping never sends"
                            ));
                        }
                    }
                }
            }
            Row {
                step: at.trim_start_matches("steps.").to_string(),
                tool: tool.to_string(),
                problems,
            }
        })
        .collect()
}

/// Every problem, one line each.
pub fn problems(adapter: &Adapter, tools: &[Tool]) -> Vec<String> {
    rows(adapter, tools)
        .into_iter()
        .flat_map(|r| r.problems)
        .collect()
}

/// The check as a table for people.
pub fn text(adapter: &Adapter, rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut o = format!(
        "adapter {} ({}){}\n",
        adapter.name,
        adapter.file.display(),
        if adapter.server.is_empty() {
            String::new()
        } else {
            format!(" for {}", adapter.server)
        }
    );
    let _ = writeln!(o, "{:<16} {:<24} check", "step", "target tool");
    for r in rows {
        let verdict = if r.problems.is_empty() {
            "ok"
        } else {
            "PROBLEM"
        };
        let _ = writeln!(o, "{:<16} {:<24} {verdict}", r.step, r.tool);
        for p in &r.problems {
            let _ = writeln!(o, "    {p}");
        }
    }
    if !adapter.limits.is_empty() {
        let _ = writeln!(o, "declared limits:");
        for l in &adapter.limits {
            let _ = writeln!(o, "  - {l}");
        }
    }
    let n: usize = rows.iter().map(|r| r.problems.len()).sum();
    let _ = writeln!(
        o,
        "{}",
        if n == 0 {
            "every mapped tool and argument exists".to_string()
        } else {
            format!("{n} problems")
        }
    );
    o
}

/// The check as JSON.
pub fn json(adapter: &Adapter, rows: &[Row]) -> Value {
    json!({
        "adapter": adapter.name,
        "file": adapter.file,
        "server": adapter.server,
        "limits": adapter.limits,
        "ok": rows.iter().all(|r| r.problems.is_empty()),
        "mappings": rows,
    })
}
