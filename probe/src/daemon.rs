//! `probe run`: the long-running daemon.
//!
//! Layout (data flows one way):
//! - the **core** ([`Core`], behind one mutex) holds the loaded programs
//!   ([`Probe`]), the open spans and the session write memory. The core
//!   thread drains the ring buffer into it and routes each event to its
//!   span; connections execute their commands (begin, attach, end, status,
//!   subscribe) on it directly, so a request costs no thread hand-off (two
//!   wake-ups per call on a small VM were a third of a span's cost).
//! - the **store** thread owns the only write connection to SQLite and
//!   writes finished spans in batched transactions, then applies retention.
//! - the **control** server (tokio) accepts connections on the Unix socket,
//!   checks the peer (SO_PEERCRED), reads bounded NDJSON lines and turns
//!   them into core commands; `query` reads the DB on its own connection.

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
use crate::event::{Kind, decode, read_raw};
use crate::loader::Probe;
use crate::otlp::{CallMeta, Exporter, OtlpConfig, TraceParent};
use crate::peer::{SandboxKind, Scope};
use crate::protocol::{self, ErrorBody, ErrorCode, MAX_LINE, Request};
use crate::sessions::Sessions;
use crate::spans::SpanEvidence;
use crate::status::{
    DaemonStatus, DbStatus, Features, OtlpStatus, PidNamespaceId, RetentionRemoved, StatusDrops,
};
use crate::store::{KeepEvents, RetentionPolicy, RetentionTotals, SpanFilter, Store, StoredSpan};
use crate::trace::READ_INTERVAL;

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

/// What connections ask of the core.
enum Command {
    Begin {
        session: Option<String>,
        label: String,
        /// Attach this process at once (saves the caller a round trip).
        pid: Option<u32>,
        /// With `pid`: every thread of it and of its descendants too.
        tree: bool,
        /// With `pid`: a server already running, which outlives the span.
        server: bool,
        /// With `pid`: its seccomp mode, as the caller knows it.
        seccomp: Option<u32>,
        /// With `pid`: note its memory cgroup and limit now.
        memory_limited: bool,
        /// A cgroup to follow for the span's whole life.
        cgroup: Option<std::path::PathBuf>,
        /// For OpenTelemetry export: tool, MCP session, trace context.
        meta: Box<BeginMeta>,
        /// What the store keeps of it, when the client said.
        keep_events: Option<KeepEvents>,
        /// With `pid`: a process of a gVisor sandbox, not of this kernel.
        gvisor: Option<GvisorTarget>,
        /// The sandbox of the client that opens it (None: the host's).
        sandbox: Option<SandboxView>,
        /// The span, and with `tree` how many threads were attached.
        reply: Reply<(u64, Option<usize>)>,
    },
    Attach {
        span: u64,
        pid: u32,
        /// The asking client's sandbox: only its own spans.
        caller: Option<String>,
        /// `pid` as the client numbered it.
        client_pid: u32,
        reply: Reply<()>,
    },
    End {
        span: u64,
        caller: Option<String>,
        exit: Option<ExitStatus>,
        timed_out: Option<Duration>,
        is_error: bool,
        words: Words,
        reply: Reply<Attribution>,
    },
    Status {
        reply: oneshot::Sender<DaemonStatus>,
    },
    Subscribe {
        span: Option<u64>,
        kind: Option<Kind>,
        /// A confined client's sandbox: only its spans' events.
        caller: Option<String>,
        tx: tokio::sync::mpsc::Sender<String>,
        reply: Reply<()>,
    },
}

/// The core as connections and the drain thread share it.
struct CoreHandle {
    core: std::sync::Mutex<Core>,
    stopping: AtomicBool,
    /// Wakes the drain thread (for shutdown).
    wake: StdUnixStream,
    /// Confined clients: connected now, and requests refused as outside
    /// their sandbox.
    clients: ClientCounts,
}

#[derive(Default)]
struct ClientCounts {
    sandboxed_now: AtomicU64,
    forbidden: AtomicU64,
}

impl ClientCounts {
    /// Counts a refusal on its way to the client.
    fn refused(&self, e: ErrorBody) -> ErrorBody {
        if e.code == ErrorCode::Forbidden {
            self.forbidden.fetch_add(1, Ordering::Relaxed);
        }
        e
    }
}

impl CoreHandle {
    /// The core, unless the daemon is stopping or a panic left it unusable.
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Core>, ErrorBody> {
        let stopping = || ErrorBody::new(ErrorCode::Internal, "the probe daemon is shutting down");
        if self.stopping.load(Ordering::Acquire) {
            return Err(stopping());
        }
        let core = self.core.lock().map_err(|_| {
            ErrorBody::new(
                ErrorCode::Internal,
                "the probe daemon's core failed (see its log); restart it",
            )
        })?;
        // checked again under the lock: the shutdown ends every open span
        if self.stopping.load(Ordering::Acquire) {
            return Err(stopping());
        }
        Ok(core)
    }

    /// Executes `cmd` on the core, on the caller's thread.
    fn send(&self, cmd: Command) -> Result<(), ErrorBody> {
        self.lock()?.handle(cmd);
        Ok(())
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, ErrorBody> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        rx.await
            .map_err(|_| ErrorBody::new(ErrorCode::Internal, "the probe daemon is shutting down"))?
    }

    /// Stops the drain thread, which ends the spans still open.
    fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        // a full socket buffer means a wake-up is already pending
        let _ = (&self.wake).write(&[1]);
    }
}

use std::io::Write as _;

/// Counters the store thread shares with status.
#[derive(Default)]
struct StoreStats {
    queued: AtomicU64,
    written: AtomicU64,
    errors: AtomicU64,
    retention_spans: AtomicU64,
    retention_events: AtomicU64,
    /// Of `retention_spans`, those that explained something.
    retention_explaining: AtomicU64,
    /// Spans in the DB now (all probes').
    in_db: AtomicU64,
    /// Event rows written.
    events_written: AtomicU64,
    /// Time spent writing batches and making room (µs), and its longest
    /// stretch: how long ingestion waited at worst.
    busy_us: AtomicU64,
    longest_write_us: AtomicU64,
    /// The size budget of the moment.
    budget_bytes: AtomicU64,
}

impl StoreStats {
    /// Runs one step of the store thread, counting its time as busy and
    /// keeping the longest (how long ingestion waited at worst).
    fn timed<T>(&self, step: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = step();
        let us = started.elapsed().as_micros() as u64;
        self.busy_us.fetch_add(us, Ordering::Relaxed);
        self.longest_write_us.fetch_max(us, Ordering::Relaxed);
        out
    }
}

/// Which gVisor sandbox a `begin_span` pid lives in.
#[derive(Debug, Clone)]
enum GvisorTarget {
    /// The client said (`gvisor_container`).
    Container(String),
    /// The client reached us from inside a sandbox, through its gofer.
    Behind(crate::gvisor::routes::SandboxClient),
}

/// The daemon as gVisor's monitor: the points its sandboxes send, and
/// which span each belongs to.
struct GvisorSide {
    monitor: crate::gvisor::monitor::Monitor,
    rx: mpsc::Receiver<crate::gvisor::monitor::Delivery>,
    routes: crate::gvisor::routes::Routes,
}

/// How long `end_span` of a gVisor span whose process ended waits for
/// that exit's point (it travels the monitor socket while the caller's
/// wait returns).
const GVISOR_EXIT_WAIT: Duration = Duration::from_millis(500);

/// `begin_span`'s fields for OpenTelemetry, as the client sent them.
#[derive(Default)]
struct BeginMeta {
    tool: Option<String>,
    mcp_method: Option<String>,
    mcp_session: Option<String>,
    traceparent: Option<String>,
    tracestate: Option<String>,
}

struct OpenSpan {
    evidence: SpanEvidence,
    /// What the exported span says about the call (export on only).
    meta: Option<Box<CallMeta>>,
    started_unix_ns: u64,
    started_ms: i64,
    started: Instant,
    drops_before: u64,
    /// The id of the cgroup it follows, to stop following at its end.
    cgroup: Option<u64>,
    /// What the store keeps of its events.
    keep_events: KeepEvents,
    /// A gVisor span: the container its processes are in.
    gvisor_container: Option<String>,
    /// The sandbox whose client opened it (None: a host client).
    sandbox: Option<SandboxView>,
}

impl OpenSpan {
    fn owner(&self) -> Option<&str> {
        self.sandbox.as_ref().map(|v| v.id.as_str())
    }
}

struct Subscriber {
    span: Option<u64>,
    kind: Option<Kind>,
    /// A confined client's sandbox (None: every span's events).
    owner: Option<String>,
    tx: tokio::sync::mpsc::Sender<String>,
    lagged: u64,
}

struct Core {
    probe: Probe,
    spans: HashMap<u64, OpenSpan>,
    sessions: Sessions,
    subscribers: Vec<Subscriber>,
    next_span: u64,
    /// None once the daemon stopped: the store thread then finishes.
    store_tx: Option<mpsc::SyncSender<StoredSpan>>,
    store_stats: Arc<StoreStats>,
    config: DaemonConfig,
    started: Instant,
    events_total: u64,
    late_events: u64,
    decode_errors: u64,
    spans_ended: u64,
    retention_drops_total: u64,
    /// The DB's auto-vacuum mode (`incremental` unless made by an older
    /// version).
    auto_vacuum: &'static str,
    rate: (Instant, u64, f64),
    otlp: Option<Arc<Exporter>>,
    /// `begin_span` traceparents that were not valid W3C trace context.
    invalid_traceparents: u64,
    gvisor: Option<GvisorSide>,
}

/// The drain thread: waits for the ring buffer (or the read interval, or
/// shutdown) and drains it into the core, until the daemon stops.
fn drain_loop(handle: &CoreHandle, wake: StdUnixStream) {
    wake.set_nonblocking(true).ok();
    let ring_fd = match handle.core.lock() {
        Ok(mut core) => core.probe.events().as_fd().try_clone_to_owned(),
        Err(_) => Err(std::io::Error::other("the core failed")),
    };
    let ring_fd = match ring_fd {
        Ok(fd) => fd,
        Err(e) => {
            // nothing would drain the events: stop rather than lose them
            tracing::error!("cannot poll the ring buffer: {e}; stopping the daemon");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM);
            return;
        }
    };
    let mut last_sweep = Instant::now();
    loop {
        let mut fds = [
            PollFd::new(ring_fd.as_fd(), PollFlags::POLLIN),
            PollFd::new(wake.as_fd(), PollFlags::POLLIN),
        ];
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
        core.drain_gvisor();
        core.update_rate();
        if last_sweep.elapsed() >= SWEEP_INTERVAL {
            core.sweep();
            last_sweep = Instant::now();
        }
        if handle.stopping.load(Ordering::Acquire) {
            // end what is still open, so nothing collected is lost
            let open: Vec<u64> = core.spans.keys().copied().collect();
            for span in open {
                let _ = core.end(span, None, None, false, Words::default());
            }
            core.store_tx = None; // lets the store thread finish
            tracing::info!("core stopped");
            return;
        }
    }
}

/// Whether process `pid` exists (kill(2) with signal 0: only ESRCH says no).
fn process_exists(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|p| {
        p > 0
            && !matches!(
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None),
                Err(nix::errno::Errno::ESRCH)
            )
    })
}

impl Core {
    /// Stops tracing threads of spans that are no longer open: ones whose
    /// fork event was lost, so `end` could not name them.
    fn sweep(&mut self) {
        for (span, _) in self.probe.tracked_spans() {
            if !self.spans.contains_key(&span) {
                let pending = self.probe.untrack_span(span);
                let lost: u64 = pending.iter().map(|p| p.repeats).sum();
                // the span is stored already: its late repeats are counted, like late events
                self.late_events += lost;
                tracing::debug!("swept stale threads of ended span {span}; {lost} late repeats");
            }
        }
        let spans = &self.spans;
        let forgotten = self
            .probe
            .forget_uring_requests(|span| spans.contains_key(&span));
        if forgotten > 0 {
            tracing::debug!("forgot {forgotten} io_uring requests of ended spans");
        }
    }

    /// Drains the ring buffer until it is empty.
    fn drain(&mut self) {
        self.drain_at_most(usize::MAX);
    }

    /// Drains at most `max` records.
    fn drain_at_most(&mut self, max: usize) {
        let Core {
            probe,
            spans,
            sessions,
            subscribers,
            events_total,
            late_events,
            decode_errors,
            ..
        } = self;
        let ring = probe.events();
        for _ in 0..max {
            let Some(item) = ring.next() else { break };
            *events_total += 1;
            let raw = match read_raw(&item) {
                Ok(raw) => raw,
                Err(e) => {
                    *decode_errors += 1;
                    tracing::warn!("undecodable ring buffer record: {e}");
                    continue;
                }
            };
            drop(item);
            let Some(open) = spans.get_mut(&raw.span) else {
                // a descendant outliving its ended span: counted, not hidden
                *late_events += 1;
                continue;
            };
            let mut ev = match decode(&raw, open.evidence.start_ns) {
                Ok(ev) => ev,
                Err(e) => {
                    *decode_errors += 1;
                    tracing::warn!("{e}");
                    continue;
                }
            };
            open.evidence.name(&mut ev);
            if let Some(session) = open.evidence.session.as_deref() {
                sessions.observe(session, raw.span, &mut ev);
            }
            if !subscribers.is_empty() {
                publish(subscribers, raw.span, open.owner(), &ev);
            }
            open.evidence.add(ev);
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Begin {
                session,
                label,
                pid,
                tree,
                server,
                seccomp,
                memory_limited,
                cgroup,
                meta,
                keep_events,
                gvisor,
                sandbox,
                reply,
            } => {
                if let Some(target) = gvisor {
                    let begun = self.begin_gvisor(
                        session,
                        label,
                        pid,
                        tree,
                        target,
                        *meta,
                        keep_events,
                        sandbox,
                    );
                    if let Ok((span, _)) = &begun
                        && let Some(open) = self.spans.get_mut(span)
                    {
                        open.evidence.root_serves = tree || server;
                    }
                    let _ = reply.send(begun);
                    return;
                }
                let begun = self
                    .begin(session, label, *meta, keep_events, sandbox)
                    .and_then(|span| {
                        let attached =
                            self.follow_cgroup(span, cgroup.as_deref())
                                .and_then(|in_cgroup| {
                                    let in_tree = match pid {
                                        None => None,
                                        Some(pid) => tree
                                            .then_some(self.attach_pid(span, pid, tree, seccomp)?),
                                    };
                                    // `tids`: how many threads were attached by walking
                                    let tids = match (in_tree, in_cgroup) {
                                        (None, None) => None,
                                        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
                                    };
                                    if memory_limited
                                        && let (Some(pid), Some(open)) =
                                            (pid, self.spans.get_mut(&span))
                                    {
                                        open.evidence.memory_cgroup = crate::cgroup::memory_of(pid);
                                    }
                                    if let (Some(_), Some(open)) = (pid, self.spans.get_mut(&span))
                                    {
                                        open.evidence.root_serves = tree || server;
                                    }
                                    Ok((span, tids))
                                });
                        if attached.is_err() {
                            // nothing was traced: the span never existed
                            if let Some(open) = self.spans.remove(&span)
                                && let Some(id) = open.cgroup
                            {
                                self.probe.unfollow_cgroup(id, span);
                            }
                        }
                        attached
                    });
                let _ = reply.send(begun);
            }
            Command::Attach {
                span,
                pid,
                caller,
                client_pid,
                reply,
            } => {
                if let Err(e) = self.reachable(span, caller.as_deref()) {
                    let _ = reply.send(Err(e));
                    return;
                }
                // a span a confined client opened without a pid: its first
                // process under both numberings (gVisor's are one)
                if let Some(view) = self.spans.get_mut(&span).and_then(|o| o.sandbox.as_mut())
                    && view.pids == PidsIn::Daemon
                {
                    view.root_pid.get_or_insert(RootPid {
                        daemon: pid,
                        sandbox: client_pid,
                    });
                }
                let container = self
                    .spans
                    .get(&span)
                    .and_then(|o| o.gvisor_container.clone());
                let attached = match (container, self.gvisor.as_mut()) {
                    (Some(c), Some(g)) => {
                        g.routes.attach(span, &c, pid, false);
                        if let Some(open) = self.spans.get_mut(&span) {
                            open.evidence.root_pid.get_or_insert(pid);
                        }
                        Ok(())
                    }
                    _ => self.attach(span, pid, None),
                };
                let _ = reply.send(attached);
            }
            Command::End {
                span,
                caller,
                exit,
                timed_out,
                is_error,
                words,
                reply,
            } => {
                let ended = self
                    .reachable(span, caller.as_deref())
                    .and_then(|()| self.end(span, exit, timed_out, is_error, words));
                let _ = reply.send(ended);
            }
            Command::Status { reply } => {
                self.drain(); // counts up to date, as of this request
                let _ = reply.send(self.status());
            }
            Command::Subscribe {
                span,
                kind,
                caller,
                tx,
                reply,
            } => {
                // a confined client tails its own open span, or all of its own
                let allowed = match (span, caller.as_deref()) {
                    (Some(id), Some(_)) => self.reachable(id, caller.as_deref()),
                    _ => Ok(()),
                };
                if allowed.is_ok() {
                    self.subscribers.push(Subscriber {
                        span,
                        kind,
                        owner: caller,
                        tx,
                        lagged: 0,
                    });
                }
                let _ = reply.send(allowed);
            }
        }
    }

    /// Whether a client of sandbox `caller` (None: the host's) may use
    /// span `span`: only an open span its sandbox opened. A host client
    /// reaches every span (one not open is the request's own `not_found`).
    fn reachable(&self, span: u64, caller: Option<&str>) -> Result<(), ErrorBody> {
        let Some(caller) = caller else {
            return Ok(());
        };
        match self.spans.get(&span) {
            Some(open) if open.owner() == Some(caller) => Ok(()),
            _ => Err(crate::peer::forbidden(format!(
                "span {span} is not an open span of this client's sandbox ({caller})"
            ))),
        }
    }

    fn begin(
        &mut self,
        session: Option<String>,
        label: String,
        meta: BeginMeta,
        keep_events: Option<KeepEvents>,
        sandbox: Option<SandboxView>,
    ) -> Result<u64, ErrorBody> {
        if self.spans.len() >= self.config.max_open_spans {
            return Err(ErrorBody::new(
                ErrorCode::Unavailable,
                format!(
                    "{} spans are open, the limit (end some, or raise --max-open-spans)",
                    self.spans.len()
                ),
            ));
        }
        let id = self.next_span;
        if id > u32::MAX as u64 {
            return Err(ErrorBody::new(
                ErrorCode::Unavailable,
                "span ids exhausted (2^32): start a new database",
            ));
        }
        self.next_span += 1;
        let mut evidence = SpanEvidence::new(id, session, label, crate::clock::monotonic_ns());
        evidence.cap = self.config.event_cap;
        let drops_before = self.probe.drops().iter().sum();
        let meta = self.otlp.is_some().then(|| {
            let parent = meta.traceparent.as_deref().and_then(|t| {
                let parsed = TraceParent::parse(t);
                if parsed.is_none() {
                    // ignored: the span starts a trace of its own
                    self.invalid_traceparents += 1;
                }
                parsed
            });
            Box::new(CallMeta {
                tool: meta.tool,
                mcp_method: meta.mcp_method,
                mcp_session: meta.mcp_session,
                tracestate: meta.tracestate.filter(|_| parent.is_some()),
                parent,
                is_error: false,
            })
        });
        self.spans.insert(
            id,
            OpenSpan {
                evidence,
                meta,
                started_unix_ns: crate::otlp::now_unix_ns(),
                started_ms: crate::clock::now_ms(),
                started: Instant::now(),
                drops_before,
                cgroup: None,
                keep_events: keep_events.unwrap_or(self.config.retention.keep_events),
                gvisor_container: None,
                sandbox,
            },
        );
        Ok(id)
    }

    /// A span over a process of a gVisor sandbox (`pid` as the sandbox
    /// sees it, or one `attach` names later): its events come from the
    /// sandbox's points, not from the kernel. Answers the span and, with
    /// `tree`, how many processes.
    #[allow(clippy::too_many_arguments)]
    fn begin_gvisor(
        &mut self,
        session: Option<String>,
        label: String,
        pid: Option<u32>,
        tree: bool,
        target: GvisorTarget,
        meta: BeginMeta,
        keep_events: Option<KeepEvents>,
        sandbox: Option<SandboxView>,
    ) -> Result<(u64, Option<usize>), ErrorBody> {
        // what the sandbox said so far names its container
        self.drain_gvisor();
        let Some(g) = self.gvisor.as_mut() else {
            return Err(ErrorBody::new(
                ErrorCode::Unavailable,
                "this daemon does not listen for gVisor sandboxes (it was started without a \
                 gVisor socket)",
            ));
        };
        let container = match target {
            GvisorTarget::Container(c) => c,
            GvisorTarget::Behind(client) => match client.container {
                Some(c) if g.routes.is_connected(&c) => c,
                // a sandbox process not found: its runsc's connection
                _ => client
                    .runsc
                    .ok_or(crate::gvisor::routes::RouteError::NoSandbox)
                    .and_then(|r| g.routes.container_of(r))
                    .map_err(|e| ErrorBody::new(ErrorCode::Unavailable, e.to_string()))?,
            },
        };
        let span = self.begin(session, label, meta, keep_events, sandbox)?;
        let g = self.gvisor.as_mut().expect("checked above");
        // without a pid, `attach` names the span's process later
        let n = pid.map(|pid| g.routes.attach(span, &container, pid, tree));
        if let Some(open) = self.spans.get_mut(&span) {
            open.evidence.source = crate::spans::Source::Gvisor;
            open.evidence.root_pid = pid;
            open.gvisor_container = Some(container);
        }
        Ok((span, n.filter(|_| tree)))
    }

    /// Takes what the gVisor monitor delivered so far.
    fn drain_gvisor(&mut self) {
        while let Some(d) = self.gvisor.as_ref().and_then(|g| g.rx.try_recv().ok()) {
            self.take_gvisor(d);
        }
    }

    /// Routes one delivery of the gVisor monitor to its spans.
    fn take_gvisor(&mut self, delivery: crate::gvisor::monitor::Delivery) {
        use crate::gvisor::monitor::Delivery;
        let Core {
            gvisor,
            spans,
            sessions,
            subscribers,
            events_total,
            late_events,
            ..
        } = self;
        let Some(g) = gvisor.as_mut() else { return };
        let (conn, dropped) = match &delivery {
            Delivery::Connected { conn, peer_pid } => {
                g.routes.connected(*conn, *peer_pid);
                return;
            }
            Delivery::Closed { conn } => {
                g.routes.closed(*conn);
                return;
            }
            Delivery::Container { conn, container } => {
                g.routes.container(*conn, container);
                return;
            }
            Delivery::Dropped { conn, dropped } => (*conn, *dropped),
            Delivery::Point { conn, dropped, .. } => {
                g.routes.counts.points += 1;
                (*conn, *dropped)
            }
        };
        if dropped > 0 {
            // runsc counts per sandbox: every span of it may have lost them
            g.routes.counts.dropped += dropped;
            for span in g.routes.spans_of(conn) {
                if let Some(open) = spans.get_mut(&span) {
                    open.evidence.drops.kernel += dropped;
                }
            }
        }
        let Delivery::Point { converted, .. } = delivery else {
            return;
        };
        for mut ev in converted.events {
            *events_total += 1;
            let Some(span) = g.routes.route(&converted.container, &ev) else {
                continue;
            };
            let Some(open) = spans.get_mut(&span) else {
                *late_events += 1;
                continue;
            };
            ev.ts_ns = ev.ts_ns.saturating_sub(open.evidence.start_ns);
            if let Some(session) = open.evidence.session.as_deref() {
                sessions.observe(session, span, &mut ev);
            }
            if !subscribers.is_empty() {
                publish(subscribers, span, open.owner(), &ev);
            }
            open.evidence.add(ev);
        }
    }

    /// Whether `end_span` may go on: not a gVisor span, no process named,
    /// or its root's exit point has arrived (drained first). Asked in
    /// short turns of the lock while the connection waits.
    fn gvisor_exit_arrived(&mut self, span: u64) -> bool {
        let Some(open) = self.spans.get(&span) else {
            return true;
        };
        if open.gvisor_container.is_none() {
            return true;
        }
        self.drain_gvisor();
        self.spans.get(&span).is_none_or(|o| {
            o.evidence
                .root_pid
                .is_none_or(|p| o.evidence.processes.get(&p).is_some_and(|p| p.exited))
        })
    }

    /// Follows `path` for `span` (when given): the threads in it now are
    /// attached, the kernel adds what forks or execs in it. How many.
    fn follow_cgroup(
        &mut self,
        span: u64,
        path: Option<&std::path::Path>,
    ) -> Result<Option<usize>, ErrorBody> {
        let Some(path) = path else { return Ok(None) };
        let bad =
            |e: crate::cgroup::CgroupError| ErrorBody::new(ErrorCode::BadRequest, e.to_string());
        let cg = crate::cgroup::Cgroup::open(path).map_err(bad)?;
        if self.probe.pid_namespace().is_some() {
            return Err(ErrorBody::new(
                ErrorCode::Unavailable,
                "following a cgroup needs a probe in the host's PID namespace",
            ));
        }
        self.probe.follow_cgroup(cg.id, span).map_err(|e| {
            ErrorBody::new(
                ErrorCode::Unavailable,
                format!("cannot follow {}: {e}", path.display()),
            )
        })?;
        if let Some(open) = self.spans.get_mut(&span) {
            open.cgroup = Some(cg.id);
        }
        let threads = cg.threads().map_err(bad)?;
        let mut attached = 0;
        for tid in threads {
            // one that exited meanwhile is simply not traced. Its seccomp
            // mode is not read (a /proc read per thread, most of a walk's
            // cost): a denial it meets is confirmed when its event arrives
            if self.probe.track_with_seccomp(tid, span, 0).is_ok() {
                attached += 1;
                if let Some(open) = self.spans.get_mut(&span) {
                    open.evidence.tids.insert(tid);
                }
            }
        }
        Ok(Some(attached))
    }

    /// `attach`, or with `tree` [`Core::attach_tree`]: how many threads.
    fn attach_pid(
        &mut self,
        span: u64,
        pid: u32,
        tree: bool,
        seccomp: Option<u32>,
    ) -> Result<usize, ErrorBody> {
        if tree {
            self.attach_tree(span, pid)
        } else {
            self.attach(span, pid, seccomp).map(|()| 1)
        }
    }

    /// Attaches a running process as it is now: every thread of `pid` and
    /// of each descendant (forks and clones after this inherit the span in
    /// the kernel). A thread that another span tracked moves to this one.
    /// Threads started while the tree is walked are caught by walking it
    /// again, until a walk finds nothing new.
    fn attach_tree(&mut self, span: u64, pid: u32) -> Result<usize, ErrorBody> {
        self.attach(span, pid, None)?;
        let mut attached: std::collections::HashSet<u32> = [pid].into();
        for _ in 0..4 {
            let new: Vec<u32> = crate::proctree::threads(pid)
                .into_iter()
                .filter(|t| !attached.contains(t))
                .collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                // a thread that exited since the walk is simply gone
                if self.probe.track(tid, span).is_ok()
                    && let Some(open) = self.spans.get_mut(&span)
                {
                    open.evidence.tids.insert(tid);
                }
                attached.insert(tid);
            }
        }
        Ok(attached.len())
    }

    /// Traces `pid` in `span`. `seccomp` is its seccomp mode when the
    /// caller knows it; else it is read from the process's status.
    fn attach(&mut self, span: u64, pid: u32, seccomp: Option<u32>) -> Result<(), ErrorBody> {
        let Some(open) = self.spans.get_mut(&span) else {
            return Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("span {span} is not open"),
            ));
        };
        let no_process = || ErrorBody::new(ErrorCode::NotFound, format!("no process {pid}"));
        let seccomp = match seccomp {
            // the caller knows the mode: only whether it exists is left
            // (a signal-0 kill: ~1 µs, where the status read is ~12)
            Some(mode) if process_exists(pid) => mode,
            Some(_) => return Err(no_process()),
            // one procfs read answers both whether it exists and its seccomp
            // mode (a lookup under /proc costs about as much as the read)
            None => {
                let status = (pid != 0)
                    .then(|| crate::loader::read_proc(format!("/proc/{pid}/status")))
                    .flatten()
                    .ok_or_else(no_process)?;
                crate::loader::seccomp_mode_in(&status).unwrap_or(0)
            }
        };
        self.probe
            .track_with_seccomp(pid, span, seccomp)
            .map_err(|e| {
                ErrorBody::new(
                    ErrorCode::Unavailable,
                    format!("cannot trace pid {pid}: {e}"),
                )
            })?;
        open.evidence.root_pid.get_or_insert(pid);
        open.evidence.tids.insert(pid);
        Ok(())
    }

    fn end(
        &mut self,
        span: u64,
        exit: Option<ExitStatus>,
        timed_out: Option<Duration>,
        is_error: bool,
        words: Words,
    ) -> Result<Attribution, ErrorBody> {
        let Some(open) = self.spans.get(&span) else {
            return Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("span {span} is not open (never begun, or already ended)"),
            ));
        };
        if open.gvisor_container.is_some() {
            self.close_gvisor_span(span);
        } else {
            self.close_kernel_span(span);
        }
        let Some(mut open) = self.spans.remove(&span) else {
            return Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("span {span} is not open"),
            ));
        };
        let exit = exit.unwrap_or_else(|| observed_exit(&open.evidence));
        let outcome = Outcome {
            exit,
            timed_out,
            duration_ns: open.started.elapsed().as_nanos() as u64,
            all_events: false,
            words,
        };
        crate::facts::capture(&mut open.evidence, &outcome, &crate::facts::LiveHost);
        let mut attribution = attribute(&open.evidence, &outcome);
        attribution.sandbox = open.sandbox.clone();
        self.spans_ended += 1;
        self.retention_drops_total += open.evidence.drops.retention;
        if let (Some(exporter), Some(mut meta)) = (&self.otlp, open.meta.take()) {
            // the protobuf is built on the exporter thread, off the core
            meta.is_error = is_error;
            let a = attribution.clone();
            let (start, end) = (open.started_unix_ns, crate::otlp::now_unix_ns());
            exporter.submit(Box::new(move || {
                crate::otlp::probe_span(&meta, &a, start, end)
            }));
        }
        let stored = kept(&attribution, &mut open);
        // replayable only with every event it saw (none evicted, none left
        // out); and only where events are stored, which bounds the words
        let replay = (stored.drops.not_kept == 0
            && stored.drops.retention == 0
            && !stored.events.is_empty())
        .then(|| open.evidence.replay(&outcome));
        self.store_stats.queued.fetch_add(1, Ordering::Relaxed);
        let sent = self.store_tx.as_ref().is_some_and(|tx| {
            tx.send(StoredSpan {
                started_ms: open.started_ms,
                ended_ms: crate::clock::now_ms(),
                attribution: stored,
                replay,
            })
            .is_ok()
        });
        if !sent {
            self.store_stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("store thread is gone; span {span} was not saved");
        }
        Ok(attribution)
    }

    /// The kernel's last word on an eBPF span: stops following it, takes
    /// what the ring buffer still holds and its drops meanwhile.
    fn close_kernel_span(&mut self, span: u64) {
        if let Some(id) = self.spans.get(&span).and_then(|o| o.cgroup) {
            self.probe.unfollow_cgroup(id, span);
        }
        self.drain();
        let pending = match self.spans.get(&span) {
            Some(open) => {
                let tids: Vec<u32> = open.evidence.tids.iter().copied().collect();
                // threads that a later span took over (overlapping calls
                // into one server) stay traced for that span
                self.probe.untrack_own(span, tids)
            }
            None => Vec::new(),
        };
        self.drain();
        let drops_after: u64 = self.probe.drops().iter().sum();
        if let Some(open) = self.spans.get_mut(&span) {
            open.evidence.add_pending(&pending);
            open.evidence.drops.kernel = drops_after.saturating_sub(open.drops_before);
        }
    }

    /// The sandbox's last word on a gVisor span: its points so far (the
    /// connection waited for the exit's, see `respond`). Its drops are
    /// runsc's own count, added as its points arrived.
    fn close_gvisor_span(&mut self, span: u64) {
        self.drain_gvisor();
        if let Some(g) = self.gvisor.as_mut() {
            g.routes.end(span);
        }
    }

    fn update_rate(&mut self) {
        let (at, total, _) = self.rate;
        let elapsed = at.elapsed();
        if elapsed >= Duration::from_secs(1) {
            let rate = (self.events_total - total) as f64 / elapsed.as_secs_f64();
            self.rate = (Instant::now(), self.events_total, rate);
        }
    }

    fn status(&self) -> DaemonStatus {
        let drops = self.probe.drops();
        let untracked = drops[probe_abi::EventKind::TaskUntracked as usize];
        let kernel_by_kind = probe_abi::EventKind::ALL
            .iter()
            .map(|k| (format!("{k:?}"), drops[*k as usize]))
            .collect();
        let rss_kib = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .map(|v| v.trim().trim_end_matches(" kB").trim().to_string())
            })
            .and_then(|v| v.parse::<u64>().ok());
        let db_size = std::fs::metadata(&self.config.db)
            .map(|m| m.len())
            .unwrap_or(0)
            + std::fs::metadata(format!("{}-wal", self.config.db.display()))
                .map(|m| m.len())
                .unwrap_or(0);
        let s = &self.store_stats;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        DaemonStatus {
            protocol: protocol::PROTOCOL_VERSION,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            pid_namespace: self.probe.pid_namespace().map(|ns| PidNamespaceId {
                dev: ns.dev,
                inode: ns.ino,
            }),
            uptime_s: self.started.elapsed().as_secs(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            features: Features {
                btf: self.probe.rung == crate::loader::Rung::Btf,
                ring_buffer: true,
                raw_tracepoints: true,
                kprobes: Path::new("/sys/kernel/tracing/kprobe_events").exists(),
                rung: self.probe.rung.name().to_owned(),
                jit: crate::preflight::jit(),
            },
            programs: self.probe.attached.clone(),
            missing_optional: self.probe.missing.clone(),
            events_total: self.events_total,
            events_per_sec: (self.rate.2 * 10.0).round() / 10.0,
            late_events: self.late_events,
            decode_errors: self.decode_errors,
            drops: StatusDrops {
                kernel_total: drops.iter().sum::<u64>() - untracked,
                untracked_children: untracked,
                kernel_by_kind,
                retention_events_total: self.retention_drops_total,
            },
            open_spans: self.spans.len(),
            spans_ended: self.spans_ended,
            tracked_tasks: self.probe.tracked_tasks(),
            sessions_remembered: self.sessions.len(),
            otlp: self.otlp.as_ref().map(|e| OtlpStatus {
                invalid_traceparents: self.invalid_traceparents,
                ..e.status()
            }),
            gvisor: self.gvisor.as_ref().map(|g| {
                let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
                let stats = &g.monitor.stats;
                crate::status::GvisorStatus {
                    socket: g.monitor.path().to_path_buf(),
                    sandboxes: g
                        .routes
                        .sandboxes()
                        .into_iter()
                        .map(|(runsc_pid, containers)| crate::status::GvisorSandbox {
                            runsc_pid,
                            containers,
                        })
                        .collect(),
                    connections: load(&stats.connections),
                    datagrams: load(&stats.datagrams),
                    points: g.routes.counts.points,
                    unrouted: g.routes.counts.unrouted,
                    dropped: g.routes.counts.dropped,
                    malformed: load(&stats.malformed),
                    refused: load(&stats.refused),
                }
            }),
            rss_kib,
            db: DbStatus {
                path: self.config.db.clone(),
                size_bytes: db_size,
                store_queue: load(&s.queued).saturating_sub(load(&s.written) + load(&s.errors)),
                stored_spans: load(&s.written),
                store_errors: load(&s.errors),
                retention_removed: RetentionRemoved {
                    spans: load(&s.retention_spans),
                    events: load(&s.retention_events),
                    explaining_spans: load(&s.retention_explaining),
                },
                budget_bytes: load(&s.budget_bytes),
                spans_in_db: load(&s.in_db),
                bytes_per_span: db_size.checked_div(load(&s.in_db)).unwrap_or(0),
                keep_events: self.config.retention.keep_events.id().to_owned(),
                auto_vacuum: self.auto_vacuum.to_owned(),
                events_stored: load(&s.events_written),
                store_busy_ms: load(&s.busy_us) as f64 / 1e3,
                longest_write_ms: load(&s.longest_write_us) as f64 / 1e3,
            },
            // filled by the connection, which holds the client counts
            clients: Default::default(),
            client_sandbox: None,
        }
    }
}

/// What the store keeps of an ended span (docs/RETENTION.md). With
/// keep_events `all`, every event. Else, of a span that explains
/// something, its lineage (forks, execs, exits, signals, OOM kills,
/// writes, denials…) and the failures its attribution holds as evidence,
/// not the failed lookups it got past; of a span that explains nothing,
/// no event (its counts say what it saw). What is not kept is counted in
/// `drops.not_kept`.
fn kept(attribution: &Attribution, open: &mut OpenSpan) -> Attribution {
    let mut stored = attribution.clone();
    let all = std::mem::take(&mut open.evidence.events);
    let seen = all.len();
    stored.events = match open.keep_events {
        KeepEvents::All => all.into(),
        KeepEvents::Failed if attribution.explains() => all
            .into_iter()
            .filter(|e| !e.kind.is_failure() || attribution.events.contains(e))
            .collect(),
        KeepEvents::Failed => Vec::new(),
    };
    stored.drops.not_kept = (seen - stored.events.len()) as u64;
    stored
}

/// The first process's exit as the kernel saw it, when the caller did not say.
fn observed_exit(span: &SpanEvidence) -> ExitStatus {
    let root = span.root_pid.and_then(|pid| span.processes.get(&pid));
    match root {
        Some(p) if p.exited && p.exit_code.is_some() => ExitStatus {
            code: p.exit_code,
            signal: None,
        },
        Some(p) if p.exited => ExitStatus {
            code: None,
            signal: p.signal.clone(),
        },
        _ => ExitStatus::default(),
    }
}

fn publish(
    subscribers: &mut Vec<Subscriber>,
    span: u64,
    owner: Option<&str>,
    ev: &crate::event::KernelEvent,
) {
    let mut line: Option<String> = None;
    subscribers.retain_mut(|s| {
        if s.span.is_some_and(|id| id != span)
            || s.kind.is_some_and(|k| k != ev.kind)
            || s.owner.as_deref().is_some_and(|o| Some(o) != owner)
        {
            return !s.tx.is_closed();
        }
        let text = line.get_or_insert_with(|| {
            let mut l = json!({"span": span, "event": ev}).to_string();
            l.push('\n');
            l
        });
        if s.lagged > 0 {
            let notice = format!("{}\n", json!({"lagged": s.lagged}));
            if s.tx.try_send(notice).is_ok() {
                s.lagged = 0;
            }
        }
        match s.tx.try_send(text.clone()) {
            Ok(()) => true,
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                s.lagged += 1;
                true
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => false,
        }
    });
}

/// How long the store thread gathers ended spans into one transaction.
const STORE_GATHER: Duration = Duration::from_millis(20);

fn store_loop(
    mut store: Store,
    rx: mpsc::Receiver<StoredSpan>,
    policy: RetentionPolicy,
    stats: Arc<StoreStats>,
) {
    let retention = Retention {
        policy,
        stats: &stats,
    };
    retention.by_age(&mut store);
    retention.fit(&mut store);
    let mut last_age_pass = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(first) => {
                // spans that end within STORE_GATHER go in one transaction:
                // a transaction per span cost 145 µs of CPU each (locks and
                // WAL frames of the same pages again), on the CPUs the
                // calls being traced need. The thread sleeps through the
                // window instead of waiting on the channel, so the spans
                // sent meanwhile wake nobody (a wake-up per span was 5% of
                // the request thread's CPU); with a full batch queued
                // already it does not wait at all.
                const BATCH: usize = 512;
                let mut batch = vec![first];
                batch.extend(rx.try_iter().take(BATCH - 1));
                if batch.len() < BATCH {
                    std::thread::sleep(STORE_GATHER);
                    batch.extend(rx.try_iter().take(BATCH - batch.len()));
                }
                let (spans, events) = stats.timed(|| {
                    let written = write_batch(&mut store, &batch, &stats);
                    stats.in_db.fetch_add(written.0, Ordering::Relaxed);
                    // the cap holds as spans arrive, not once a minute
                    retention.fit(&mut store);
                    written
                });
                // stored, for status and `stored_so_far`: room made too
                stats.written.fetch_add(spans, Ordering::Relaxed);
                stats.events_written.fetch_add(events, Ordering::Relaxed);
            }
            // idle: a pass that stopped at PASS_TIME goes on
            Err(mpsc::RecvTimeoutError::Timeout) => stats.timed(|| retention.fit(&mut store)),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if last_age_pass.elapsed() >= Duration::from_secs(60) {
            stats.timed(|| {
                retention.by_age(&mut store);
                // the free disk may have shrunk (the workload writes too)
                retention.fit(&mut store);
            });
            last_age_pass = Instant::now();
        }
    }
    if let Err(e) = store
        .connection()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
    {
        tracing::warn!("final checkpoint: {e}");
    }
}

/// Writes a batch in one transaction; when that fails, span by span, so
/// one bad span does not take the batch down. Answers (spans, events)
/// written; failures are counted in `stats`.
fn write_batch(store: &mut Store, batch: &[StoredSpan], stats: &StoreStats) -> (u64, u64) {
    let events = |spans: &[StoredSpan]| -> u64 {
        spans
            .iter()
            .map(|s| s.attribution.events.len() as u64)
            .sum()
    };
    let Err(e) = store.insert(batch) else {
        return (batch.len() as u64, events(batch));
    };
    tracing::warn!(
        "batch of {} span(s) failed ({e}); storing them one by one",
        batch.len()
    );
    let mut written = (0, 0);
    for span in batch {
        let one = std::slice::from_ref(span);
        match store.insert(one) {
            Ok(()) => written = (written.0 + 1, written.1 + events(one)),
            Err(e) => {
                tracing::error!("cannot store span {}: {e}", span.attribution.span);
                stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    written
}

/// The store thread's retention: the policy, and where it counts.
struct Retention<'a> {
    policy: RetentionPolicy,
    stats: &'a StoreStats,
}

impl Retention<'_> {
    fn by_age(&self, store: &mut Store) {
        if let Some(age) = self.policy.max_age_secs {
            let mut removed = RetentionTotals::default();
            let done = store.enforce_age(age, &mut removed);
            self.count(removed, done);
        }
    }

    /// Under the budget of the moment (bytes, and the share of free disk).
    fn fit(&self, store: &mut Store) {
        let budget = self
            .policy
            .budget_bytes(store.path(), store.size_bytes().unwrap_or(0));
        if self.stats.budget_bytes.swap(budget, Ordering::Relaxed) != budget
            && let Err(e) = store.limit_wal(budget)
        {
            tracing::warn!("cannot limit the WAL: {e}");
        }
        let mut removed = RetentionTotals::default();
        let done = store.enforce_size(budget, &mut removed);
        self.count(removed, done);
    }

    /// Counts what a pass removed, also when it failed halfway.
    fn count(&self, r: RetentionTotals, done: Result<(), crate::store::StoreError>) {
        let s = self.stats;
        s.retention_spans
            .fetch_add(r.spans_removed, Ordering::Relaxed);
        s.retention_events
            .fetch_add(r.events_removed, Ordering::Relaxed);
        s.retention_explaining
            .fetch_add(r.explaining_removed, Ordering::Relaxed);
        // saturating: spans imported by hand are removed too
        let _ = s
            .in_db
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(r.spans_removed))
            });
        if let Err(e) = done {
            tracing::error!("retention failed: {e}");
        }
    }
}

/// Binds the control socket: refuses when another daemon answers there,
/// replaces a stale socket file, sets mode 0600 (0660 with a group).
fn bind(
    path: &Path,
    group: Option<nix::unistd::Gid>,
) -> anyhow::Result<std::os::unix::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if path.exists() {
        if StdUnixStream::connect(path).is_ok() {
            bail!(
                "another probe daemon is listening on {} (use --socket for a second one)",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if let Some(g) = group {
        nix::unistd::chown(path, None, Some(g))
            .with_context(|| format!("cannot chown {} to gid {g}", path.display()))?;
    }
    Ok(listener)
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
    let auto_vacuum = store.auto_vacuum()?;
    if auto_vacuum == "none" {
        tracing::warn!(
            "{} was made before incremental auto-vacuum: retention reuses the pages it frees but cannot give them back to the filesystem (docs/RETENTION.md says how to convert it offline)",
            config.db.display()
        );
    }
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
    let gvisor = match &config.gvisor_socket {
        Some(path) => {
            let (tx, rx) = mpsc::channel();
            match crate::gvisor::monitor::Monitor::listen(path, tx) {
                Ok(monitor) => {
                    tracing::info!(socket = %path.display(), "listening for gVisor sandboxes");
                    Some(GvisorSide {
                        monitor,
                        rx,
                        routes: Default::default(),
                    })
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
                    None
                }
            }
        }
        None => None,
    };
    let (wake_r, wake_w) = StdUnixStream::pair()?;
    wake_w.set_nonblocking(true)?;
    let core = Core {
        probe,
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
        gvisor,
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

async fn serve(
    listener: std::os::unix::net::UnixListener,
    core: Arc<CoreHandle>,
    config: DaemonConfig,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let config = Arc::new(config);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let core = core.clone();
                    let config = config.clone();
                    tokio::spawn(async move {
                        if let Err(e) = connection(stream, core, config).await {
                            tracing::debug!("connection ended: {e}");
                        }
                    });
                }
                Err(e) => tracing::warn!("accept: {e}"),
            }
        }
    }
    tracing::info!("shutting down");
    Ok(())
}

/// Whether process `pid` has `gid` among its supplementary groups.
fn in_group(pid: i32, gid: u32) -> bool {
    let gid = gid.to_string();
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .map(|g| g.split_whitespace().any(|x| x == gid))
        })
        .unwrap_or(false)
}

/// Result of reading one bounded line.
enum Line {
    Complete,
    TooLong,
    Eof,
}

/// Reads up to a newline into `buf`, at most `MAX_LINE` bytes.
async fn read_line_bounded(
    rd: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
    buf: &mut Vec<u8>,
) -> std::io::Result<Line> {
    loop {
        let available = rd.fill_buf().await?;
        if available.is_empty() {
            // EOF; a half-written line is dropped
            return Ok(Line::Eof);
        }
        match available.iter().position(|&b| b == b'\n') {
            Some(i) => {
                buf.extend_from_slice(&available[..i]);
                rd.consume(i + 1);
                return Ok(if buf.len() > MAX_LINE {
                    Line::TooLong
                } else {
                    Line::Complete
                });
            }
            None => {
                let n = available.len();
                buf.extend_from_slice(available);
                rd.consume(n);
                if buf.len() > MAX_LINE {
                    return Ok(Line::TooLong);
                }
            }
        }
    }
}

async fn connection(
    stream: UnixStream,
    core: Arc<CoreHandle>,
    config: Arc<DaemonConfig>,
) -> anyhow::Result<()> {
    let cred = stream.peer_cred()?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut buf = Vec::new();
    let me = nix::unistd::geteuid().as_raw();
    let allowed = cred.uid() == 0
        || cred.uid() == me
        || config.group.is_some_and(|g| {
            g.as_raw() == cred.gid() || cred.pid().is_some_and(|pid| in_group(pid, g.as_raw()))
        });
    if !allowed {
        let err = ErrorBody::new(
            ErrorCode::Forbidden,
            format!(
                "uid {} may not use the probe (root{} only)",
                cred.uid(),
                if config.group.is_some() {
                    " or its group"
                } else {
                    ""
                }
            ),
        );
        // answer the first request (so the client reads the refusal rather
        // than a broken pipe), then close
        let first =
            tokio::time::timeout(Duration::from_secs(2), read_line_bounded(&mut rd, &mut buf))
                .await;
        let id = match first {
            Ok(Ok(Line::Complete)) => protocol::parse_request(&buf).0,
            _ => Value::Null,
        };
        wr.write_all(protocol::error_line(&id, &err).as_bytes())
            .await?;
        return Ok(());
    }
    let peer_pid = cred.pid().and_then(|p| u32::try_from(p).ok());
    let peer = Peer {
        scope: Scope::of_peer(
            peer_pid,
            cred.uid(),
            peer_pid.and_then(crate::gvisor::routes::sandbox_behind),
            config.confine,
        ),
    };
    let _sandboxed = SandboxedClient::count(&core.clients, &peer.scope);
    // spans begun here that end with this connection (`ends_with_connection`)
    let mut ends_with_us: Vec<u64> = Vec::new();
    let served: anyhow::Result<()> = async {
        loop {
            buf.clear();
            match read_line_bounded(&mut rd, &mut buf).await? {
                Line::Eof => return Ok(()),
                Line::TooLong => {
                    let err = ErrorBody::new(
                        ErrorCode::TooLarge,
                        format!("request line longer than {MAX_LINE} bytes; closing"),
                    );
                    wr.write_all(protocol::error_line(&Value::Null, &err).as_bytes())
                        .await?;
                    return Ok(());
                }
                Line::Complete => {}
            }
            if buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let (id, req) = protocol::parse_request(&buf);
            let line = match req {
                Err(e) => protocol::error_line(&id, &e),
                Ok(Request::Subscribe { span_id, kind }) => {
                    let kind = match kind.as_deref().map(|k| Kind::from_id(k).ok_or(k)) {
                        Some(Err(k)) => {
                            let e = ErrorBody::new(
                                ErrorCode::BadRequest,
                                format!("unknown event kind \"{k}\""),
                            );
                            wr.write_all(protocol::error_line(&id, &e).as_bytes())
                                .await?;
                            continue;
                        }
                        Some(Ok(k)) => Some(k),
                        None => None,
                    };
                    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
                    let subscribed = core
                        .ask(|reply| Command::Subscribe {
                            span: span_id,
                            kind,
                            caller: peer.scope.sandbox_id().map(str::to_owned),
                            tx,
                            reply,
                        })
                        .await;
                    if let Err(e) = subscribed {
                        let e = core.clients.refused(e);
                        wr.write_all(protocol::error_line(&id, &e).as_bytes())
                            .await?;
                        if e.code == ErrorCode::Forbidden {
                            continue; // the connection stays usable
                        }
                        return Ok(());
                    }
                    wr.write_all(protocol::ok_line(&id, json!({"subscribed": true})).as_bytes())
                        .await?;
                    // stream until the client hangs up
                    let mut probe_buf = Vec::new();
                    loop {
                        tokio::select! {
                            line = rx.recv() => match line {
                                Some(l) => wr.write_all(l.as_bytes()).await?,
                                None => return Ok(()),
                            },
                            r = read_line_bounded(&mut rd, &mut probe_buf) => match r {
                                Ok(Line::Eof) | Err(_) | Ok(Line::TooLong) => return Ok(()),
                                Ok(Line::Complete) => probe_buf.clear(),
                            },
                        }
                    }
                }
                Ok(req) => {
                    let ends_with_us_too = matches!(
                        req,
                        Request::BeginSpan {
                            ends_with_connection: true,
                            ..
                        }
                    );
                    let line = respond(&id, req, &core, &config, &peer).await;
                    if ends_with_us_too
                        && let Some(span) = serde_json::from_str::<Value>(&line)
                            .ok()
                            .and_then(|v| v["span_id"].as_u64())
                    {
                        ends_with_us.push(span);
                    }
                    line
                }
            };
            wr.write_all(line.as_bytes()).await?;
        }
    }
    .await;
    // those its client ended already answer "no such span": nothing to do
    for span_id in ends_with_us {
        let end = Request::EndSpan {
            span_id,
            exit: None,
            timed_out_ms: None,
            is_error: false,
            words: Default::default(),
        };
        respond(&Value::Null, end, &core, &config, &peer).await;
    }
    served
}

/// A gVisor span whose process ended: waits (up to [`GVISOR_EXIT_WAIT`])
/// for that exit's point, which travels the monitor socket while the
/// caller's wait returns, holding the core only to look.
async fn await_gvisor_exit(core: &CoreHandle, span: u64) {
    let deadline = Instant::now() + GVISOR_EXIT_WAIT;
    loop {
        let arrived = match core.lock() {
            Ok(mut c) => c.gvisor_exit_arrived(span),
            Err(_) => true,
        };
        if arrived || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Who is at the other end of a control connection.
#[derive(Debug, Clone)]
struct Peer {
    /// What it may reach: everything, or its own sandbox.
    scope: Scope,
}

/// A confined client counted as connected while it is.
struct SandboxedClient<'a>(Option<&'a ClientCounts>);

impl<'a> SandboxedClient<'a> {
    fn count(counts: &'a ClientCounts, scope: &Scope) -> Self {
        if matches!(scope, Scope::Host) {
            return SandboxedClient(None);
        }
        counts.sandboxed_now.fetch_add(1, Ordering::Relaxed);
        SandboxedClient(Some(counts))
    }
}

impl Drop for SandboxedClient<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.sandboxed_now.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What a `begin_span` asks to trace, as the core takes it: pids and
/// cgroups of a confined client translated into the daemon's view and
/// checked to be its sandbox's (see [`crate::peer`]).
struct Admitted {
    pid: Option<u32>,
    cgroup: Option<PathBuf>,
    gvisor: Option<GvisorTarget>,
    sandbox: Option<SandboxView>,
}

fn admit_begin(
    scope: &Scope,
    pid: Option<u32>,
    cgroup: Option<PathBuf>,
    gvisor_container: Option<String>,
) -> Result<Admitted, ErrorBody> {
    let sandbox = match scope {
        Scope::Host => {
            return Ok(Admitted {
                pid,
                cgroup,
                gvisor: gvisor_container.map(GvisorTarget::Container),
                sandbox: None,
            });
        }
        Scope::Sandbox(s) => s,
    };
    match &sandbox.kind {
        SandboxKind::Gvisor(client) => {
            if let Some(path) = &cgroup {
                sandbox.cgroup(path)?; // always refused, saying why
            }
            let gvisor = match gvisor_container {
                Some(c) if client.container.as_deref() == Some(c.as_str()) => {
                    GvisorTarget::Container(c)
                }
                Some(c) => {
                    return Err(crate::peer::forbidden(format!(
                        "gVisor container {c:?} is not this client's sandbox ({})",
                        sandbox.id
                    )));
                }
                None => GvisorTarget::Behind(client.clone()),
            };
            Ok(Admitted {
                pid,
                cgroup: None,
                gvisor: Some(gvisor),
                sandbox: Some(SandboxView {
                    id: sandbox.id.clone(),
                    pids: PidsIn::Sandbox,
                    root_pid: None,
                }),
            })
        }
        SandboxKind::PidNamespace(_) | SandboxKind::Owner(_) => {
            if let Some(c) = gvisor_container {
                return Err(crate::peer::forbidden(format!(
                    "gVisor container {c:?} is not this client's sandbox ({})",
                    sandbox.id
                )));
            }
            let daemon_pid = pid.map(|p| sandbox.to_daemon_pid(p)).transpose()?;
            let cgroup = cgroup.map(|c| sandbox.cgroup(&c)).transpose()?;
            Ok(Admitted {
                pid: daemon_pid,
                cgroup,
                gvisor: None,
                sandbox: Some(SandboxView {
                    id: sandbox.id.clone(),
                    pids: PidsIn::Daemon,
                    root_pid: pid
                        .zip(daemon_pid)
                        .map(|(sandbox, daemon)| RootPid { daemon, sandbox }),
                }),
            })
        }
    }
}

/// `pid` as a client of `scope` named it, in the daemon's numbering.
fn admit_pid(scope: &Scope, pid: u32) -> Result<u32, ErrorBody> {
    match scope {
        Scope::Sandbox(s) => s.to_daemon_pid(pid),
        Scope::Host => Ok(pid),
    }
}

async fn respond(
    id: &Value,
    req: Request,
    core: &CoreHandle,
    config: &DaemonConfig,
    peer: &Peer,
) -> String {
    let result: Result<Value, ErrorBody> = match req {
        Request::Hello => Ok(
            json!({"protocol": protocol::PROTOCOL_VERSION, "version": env!("CARGO_PKG_VERSION")}),
        ),
        Request::BeginSpan {
            session,
            label,
            pid,
            tree,
            server,
            seccomp,
            memory_limited,
            cgroup,
            tool,
            mcp_method,
            mcp_session,
            traceparent,
            tracestate,
            ends_with_connection: _,
            keep_events,
            gvisor_container,
        } => match admit_begin(&peer.scope, pid, cgroup, gvisor_container) {
            Err(e) => Err(e),
            Ok(admitted) => core
                .ask(|reply| Command::Begin {
                    gvisor: admitted.gvisor,
                    sandbox: admitted.sandbox,
                    session,
                    label,
                    pid: admitted.pid,
                    tree,
                    server,
                    seccomp,
                    memory_limited,
                    cgroup: admitted.cgroup,
                    meta: Box::new(BeginMeta {
                        tool,
                        mcp_method,
                        mcp_session,
                        traceparent,
                        tracestate,
                    }),
                    keep_events,
                    reply,
                })
                .await
                .map(|(span, tids)| match tids {
                    Some(n) => json!({"span_id": span, "tids": n}),
                    None => json!({"span_id": span}),
                }),
        },
        Request::Attach { span_id, pid } => match admit_pid(&peer.scope, pid) {
            Err(e) => Err(e),
            Ok(daemon_pid) => core
                .ask(|reply| Command::Attach {
                    span: span_id,
                    pid: daemon_pid,
                    caller: peer.scope.sandbox_id().map(str::to_owned),
                    client_pid: pid,
                    reply,
                })
                .await
                .map(|()| json!({})),
        },
        Request::EndSpan {
            span_id,
            exit,
            timed_out_ms,
            is_error,
            words,
        } => {
            if exit.is_some() {
                await_gvisor_exit(core, span_id).await;
            }
            core.ask(|reply| Command::End {
                span: span_id,
                caller: peer.scope.sandbox_id().map(str::to_owned),
                exit,
                timed_out: timed_out_ms.map(Duration::from_millis),
                is_error,
                words: words.bounded(),
                reply,
            })
            .await
            .map(|a| json!({"attribution": a}))
        }
        Request::Status => {
            let (tx, rx) = oneshot::channel();
            match core.send(Command::Status { reply: tx }) {
                Ok(()) => rx
                    .await
                    .map(|mut s| {
                        s.clients = crate::status::ClientsStatus {
                            sandboxed: core.clients.sandboxed_now.load(Ordering::Relaxed),
                            forbidden: core.clients.forbidden.load(Ordering::Relaxed),
                        };
                        json!({"status": seen_by(s, &peer.scope)})
                    })
                    .map_err(|_| {
                        ErrorBody::new(ErrorCode::Internal, "the probe daemon is shutting down")
                    }),
                Err(e) => Err(e),
            }
        }
        Request::Query {
            session,
            failed,
            since_ms,
            span_id,
            limit,
        } => {
            // what ended before this query is in its answer, although the
            // store thread may still be gathering it (STORE_GATHER)
            if let Ok(stats) = core.lock().map(|c| c.store_stats.clone()) {
                stored_so_far(&stats).await;
            }
            let db = config.db.clone();
            let sandbox = peer.scope.sandbox_id().map(str::to_owned);
            tokio::task::spawn_blocking(move || {
                query(&db, session, failed, since_ms, span_id, limit, sandbox)
            })
            .await
            .unwrap_or_else(|e| Err(ErrorBody::new(ErrorCode::Internal, e.to_string())))
        }
        Request::Subscribe { .. } => Err(ErrorBody::new(
            ErrorCode::Internal,
            "subscribe is handled by the connection",
        )),
    };
    match result {
        Ok(v) => protocol::ok_line(id, v),
        Err(e) => protocol::error_line(id, &core.clients.refused(e)),
    }
}

/// The status as a client of `scope` may see it: a confined client sees
/// no other sandbox's name and no host path.
fn seen_by(mut status: DaemonStatus, scope: &Scope) -> DaemonStatus {
    let Scope::Sandbox(s) = scope else {
        return status;
    };
    status.client_sandbox = Some(s.id.clone());
    status.db.path = PathBuf::new();
    if let Some(g) = status.gvisor.as_mut() {
        g.socket = PathBuf::new();
        for sandbox in &mut g.sandboxes {
            sandbox
                .containers
                .retain(|c| s.id.strip_prefix("gvisor:") == Some(c.as_str()));
        }
        g.sandboxes.retain(|sb| !sb.containers.is_empty());
    }
    status
}

/// Waits (up to 2 s) until every span queued for the store so far is
/// written (or failed).
async fn stored_so_far(stats: &StoreStats) {
    let queued = stats.queued.load(Ordering::Acquire);
    let deadline = Instant::now() + Duration::from_secs(2);
    while stats.written.load(Ordering::Acquire) + stats.errors.load(Ordering::Acquire) < queued
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn query(
    db: &Path,
    session: Option<String>,
    failed: bool,
    since_ms: Option<i64>,
    span_id: Option<u64>,
    limit: Option<u64>,
    sandbox: Option<String>,
) -> Result<Value, ErrorBody> {
    let internal = |e: crate::store::StoreError| ErrorBody::new(ErrorCode::Internal, e.to_string());
    let store = Store::open_readonly(db).map_err(internal)?;
    if let Some(id) = span_id {
        let shown = store.show(id).map_err(internal)?;
        return match (shown, &sandbox) {
            // a confined client: its own stored spans, and nothing said of others'
            (Some(a), Some(mine)) if a.sandbox.as_ref().map(|v| &v.id) != Some(mine) => {
                Err(crate::peer::forbidden(format!(
                    "span {id} is not a stored span of this client's sandbox ({mine})"
                )))
            }
            (None, Some(mine)) => Err(crate::peer::forbidden(format!(
                "span {id} is not a stored span of this client's sandbox ({mine})"
            ))),
            (Some(a), _) => Ok(json!({"span": a})),
            (None, None) => Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("span {id} is not stored (still open, or never existed)"),
            )),
        };
    }
    let rows = store
        .spans(&SpanFilter {
            session,
            failed_only: failed,
            since_ms,
            limit,
            sandbox,
        })
        .map_err(internal)?;
    Ok(json!({"spans": rows}))
}
