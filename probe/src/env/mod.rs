//! The environment a workload runs in, as one document of typed facets
//! (`probe env`), and what differs between two of them (`probe env diff`,
//! `campaign compare`): the article's "compare the two environments
//! feature by feature", tied to the failures it explains.
//!
//! A snapshot is taken from inside the sandbox, as the workload's user,
//! without root or a daemon. It never holds a secret: environment
//! variables by name with a hash of the value, no file contents.

pub mod collect;
pub mod diff;
pub mod explain;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the document says it is.
pub const FORMAT: &str = "probe-env";
/// The newest document version this probe reads and writes.
pub const VERSION: u32 = 1;

/// The facets, in the order they are shown.
pub const FACETS: &[&str] = &[
    "runtime",
    "identity",
    "commands",
    "browser",
    "packages",
    "writable",
    "persistence",
    "resources",
    "syscalls",
    "network",
    "variables",
    "mcp",
];

/// One environment, measured from inside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub format: String,
    pub version: u32,
    /// The probe that took it.
    pub probe_version: String,
    /// When (ms since the epoch) and how long it took.
    pub taken_at_ms: i64,
    pub took_ms: u64,
    /// Where it was taken, as its taker says (`host`, `bridge`, `proxy`, a file).
    #[serde(default)]
    pub source: String,
    pub facets: BTreeMap<String, Facet>,
}

/// One facet: how it was measured, what it found (key → value), and what
/// could not be read (key → why).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Facet {
    pub how: String,
    #[serde(default)]
    pub items: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unreadable: BTreeMap<String, String>,
}

impl Facet {
    pub fn new(how: impl Into<String>) -> Facet {
        Facet {
            how: how.into(),
            ..Facet::default()
        }
    }

    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        self.items.insert(key.into(), value.into());
    }

    /// Records why `key` could not be read.
    pub fn cannot(&mut self, key: impl Into<String>, why: impl std::fmt::Display) {
        self.unreadable.insert(key.into(), why.to_string());
    }
}

/// A document that is not a snapshot this probe can read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("not a probe environment snapshot (no \"format\": \"{FORMAT}\")")]
    NotASnapshot,
    #[error(
        "made by a newer probe (document version {0}; this probe reads up to {VERSION}): \
         take both snapshots with the same probe, or upgrade this one"
    )]
    Newer(u32),
    #[error("malformed snapshot: {0}")]
    Malformed(serde_json::Error),
}

impl Snapshot {
    /// An empty snapshot of this probe's version.
    pub fn empty(source: &str) -> Snapshot {
        Snapshot {
            format: FORMAT.into(),
            version: VERSION,
            probe_version: env!("CARGO_PKG_VERSION").into(),
            taken_at_ms: crate::clock::now_ms(),
            took_ms: 0,
            source: source.into(),
            facets: BTreeMap::new(),
        }
    }

    /// Reads a snapshot document, saying exactly what is wrong with one
    /// it cannot read.
    pub fn parse(text: &[u8]) -> Result<Snapshot, SnapshotError> {
        let v: Value = serde_json::from_slice(text).map_err(SnapshotError::NotJson)?;
        Snapshot::from_value(v)
    }

    pub fn from_value(v: Value) -> Result<Snapshot, SnapshotError> {
        if v.get("format").and_then(Value::as_str) != Some(FORMAT) {
            return Err(SnapshotError::NotASnapshot);
        }
        match v.get("version").and_then(Value::as_u64) {
            Some(n) if n > VERSION as u64 => return Err(SnapshotError::Newer(n as u32)),
            _ => {}
        }
        serde_json::from_value(v).map_err(SnapshotError::Malformed)
    }

    pub fn facet(&self, name: &str) -> Option<&Facet> {
        self.facets.get(name)
    }

    pub fn facet_mut(&mut self, name: &str, how: &str) -> &mut Facet {
        self.facets
            .entry(name.to_string())
            .or_insert_with(|| Facet::new(how))
    }
}

/// A secret-free stand-in for a value: `sha256:` and 16 hex digits.
pub fn hash_of(value: &[u8]) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(value);
    format!("sha256:{}", hex::encode(&d[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_documents_are_named() {
        assert!(matches!(
            Snapshot::parse(b"{not json"),
            Err(SnapshotError::NotJson(_))
        ));
        assert!(matches!(
            Snapshot::parse(br#"{"format":"other"}"#),
            Err(SnapshotError::NotASnapshot)
        ));
        let e = Snapshot::parse(br#"{"format":"probe-env","version":9}"#).unwrap_err();
        assert!(e.to_string().contains("version 9"), "{e}");
        assert!(matches!(
            Snapshot::parse(br#"{"format":"probe-env","version":1,"facets":3}"#),
            Err(SnapshotError::Malformed(_))
        ));
        let s = Snapshot::empty("test");
        let back = Snapshot::parse(&serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn a_hash_hides_the_value() {
        let h = hash_of(b"hunter2");
        assert!(h.starts_with("sha256:") && h.len() == 7 + 16, "{h}");
        assert!(!h.contains("hunter2"));
        assert_eq!(h, hash_of(b"hunter2"));
    }
}
