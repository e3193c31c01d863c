//! A snapshot for people: one table per facet, each value on one line.

use std::fmt::Write as _;

use serde_json::Value;

use crate::env::{FACETS, Facet, Snapshot};

/// Lines shown per facet at most (the JSON has them all).
const MAX_LINES: usize = 60;

pub fn render_text(s: &Snapshot) -> String {
    let mut out = format!(
        "probe env {} — {} — taken in {} ms\n",
        s.probe_version, s.source, s.took_ms
    );
    let mut names: Vec<&str> = FACETS.to_vec();
    for extra in s.facets.keys() {
        if !names.contains(&extra.as_str()) {
            names.push(extra);
        }
    }
    for name in names {
        let Some(f) = s.facet(name) else {
            continue;
        };
        render_facet(&mut out, name, f);
    }
    out
}

fn render_facet(out: &mut String, name: &str, f: &Facet) {
    let _ = writeln!(out, "\n{name}: {}", f.how);
    let width = f
        .items
        .keys()
        .chain(f.unreadable.keys())
        .map(|k| k.chars().count())
        .filter(|n| *n <= 32)
        .max()
        .unwrap_or(8);
    if name == "packages" {
        let count = |prefix: &str| f.items.keys().filter(|k| k.starts_with(prefix)).count();
        let _ = writeln!(
            out,
            "  {} python, {} node packages",
            count("python:"),
            count("node:")
        );
    }
    let total = f.items.len();
    for (shown, (k, v)) in f.items.iter().enumerate() {
        if shown == MAX_LINES {
            let _ = writeln!(out, "  … {} more (see --json)", total - shown);
            break;
        }
        let _ = writeln!(out, "  {k:<width$}  {}", summary(name, k, v));
    }
    for (k, why) in &f.unreadable {
        let _ = writeln!(out, "  ?  {k}: {why}");
    }
}

/// One value on one line.
fn summary(facet: &str, key: &str, v: &Value) -> String {
    if key.starts_with("caps.")
        && let Some(caps) = v.as_array()
    {
        return capabilities(caps);
    }
    let Value::Object(o) = v else {
        return scalar(v);
    };
    if o.get("path").is_some_and(Value::is_null) {
        return "absent".into();
    }
    let get = |k: &str| o.get(k).map(scalar).unwrap_or_default();
    let missing = match o.get("missing_libs").and_then(Value::as_array) {
        Some(m) if !m.is_empty() => format!("  MISSING {}", list(m)),
        _ => String::new(),
    };
    match facet {
        "commands" => {
            let version = o.get("version").and_then(Value::as_str).unwrap_or("-");
            format!("{}  {}  {}{missing}", get("path"), version, get("machine"))
        }
        "browser" => format!(
            "{} (elf {})  fonts {}  userns {}{missing}",
            get("path"),
            get("elf"),
            get("fonts"),
            get("userns")
        ),
        "writable" if o.get("exists") == Some(&Value::Bool(false)) => {
            format!("{}  does not exist", get("path"))
        }
        "writable" => {
            let flag = |k: &str, word: &str| {
                if o.get(k) == Some(&Value::Bool(true)) {
                    format!(" {word}")
                } else {
                    String::new()
                }
            };
            let free = o
                .get("free_bytes")
                .and_then(Value::as_u64)
                .map(bytes)
                .unwrap_or_else(|| "?".into());
            format!(
                "{}  on {} ({}){}{}{}{}  {free} free  write: {}",
                get("path"),
                get("mount"),
                get("fstype"),
                if o.get("read_only") == Some(&Value::Bool(true)) {
                    " ro"
                } else {
                    " rw"
                },
                flag("noexec", "noexec"),
                flag("nosuid", "nosuid"),
                flag("tmpfs", "tmpfs"),
                get("writable")
            )
        }
        "network" if o.contains_key("up") => format!(
            "{}  {}",
            if o.get("up") == Some(&Value::Bool(true)) {
                "up"
            } else {
                "down"
            },
            o.get("addrs")
                .and_then(Value::as_array)
                .map(|a| list(a))
                .unwrap_or_default()
        ),
        _ => o
            .iter()
            .map(|(k, v)| format!("{k}={}", scalar(v)))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// A capability set, by what it lacks when it has most of them.
fn capabilities(caps: &[Value]) -> String {
    let have: Vec<&str> = caps.iter().filter_map(Value::as_str).collect();
    let all = super::syscalls::cap_names(u64::MAX >> 23);
    let lacking: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|c| !have.contains(c))
        .collect();
    match (have.len(), lacking.len()) {
        (0, _) => "(none)".into(),
        (_, 0) => format!("all {} known", all.len()),
        (h, l) if h > l => format!("all but {}", lacking.join(", ")),
        _ => have.join(", "),
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Array(a) => list(a),
        other => other.to_string(),
    }
}

fn list(a: &[Value]) -> String {
    if a.is_empty() {
        return "(none)".into();
    }
    a.iter().map(scalar).collect::<Vec<_>>().join(", ")
}

/// `12.3 GiB`.
fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_summarize_on_one_line() {
        let c = json!({"path": "/usr/bin/python3", "version": "Python 3.11.2",
                       "machine": "x86_64", "missing_libs": []});
        assert_eq!(
            summary("commands", "python3", &c),
            "/usr/bin/python3  Python 3.11.2  x86_64"
        );
        assert_eq!(summary("commands", "zsh", &json!({"path": null})), "absent");
        let w = json!({"path": "/work", "mount": "/work", "fstype": "ext4", "read_only": true,
                       "noexec": false, "nosuid": true, "tmpfs": false,
                       "free_bytes": 3u64 << 30, "free_inodes": 9, "writable": "EROFS"});
        assert_eq!(
            summary("writable", "cwd", &w),
            "/work  on /work (ext4) ro nosuid  3.0 GiB free  write: EROFS"
        );
        assert_eq!(
            summary(
                "network",
                "if.lo",
                &json!({"up": true, "addrs": ["127.0.0.1/8"]})
            ),
            "up  127.0.0.1/8"
        );
        let caps = |m: u64| json!(crate::env::collect::syscalls::cap_names(m));
        assert_eq!(summary("syscalls", "caps.effective", &caps(0)), "(none)");
        assert_eq!(
            summary("syscalls", "caps.bounding", &caps((1 << 41) - 1)),
            "all 41 known"
        );
        assert_eq!(
            summary(
                "syscalls",
                "caps.bounding",
                &caps(((1 << 41) - 1) & !(1 << 21))
            ),
            "all but cap_sys_admin"
        );
        assert_eq!(
            summary("syscalls", "caps.effective", &caps(1 | 1 << 10)),
            "cap_chown, cap_net_bind_service"
        );
        let mut s = Snapshot::empty("test");
        let f = s.facet_mut("identity", "How.");
        f.set("uid", 1000);
        f.cannot("tz", "no zone");
        let text = render_text(&s);
        assert!(text.contains("identity: How."), "{text}");
        assert!(text.contains("  ?  tz: no zone"), "{text}");
    }
}
