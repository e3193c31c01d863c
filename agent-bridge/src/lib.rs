//! agent-bridge: the MCP server for the sandbox.
//!
//! Layout (data flows down): [`server`] speaks MCP and hands each call to
//! its [`session`], which checks arguments ([`contract::tools`]) and runs workloads
//! ([`workload`], [`process`] for background ones) under the profile
//! ([`profile`] → [`sandbox`], [`cgroup`]) with a probe span ([`kernel`]).
//! File tools run in a child too ([`worker`]). Payloads are described by
//! [`contract::bytes`]; [`contract::fault`] corrupts them on purpose when asked. [`big_alloc`]
//! keeps freed big buffers mapped for a moment, for the next transfer.

pub mod attach;
pub mod big_alloc;
pub mod cgroup;
pub mod http_answer;
pub mod kernel;
pub mod launch;
pub mod process;
pub mod profile;
pub mod proxy;
pub mod results;
pub mod sandbox;
pub mod self_exec;
pub mod server;
pub mod session;
pub mod stdio;
pub mod worker;
pub mod workload;
