//! gVisor, the second evidence source: the probe as the monitor of runsc's
//! runtime monitoring ("seccheck"). Inside a gVisor sandbox there is no
//! bpf(2) and no tracefs, and the host's eBPF sees only the Sentry; gVisor
//! itself streams "points" (syscall exits with their errno, clone, execve,
//! task exits) to a Unix socket on the host. [`wire`] reads them,
//! [`events`] turns them into the probe's events, [`monitor`] listens,
//! [`session`] writes the configuration runsc is started with,
//! [`routes`] tells which span a point belongs to, [`memory`] watches the
//! sandbox's memory from the host, and [`source`] is all of it behind the
//! evidence-source interface (`probe trace --gvisor`, the daemon).

pub mod events;
pub mod memory;
pub mod monitor;
pub mod routes;
pub mod session;
pub mod source;
pub mod wire;
