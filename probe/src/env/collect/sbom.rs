//! The `packages` facet as a CycloneDX 1.5 JSON SBOM, for tools that read
//! those.

use serde_json::{Value, json};

use crate::env::Snapshot;

pub fn cyclonedx(s: &Snapshot) -> Value {
    let mut components = Vec::new();
    if let Some(f) = s.facet("packages") {
        for (key, version) in &f.items {
            let (Some((eco, name)), Some(version)) = (key.split_once(':'), version.as_str()) else {
                continue;
            };
            let kind = match eco {
                "python" => "pypi",
                "node" => "npm",
                _ => continue,
            };
            let purl = format!("pkg:{kind}/{}@{}", purl_name(name), encode(version));
            components.push(json!({
                "type": "library",
                "bom-ref": purl,
                "name": name,
                "version": version,
                "purl": purl,
            }));
        }
    }
    json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": iso8601(s.taken_at_ms),
            "tools": {"components": [{
                "type": "application",
                "name": "probe",
                "version": s.probe_version,
            }]},
        },
        "components": components,
    })
}

/// A purl's name: npm's `@scope/name` is the namespace `%40scope` and the
/// name; each part percent-encoded.
fn purl_name(name: &str) -> String {
    match name.strip_prefix('@').and_then(|n| n.split_once('/')) {
        Some((scope, n)) => format!("%40{}/{}", encode(scope), encode(n)),
        None => encode(name),
    }
}

/// Percent-encodes all but the characters a purl segment keeps as is.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `2026-11-29T17:55:01Z` for Unix ms.
fn iso8601(ms: i64) -> String {
    format!("{}Z", crate::clock::utc(ms, 'T'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_become_components() {
        let mut s = Snapshot::empty("test");
        s.taken_at_ms = 1_795_974_901_000;
        let f = s.facet_mut("packages", "how");
        f.set("python:requests", "2.31.0");
        f.set("node:@types/node", "20.1.0+x");
        let bom = cyclonedx(&s);
        assert_eq!(bom["bomFormat"], "CycloneDX");
        assert_eq!(bom["specVersion"], "1.5");
        assert_eq!(bom["metadata"]["timestamp"], "2026-11-29T17:55:01Z");
        let c = bom["components"].as_array().unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0]["purl"], "pkg:npm/%40types/node@20.1.0%2Bx");
        assert_eq!(c[1]["purl"], "pkg:pypi/requests@2.31.0");
        assert_eq!(c[1]["type"], "library");
    }
}
