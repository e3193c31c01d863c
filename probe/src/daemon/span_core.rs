//! The span core: the open spans, the sessions' write memory, the evidence
//! sources (see [`crate::source`]) and the commands connections run on it.
//! Every span, whichever source sees it, goes one path: `begin` on its
//! source, events drained into it, `close_span` with the source's last
//! word, then [`Closed::judge`].

use super::*;

/// What connections ask of the core.
pub(super) enum Command {
    Begin {
        session: Option<String>,
        label: String,
        /// What to follow (attached at once: saves the caller a round trip).
        follow: Follow,
        /// Which source sees it.
        source: Source,
        /// With `follow.pid`: a server already running, which outlives the
        /// span.
        server: bool,
        /// For OpenTelemetry export: tool, MCP session, trace context.
        meta: Box<BeginMeta>,
        /// What the store keeps of it, when the client said.
        keep_events: Option<KeepEvents>,
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
    /// Spans begun to end with their connection, not ended yet: each
    /// connection keeps their ids until its client ends them or it closes.
    pub(super) ending_with_connection: AtomicU64,
    /// Spans begun to end with their client's process, whose ids a
    /// connection keeps: those not ended yet, and those ended on another
    /// connection since it last pruned its list.
    pub(super) ending_with_client: AtomicU64,
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

/// How long `end_span` of a span whose process ended waits for its source
/// to settle (gVisor's exit point travels the monitor socket while the
/// caller's wait returns).
pub(super) const SETTLE_WAIT: Duration = Duration::from_millis(500);

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
    /// What the store keeps of its events.
    pub(super) keep_events: KeepEvents,
    /// Which of the core's sources sees it.
    pub(super) source: usize,
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
    /// The evidence sources, the eBPF programs first.
    pub(super) sources: Vec<Box<dyn EvidenceSource>>,
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
}

/// The open spans as a source's sink: each event is noted in its
/// session's write memory, published to subscribers, and added.
pub(super) struct OpenSpans<'a> {
    spans: &'a mut HashMap<u64, OpenSpan>,
    sessions: &'a mut Sessions,
    subscribers: &'a mut Vec<Subscriber>,
    events_total: &'a mut u64,
    late_events: &'a mut u64,
    decode_errors: &'a mut u64,
}

impl SpanSink for OpenSpans<'_> {
    fn evidence(&mut self, span: u64) -> Option<&mut SpanEvidence> {
        self.spans.get_mut(&span).map(|o| &mut o.evidence)
    }

    fn deliver(&mut self, span: u64, mut ev: crate::event::KernelEvent) {
        let Some(open) = self.spans.get_mut(&span) else {
            *self.late_events += 1;
            return;
        };
        if let Some(session) = open.evidence.session.as_deref() {
            self.sessions.observe(session, span, &mut ev);
        }
        if !self.subscribers.is_empty() {
            publish(self.subscribers, span, open.owner(), &ev);
        }
        open.evidence.add(ev);
    }

    fn read(&mut self) {
        *self.events_total += 1;
    }

    fn late(&mut self) {
        // a descendant outliving its ended span: counted, not hidden
        *self.late_events += 1;
    }

    fn undecodable(&mut self) {
        *self.decode_errors += 1;
    }
}

impl Core {
    /// The sources, and the open spans as their sink.
    pub(super) fn parts(&mut self) -> (&mut [Box<dyn EvidenceSource>], OpenSpans<'_>) {
        let Core {
            sources,
            spans,
            sessions,
            subscribers,
            events_total,
            late_events,
            decode_errors,
            ..
        } = self;
        let sink = OpenSpans {
            spans,
            sessions,
            subscribers,
            events_total,
            late_events,
            decode_errors,
        };
        (sources, sink)
    }

    /// Lets the sources forget what they keep for spans no longer open
    /// (ones whose end could not name every thread).
    pub(super) fn sweep(&mut self) {
        let spans = &self.spans;
        let mut lost = 0;
        for source in &mut self.sources {
            lost += source.sweep(&|span| spans.contains_key(&span));
        }
        // the spans are stored already: what they lose is counted, like late events
        self.late_events += lost;
    }

    /// Drains every source until it is empty.
    pub(super) fn drain(&mut self) {
        self.drain_at_most(usize::MAX);
    }

    /// Drains at most `max` records of each source.
    pub(super) fn drain_at_most(&mut self, max: usize) {
        let (sources, mut sink) = self.parts();
        for source in sources {
            source.drain(max, &mut sink);
        }
    }

    /// Whether span `id` is open (ids are never reused).
    pub(super) fn is_open(&self, id: u64) -> bool {
        self.spans.contains_key(&id)
    }

    pub(super) fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Begin {
                session,
                label,
                follow,
                source,
                server,
                meta,
                keep_events,
                sandbox,
                reply,
            } => {
                let begun = self.begin(
                    session,
                    label,
                    &follow,
                    source,
                    server,
                    *meta,
                    keep_events,
                    sandbox,
                );
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
                let attached = match self.spans.get_mut(&span) {
                    Some(open) => self.sources[open.source].attach(&mut open.evidence, pid),
                    None => Err(ErrorBody::new(
                        ErrorCode::NotFound,
                        format!("span {span} is not open"),
                    )),
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

    /// Opens a span on the source of kind `source`, following `follow`.
    /// Answers the span and, with `tree`, how many threads or processes a
    /// walk attached.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn begin(
        &mut self,
        session: Option<String>,
        label: String,
        follow: &Follow,
        source: Source,
        server: bool,
        meta: BeginMeta,
        keep_events: Option<KeepEvents>,
        sandbox: Option<SandboxView>,
    ) -> Result<(u64, Option<usize>), ErrorBody> {
        if self.spans.len() >= self.config.max_open_spans {
            return Err(ErrorBody::new(
                ErrorCode::Unavailable,
                format!(
                    "{} spans are open, the limit (end some, or raise --max-open-spans)",
                    self.spans.len()
                ),
            ));
        }
        let Some(index) = self.sources.iter().position(|s| s.kind() == source) else {
            return Err(ErrorBody::new(
                ErrorCode::Unavailable,
                source.not_listening(),
            ));
        };
        let id = self.next_span;
        if id > u32::MAX as u64 {
            return Err(ErrorBody::new(
                ErrorCode::Unavailable,
                "span ids exhausted (2^32): start a new database",
            ));
        }
        let (started, started_ms, started_unix_ns) = (
            Instant::now(),
            crate::clock::now_ms(),
            crate::otlp::now_unix_ns(),
        );
        let mut evidence = SpanEvidence::new(id, session, label, crate::clock::monotonic_ns());
        evidence.cap = self.config.event_cap;
        evidence.source = source;
        let (sources, mut sink) = self.parts();
        let attached = sources[index].begin(&mut evidence, follow, &mut sink);
        // the id is spent even on an error: events the ring still holds
        // from what was followed before it must not land in the next span
        self.next_span += 1;
        let attached = attached?;
        evidence.root_serves = follow.tree || server;
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
                started_unix_ns,
                started_ms,
                started,
                keep_events: keep_events.unwrap_or(self.config.retention.keep_events),
                source: index,
                sandbox,
            },
        );
        Ok((id, attached))
    }

    /// Whether `end_span` may go on: the span's source has settled (its
    /// root's exit has arrived where its events trail the caller's wait).
    /// Asked in short turns of the lock while the connection waits.
    pub(super) fn settled(&mut self, span: u64) -> bool {
        let Some(index) = self.spans.get(&span).map(|o| o.source) else {
            return true;
        };
        let (sources, mut sink) = self.parts();
        sources[index].settled(span, &mut sink)
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
        let index = open.source;
        let (sources, mut sink) = self.parts();
        sources[index].close(span, &mut sink);
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
