//! The campaign: generated tests across ten domains, run against
//! agent-bridge or any other MCP server (through an adapter). A client of
//! MCP servers: it needs from the bridge only the wire contract
//! (`contract`).
//!
//! Layout:
//! - [`spec`]: the test format (one JSON file per test) and its schema.
//! - [`validate`]: loading test files, with every problem explained.
//! - [`generate`]: the deterministic default suite; [`upstream`]: the local
//!   "internet" its network and browser tests reach; [`egress`]: the guard
//!   rail against tests that name hosts off this machine.
//! - [`target`]: one MCP session with the bridge under test; [`adapter`]:
//!   the campaign's steps on another server's tools ([`adapter_check`]:
//!   does the server have every tool the adapter maps).
//! - [`record`]: the records the stages hand each other (a step's outcome,
//!   a call error, a triage, a test record) and the typed causes; a leaf.
//! - [`verdict`]: one step's result against its expectations.
//! - [`triage`]: a failed test's layer and primitive.
//! - [`db`]: results in SQLite or ([`pg`]) PostgreSQL; [`run`]: workers,
//!   targets, shards and claims, resume.
//! - [`report`]: one run as data and tables; [`html`], [`export`] (CSV,
//!   JSON lines); [`compare`]: runs side by side, the confusion matrix.
//! - [`environment`]: each target's environment snapshot stored with the
//!   run (and its persistence markers); [`preflight`]: a suite's needs read
//!   against a snapshot, before a run.
//! - [`mangle`]: how bytes that came back differ from the bytes sent;
//!   [`shrink`]: the smallest input that still comes back mangled.
//! - [`pattern`]: an explanation with its pids, ports and digests as placeholders.
//! - [`otel`]: run, test and step spans over OTLP, the step's trace
//!   context on its call.
//! - [`cli`]: `agent-bridge campaign …`, the command line over all of this.

pub mod adapter;
pub mod adapter_check;
pub mod cli;
pub mod compare;
pub mod db;
pub mod egress;
pub mod environment;
pub mod export;
pub mod generate;
pub mod html;
pub mod mangle;
pub mod otel;
pub mod pattern;
pub mod pg;
pub mod preflight;
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
