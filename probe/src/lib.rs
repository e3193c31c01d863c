//! The probe: eBPF evidence for a workload, attributed to the kernel
//! primitive that made it fail.
//!
//! Layout (data flows down this list, never back up):
//! - [`loader`]: checks the machine, loads and attaches the embedded eBPF
//!   programs ([`tracefs`] supplies tracepoint offsets).
//! - [`spawn`]: starts a workload attached to its span before it execs.
//! - [`event`]: decodes ring-buffer records into [`event::KernelEvent`]s.
//! - [`spans`]: collects a span's events and process facts, bounded.
//! - [`attribution`]: picks the decisive event and the [`primitive`].
//! - [`report`]: renders an attribution for people.
//! - [`trace`]: `probe trace`, all of the above for one command.
//!
//! Supporting tables: [`primitive`] (the taxonomy and its rules),
//! [`syscalls`] (names and classes), [`mounts`] (mountinfo lookups).

pub mod attribution;
pub mod btf;
pub mod cgroup;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod event;
pub mod fault;
pub mod loader;
pub mod mounts;
pub mod otlp;
pub mod otlp_receiver;
pub mod primitive;
pub mod proctree;
pub mod protocol;
pub mod report;
pub mod sessions;
pub mod spans;
pub mod spawn;
pub mod store;
pub mod syscalls;
pub mod trace;
pub mod tracefs;
