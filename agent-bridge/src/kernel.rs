//! The probe daemon as one MCP session sees it: one probe session, one span
//! per tool call. The bridge works without a daemon; every result then says
//! `{available: false, reason}`.

use std::path::PathBuf;
use std::sync::Mutex;

use probe::attribution::{ExitStatus, Words};
use std::os::fd::RawFd;

use probe::client::{AsyncClient, Client, PidRequest};
use probe::protocol::{BeginSpan, Query, Request};
use serde_json::{Value, json};

/// How long ending a span may take before the call reports the probe as
/// unavailable (a wedged daemon must not hang every tool call).
const END_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long each read or write on the blocking connection waits for the
/// daemon: a workload's own `begin_span`, which its launch waits for (a
/// lone launch holds the async thread, see `workload::Live`), an end after
/// a failed start, `kernel_evidence` queries and status. The daemon answers
/// these in milliseconds; a long answer only has to keep arriving.
const BLOCKING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Drops a kept connection the daemon closed (a daemon restarted since
/// the last call): found out before the call, which then goes to the new
/// daemon instead of failing on the old connection.
fn forget_if_closed(client: &mut Option<Client>) {
    if client
        .as_ref()
        .is_some_and(|c| closed_by_peer(c.socket_fd()))
    {
        *client = None;
    }
}

/// Whether the other end closed the connection (nothing read, no wait).
fn closed_by_peer(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let ready = unsafe { libc::poll(&mut p, 1, 0) };
    ready == 1 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// A blocking connection to the daemon, its requests bounded by
/// [`BLOCKING_TIMEOUT`].
fn connect_blocking(socket: &std::path::Path) -> Result<Client, probe::client::ClientError> {
    let mut client = Client::connect(socket)?;
    client.set_timeout(BLOCKING_TIMEOUT)?;
    Ok(client)
}

/// Why the daemon cannot be reached: on a kernel where no probe can run
/// (gVisor, no bpf(2), no tracing programs) the one sentence saying so,
/// which outlives every retry; else the connect error.
fn unreachable_reason(e: &probe::client::ClientError) -> String {
    static CANNOT_RUN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    CANNOT_RUN
        .get_or_init(probe::preflight::cannot_run)
        .clone()
        .unwrap_or_else(|| e.to_string())
}

pub struct Kernel {
    socket: Option<PathBuf>,
    session: String,
    /// For the workload's own `begin_span` (see `attach`), sent on a
    /// blocking thread.
    client: Mutex<Option<Client>>,
    /// For ending spans from the runtime without a hand-off to a blocking
    /// thread and back (two wake-ups on the reply path of every call).
    ender: tokio::sync::Mutex<Option<AsyncClient>>,
}

/// The MCP call a span runs for, as the daemon's OpenTelemetry export
/// names it: the tool, the MCP session (transports with sessions) and the
/// caller's W3C trace context from the request's `params._meta`.
#[derive(Debug, Clone, Default)]
pub struct CallTrace {
    pub tool: String,
    pub mcp_session: Option<String>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

tokio::task_local! {
    /// The tool call being served (set around the call by the server).
    pub static CALL: CallTrace;
}

impl CallTrace {
    /// The call this task serves, if any.
    pub fn current() -> Option<CallTrace> {
        CALL.try_with(Clone::clone).ok()
    }

    /// Adds `begin_span`'s OpenTelemetry fields to `request` (an empty
    /// `tool`: a call without a name, named by its label).
    fn add_to(&self, request: &mut BeginSpan) {
        request.tool = Some(self.tool.clone()).filter(|t| !t.is_empty());
        request.mcp_method = Some("tools/call".into());
        request.mcp_session = self.mcp_session.clone();
        request.traceparent = self.traceparent.clone();
        request.tracestate = self.tracestate.clone();
    }
}

/// A span that is open for one call, or why there is none.
#[derive(Debug, Clone)]
pub enum Span {
    Open(u64),
    Unavailable(String),
}

impl Kernel {
    /// `socket` None: the probe is switched off (`--no-probe`).
    pub fn new(socket: Option<PathBuf>, session: String) -> Kernel {
        Kernel {
            socket,
            session,
            client: Mutex::new(None),
            ender: tokio::sync::Mutex::new(None),
        }
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    /// Runs `f` on a connected client, connecting (again) when needed, so a
    /// daemon started after the bridge is picked up on the next call.
    fn with_client<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, probe::client::ClientError>,
    ) -> Result<T, String> {
        let Some(socket) = &self.socket else {
            return Err("the probe is switched off (--no-probe)".into());
        };
        let mut guard = self.client.lock().unwrap_or_else(|p| p.into_inner());
        forget_if_closed(&mut guard);
        if guard.is_none() {
            *guard = Some(connect_blocking(socket).map_err(|e| unreachable_reason(&e))?);
        }
        let client = guard.as_mut().expect("just connected");
        let result = f(client);
        if let Err(e) = &result
            && e.code().is_none()
        {
            *guard = None; // the connection broke: reconnect next time
        }
        result.map_err(|e| e.to_string())
    }

    /// Blocking. Runs `spawn` holding the daemon connection, for a child
    /// that opens its own span (see `attach`): `spawn` gets the socket and
    /// the `begin_span` request for the child to complete with its pid (None
    /// when the probe is off or unreachable), and returns the answer line
    /// the child read, if it read one. `call`: the MCP call it runs for.
    /// `memory_limited`: the child joins a memory cgroup with a limit,
    /// which the daemon then notes while the child lives.
    pub fn begin_in_child<T>(
        &self,
        label: &str,
        call: Option<&CallTrace>,
        memory_limited: bool,
        spawn: impl FnOnce(Option<(RawFd, PidRequest)>) -> (T, Option<Vec<u8>>),
    ) -> (T, Span) {
        let Some(socket) = &self.socket else {
            let (spawned, _) = spawn(None);
            return (
                spawned,
                Span::Unavailable("the probe is switched off (--no-probe)".into()),
            );
        };
        let mut guard = self.client.lock().unwrap_or_else(|p| p.into_inner());
        forget_if_closed(&mut guard);
        if guard.is_none() {
            match connect_blocking(socket) {
                Ok(c) => *guard = Some(c),
                Err(e) => return (spawn(None).0, Span::Unavailable(unreachable_reason(&e))),
            }
        }
        let client = guard.as_mut().expect("just connected");
        let mut request = self.begin_request(label);
        if let Some(call) = call {
            call.add_to(&mut request);
        }
        request.memory_limited = memory_limited;
        // the child's seccomp mode when it attaches is this thread's (the
        // profile's filter comes after): said here, the daemon need not
        // read it from the child's /proc status
        // SAFETY: prctl(2) PR_GET_SECCOMP reads the calling thread's mode.
        let seccomp = unsafe { libc::prctl(libc::PR_GET_SECCOMP) };
        request.seccomp = u32::try_from(seccomp).ok();
        let request = client.pid_request(request);
        let id = request.id;
        let (spawned, answer) = spawn(Some((client.socket_fd(), request)));
        let span = match answer.map(|line| client.pid_answer(id, &line)) {
            Some(Ok(r)) => match r["span_id"].as_u64() {
                Some(id) => Span::Open(id),
                None => Span::Unavailable(format!("the probe daemon answered nonsense: {r}")),
            },
            Some(Err(e)) => {
                if e.code().is_none() {
                    *guard = None; // the connection broke: reconnect next time
                }
                Span::Unavailable(e.to_string())
            }
            None => {
                // the child never read a whole answer: whatever it left
                // on the connection must not answer the next request
                *guard = None;
                Span::Unavailable(format!(
                    "the probe daemon did not answer the workload's begin_span within {} s \
                     (or the workload ended before it answered)",
                    BLOCKING_TIMEOUT.as_secs()
                ))
            }
        };
        (spawned, span)
    }

    /// Blocking. Ends the span and returns the attribution object (or why
    /// there is none).
    pub fn end_blocking(
        &self,
        span: &Span,
        exit: Option<&ExitStatus>,
        timed_out_ms: Option<u64>,
    ) -> Value {
        match span {
            Span::Open(id) => {
                attribution_value(self.with_client(|c| c.end_span(*id, exit, timed_out_ms)))
            }
            Span::Unavailable(reason) => unavailable(reason),
        }
    }

    /// Ends the span and returns the attribution object (or why there is
    /// none), on the runtime. `is_error`: the tool's result will be an
    /// error (`isError`), for the OpenTelemetry export.
    pub async fn end(
        &self,
        span: &Span,
        exit: Option<&ExitStatus>,
        timed_out_ms: Option<u64>,
        is_error: bool,
    ) -> Value {
        self.end_with_words(span, exit, timed_out_ms, is_error, &Words::default())
            .await
    }

    /// [`Kernel::end`] with the workload's words (its command and output,
    /// or a tool call's arguments and result): the witnesses that let the
    /// probe name a failed lookup as the cause.
    pub async fn end_with_words(
        &self,
        span: &Span,
        exit: Option<&ExitStatus>,
        timed_out_ms: Option<u64>,
        is_error: bool,
        words: &Words,
    ) -> Value {
        let Span::Open(id) = span else {
            return self.end_blocking(span, exit, timed_out_ms); // nothing to ask
        };
        let request = Request::EndSpan {
            span_id: *id,
            exit: exit.cloned(),
            timed_out_ms,
            is_error,
            words: words.clone(),
        };
        let answer = self.ask(request).await.and_then(|mut r| {
            serde_json::from_value(r["attribution"].take())
                .map_err(|e| format!("the probe daemon answered nonsense: attribution: {e}"))
        });
        attribution_value(answer)
    }

    /// On the runtime: opens a span with a running process tree attached
    /// (every thread of `pid` and of its descendants, in one round trip);
    /// with `cgroup`, the tree's own cgroup v2 directory, the span follows
    /// that instead (the same processes, without walking /proc).
    pub async fn begin_tree(
        &self,
        label: &str,
        pid: u32,
        cgroup: Option<&std::path::Path>,
        call: Option<&CallTrace>,
    ) -> Span {
        let mut request = self.server_request(label, pid, cgroup);
        if let Some(call) = call {
            call.add_to(&mut request);
        }
        self.open(request).await
    }

    /// A span over a server's (or a browser's) tree while no call is in
    /// flight, so what dies meanwhile is not lost; the daemon ends it if
    /// this connection goes first (a keeper killed between calls).
    pub async fn begin_between(&self, pid: u32, cgroup: Option<&std::path::Path>) -> Span {
        let request = BeginSpan {
            ends_with_connection: true,
            ..self.server_request("between calls", pid, cgroup)
        };
        self.open(request).await
    }

    /// Ends a span of [`Kernel::begin_between`]: its attribution when the
    /// kernel names a cause in it (a death between calls, for the next
    /// call's `before_call`), `None` when nothing died, and why not when
    /// the span cannot be read (which is not "nothing died").
    async fn end_between_or_why(&self, span: &Span) -> Result<Option<Value>, String> {
        let v = self.end(span, None, None, false).await;
        if v["available"] != Value::Bool(true) {
            return Err(v["reason"].as_str().unwrap_or_default().to_string());
        }
        // a span without an exit of its own is "failed" on nothing otherwise
        let named = |c: &Value| c["primitive"].as_str().is_some_and(|p| p != "none");
        let died = (v["failed"] == Value::Bool(true) && named(&v)) || named(&v["hidden_failure"]);
        Ok(died.then_some(v))
    }

    /// Ends a span of [`Kernel::begin_between`] for the next call: what
    /// died meanwhile, or why the span cannot be read (which is not
    /// "nothing died"); None when nothing died.
    pub async fn end_between(&self, span: &Span) -> Option<Value> {
        match self.end_between_or_why(span).await {
            Ok(died) => died,
            Err(why) => Some(unavailable(&why)),
        }
    }

    /// A `begin_span` of this bridge's session.
    fn begin_request(&self, label: &str) -> BeginSpan {
        BeginSpan {
            session: Some(self.session.clone()),
            label: label.to_owned(),
            ..BeginSpan::default()
        }
    }

    /// A `begin_span` over a running server's tree: with `cgroup`, the
    /// server's own cgroup, whose threads are one file away, where the tree
    /// is a walk of /proc (twice) and a status read a thread.
    fn server_request(&self, label: &str, pid: u32, cgroup: Option<&std::path::Path>) -> BeginSpan {
        BeginSpan {
            pid: Some(pid),
            tree: cgroup.is_none(),
            server: cgroup.is_some(),
            cgroup: cgroup.map(std::path::Path::to_path_buf),
            ..self.begin_request(label)
        }
    }

    async fn open(&self, request: BeginSpan) -> Span {
        match self.ask(Request::BeginSpan(request)).await {
            Ok(r) => match r["span_id"].as_u64() {
                Some(id) => Span::Open(id),
                None => Span::Unavailable(format!("the probe daemon answered nonsense: {r}")),
            },
            Err(reason) => Span::Unavailable(reason),
        }
    }

    /// One request on the runtime's connection (connecting, or connecting
    /// again to a daemon that restarted), within [`END_TIMEOUT`].
    async fn ask(&self, request: Request) -> Result<Value, String> {
        let Some(socket) = &self.socket else {
            return Err("the probe is switched off (--no-probe)".into());
        };
        let asked = tokio::time::timeout(END_TIMEOUT, async {
            let mut guard = self.ender.lock().await;
            // taken out for the call: if this future is dropped halfway, the
            // connection (maybe holding half an answer) goes with it
            let cached = guard.take();
            let reused = cached.is_some();
            let mut client = match cached {
                Some(c) => c,
                None => AsyncClient::connect(socket).await?,
            };
            // an error without a code is the connection's, not the daemon's answer
            let broken = |r: &Result<_, probe::client::ClientError>| {
                r.as_ref().is_err_and(|e| e.code().is_none())
            };
            let mut result = client.send(&request).await;
            if reused && broken(&result) {
                // a connection to a daemon that has since restarted (the span
                // was begun on the other connection, which reconnected)
                client = AsyncClient::connect(socket).await?;
                result = client.send(&request).await;
            }
            if !broken(&result) {
                *guard = Some(client); // broken connections are not kept
            }
            result
        })
        .await;
        match asked {
            Ok(r) => r.map_err(|e| match e.code() {
                Some(_) => e.to_string(),
                None => unreachable_reason(&e),
            }),
            Err(_) => Err(format!(
                "the probe daemon did not answer within {} s",
                END_TIMEOUT.as_secs()
            )),
        }
    }

    /// Blocking. The `kernel_evidence` tool: one span in full, or a
    /// session's spans (this session's by default).
    pub fn evidence(&self, span: Option<u64>, session: Option<&str>) -> Value {
        let query = Request::Query(Query {
            session: span
                .is_none()
                .then(|| session.unwrap_or(&self.session).to_owned()),
            span_id: span,
            limit: span.is_none().then_some(200),
            ..Query::default()
        });
        match self.with_client(|c| c.send(&query)) {
            Ok(mut r) => {
                let mut v = json!({"available": true, "session": session.unwrap_or(&self.session)});
                for key in ["span", "spans"] {
                    if let Some(x) = r.get_mut(key) {
                        v[key] = x.take();
                    }
                }
                v
            }
            Err(reason) => unavailable(&reason),
        }
    }

    /// Blocking. The daemon's status, for server info and diagnostics.
    pub fn status(&self) -> Result<Value, String> {
        self.with_client(|c| c.status())
    }
}

/// `kernel: PRIMITIVE — EXPLANATION` for a span that failed, for the
/// human-readable part of a result.
pub fn summary_line(kernel: &Value) -> Option<String> {
    (kernel["failed"] == Value::Bool(true)).then(|| {
        format!(
            "kernel: {} — {}",
            kernel["primitive"].as_str().unwrap_or("?"),
            kernel["explanation"].as_str().unwrap_or("")
        )
    })
}

fn attribution_value(a: Result<probe::attribution::Attribution, String>) -> Value {
    match a {
        Ok(a) => {
            let mut v = serde_json::to_value(a).unwrap_or(Value::Null);
            v["available"] = Value::Bool(true);
            v
        }
        Err(reason) => unavailable(&reason),
    }
}

pub fn unavailable(reason: &str) -> Value {
    json!({"available": false, "reason": reason})
}

/// Puts what [`Kernel::end_between`] found into the next call's evidence
/// as `before_call`; an unreadable span between calls is said, unless the
/// call's own evidence says already that the daemon cannot be read.
pub fn attach_before_call(evidence: &mut Value, before: Option<Value>) {
    if let Some(before) = before
        && (before["available"] == true || evidence["available"] == true)
    {
        evidence["before_call"] = before;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_call_is_attached_unless_both_sides_are_unreadable() {
        let read = json!({"available": true, "primitive": "fs.missing"});
        let died = json!({"available": true, "primitive": "mem.oom"});
        let unreadable = unavailable("the probe daemon is gone");
        let attached = |call: &Value, before: Option<Value>| {
            let mut v = call.clone();
            attach_before_call(&mut v, before);
            v.get("before_call").cloned()
        };
        assert_eq!(attached(&read, Some(died.clone())), Some(died.clone()));
        assert_eq!(attached(&read, None), None);
        // the call read fine, the span before it did not: said
        assert_eq!(
            attached(&read, Some(unreadable.clone())),
            Some(unreadable.clone())
        );
        // neither could be read: the call's own evidence says so already
        assert_eq!(attached(&unreadable, Some(unreadable.clone())), None);
        assert_eq!(attached(&unreadable, Some(died.clone())), Some(died));
    }
}
