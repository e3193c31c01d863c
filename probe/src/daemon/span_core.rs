//! The span core: the open spans, the sessions' write memory, the two
//! evidence sources (the eBPF programs, gVisor's points) and the commands
//! connections run on it.

use super::*;

/// What connections ask of the core.
pub(super) enum Command {
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
        reply: Reply<Closed>,
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
pub(super) struct CoreHandle {
    pub(super) core: std::sync::Mutex<Core>,
    pub(super) stopping: AtomicBool,
    /// Wakes the drain thread (for shutdown).
    pub(super) wake: StdUnixStream,
    /// Confined clients: connected now, and requests refused as outside
    /// their sandbox.
    pub(super) clients: ClientCounts,
}

#[derive(Default)]
pub(super) struct ClientCounts {
    pub(super) sandboxed_now: AtomicU64,
    pub(super) forbidden: AtomicU64,
}

impl ClientCounts {
    /// Counts a refusal on its way to the client.
    pub(super) fn refused(&self, e: ErrorBody) -> ErrorBody {
        if e.code == ErrorCode::Forbidden {
            self.forbidden.fetch_add(1, Ordering::Relaxed);
        }
        e
    }
}

impl CoreHandle {
    /// The core, unless the daemon is stopping or a panic left it unusable.
    pub(super) fn lock(&self) -> Result<std::sync::MutexGuard<'_, Core>, ErrorBody> {
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
    pub(super) fn send(&self, cmd: Command) -> Result<(), ErrorBody> {
        self.lock()?.handle(cmd);
        Ok(())
    }

    pub(super) async fn ask<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, ErrorBody> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        rx.await
            .map_err(|_| ErrorBody::new(ErrorCode::Internal, "the probe daemon is shutting down"))?
    }

    /// Stops the drain thread, which ends the spans still open.
    pub(super) fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        // a full socket buffer means a wake-up is already pending
        let _ = (&self.wake).write(&[1]);
    }
}

use std::io::Write as _;

/// Which gVisor sandbox a `begin_span` pid lives in.
#[derive(Debug, Clone)]
pub(super) enum GvisorTarget {
    /// The client said (`gvisor_container`).
    Container(String),
    /// The client reached us from inside a sandbox, through its gofer.
    Behind(crate::gvisor::routes::SandboxClient),
}

/// The daemon as gVisor's monitor: the points its sandboxes send, and
/// which span each belongs to.
pub(super) struct GvisorSide {
    pub(super) monitor: crate::gvisor::monitor::Monitor,
    pub(super) rx: mpsc::Receiver<crate::gvisor::monitor::Delivery>,
    pub(super) routes: crate::gvisor::routes::Routes,
}

/// How long `end_span` of a gVisor span whose process ended waits for
/// that exit's point (it travels the monitor socket while the caller's
/// wait returns).
pub(super) const GVISOR_EXIT_WAIT: Duration = Duration::from_millis(500);

/// `begin_span`'s fields for OpenTelemetry, as the client sent them.
#[derive(Default)]
pub(super) struct BeginMeta {
    pub(super) tool: Option<String>,
    pub(super) mcp_method: Option<String>,
    pub(super) mcp_session: Option<String>,
    pub(super) traceparent: Option<String>,
    pub(super) tracestate: Option<String>,
}

pub(super) struct OpenSpan {
    pub(super) evidence: SpanEvidence,
    /// What the exported span says about the call (export on only).
    pub(super) meta: Option<Box<CallMeta>>,
    pub(super) started_unix_ns: u64,
    pub(super) started_ms: i64,
    pub(super) started: Instant,
    pub(super) drops_before: u64,
    /// The id of the cgroup it follows, to stop following at its end.
    pub(super) cgroup: Option<u64>,
    /// What the store keeps of its events.
    pub(super) keep_events: KeepEvents,
    /// A gVisor span: the container its processes are in.
    pub(super) gvisor_container: Option<String>,
    /// The sandbox whose client opened it (None: a host client).
    pub(super) sandbox: Option<SandboxView>,
}

impl OpenSpan {
    pub(super) fn owner(&self) -> Option<&str> {
        self.sandbox.as_ref().map(|v| v.id.as_str())
    }
}

pub(super) struct Subscriber {
    pub(super) span: Option<u64>,
    pub(super) kind: Option<Kind>,
    /// A confined client's sandbox (None: every span's events).
    pub(super) owner: Option<String>,
    pub(super) tx: tokio::sync::mpsc::Sender<String>,
    pub(super) lagged: u64,
}

pub(super) struct Core {
    pub(super) probe: Probe,
    pub(super) spans: HashMap<u64, OpenSpan>,
    pub(super) sessions: Sessions,
    pub(super) subscribers: Vec<Subscriber>,
    pub(super) next_span: u64,
    /// None once the daemon stopped: the store thread then finishes.
    pub(super) store_tx: Option<mpsc::SyncSender<StoredSpan>>,
    pub(super) store_stats: Arc<StoreStats>,
    pub(super) config: DaemonConfig,
    pub(super) started: Instant,
    pub(super) events_total: u64,
    pub(super) late_events: u64,
    pub(super) decode_errors: u64,
    pub(super) spans_ended: u64,
    pub(super) retention_drops_total: u64,
    /// The DB's auto-vacuum mode (`incremental` unless made by an older
    /// version).
    pub(super) auto_vacuum: &'static str,
    pub(super) rate: (Instant, u64, f64),
    pub(super) otlp: Option<Arc<Exporter>>,
    /// `begin_span` traceparents that were not valid W3C trace context.
    pub(super) invalid_traceparents: u64,
    pub(super) gvisor: Option<GvisorSide>,
}

impl Core {
    /// Stops tracing threads of spans that are no longer open: ones whose
    /// fork event was lost, so `end` could not name them.
    pub(super) fn sweep(&mut self) {
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
    pub(super) fn drain(&mut self) {
        self.drain_at_most(usize::MAX);
    }

    /// Drains at most `max` records.
    pub(super) fn drain_at_most(&mut self, max: usize) {
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

    pub(super) fn handle(&mut self, cmd: Command) {
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
                    .and_then(|()| self.close_span(span, exit, timed_out, is_error, words));
                // the asker gone (its connection dropped): judged here, so
                // the span is stored all the same
                if let Err(Ok(closed)) = reply.send(ended) {
                    closed.judge();
                }
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
    pub(super) fn reachable(&self, span: u64, caller: Option<&str>) -> Result<(), ErrorBody> {
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

    pub(super) fn begin(
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
    pub(super) fn begin_gvisor(
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
    pub(super) fn drain_gvisor(&mut self) {
        while let Some(d) = self.gvisor.as_ref().and_then(|g| g.rx.try_recv().ok()) {
            self.take_gvisor(d);
        }
    }

    /// Routes one delivery of the gVisor monitor to its spans.
    pub(super) fn take_gvisor(&mut self, delivery: crate::gvisor::monitor::Delivery) {
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
    pub(super) fn gvisor_exit_arrived(&mut self, span: u64) -> bool {
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
    pub(super) fn follow_cgroup(
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
    pub(super) fn attach_pid(
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
    pub(super) fn attach_tree(&mut self, span: u64, pid: u32) -> Result<usize, ErrorBody> {
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
    pub(super) fn attach(
        &mut self,
        span: u64,
        pid: u32,
        seccomp: Option<u32>,
    ) -> Result<(), ErrorBody> {
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

    /// Takes span `span` out of the core with the sources' last word on
    /// it; [`Closed::judge`] attributes it, off the core's lock.
    pub(super) fn close_span(
        &mut self,
        span: u64,
        exit: Option<ExitStatus>,
        timed_out: Option<Duration>,
        is_error: bool,
        words: Words,
    ) -> Result<Closed, ErrorBody> {
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
        let Some(open) = self.spans.remove(&span) else {
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
        self.spans_ended += 1;
        self.retention_drops_total += open.evidence.drops.retention;
        // counted now: `query` waits until what is queued is written
        self.store_stats.queued.fetch_add(1, Ordering::Relaxed);
        Ok(Closed {
            span,
            open,
            outcome,
            is_error,
            otlp: self.otlp.clone(),
            store_tx: self.store_tx.clone(),
            store_stats: self.store_stats.clone(),
        })
    }
}

/// A span taken out of the core: judged without the core's lock, so other
/// connections go on while a big span is attributed.
pub(super) struct Closed {
    span: u64,
    open: OpenSpan,
    outcome: Outcome,
    is_error: bool,
    otlp: Option<Arc<Exporter>>,
    store_tx: Option<mpsc::SyncSender<StoredSpan>>,
    store_stats: Arc<StoreStats>,
}

impl Closed {
    /// Captures the host's facts, attributes the span, and hands it to the
    /// exporter and the store thread.
    pub(super) fn judge(self) -> Attribution {
        let Closed {
            span,
            mut open,
            outcome,
            is_error,
            otlp,
            store_tx,
            store_stats,
        } = self;
        crate::facts::capture(
            &mut open.evidence,
            outcome.exit.signal.as_deref(),
            &crate::facts::LiveHost,
        );
        let mut attribution = attribute(&open.evidence, &outcome);
        attribution.sandbox = open.sandbox.clone();
        if let (Some(exporter), Some(mut meta)) = (&otlp, open.meta.take()) {
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
        let sent = store_tx.as_ref().is_some_and(|tx| {
            tx.send(StoredSpan {
                started_ms: open.started_ms,
                ended_ms: crate::clock::now_ms(),
                attribution: stored,
                replay,
            })
            .is_ok()
        });
        if !sent {
            store_stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("store thread is gone; span {span} was not saved");
        }
        attribution
    }
}

impl Core {
    /// The kernel's last word on an eBPF span: stops following it, takes
    /// what the ring buffer still holds and its drops meanwhile.
    pub(super) fn close_kernel_span(&mut self, span: u64) {
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
    pub(super) fn close_gvisor_span(&mut self, span: u64) {
        self.drain_gvisor();
        if let Some(g) = self.gvisor.as_mut() {
            g.routes.end(span);
        }
    }

    pub(super) fn update_rate(&mut self) {
        let (at, total, _) = self.rate;
        let elapsed = at.elapsed();
        if elapsed >= Duration::from_secs(1) {
            let rate = (self.events_total - total) as f64 / elapsed.as_secs_f64();
            self.rate = (Instant::now(), self.events_total, rate);
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
pub(super) fn kept(attribution: &Attribution, open: &mut OpenSpan) -> Attribution {
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
pub(super) fn observed_exit(span: &SpanEvidence) -> ExitStatus {
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

pub(super) fn publish(
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
