//! The campaign: generated tests across ten domains, run against a bridge.
//!
//! - [`spec`]: the test format (one JSON file per test) and its schema.
//! - [`validate`]: loading test files, with every problem explained.
//! - [`generate`]: the deterministic default suite; [`upstream`]: the local
//!   "internet" its network and browser tests reach; [`egress`]: the guard
//!   rail against tests that name hosts off this machine.
//! - [`target`]: one MCP session with the bridge under test; [`adapter`]:
//!   the campaign's steps on another server's tools.
//! - [`verdict`]: one step's result against its expectations.
//! - [`triage`]: a failed test's layer and primitive.
//! - [`db`]: results in SQLite or ([`pg`]) PostgreSQL; [`run`]: workers,
//!   targets, shards and claims, resume.
//! - [`report`]: one run as data and tables; [`html`], [`export`] (CSV,
//!   JSON lines); [`compare`]: runs side by side, the confusion matrix.
//! - [`mangle`]: how bytes that came back differ from the bytes sent;
//!   [`shrink`]: the smallest input that still comes back mangled.
//! - [`pattern`]: an explanation with its pids, ports and digests as placeholders.

pub mod adapter;
pub mod adapter_check;
pub mod cli;
pub mod compare;
pub mod db;
pub mod egress;
pub mod export;
pub mod generate;
pub mod html;
pub mod mangle;
pub mod otel;
pub mod pattern;
pub mod pg;
pub mod record;
pub mod report;
pub mod run;
pub mod shrink;
pub mod spec;
pub mod target;
pub mod triage;
pub mod upstream;
pub mod validate;
pub mod verdict;
