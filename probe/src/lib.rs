//! The probe: eBPF evidence for a workload, attributed to the kernel
//! primitive that made it fail.
//!
//! Layout (data flows down this list, never back up):
//! - [`preflight`]: what the kernel offers (`probe check`), and the one
//!   sentence said where no probe can run (gVisor, no bpf(2), no tracing).
//! - [`loader`]: checks the machine, loads and attaches the embedded eBPF
//!   programs on the highest rung the kernel accepts ([`tracefs`] and
//!   [`btf`] supply tracepoint and struct offsets).
//! - [`spawn`]: starts a workload attached to its span before it execs;
//!   [`proctree`] and [`cgroup`] let a span follow a running tree or a cgroup.
//! - [`event`]: decodes ring-buffer records into [`event::KernelEvent`]s;
//!   [`gvisor`], the second source, turns gVisor's runtime-monitoring
//!   points into the same events for a sandbox whose kernel is gVisor's.
//! - [`source`]: the one interface of evidence sources (follow a workload,
//!   drain its events into spans, the last word at a span's end), with the
//!   eBPF programs and gVisor's points as its two implementations.
//! - [`spans`]: collects a span's events and process facts, bounded;
//!   [`sessions`] remembers what a session wrote (for `fs.persistence`).
//! - [`facts`]: what the host says when a span closes, captured once (the
//!   last read of the host before attribution).
//! - [`attribution`]: picks the decisive event and the [`primitive`], a
//!   function of the span's evidence alone.
//! - [`report`]: renders an attribution for people.
//! - [`trace`]: `probe trace`, all of the above for one command; [`tee`]:
//!   the workload's stderr passed through, its tail kept as a witness.
//! - [`daemon`]: `probe run`, the same for many spans, over the control
//!   [`protocol`] (its [`client`]s: `probe span`, agent-bridge; its
//!   [`status`]; [`peer`]: who a client is and what it may reach, its pids
//!   translated from its PID namespace), configured by
//!   [`config`], storing evidence in [`store`] (SQLite) and exporting spans
//!   over [`otlp`] ([`otlp_receiver`]: a local receiver for tests);
//!   [`replay`]: a stored span attributed again (`probe show --reattribute`).
//!
//! - [`env`]: the environment from inside the sandbox (`probe env`), two
//!   snapshots diffed, and each difference tied to the failures it explains.
//!
//! Supporting: [`primitive`] (the taxonomy and its rules), [`syscalls`]
//! (names and classes), [`mounts`] (mountinfo lookups), [`fault`] (seccomp
//! filters that inject faults), [`clock`] (wall and monotonic time).

pub mod attribution;
pub mod btf;
pub mod cgroup;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod env;
pub mod event;
pub mod facts;
pub mod fault;
pub mod gvisor;
pub mod loader;
pub mod mounts;
pub mod otlp;
pub mod otlp_receiver;
pub mod peer;
pub mod preflight;
pub mod primitive;
pub mod proctree;
pub mod protocol;
pub mod replay;
pub mod report;
pub mod sessions;
pub mod source;
pub mod spans;
pub mod spawn;
pub mod status;
pub mod store;
pub mod syscalls;
pub mod tee;
pub mod trace;
pub mod tracefs;
