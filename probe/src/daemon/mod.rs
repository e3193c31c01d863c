//! `probe run`: the long-running daemon.
//!
//! Layout (data flows one way):
//! - the **core** ([`Core`], behind one mutex) holds the evidence sources
//!   ([`crate::source`]: the loaded eBPF programs, and gVisor's monitor when
//!   it listens), the open spans and the session write memory. The core
//!   thread drains the sources into it, each event to its span;
//!   connections execute their commands (begin, attach, end, status,
//!   subscribe) on it directly, so a request costs no thread hand-off (two
//!   wake-ups per call on a small VM were a third of a span's cost).
//! - the **store** thread owns the only write connection to SQLite and
//!   writes finished spans in batched transactions, then applies retention.
//! - the **control** server (tokio) accepts connections on the Unix socket,
//!   checks the peer (SO_PEERCRED), reads bounded NDJSON lines and turns
//!   them into core commands; `query` reads the DB on its own connection.
//!
//! One room per job: the span core in `span_core.rs`, the store thread in
//! `store_thread.rs`, the control server in `server.rs`, what `probe
//! status` says in `status.rs`; this file holds the settings, the drain
//! thread and `run`, which starts them.

use std::collections::HashMap;
use std::io::Read as _;
use std::os::fd::AsFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::UnixStream;
use tokio::sync::oneshot;

use crate::attribution::{
    Attribution, ExitStatus, Outcome, PidsIn, RootPid, SandboxView, Words, attribute,
};
use crate::event::Kind;
use crate::gvisor::source::GvisorSource;
use crate::loader::Probe;
use crate::otlp::{CallMeta, Exporter, OtlpConfig, TraceParent};
use crate::peer::{SandboxKind, Scope};
use crate::protocol::{self, BeginSpan, ErrorBody, ErrorCode, MAX_LINE, Query, Request};
use crate::sessions::Sessions;
use crate::source::ebpf::EbpfSource;
use crate::source::{EvidenceSource, Follow, SpanSink, Within};
use crate::spans::{Source, SpanEvidence};
use crate::status::{DaemonStatus, DbStatus, Features, OtlpStatus, RetentionRemoved, StatusDrops};
use crate::store::{
    Conversion, KeepEvents, Pass, RetentionPolicy, RetentionTotals, SpanFilter, Store, StoredSpan,
};
use crate::trace::READ_INTERVAL;

mod server;
mod span_core;
mod status;
mod store_thread;

use server::*;
use span_core::*;
use status::*;
use store_thread::*;

/// Daemon settings (flags override the config file).
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub socket: PathBuf,
    pub db: PathBuf,
    /// Group allowed to use the socket besides root.
    pub group: Option<nix::unistd::Gid>,
    pub event_cap: usize,
    pub max_open_spans: usize,
    pub retention: RetentionPolicy,
    /// Export every finished span as an OpenTelemetry span (OTLP/HTTP).
    pub otlp: Option<OtlpConfig>,
    /// Where gVisor sandboxes send their runtime-monitoring points (None:
    /// not listening).
    pub gvisor_socket: Option<PathBuf>,
    /// The user chose that path (a flag or the config file): not being
    /// able to listen there stops the daemon; at the default place beside
    /// the control socket it is a warning.
    pub gvisor_socket_chosen: bool,
    /// Which clients are confined to their own sandbox (docs/PROTOCOL.md).
    pub confine: crate::peer::Confine,
}

impl DaemonConfig {
    /// The gVisor socket beside a control socket: `probe.sock` →
    /// `probe.gvisor.sock`.
    pub fn gvisor_socket_beside(socket: &std::path::Path) -> PathBuf {
        socket.with_extension("gvisor.sock")
    }
}

/// Records the drain thread takes per pass, holding the core.
const DRAIN_PASS: usize = 1 << 16;

/// How often threads of ended spans are swept from the kernel maps.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

type Reply<T> = oneshot::Sender<Result<T, ErrorBody>>;

/// The drain thread: waits for a source (or the read interval, or
/// shutdown) and drains the sources into the core, until the daemon stops.
fn drain_loop(handle: &CoreHandle, wake: StdUnixStream) {
    wake.set_nonblocking(true).ok();
    let source_fds: std::io::Result<Vec<std::os::fd::OwnedFd>> = match handle.core.lock() {
        Ok(core) => core
            .sources
            .iter()
            .filter_map(|s| s.poll_fd())
            .map(|fd| fd.try_clone_to_owned())
            .collect(),
        Err(_) => Err(std::io::Error::other("the core failed")),
    };
    let source_fds = match source_fds {
        Ok(fds) => fds,
        Err(e) => {
            // nothing would drain the events: stop rather than lose them
            tracing::error!("cannot poll the evidence sources: {e}; stopping the daemon");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM);
            return;
        }
    };
    let mut last_sweep = Instant::now();
    loop {
        let mut fds: Vec<PollFd> = source_fds
            .iter()
            .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
            .collect();
        fds.push(PollFd::new(wake.as_fd(), PollFlags::POLLIN));
        let _ = poll(
            &mut fds,
            PollTimeout::from(READ_INTERVAL.as_millis() as u16),
        );
        let mut sink = [0u8; 256];
        while matches!((&wake).read(&mut sink), Ok(n) if n > 0) {}
        let mut core = match handle.core.lock() {
            Ok(core) => core,
            Err(poisoned) => {
                // a bug panicked while holding the core: stop the daemon
                // (visibly, so a supervisor restarts it) and let the store
                // thread finish what it has
                tracing::error!("the core failed; stopping the daemon");
                poisoned.into_inner().store_tx = None;
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM);
                return;
            }
        };
        // a bounded pass: under an event storm the lock is let go between
        // passes, so requests are not held up until the ring is empty
        core.drain_at_most(DRAIN_PASS);
        core.update_rate();
        if last_sweep.elapsed() >= SWEEP_INTERVAL {
            core.sweep();
            last_sweep = Instant::now();
        }
        if handle.stopping.load(Ordering::Acquire) {
            // end what is still open, so nothing collected is lost
            let open: Vec<u64> = core.spans.keys().copied().collect();
            for span in open {
                if let Ok(closed) = core.close_span(span, None, None, false, Words::default()) {
                    closed.judge();
                }
            }
            core.store_tx = None; // lets the store thread finish
            tracing::info!("core stopped");
            return;
        }
    }
}

/// Runs the daemon until SIGTERM/SIGINT.
pub fn run(config: DaemonConfig) -> anyhow::Result<()> {
    // the DB first: a locked, full or corrupt DB is reported even without root
    let store = Store::open(&config.db)?;
    let next_span = store.next_span_id()?;
    let probe = Probe::load()?;
    probe.warn_if_lower_rung();
    let listener = bind(&config.socket, config.group)?;
    tracing::info!(socket = %config.socket.display(), db = %config.db.display(), "probe daemon ready");

    let (store_tx, store_rx) = mpsc::sync_channel::<StoredSpan>(4096);
    let stats = Arc::new(StoreStats {
        in_db: AtomicU64::new(store.span_count()?),
        ..Default::default()
    });
    // a DB an earlier version made: converted once, so retention can give
    // the pages it frees back to the filesystem
    let mut store = store;
    match store.convert_to_incremental()? {
        Conversion::NotNeeded => {}
        Conversion::Converted {
            before,
            after,
            took,
        } => tracing::info!(
            "converted {} to incremental auto-vacuum ({before} → {after} bytes, {:.1} s)",
            config.db.display(),
            took.as_secs_f64()
        ),
        Conversion::NoRoom { need, free } => tracing::warn!(
            "{} was made before incremental auto-vacuum and converting it needs {} MiB free \
             ({} MiB are): retention reuses the pages it frees but cannot give them back to \
             the filesystem until it is converted (at the next start with room, or offline: \
             docs/RETENTION.md)",
            config.db.display(),
            need >> 20,
            free >> 20
        ),
    }
    let auto_vacuum = store.auto_vacuum()?;
    let store_thread = {
        let stats = stats.clone();
        let policy = config.retention;
        std::thread::Builder::new()
            .name("store".into())
            .spawn(move || store_loop(store, store_rx, policy, stats))?
    };
    let otlp = match &config.otlp {
        Some(c) => {
            tracing::info!(endpoint = %c.endpoint, "exporting spans over OTLP/HTTP");
            Some(Arc::new(Exporter::start(c.clone())?))
        }
        None => None,
    };
    // the sources: the eBPF programs, and gVisor's monitor when it listens
    let mut sources: Vec<Box<dyn EvidenceSource>> = vec![Box::new(EbpfSource::new(probe)?)];
    if let Some(path) = &config.gvisor_socket {
        match GvisorSource::listen(path) {
            Ok(source) => {
                tracing::info!(socket = %path.display(), "listening for gVisor sandboxes");
                sources.push(Box::new(source));
            }
            Err(e) if config.gvisor_socket_chosen => {
                return Err(e.context(format!("the gVisor socket {}", path.display())));
            }
            // the default place beside the control socket: the daemon
            // serves without it rather than not at all
            Err(e) => {
                tracing::warn!(
                    "not listening for gVisor sandboxes at {}: {e:#} (--gvisor-socket PATH \
                     puts it elsewhere)",
                    path.display()
                );
            }
        }
    }
    let (wake_r, wake_w) = StdUnixStream::pair()?;
    wake_w.set_nonblocking(true)?;
    let core = Core {
        sources,
        spans: HashMap::new(),
        sessions: Sessions::default(),
        subscribers: Vec::new(),
        next_span,
        store_tx: Some(store_tx),
        store_stats: stats,
        config: config.clone(),
        started: Instant::now(),
        events_total: 0,
        late_events: 0,
        decode_errors: 0,
        spans_ended: 0,
        retention_drops_total: 0,
        auto_vacuum,
        rate: (Instant::now(), 0, 0.0),
        otlp: otlp.clone(),
        invalid_traceparents: 0,
    };
    let handle = Arc::new(CoreHandle {
        core: std::sync::Mutex::new(core),
        stopping: AtomicBool::new(false),
        clients: ClientCounts::default(),
        wake: wake_w,
    });
    let core_thread = {
        let handle = handle.clone();
        std::thread::Builder::new()
            .name("core".into())
            .spawn(move || drain_loop(&handle, wake_r))?
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let served = runtime.block_on(serve(listener, handle.clone(), config.clone()));
    handle.shutdown();
    runtime.shutdown_timeout(Duration::from_secs(2));
    drop(handle);
    if core_thread.join().is_err() {
        tracing::error!("core thread panicked");
    }
    if store_thread.join().is_err() {
        tracing::error!("store thread panicked");
    }
    if let Some(e) = otlp {
        // what is queued goes out (each request within the timeout)
        e.shutdown();
    }
    let _ = std::fs::remove_file(&config.socket);
    tracing::info!("probe daemon stopped");
    served
}
