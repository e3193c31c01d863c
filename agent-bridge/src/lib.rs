//! agent-bridge: the MCP server for the sandbox, and the proxy that puts
//! kernel evidence on another MCP server's calls. The wire contract they
//! share with the campaign is the `contract` crate; the campaign is the
//! `campaign` crate.
//!
//! Layout (data flows down this list):
//! - [`server`] speaks MCP (rmcp) over [`stdio`] or Streamable HTTP, whose
//!   connections [`listen`] accepts under a cap and timeouts
//!   ([`http_answer`] answers a call as one JSON document, [`http_errors`]
//!   refuses a body as JSON-RPC says, [`http_ids`] refuses a request id
//!   still in flight) and hands each
//!   call to its [`session`], which checks arguments (`contract::tools`).
//! - [`workload`] starts a command under the session's [`profile`]:
//!   [`launch`] clones it without copying the bridge, [`attach`] puts it in
//!   its call's [`cgroup`] and probe span between fork and exec, [`sandbox`]
//!   applies the profile there; [`process`] keeps background ones; a
//!   session's browser is one too, driven over [`cdp`].
//! - File tools run in a child too: [`worker`], exec'd by [`self_exec`].
//! - [`kernel`] asks the probe daemon for each call's attribution.
//! - [`results`] stores an outside agent's `record_result` outcomes.
//! - [`proxy`]: any stdio MCP server behind the bridge, one span per call.
//! - [`reaper`]: the process beside a server that kills and removes its
//!   call cgroups once it is gone, however it ended.
//! - [`big_alloc`]: the global allocator that keeps freed big buffers
//!   mapped for a moment, for the next transfer.
//! - `thread_heap` (unit tests only): an allocator that counts each
//!   thread's heap, for tests that show nothing is left on it.

pub mod attach;
pub mod big_alloc;
pub mod cdp;
pub mod cgroup;
pub mod http_answer;
pub mod http_errors;
pub mod http_ids;
pub mod kernel;
pub mod launch;
pub mod listen;
pub mod process;
pub mod profile;
pub mod proxy;
pub mod reaper;
pub mod results;
pub mod sandbox;
pub mod self_exec;
pub mod server;
pub mod session;
pub mod stdio;
pub mod worker;
pub mod workload;

#[cfg(test)]
mod thread_heap;
