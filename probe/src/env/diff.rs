//! Two snapshots side by side: every item whose value differs, facet by
//! facet, and what one side could read and the other could not.
//!
//! Equality is exact except where a value moves on its own between two
//! measurements of the same machine: free space and inodes (a difference
//! only when one side has less than half the other's) and counters that
//! only grow (`memory.oom_kill`); and the shell's bookkeeping variables.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::{FACETS, Snapshot};

/// One item that differs: its value on each side (`None`: not there).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    pub facet: String,
    pub key: String,
    pub a: Option<Value>,
    pub b: Option<Value>,
    /// For object values: the fields that differ.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

/// An item one side measured and the other could not (or did not).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unknown {
    pub facet: String,
    pub key: String,
    /// Why it is unknown, and on which side.
    pub why: String,
}

/// Which snapshot a side is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    pub source: String,
    pub taken_at_ms: i64,
    pub probe_version: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diff {
    pub a: Side,
    pub b: Side,
    pub differences: Vec<Difference>,
    pub unknown: Vec<Unknown>,
}

/// Fields whose value drifts between two measurements of one machine.
const SPACE_FIELDS: &[&str] = &["free_bytes", "free_inodes"];
/// Items that only count up while a machine runs.
const COUNTERS: &[(&str, &str)] = &[("resources", "memory.oom_kill")];
/// Fields that name where one measurement happened, not what it found:
/// the cgroup a bridge makes for each call, and the levels of it the
/// limits were read from.
const WHERE_FIELDS: &[(&str, &str, &str)] = &[
    ("resources", "cgroup", "path"),
    ("resources", "cgroup", "limits_from"),
];
/// Variables a shell or a login sets anew for every start or session.
const SHELL_BOOKKEEPING: &[&str] = &[
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "SSH_CONNECTION",
    "SSH_CLIENT",
    "SSH_TTY",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "XDG_SESSION_ID",
    "TERM_SESSION_ID",
    "WINDOWID",
];
/// Facets whose keys are the names each side was asked to look up: a
/// name one side did not look up is not known there, not absent.
const ASKED_FOR: &[&str] = &["commands"];

fn side(s: &Snapshot) -> Side {
    Side {
        source: s.source.clone(),
        taken_at_ms: s.taken_at_ms,
        probe_version: s.probe_version.clone(),
    }
}

/// Facets in display order: the known ones first, then any others.
fn facet_names<'a>(a: &'a Snapshot, b: &'a Snapshot) -> Vec<&'a str> {
    let mut names: Vec<&str> = FACETS
        .iter()
        .copied()
        .filter(|f| a.facets.contains_key(*f) || b.facets.contains_key(*f))
        .collect();
    let others: BTreeSet<&str> = a
        .facets
        .keys()
        .chain(b.facets.keys())
        .map(String::as_str)
        .filter(|f| !FACETS.contains(f))
        .collect();
    names.extend(others);
    names
}

pub fn diff(a: &Snapshot, b: &Snapshot) -> Diff {
    let mut d = Diff {
        a: side(a),
        b: side(b),
        differences: vec![],
        unknown: vec![],
    };
    for facet in facet_names(a, b) {
        let (fa, fb) = match (a.facets.get(facet), b.facets.get(facet)) {
            (Some(x), Some(y)) => (x, y),
            (x, _) => {
                let missing = if x.is_none() { "A" } else { "B" };
                d.unknown.push(Unknown {
                    facet: facet.into(),
                    key: "*".into(),
                    why: format!("not measured in {missing}"),
                });
                continue;
            }
        };
        let keys: BTreeSet<&String> = fa.items.keys().chain(fb.items.keys()).collect();
        for key in keys {
            if COUNTERS.contains(&(facet, key.as_str()))
                || (facet == "variables" && SHELL_BOOKKEEPING.contains(&key.as_str()))
            {
                continue;
            }
            let (va, vb) = (fa.items.get(key), fb.items.get(key));
            // a value on one side, unreadable on the other: not a difference
            let unreadable = match (va, vb) {
                (Some(_), None) => fb
                    .unreadable
                    .get(key)
                    .map(|w| format!("unreadable in B: {w}")),
                (None, Some(_)) => fa
                    .unreadable
                    .get(key)
                    .map(|w| format!("unreadable in A: {w}")),
                _ => None,
            };
            let unreadable = unreadable.or_else(|| {
                let side = match (va, vb) {
                    (Some(_), None) => "B",
                    (None, Some(_)) => "A",
                    _ => return None,
                };
                ASKED_FOR
                    .contains(&facet)
                    .then(|| format!("not looked up in {side}"))
            });
            if let Some(why) = unreadable {
                d.unknown.push(Unknown {
                    facet: facet.into(),
                    key: key.clone(),
                    why,
                });
                continue;
            }
            let fields = match (va, vb) {
                (Some(x), Some(y)) => match differing_fields(x, y).map(|f| {
                    f.into_iter()
                        .filter(|field| {
                            !WHERE_FIELDS.contains(&(facet, key.as_str(), field.as_str()))
                        })
                        .collect::<Vec<_>>()
                }) {
                    Some(f) if f.is_empty() => continue,
                    Some(f) => f,
                    None => vec![],
                },
                _ => vec![],
            };
            d.differences.push(Difference {
                facet: facet.into(),
                key: key.clone(),
                a: va.cloned(),
                b: vb.cloned(),
                fields,
            });
        }
    }
    d
}

/// `Some(fields that differ)` for two objects (empty: the same), `None`
/// for two other values that differ; `Some([])` for equal values.
fn differing_fields(a: &Value, b: &Value) -> Option<Vec<String>> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            Some(
                keys.into_iter()
                    .filter(|k| {
                        let (p, q) = (x.get(*k), y.get(*k));
                        if SPACE_FIELDS.contains(&k.as_str()) {
                            !similar_amount(p, q)
                        } else {
                            p != q
                        }
                    })
                    .cloned()
                    .collect(),
            )
        }
        _ if a == b => Some(vec![]),
        _ => None,
    }
}

/// Two amounts of free space are alike unless one is under half the other.
fn similar_amount(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a.and_then(Value::as_u64), b.and_then(Value::as_u64)) {
        (Some(x), Some(y)) => x.min(y).saturating_mul(2) >= x.max(y),
        _ => a == b,
    }
}

/// A value in a few words: strings as they are, `none` for null, sizes
/// in binary units, objects by their telling fields.
pub fn words(v: Option<&Value>) -> String {
    match v {
        None => "—".into(),
        Some(Value::Null) => "none".into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.is_empty() => "[]".into(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| words(Some(x)))
            .collect::<Vec<_>>()
            .join(", "),
        Some(Value::Object(o)) => {
            if o.get("path") == Some(&Value::Null) || o.get("exists") == Some(&Value::Bool(false)) {
                return "absent".into();
            }
            // the path first, bare: what people look for
            let path = o.get("path").and_then(Value::as_str);
            path.into_iter()
                .map(str::to_string)
                .chain(
                    o.iter()
                        .filter(|(k, v)| !v.is_null() && (*k != "path" || path.is_none()))
                        .map(|(k, v)| format!("{k}={}", field_words(k, v))),
                )
                .collect::<Vec<_>>()
                .join(" ")
        }
        Some(other) => other.to_string(),
    }
}

fn field_words(key: &str, v: &Value) -> String {
    match (key, v.as_u64()) {
        ("free_bytes" | "mem_total_bytes", Some(n)) => bytes(n),
        _ => words(Some(v)),
    }
}

/// `n` bytes as people read them.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u < UNITS.len() - 1 {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

impl Difference {
    /// `A → B` in words: only the fields that differ, for objects.
    pub fn change(&self) -> String {
        let absent = |v: &Option<Value>| v.as_ref().is_some_and(|v| words(Some(v)) == "absent");
        if !self.fields.is_empty() && !absent(&self.a) && !absent(&self.b) {
            return self
                .fields
                .iter()
                .map(|f| {
                    let get = |v: &Option<Value>| v.as_ref().and_then(|v| v.get(f)).cloned();
                    let (x, y) = (get(&self.a), get(&self.b));
                    let w = |v: &Option<Value>| match v {
                        Some(v) => field_words(f, v),
                        None => "—".into(),
                    };
                    format!("{f} {} → {}", w(&x), w(&y))
                })
                .collect::<Vec<_>>()
                .join("; ");
        }
        format!("{} → {}", words(self.a.as_ref()), words(self.b.as_ref()))
    }
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.differences.is_empty()
    }

    /// The differences for people: a heading per facet, a line per item.
    pub fn render_text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "environment: A = {} → B = {}",
            self.a.source, self.b.source
        );
        let facets: BTreeSet<&str> = self.differences.iter().map(|d| d.facet.as_str()).collect();
        let _ = writeln!(
            o,
            "{} difference(s) in {} facet(s); {} item(s) could not be compared",
            self.differences.len(),
            facets.len(),
            self.unknown.len()
        );
        let mut last = "";
        for d in &self.differences {
            if d.facet != last {
                let _ = writeln!(o, "\n{}", d.facet);
                last = &d.facet;
            }
            let _ = writeln!(o, "  {:<28} {}", d.key, d.change());
        }
        if !self.unknown.is_empty() {
            let _ = writeln!(o, "\nnot compared");
            for u in &self.unknown {
                let _ = writeln!(o, "  {:<28} {}", format!("{}/{}", u.facet, u.key), u.why);
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snap(facets: Value) -> Snapshot {
        Snapshot::from_value(json!({
            "format": "probe-env", "version": 1, "probe_version": "t",
            "taken_at_ms": 0, "took_ms": 0, "source": "t", "facets": facets
        }))
        .unwrap()
    }

    #[test]
    fn only_real_differences_are_listed() {
        let a = snap(json!({
            "writable": {"how": "h", "items": {
                "tmp": {"path": "/tmp", "tmpfs": false, "free_bytes": 40_000_000_000u64},
                "cwd": {"path": "/w", "writable": "ok", "free_bytes": 1000}}},
            "commands": {"how": "h", "items": {"gcc": {"path": "/usr/bin/gcc"}, "sh": {"path": "/bin/sh"}}},
            "resources": {"how": "h", "items": {"memory.oom_kill": 0, "pids.max": "max"}},
            "variables": {"how": "h", "items": {"PWD": "sha256:1", "TOKEN": "sha256:2"}},
            "network": {"how": "h", "items": {"if.eth0": {"up": true}}},
        }));
        let b = snap(json!({
            "writable": {"how": "h", "items": {
                "tmp": {"path": "/tmp", "tmpfs": true, "free_bytes": 8_000_000u64},
                "cwd": {"path": "/w", "writable": "ok", "free_bytes": 900}}},
            "commands": {"how": "h", "items": {"gcc": {"path": null}, "sh": {"path": "/bin/sh"}}},
            "resources": {"how": "h", "items": {"memory.oom_kill": 4, "pids.max": "64"}},
            "variables": {"how": "h", "items": {"PWD": "sha256:9", "TOKEN": "sha256:2"}},
            "network": {"how": "h", "items": {}, "unreadable": {"if.eth0": "no /sys"}},
        }));
        let d = diff(&a, &b);
        let got: Vec<(&str, &str)> = d
            .differences
            .iter()
            .map(|x| (x.facet.as_str(), x.key.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("commands", "gcc"),
                ("writable", "tmp"),
                ("resources", "pids.max")
            ]
        );
        assert_eq!(d.differences[1].fields, ["free_bytes", "tmpfs"]);
        assert_eq!(d.differences[0].change(), "/usr/bin/gcc → absent");
        assert!(d.differences[1].change().contains("tmpfs false → true"));
        assert_eq!(d.unknown.len(), 1, "{:?}", d.unknown);
        assert!(d.unknown[0].why.contains("no /sys"));
        let text = d.render_text();
        assert!(text.contains("3 difference(s) in 3 facet(s)"), "{text}");
        assert!(diff(&a, &a).is_empty());
    }

    #[test]
    fn a_facet_one_side_never_measured_is_unknown_not_different() {
        let a = snap(json!({"mcp": {"how": "h", "items": {"exec": "sha256:1"}}}));
        let b = snap(json!({}));
        let d = diff(&a, &b);
        assert!(d.differences.is_empty());
        assert_eq!(d.unknown[0].why, "not measured in B");
    }
}
