//! The control server: the Unix socket, peer checks, bounded NDJSON
//! lines turned into core commands, `query` on its own DB connection.

use super::*;

/// Binds the control socket: refuses when another daemon answers there,
/// replaces a stale socket file, sets mode 0600 (0660 with a group).
pub(super) fn bind(
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

pub(super) async fn serve(
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
pub(super) fn in_group(pid: i32, gid: u32) -> bool {
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
pub(super) enum Line {
    Complete,
    TooLong,
    Eof,
}

/// Reads up to a newline into `buf`, at most `MAX_LINE` bytes.
pub(super) async fn read_line_bounded(
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

pub(super) async fn connection(
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
    let mut begun_here = BegunHere::new(&core);
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
                        Request::BeginSpan(BeginSpan {
                            ends_with_connection: true,
                            ..
                        })
                    );
                    let begun = matches!(req, Request::BeginSpan(_));
                    let ended = match req {
                        Request::EndSpan { span_id, .. } => Some(span_id),
                        _ => None,
                    };
                    let line = respond(&id, req, &core, &config, &peer).await;
                    if let Some(span) = begun.then(|| span_begun(&line)).flatten() {
                        begun_here.begun(span, ends_with_us_too);
                    }
                    if let Some(span) = ended {
                        begun_here.ended(span);
                    }
                    line
                }
            };
            wr.write_all(line.as_bytes()).await?;
        }
    }
    .await;
    // the daemon ends them (they were begun here, by this client): those
    // its client ended already are not open, which is nothing to do (and
    // no refusal to count)
    for span in begun_here.left_at_close(peer_pid).await {
        let closed = core
            .ask(|reply| Command::End {
                span,
                caller: None,
                exit: None,
                timed_out: None,
                is_error: false,
                words: Words::default(),
                reply,
            })
            .await;
        if let Ok(closed) = closed {
            let _ = tokio::task::spawn_blocking(move || closed.judge()).await;
        }
    }
    served
}

/// The span id a `begin_span` answered with.
fn span_begun(line: &str) -> Option<u64> {
    serde_json::from_str::<Value>(line)
        .ok()
        .and_then(|v| v["span_id"].as_u64())
}

/// The spans one connection began that its client has not ended yet: those
/// begun to end with the connection (`ends_with_connection`), and the
/// others, which end with the client's process (both counted daemon-wide in
/// status). A server's connection lives for weeks and begins spans for
/// every call, so each is forgotten once its client ends it: on this
/// connection at once, and on another (agent-bridge begins a call's span on
/// one connection and ends it on a second) when the lists are next pruned
/// of the spans no longer open.
struct BegunHere<'a> {
    with_connection: Kept<'a>,
    with_client: Kept<'a>,
    core: &'a CoreHandle,
    /// The length at which the lists are pruned next: twice what the last
    /// pruning kept, so pruning costs O(1) a span.
    prune_at: usize,
}

/// The least `BegunHere::prune_at`.
const PRUNE_AT_LEAST: usize = 64;

/// Span ids a connection keeps, with the daemon-wide count status shows
/// kept in step.
struct Kept<'a> {
    ids: Vec<u64>,
    count: &'a AtomicU64,
}

impl<'a> Kept<'a> {
    fn new(count: &'a AtomicU64) -> Self {
        Self {
            ids: Vec::new(),
            count,
        }
    }

    fn push(&mut self, span: u64) {
        self.ids.push(span);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn forget(&mut self, span: u64) {
        if let Some(i) = self.ids.iter().position(|s| *s == span) {
            self.ids.swap_remove(i);
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        let before = self.ids.len();
        self.ids.retain(|s| keep(*s));
        self.count
            .fetch_sub((before - self.ids.len()) as u64, Ordering::Relaxed);
    }

    /// The ids, no longer counted.
    fn take(mut self) -> Vec<u64> {
        self.count
            .fetch_sub(self.ids.len() as u64, Ordering::Relaxed);
        std::mem::take(&mut self.ids)
    }
}

impl<'a> BegunHere<'a> {
    fn new(core: &'a CoreHandle) -> Self {
        Self {
            with_connection: Kept::new(&core.clients.ending_with_connection),
            with_client: Kept::new(&core.clients.ending_with_client),
            core,
            prune_at: PRUNE_AT_LEAST,
        }
    }

    fn kept(&self) -> usize {
        self.with_connection.ids.len() + self.with_client.ids.len()
    }

    fn begun(&mut self, span: u64, ends_with_connection: bool) {
        if ends_with_connection {
            self.with_connection.push(span);
        } else {
            self.with_client.push(span);
        }
        if self.kept() >= self.prune_at {
            self.prune();
        }
    }

    /// Ended by its client (or not open any more, which the answer says):
    /// nothing left to end at the close.
    fn ended(&mut self, span: u64) {
        self.with_connection.forget(span);
        self.with_client.forget(span);
    }

    /// Forgets the spans no longer open (a span id is never reused, so one
    /// closed stays closed).
    fn prune(&mut self) {
        if let Ok(core) = self.core.lock() {
            self.with_connection.retain(|s| core.is_open(s));
            self.with_client.retain(|s| core.is_open(s));
        }
        self.prune_at = (2 * self.kept()).max(PRUNE_AT_LEAST);
    }

    /// The spans the daemon ends as the connection closes. The client's
    /// other spans go with its process: one killed in the middle of a call
    /// never ends that call's span, which would hold a place among
    /// `max_open_spans` and its threads' tracking for the daemon's life. A
    /// client alive that closed a connection (to open another, say) ends
    /// its spans itself.
    async fn left_at_close(self, peer_pid: Option<u32>) -> Vec<u64> {
        let mut ending = self.with_connection.take();
        let with_client = self.with_client.take();
        let client_gone = match peer_pid {
            // (0: a process in a PID namespace the daemon cannot see)
            Some(pid) if pid > 0 && !with_client.is_empty() => has_exited(pid).await,
            _ => false,
        };
        if client_gone {
            ending.extend(with_client);
        }
        ending
    }
}

/// Whether a client whose connection just closed has exited: a process
/// closes its files before it becomes a zombie, so the close can come a
/// moment before the exit shows in /proc.
async fn has_exited(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if crate::proctree::exited(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A span whose process ended: waits (up to [`SETTLE_WAIT`]) for its
/// source to settle (gVisor's exit point travels the monitor socket while
/// the caller's wait returns), holding the core only to look.
pub(super) async fn await_settled(core: &CoreHandle, span: u64) {
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        let arrived = match core.lock() {
            Ok(mut c) => c.settled(span),
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
pub(super) struct Peer {
    /// What it may reach: everything, or its own sandbox.
    pub(super) scope: Scope,
}

/// A confined client counted as connected while it is.
pub(super) struct SandboxedClient<'a>(Option<&'a ClientCounts>);

impl<'a> SandboxedClient<'a> {
    pub(super) fn count(counts: &'a ClientCounts, scope: &Scope) -> Self {
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
pub(super) struct Admitted {
    pub(super) pid: Option<u32>,
    pub(super) cgroup: Option<PathBuf>,
    /// A container of a sandbox with its own kernel (gVisor's).
    pub(super) within: Option<Within>,
    pub(super) sandbox: Option<SandboxView>,
}

pub(super) fn admit_begin(
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
                within: gvisor_container.map(Within::Container),
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
            let within = match gvisor_container {
                Some(c) if client.container.as_deref() == Some(c.as_str()) => Within::Container(c),
                Some(c) => {
                    return Err(crate::peer::forbidden(format!(
                        "gVisor container {c:?} is not this client's sandbox ({})",
                        sandbox.id
                    )));
                }
                None => Within::Behind {
                    container: client.container.clone(),
                    runsc: client.runsc,
                },
            };
            Ok(Admitted {
                pid,
                cgroup: None,
                within: Some(within),
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
                within: None,
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
pub(super) fn admit_pid(scope: &Scope, pid: u32) -> Result<u32, ErrorBody> {
    match scope {
        Scope::Sandbox(s) => s.to_daemon_pid(pid),
        Scope::Host => Ok(pid),
    }
}

pub(super) async fn respond(
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
        Request::BeginSpan(BeginSpan {
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
        }) => match admit_begin(&peer.scope, pid, cgroup, gvisor_container) {
            Err(e) => Err(e),
            Ok(admitted) => core
                .ask(|reply| Command::Begin {
                    // a container of a sandbox whose own kernel runs it:
                    // gVisor's points; else this kernel's
                    source: match admitted.within {
                        Some(_) => Source::Gvisor,
                        None => Source::Ebpf,
                    },
                    follow: Follow {
                        pid: admitted.pid,
                        tree,
                        seccomp,
                        memory_limited,
                        cgroup: admitted.cgroup,
                        within: admitted.within,
                    },
                    sandbox: admitted.sandbox,
                    session,
                    label,
                    server,
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
                await_settled(core, span_id).await;
            }
            match core
                .ask(|reply| Command::End {
                    span: span_id,
                    caller: peer.scope.sandbox_id().map(str::to_owned),
                    exit,
                    timed_out: timed_out_ms.map(Duration::from_millis),
                    is_error,
                    words: words.bounded(),
                    reply,
                })
                .await
            {
                // attributed off the core's lock, on a blocking thread
                Ok(closed) => tokio::task::spawn_blocking(move || closed.judge())
                    .await
                    .map(|a| json!({"attribution": a}))
                    .map_err(|e| ErrorBody::new(ErrorCode::Internal, e.to_string())),
                Err(e) => Err(e),
            }
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
                            spans_ending_with_connection: core
                                .clients
                                .ending_with_connection
                                .load(Ordering::Relaxed),
                            spans_ending_with_client: core
                                .clients
                                .ending_with_client
                                .load(Ordering::Relaxed),
                        };
                        json!({"status": seen_by(s, &peer.scope)})
                    })
                    .map_err(|_| {
                        ErrorBody::new(ErrorCode::Internal, "the probe daemon is shutting down")
                    }),
                Err(e) => Err(e),
            }
        }
        Request::Query(Query {
            session,
            failed,
            since_ms,
            span_id,
            limit,
        }) => {
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

/// Waits (up to 2 s) until every span queued for the store so far is
/// written (or failed).
pub(super) async fn stored_so_far(stats: &StoreStats) {
    let queued = stats.queued.load(Ordering::Acquire);
    let deadline = Instant::now() + Duration::from_secs(2);
    while stats.written.load(Ordering::Acquire) + stats.errors.load(Ordering::Acquire) < queued
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

pub(super) fn query(
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
