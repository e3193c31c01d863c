//! `agent-bridge proxy`: any stdio MCP server, with kernel evidence on
//! every `tools/call`.
//!
//! A [`Relay`] owns one foreign server (a child process, run under the
//! profile) and relays JSON-RPC messages between it and one client, as raw
//! lines: nothing is re-typed, so unknown fields survive. For each
//! `tools/call` it opens a probe span over the server's whole process tree
//! (every thread, every descendant) before forwarding the request, and ends
//! it when the answer comes back; the answer gains
//! `result._meta["probe/kernel"]`, spliced into the line ([`frame`]).
//! A server that dies, hangs or breaks the protocol fails the requests in
//! flight with a JSON-RPC error that says what happened, and is started
//! again (the client's `initialize` replayed) for the next request.

pub mod frame;
pub mod http;
mod lines;

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use probe::attribution::{ExitStatus, Words};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::{mpsc, oneshot};

use crate::cgroup::{CallCgroups, Limits};
use crate::kernel::{Kernel, Span};
use crate::profile::Profile;
use crate::sandbox::Plan;
use frame::{ChildHead, ClientHead, Kind};

/// JSON-RPC error code of answers the proxy makes for a foreign server
/// that failed (the implementation-defined server error range).
pub const SERVER_FAILED: i32 = -32000;

/// Ids of the requests the proxy sends itself (replayed `initialize`).
const OWN_ID_PREFIX: &str = "agent-bridge-proxy:";

/// The tool the proxy answers itself (as `serve` does): the environment
/// snapshot, taken as the server's workloads would.
pub const ENVIRONMENT_TOOL: &str = "sandbox_environment";

/// How long a snapshot may take before it is stopped.
const SNAPSHOT_DEADLINE: Duration = Duration::from_secs(60);

/// Bytes of the server's stderr kept for error messages.
const STDERR_TAIL: usize = 2048;

/// How the proxy runs foreign servers.
pub struct Options {
    pub argv: Vec<OsString>,
    pub profile: Profile,
    /// None: no kernel evidence (`{available: false}`).
    pub probe_socket: Option<PathBuf>,
    pub max_message: usize,
    pub init_timeout: Duration,
    pub call_timeout: Duration,
    /// Where session disks of `disk_limit` profiles are mounted.
    pub run_dir: PathBuf,
}

/// Delivers one answer to the client that asked.
pub type Deliver = Box<dyn FnOnce(Vec<Bytes>) + Send>;

/// Where the server's own requests and notifications go.
pub trait ClientSink: Send + Sync + 'static {
    /// `related`: the client request a progress notification belongs to,
    /// or the one a late answer (a `Response`) answers.
    /// False when the message cannot reach the client (then a server
    /// request is answered with an error).
    fn server_message(&self, line: Bytes, head: &ChildHead, related: Option<&str>) -> bool;
}

struct Pending {
    method: String,
    deliver: Deliver,
    /// tools/call only: the span, and when it began.
    call: Option<Call>,
    generation: u64,
    progress: Option<String>,
    /// When it was sent to the server, in the order of requests sent.
    sent: u64,
    /// A strict JSON parser refuses its line (a number beyond f64, a lone
    /// surrogate, nesting deeper than 128), or its id is a number no i64
    /// holds (rmcp's servers refuse it): a server may answer `id: null`.
    unreadable: bool,
    /// Its `--call-timeout` timer, stopped when the request is answered.
    timer: Option<Timer>,
}

/// A request's timeout task, aborted when dropped with its request: an
/// answered request's timer neither sleeps on for the rest of the timeout
/// nor fires on a later request that reuses the id.
struct Timer(tokio::task::AbortHandle);

impl Drop for Timer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Call {
    span: Span,
    /// None: a call without a name (its span is `tools/call ?`).
    tool: Option<String>,
    server_pid: u32,
    started: Instant,
    /// Other calls in flight at some time during this one.
    overlapping: usize,
    /// What died in the server's tree since its last call was answered
    /// (a tab the OOM killer took while nobody asked): the attribution of
    /// the span between the calls, when it holds a failure. Ended beside
    /// the call, off its path; read with its evidence.
    before: Mutex<Option<tokio::task::JoinHandle<Option<Value>>>>,
    /// The request as the client sent it (its arguments): what the server
    /// was asked, a witness for the attribution.
    asked: String,
}

/// A call the client no longer waits for an answer to from the server:
/// cancelled, or answered by the proxy first (at `--call-timeout`, or with
/// a server's `id: null` error). A late answer still carries its evidence.
struct Ended {
    id: String,
    generation: u64,
    /// What the late answer's evidence says: `cancelled` or `late`.
    outcome: &'static str,
    evidence: Evidence,
}

enum Evidence {
    /// Being read from the daemon (a cancelled call's span ends at once).
    Coming(tokio::task::JoinHandle<Value>),
    Known(Value),
}

/// How many ended calls are kept for a late answer.
const ENDED: usize = 64;

/// A running foreign server.
struct Child {
    pid: u32,
    generation: u64,
    /// `None` once closed (the proxy's shutdown: the server's cue to exit).
    stdin: tokio::sync::Mutex<Option<tokio::process::ChildStdin>>,
    tree: Arc<CallCgroups>,
    stderr_tail: Arc<Mutex<VecDeque<u8>>>,
    /// Fires when the server's stderr ends (its tail is then complete).
    stderr_done: Mutex<Option<oneshot::Receiver<()>>>,
    alive: AtomicBool,
    /// Why the proxy killed it (a protocol violation, a hung call).
    killed_because: Mutex<Option<String>>,
}

impl Child {
    fn kill(&self, because: String) {
        self.killed_because
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(because);
        // from now on the next request starts a new server: it must not be
        // sent to this one while its end is still being reported
        self.alive.store(false, Ordering::Release);
        crate::workload::Running::signal_tree(&self.tree, self.pid);
    }

    fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
        let bytes: Vec<u8> = tail.iter().copied().collect();
        String::from_utf8_lossy(&bytes).trim().to_string()
    }
}

#[derive(Default)]
struct State {
    child: Option<Arc<Child>>,
    /// The client's `initialize` and `notifications/initialized`, replayed
    /// to a restarted server.
    initialize: Option<Vec<u8>>,
    initialized: Option<Vec<u8>>,
    generation: u64,
}

/// One client's relay to one foreign server.
pub struct Relay {
    opts: Arc<Options>,
    plan: Arc<Plan>,
    kernel: Arc<Kernel>,
    sink: Arc<dyn ClientSink>,
    state: tokio::sync::Mutex<State>,
    pending: Mutex<HashMap<String, Pending>>,
    own_ids: AtomicU64,
    /// Requests sent to servers so far (orders [`Pending::sent`]).
    sent: AtomicU64,
    /// The span over the server's tree while no call is in flight, and the
    /// server it watches: deaths between calls belong to the next call.
    between: tokio::sync::Mutex<Option<(Span, u64)>>,
    /// Ended calls, oldest first, at most [`ENDED`].
    ended: Mutex<VecDeque<Ended>>,
    name: String,
    _disks: Vec<crate::session::SessionDisk>,
}

static RELAYS: AtomicU64 = AtomicU64::new(0);

fn failure(id: &str, message: String, data: Value) -> Vec<Bytes> {
    let mut v = crate::stdio::error_answer(Value::Null, SERVER_FAILED, message);
    v["error"]["data"] = data;
    vec![Bytes::from(frame::with_raw_id(v, id))]
}

impl Relay {
    pub fn new(opts: Arc<Options>, sink: Arc<dyn ClientSink>) -> std::io::Result<Arc<Relay>> {
        let n = RELAYS.fetch_add(1, Ordering::Relaxed);
        // `mcp-PID-…`: cgroups left by a proxy that died are swept like the bridge's
        let name = format!("mcp-{}-proxy-{n}", std::process::id());
        let disks = crate::session::session_disks(&opts.profile, &opts.run_dir, &name)?;
        let paths: Vec<PathBuf> = disks.iter().map(|d| d.path().to_path_buf()).collect();
        let plan = Arc::new(Plan::new(&opts.profile, &paths)?);
        Ok(Arc::new(Relay {
            kernel: Arc::new(Kernel::new(opts.probe_socket.clone(), name.clone())),
            opts,
            plan,
            sink,
            state: tokio::sync::Mutex::new(State::default()),
            pending: Mutex::new(HashMap::new()),
            own_ids: AtomicU64::new(1),
            sent: AtomicU64::new(0),
            between: tokio::sync::Mutex::new(None),
            ended: Mutex::new(VecDeque::new()),
            name,
            _disks: disks,
        }))
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Handles one message from the client (`line`, read as `head`);
    /// `deliver` gets the answer of a request.
    pub async fn on_client_message(
        self: &Arc<Self>,
        line: Vec<u8>,
        head: ClientHead,
        deliver: Deliver,
    ) {
        match head.kind {
            Kind::Request => self.request(line, head, deliver).await,
            Kind::Notification | Kind::Response => {
                if let Some(id) = &head.cancelled {
                    self.cancelled(id);
                }
                let child = {
                    let mut st = self.state.lock().await;
                    if head.method.as_deref() == Some("notifications/initialized") {
                        st.initialized = Some(line.clone());
                    }
                    st.child.clone().filter(|c| c.alive.load(Ordering::Acquire))
                };
                // nothing to tell a server that is gone (the next request restarts it)
                if let Some(child) = child {
                    let _ = write_line(&child, &line).await;
                }
            }
        }
    }

    async fn request(self: &Arc<Self>, line: Vec<u8>, head: ClientHead, deliver: Deliver) {
        let id = head.id.clone().expect("requests have ids");
        let method = head.method.clone().unwrap_or_default();
        if self.pending().contains_key(&id) {
            // JSON-RPC ids are unique among a session's unanswered
            // requests: the second is refused, the first runs on (as serve
            // does); it never reaches the server
            let mut answer = crate::stdio::error_answer(
                Value::Null,
                -32600,
                format!(
                    "Invalid Request: request id {id} is still in flight (ids must be unique \
                     among a session's unanswered requests); this request was not run"
                ),
            );
            answer["error"]["data"] = json!({frame::META_KEY: no_span(&method, "it was not run")});
            return deliver(vec![Bytes::from(frame::with_raw_id(answer, &id))]);
        }
        if method == "tools/call" && head.tool.as_deref() == Some(ENVIRONMENT_TOOL) {
            let answer = self.environment(&line).await;
            return deliver(vec![Bytes::from(frame::with_raw_id(answer, &id))]);
        }
        let child = match self.child_for(&method, &line).await {
            Ok(c) => c,
            Err((message, data)) => {
                let data = with_evidence(data, no_span(&method, "it reached no server"));
                return deliver(failure(&id, message, data));
            }
        };
        // held until the call is pending: no span between calls begins
        // meanwhile (it would take the server's threads from this call's)
        let mut between = self.between.lock().await;
        // every call has a span, a call without a name too: its answer
        // carries evidence like any other
        let call = if method == "tools/call" {
            let tool = head.tool.clone();
            let span = self
                .kernel
                .begin_tree(
                    &format!("tools/call {}", tool.as_deref().unwrap_or("?")),
                    child.pid,
                    child.tree.v2_dir(),
                    Some(&crate::kernel::CallTrace {
                        tool: tool.clone().unwrap_or_default(),
                        mcp_session: None,
                        traceparent: head.traceparent.clone(),
                        tracestate: head.tracestate.clone(),
                    }),
                )
                .await;
            // ended after the call's span began: the server's threads
            // are the call's now, and ending it leaves them so
            let before = between.take().map(|(span, watched)| {
                let (kernel, generation) = (self.kernel.clone(), child.generation);
                tokio::spawn(async move {
                    let died = kernel.end_between(&span).await;
                    died.filter(|_| watched == generation)
                })
            });
            Some(Call {
                span,
                tool,
                server_pid: child.pid,
                started: Instant::now(),
                overlapping: 0,
                before: Mutex::new(before),
                asked: String::from_utf8_lossy(&line[..line.len().min(Words::MAX)]).into_owned(),
            })
        } else {
            None
        };
        // numbered under the lock of `pending`: the order requests enter it
        let sent;
        {
            // a late answer to an ended call of this id could not be told
            // from this request's answer
            self.ended().retain(|e| e.id != id);
            let mut pending = self.pending();
            let mut call = call;
            sent = self.sent.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = &mut call {
                for other in pending.values_mut().filter_map(|p| p.call.as_mut()) {
                    other.overlapping += 1;
                    c.overlapping += 1;
                }
            }
            if let Some(old) = pending.insert(
                id.clone(),
                Pending {
                    method: method.clone(),
                    deliver,
                    call,
                    generation: child.generation,
                    progress: head.progress_token.clone(),
                    sent,
                    unreadable: id.parse::<i64>().is_err() && !id.starts_with('"')
                        || strictly_unreadable(&line),
                    timer: None,
                },
            ) {
                // two requests under one id that arrived together (the
                // check above let both by): the first asker is answered
                // now, and its call's span ends with what it saw
                let (relay, id) = (self.clone(), id.clone());
                tokio::spawn(async move {
                    let kernel = match &old.call {
                        Some(c) => relay.evidence(c, None, None, "cancelled", None).await,
                        None => no_span(&old.method, "its id was reused"),
                    };
                    let message = format!(
                        "request id {id} was reused by a later request while this one was in flight"
                    );
                    (old.deliver)(failure(&id, message, with_evidence(json!({}), kernel)));
                });
            }
        }
        drop(between);
        let timeout = if method == "initialize" {
            self.opts.init_timeout
        } else {
            self.opts.call_timeout
        };
        self.watch(id, sent, child.clone(), timeout);
        // a write to a dead server fails the request through the reader's end of file
        let _ = write_line(&child, &line).await;
    }

    /// The server to send `method` to: the running one, or a new one (the
    /// client's initialize replayed to it first, unless this is it).
    async fn child_for(
        self: &Arc<Self>,
        method: &str,
        line: &[u8],
    ) -> Result<Arc<Child>, (String, Value)> {
        let mut st = self.state.lock().await;
        if method == "initialize" {
            st.initialize = Some(line.to_vec());
            st.initialized = None;
        }
        if let Some(c) = &st.child
            && c.alive.load(Ordering::Acquire)
        {
            return Ok(c.clone());
        }
        let restart = st.generation > 0;
        st.generation += 1;
        let child = self.spawn(st.generation).await.map_err(|e| {
            (
                format!("agent-bridge proxy: cannot start the foreign server: {e}"),
                json!({"proxy": {"reason": "spawn_failed"}}),
            )
        })?;
        st.child = Some(child.clone());
        if restart {
            tracing::warn!("foreign server restarted (pid {})", child.pid);
        }
        if method != "initialize"
            && let Some(init) = st.initialize.clone()
        {
            self.replay(&child, &init, st.initialized.clone())
                .await
                .map_err(|e| (e, json!({"proxy": {"reason": "replay_failed"}})))?;
        }
        Ok(child)
    }

    /// Sends the client's initialize (under an id of the proxy's own; the
    /// answer is swallowed) and initialized notification to a new server.
    async fn replay(
        self: &Arc<Self>,
        child: &Arc<Child>,
        init: &[u8],
        initialized: Option<Vec<u8>>,
    ) -> Result<(), String> {
        let own = format!(
            "\"{OWN_ID_PREFIX}replay-{}\"",
            self.own_ids.fetch_add(1, Ordering::Relaxed)
        );
        let mut msg: Value = serde_json::from_slice(init).map_err(|e| e.to_string())?;
        msg["id"] = serde_json::from_str(&own).map_err(|e| e.to_string())?;
        let (tx, rx) = oneshot::channel::<Vec<Bytes>>();
        let sent = self.sent.fetch_add(1, Ordering::Relaxed);
        self.pending().insert(
            own.clone(),
            Pending {
                method: "initialize".into(),
                deliver: Box::new(move |b| {
                    let _ = tx.send(b);
                }),
                call: None,
                generation: child.generation,
                progress: None,
                sent,
                unreadable: false,
                timer: None,
            },
        );
        self.watch(own, sent, child.clone(), self.opts.init_timeout);
        let _ = write_line(child, &serde_json::to_vec(&msg).unwrap_or_default()).await;
        let answer = rx.await.unwrap_or_default().concat();
        let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        if let Some(err) = answer.get("error") {
            return Err(format!(
                "agent-bridge proxy: the foreign server was restarted, and did not accept the replayed initialize: {}",
                err["message"].as_str().unwrap_or("?")
            ));
        }
        if let Some(n) = initialized {
            let _ = write_line(child, &n).await;
        }
        Ok(())
    }

    /// Fails request `id` (the `sent`th request) if the server has not
    /// answered within `timeout`, and kills the server (it is hung; the
    /// next request starts it again). The timer stops with the request.
    fn watch(self: &Arc<Self>, id: String, sent: u64, child: Arc<Child>, timeout: Duration) {
        let relay = Arc::downgrade(self);
        // weak too: a session that ends meanwhile frees its server's cgroup
        // (a directory and two open files) now, not when the timer fires;
        // held strongly, every session of the last --call-timeout (600 s)
        // kept its own
        let child = Arc::downgrade(&child);
        let task_id = id.clone();
        let task = tokio::spawn(async move {
            let id = task_id;
            tokio::time::sleep(timeout).await;
            let (Some(relay), Some(child)) = (relay.upgrade(), child.upgrade()) else {
                return;
            };
            let taken = {
                let mut pending = relay.pending();
                match pending.get(&id) {
                    Some(p) if p.sent == sent && p.generation == child.generation => {
                        pending.remove(&id)
                    }
                    _ => None,
                }
            };
            let Some(p) = taken else { return };
            let flag = if p.method == "initialize" {
                "--init-timeout"
            } else {
                "--call-timeout"
            };
            let what = format!(
                "the foreign server did not answer `{}` within {} s ({flag})",
                p.method,
                timeout.as_secs_f64()
            );
            child.kill(format!("it was killed after {what}"));
            let kernel = match &p.call {
                Some(c) => {
                    let tail = child.stderr_tail();
                    let ms = timeout.as_millis() as u64;
                    let k = relay
                        .evidence(c, None, Some(ms), "timeout", Some(tail.as_bytes()))
                        .await;
                    // its answer may be on its way still
                    relay.ended_call(&id, p.generation, "late", Evidence::Known(k.clone()));
                    k
                }
                None => no_span(&p.method, "the proxy opens spans for tools/call"),
            };
            let message = format!(
                "agent-bridge proxy: {what}; it was killed and starts again for the next request{}",
                tail_note(&child.stderr_tail())
            );
            let data = with_evidence(
                json!({"proxy": {"reason": "timeout", "stderr_tail": child.stderr_tail()}}),
                kernel,
            );
            (p.deliver)(failure(&id, message, data));
        });
        // answered already: the timer stops now
        match self.pending().get_mut(&id) {
            Some(p) if p.sent == sent => p.timer = Some(Timer(task.abort_handle())),
            _ => task.abort(),
        }
    }

    /// The client gave up on request `id`: its span ends now, and a late
    /// answer carries what it saw until then.
    fn cancelled(self: &Arc<Self>, id: &str) {
        let Some(p) = self.pending().remove(id) else {
            return;
        };
        if let Some(call) = p.call {
            let relay = self.clone();
            let ending = async move { relay.evidence(&call, None, None, "cancelled", None).await };
            let evidence = Evidence::Coming(tokio::spawn(ending));
            self.ended_call(id, p.generation, "cancelled", evidence);
        }
    }

    fn ended(&self) -> std::sync::MutexGuard<'_, VecDeque<Ended>> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the evidence of call `id` for an answer the server may still send.
    fn ended_call(&self, id: &str, generation: u64, outcome: &'static str, evidence: Evidence) {
        let mut ended = self.ended();
        if ended.len() == ENDED {
            ended.pop_front();
        }
        ended.push_back(Ended {
            id: id.to_string(),
            generation,
            outcome,
            evidence,
        });
    }

    /// The evidence for a late answer to ended call `id` of server
    /// `generation`, if it was one.
    async fn late_evidence(&self, id: &str, generation: u64) -> Option<Value> {
        let ended = {
            let mut ended = self.ended();
            let at = ended
                .iter()
                .position(|e| e.id == id && e.generation == generation)?;
            ended.remove(at)?
        };
        let mut v = match ended.evidence {
            Evidence::Coming(task) => task
                .await
                .unwrap_or_else(|e| crate::kernel::unavailable(&e.to_string())),
            Evidence::Known(v) => v,
        };
        v["outcome"] = ended.outcome.into();
        Some(v)
    }

    /// Once no call is in flight: a span over the server's tree until the
    /// next call, so what dies meanwhile is not lost.
    async fn begin_between(&self, child: &Child) {
        let mut between = self.between.lock().await;
        if between.is_some() || self.pending().values().any(|p| p.call.is_some()) {
            return;
        }
        let span = self
            .kernel
            .begin_between(child.pid, child.tree.v2_dir())
            .await;
        *between = Some((span, child.generation));
    }

    /// The call's attribution, with what the proxy knows beside it.
    async fn evidence(
        &self,
        call: &Call,
        exit: Option<&ExitStatus>,
        timed_out_ms: Option<u64>,
        outcome: &str,
        said: Option<&[u8]>,
    ) -> Value {
        let words = Words::new(Some(call.asked.clone()), said);
        // anything but a plain result is a tool error for the trace
        let mut v = self
            .kernel
            .end_with_words(&call.span, exit, timed_out_ms, outcome != "ok", &words)
            .await;
        v["overlapping_calls"] = call.overlapping.into();
        let before = call.before.lock().unwrap_or_else(|p| p.into_inner()).take();
        let died = match before {
            Some(task) => task.await.ok().flatten(),
            None => None,
        };
        crate::kernel::attach_before_call(&mut v, died);
        v["outcome"] = outcome.into();
        v["server_pid"] = call.server_pid.into();
        v["tool"] = call.tool.clone().into();
        if timed_out_ms.is_none() && v.get("duration_ms").is_none() {
            v["duration_ms"] = (call.started.elapsed().as_secs_f64() * 1e3).into();
        }
        v
    }

    /// `sandbox_environment`, answered by the proxy: the snapshot taken by
    /// the bridge's worker started as a server is (the profile, the same
    /// limits, environment and working directory), so it sees what the
    /// server's workloads see.
    async fn environment(self: &Arc<Self>, line: &[u8]) -> Value {
        let names: Vec<String> = serde_json::from_slice::<Value>(line)
            .ok()
            .and_then(|v| v.pointer("/params/arguments/commands").cloned())
            .and_then(|c| serde_json::from_value(c).ok())
            .unwrap_or_default();
        let result = match names
            .iter()
            .try_for_each(|n| contract::tools::command_name(n))
        {
            Err(why) => Err(format!("commands: {why}")),
            Ok(()) if names.len() > contract::tools::MAX_COMMAND_NAMES => Err(format!(
                "commands: at most {} names",
                contract::tools::MAX_COMMAND_NAMES
            )),
            Ok(()) => self.snapshot(names).await,
        };
        let (text, structured, is_error) = match result {
            Ok(snapshot) => (
                format!(
                    "environment: {} facets in {} ms (structuredContent.snapshot)",
                    snapshot["facets"].as_object().map_or(0, |f| f.len()),
                    snapshot["took_ms"]
                ),
                json!({"snapshot": snapshot}),
                false,
            ),
            Err(why) => (format!("sandbox_environment: {why}"), json!({}), true),
        };
        json!({"jsonrpc": "2.0", "result": {
            "content": [{"type": "text", "text": text}],
            "structuredContent": structured,
            "isError": is_error,
        }})
    }

    async fn snapshot(self: &Arc<Self>, names: Vec<String>) -> Result<Value, String> {
        let (opts, plan) = (self.opts.clone(), self.plan.clone());
        let name = format!("{}-env", self.name);
        let run = move || -> Result<Value, String> {
            let mut cmd = std::process::Command::new("/proc/self/exe");
            cmd.args(["worker", "env", "snapshot"])
                .args(&names)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let (child, _tree) =
                start_as_server(&opts, plan, &name, cmd).map_err(|e| e.to_string())?;
            // the snapshot cuts its own probes at 2 s each; a worker stuck
            // past that is killed with its process group, not waited on
            let group = nix::unistd::Pid::from_raw(child.id() as i32);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(child.wait_with_output());
            });
            let out = match rx.recv_timeout(SNAPSHOT_DEADLINE) {
                Ok(out) => out.map_err(|e| e.to_string())?,
                Err(_) => {
                    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                    return Err(format!(
                        "the snapshot took more than {} s and was stopped",
                        SNAPSHOT_DEADLINE.as_secs()
                    ));
                }
            };
            if !out.status.success() {
                return Err(format!(
                    "the snapshot failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            serde_json::from_slice(&out.stdout)
                .map_err(|e| format!("the snapshot is not JSON: {e}"))
        };
        tokio::task::spawn_blocking(run)
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
    }

    /// Starts a server: its cgroup, the profile applied between fork and
    /// exec, pipes; a thread reads its stdout, another its stderr.
    async fn spawn(self: &Arc<Self>, generation: u64) -> std::io::Result<Arc<Child>> {
        let (opts, plan) = (self.opts.clone(), self.plan.clone());
        let name = format!("{}-{generation}", self.name);
        let (child, tree) = tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new(&opts.argv[0]);
            cmd.args(&opts.argv[1..])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            start_as_server(&opts, plan, &name, cmd)
        })
        .await
        .map_err(std::io::Error::other)??;
        let mut child = child;
        let pid = child.id();
        let take = || std::io::Error::other("the server's pipes are missing");
        let stdin = child.stdin.take().ok_or_else(take)?;
        let stdout = child.stdout.take().ok_or_else(take)?;
        let stderr = child.stderr.take().ok_or_else(take)?;
        use std::os::fd::AsFd as _;
        crate::workload::widen_pipe(stdin.as_fd());
        crate::workload::widen_pipe(stdout.as_fd());
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr_tail.clone();
        let (done_tx, done_rx) = oneshot::channel();
        std::thread::spawn(move || {
            pass_stderr(stderr, &tail);
            let _ = done_tx.send(());
        });
        let (status_tx, status_rx) = oneshot::channel();
        std::thread::spawn(move || {
            let _ = status_tx.send(child.wait().ok());
        });
        let child = Arc::new(Child {
            pid,
            generation,
            stdin: tokio::sync::Mutex::new(Some(tokio::process::ChildStdin::from_std(stdin)?)),
            tree: Arc::new(tree),
            stderr_tail,
            stderr_done: Mutex::new(Some(done_rx)),
            alive: AtomicBool::new(true),
            killed_because: Mutex::new(None),
        });
        let (lines_tx, lines_rx) = mpsc::unbounded_channel();
        let max = self.opts.max_message;
        let reader_child = child.clone();
        std::thread::spawn(move || read_child(stdout, max, &reader_child, &lines_tx));
        let relay = self.clone();
        let c = child.clone();
        tokio::spawn(async move { relay.dispatch(c, lines_rx, status_rx).await });
        Ok(child)
    }

    /// Handles the server's lines in order, then its end.
    async fn dispatch(
        self: Arc<Self>,
        child: Arc<Child>,
        mut lines: mpsc::UnboundedReceiver<(Bytes, ChildHead)>,
        status: oneshot::Receiver<Option<std::process::ExitStatus>>,
    ) {
        while let Some((line, head)) = lines.recv().await {
            self.on_server_line(&child, line, head).await;
        }
        // end of its stdout: it exited, or closed stdout (then it is killed)
        child.alive.store(false, Ordering::Release);
        let status = match tokio::time::timeout(Duration::from_secs(2), status).await {
            Ok(s) => s.ok().flatten(),
            Err(_) => {
                child.kill("it closed its stdout but kept running".into());
                None
            }
        };
        self.server_gone(&child, status).await;
    }

    async fn on_server_line(&self, child: &Arc<Child>, line: Bytes, head: ChildHead) {
        match head.kind {
            Kind::Response => {
                let guessed = head.id.is_none();
                let (id, line, head) = match head.id.clone() {
                    Some(id) => (id, line, head),
                    None => match self.unread_request(child.generation) {
                        Some(id) => {
                            let line = with_id(&line, &id);
                            // read again: the evidence goes in by byte ranges
                            let head = frame::child_head(&line).unwrap_or(head);
                            (id, line, head)
                        }
                        None => {
                            self.sink.server_message(line, &head, None);
                            return;
                        }
                    },
                };
                let Some(p) = self.pending().remove(&id) else {
                    // the answer to a call the client gave up on, or that the
                    // proxy answered first: the client decides, with the
                    // call's evidence
                    let line = match self.late_evidence(&id, child.generation).await {
                        Some(kernel) => {
                            Bytes::from(with_kernel(line, &head, &id, &kernel).concat())
                        }
                        None => line,
                    };
                    self.sink.server_message(line, &head, Some(&id));
                    return;
                };
                let Some(call) = &p.call else {
                    return (p.deliver)(vec![line]);
                };
                let (exit, outcome) = if head.rpc_error {
                    (1, "jsonrpc_error")
                } else if head.is_error {
                    (1, "is_error")
                } else {
                    (0, "ok")
                };
                let exit = ExitStatus {
                    code: Some(exit),
                    signal: None,
                };
                let kernel = self
                    .evidence(call, Some(&exit), None, outcome, Some(&line))
                    .await;
                if guessed {
                    // the guess may be wrong: the real answer may follow
                    let known = Evidence::Known(kernel.clone());
                    self.ended_call(&id, p.generation, "late", known);
                }
                (p.deliver)(with_kernel(line, &head, &id, &kernel));
                self.begin_between(child).await;
            }
            Kind::Request | Kind::Notification => {
                let related = head.progress_token.as_ref().and_then(|t| {
                    self.pending()
                        .iter()
                        .find(|(_, p)| p.progress.as_ref() == Some(t))
                        .map(|(id, _)| id.clone())
                });
                let delivered = self.sink.server_message(line, &head, related.as_deref());
                if !delivered && head.kind == Kind::Request {
                    let answer = crate::stdio::error_answer(
                        Value::Null,
                        -32601,
                        format!(
                            "agent-bridge proxy: cannot relay `{}` to the client: over HTTP a server request reaches the client only while it has a stream open (GET /mcp, or a tools/call with a progressToken in flight)",
                            head.method.as_deref().unwrap_or("?")
                        ),
                    );
                    let answer = frame::with_raw_id(answer, head.id.as_deref().unwrap_or("null"));
                    let _ = write_line(child, &answer).await;
                }
            }
        }
    }

    /// The request an `id: null` error of the server answers: the first
    /// still waiting whose line a strict parser refuses; else the latest
    /// sent (a server answers a line it cannot read as soon as it reads it).
    fn unread_request(&self, generation: u64) -> Option<String> {
        let pending = self.pending();
        let mine = || pending.iter().filter(|(_, p)| p.generation == generation);
        mine()
            .filter(|(_, p)| p.unreadable)
            .min_by_key(|(_, p)| p.sent)
            .or_else(|| mine().max_by_key(|(_, p)| p.sent))
            .map(|(id, _)| id.clone())
    }

    /// The server is gone: every request it had is answered with what
    /// happened; the next request starts a new one.
    async fn server_gone(&self, child: &Arc<Child>, status: Option<std::process::ExitStatus>) {
        let exit = status.map(crate::workload::exit_status);
        let how = match (
            &exit,
            child
                .killed_because
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        ) {
            (_, Some(because)) => because,
            (Some(e), None) => format!("it {}", e.describe()),
            (None, None) => "it ended with an unknown status".to_string(),
        };
        // what it wrote last (why it crashed) may still be in the pipe: read
        // to its end, unless a descendant that outlived it keeps it open
        let done = child
            .stderr_done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(done) = done {
            let _ = tokio::time::timeout(Duration::from_millis(500), done).await;
        }
        let tail = child.stderr_tail();
        tracing::warn!("foreign server (pid {}) is gone: {how}", child.pid);
        let taken: Vec<(String, Pending)> = {
            let mut pending = self.pending();
            let ids: Vec<String> = pending
                .iter()
                .filter(|(_, p)| p.generation == child.generation)
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| pending.remove(&id).map(|p| (id, p)))
                .collect()
        };
        // a request other than a call has no span of its own: the span
        // between calls over this server, if one is open, saw the end
        let between = if taken.iter().any(|(_, p)| p.call.is_none()) {
            let mut between = self.between.lock().await;
            between.take_if(|(_, watched)| *watched == child.generation)
        } else {
            None
        };
        let between = match between {
            Some((span, _)) => {
                let mut v = self.kernel.end(&span, exit.as_ref(), None, true).await;
                v["outcome"] = "server_gone".into();
                v["server_pid"] = child.pid.into();
                Some(v)
            }
            None => None,
        };
        for (id, p) in taken {
            let kernel = match (&p.call, &between) {
                // the kernel saw how the server ended: that is the call's exit
                (Some(c), _) => {
                    let said = Some(tail.as_bytes());
                    self.evidence(c, exit.as_ref(), None, "server_gone", said)
                        .await
                }
                (None, Some(between)) => between.clone(),
                (None, None) => {
                    no_span(&p.method, "no span between calls was open over this server")
                }
            };
            let message = format!(
                "agent-bridge proxy: the foreign server failed while handling `{}`: {how}; it starts again for the next request{}",
                p.method,
                tail_note(&tail)
            );
            let data = with_evidence(
                json!({"proxy": {"reason": "server_gone", "exit": exit, "stderr_tail": tail}}),
                kernel,
            );
            (p.deliver)(failure(&id, message, data));
        }
        let (tree, pid) = (child.tree.clone(), child.pid);
        let _ = tokio::task::spawn_blocking(move || end_tree(&tree, pid)).await;
    }

    /// Waits until no request is in flight (each ends by its answer, the
    /// server's end or its timeout).
    pub async fn drain(&self) {
        while !self.pending().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Ends the session as MCP's stdio transport says a client does: closes
    /// the server's stdin and gives it [`EXIT_GRACE`] to exit (to stop what
    /// it started itself), then kills what is left of its tree.
    pub async fn shutdown(&self) {
        if let Some((span, _)) = self.between.lock().await.take() {
            let _ = self.kernel.end(&span, None, None, false).await;
        }
        let st = self.state.lock().await;
        if let Some(c) = &st.child {
            drop(c.stdin.lock().await.take());
            let deadline = Instant::now() + EXIT_GRACE;
            while c.alive.load(Ordering::Acquire) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            c.alive.store(false, Ordering::Release);
            c.killed_because
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| "the proxy stopped it (its session ended)".into());
            let (tree, pid) = (c.tree.clone(), c.pid);
            let _ = tokio::task::spawn_blocking(move || end_tree(&tree, pid)).await;
        }
    }
}

/// How long a server whose stdin the proxy closed has to exit by itself.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// Kills what is left of a server's tree, waiting for it to go (blocking).
/// A server that is a bridge (`agent-bridge serve`) keeps its calls in
/// cgroups beside its tree, and its reaper in the tree, just killed: its
/// calls go from here too.
fn end_tree(tree: &CallCgroups, pid: u32) {
    crate::workload::Running::kill_tree(tree, pid);
    crate::cgroup::remove_owned_by(pid);
}

/// `data` with the request's evidence.
fn with_evidence(mut data: Value, kernel: Value) -> Value {
    data[frame::META_KEY] = kernel;
    data
}

/// The evidence of a request that had no span, and why.
fn no_span(method: &str, why: &str) -> Value {
    crate::kernel::unavailable(&format!("`{method}` had no span: {why}"))
}

/// The server's answer `line` to request `id` with `kernel` in it; an
/// answer that has no place for it is passed on as it is, and said.
fn with_kernel(line: Bytes, head: &ChildHead, id: &str, kernel: &Value) -> Vec<Bytes> {
    frame::splice_evidence(&line, head, kernel).unwrap_or_else(|| {
        let what = if head.rpc_error { "error" } else { "result" };
        tracing::warn!(
            "the foreign server's answer to request {id} has a `{what}` that is not an object: it is passed on without the kernel evidence"
        );
        vec![line]
    })
}

fn tail_note(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!(". Its stderr ended with:\n{tail}")
    }
}

/// A line a strict JSON parser (serde_json's, with its depth limit)
/// refuses; lines over 1 MiB are not parsed again, to keep big writes cheap.
fn strictly_unreadable(line: &[u8]) -> bool {
    line.len() <= 1 << 20 && serde_json::from_slice::<Value>(line).is_err()
}

/// Starts `cmd` as the proxy starts its server: in a cgroup of its own
/// (`name`) with the profile's limits, the profile's environment over the
/// proxy's, in the proxy's working directory, the profile applied between
/// fork and exec, in a process group of its own.
fn start_as_server(
    opts: &Options,
    plan: Arc<Plan>,
    name: &str,
    mut cmd: std::process::Command,
) -> std::io::Result<(std::process::Child, CallCgroups)> {
    let profile = &opts.profile;
    let limits = Limits {
        memory_bytes: profile.memory_limit.map(|s| s.0),
        pids: profile.pids_limit,
    };
    let tree = CallCgroups::create(name, limits)?;
    let cwd = std::env::current_dir()?;
    let ccwd = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(cwd.as_os_str()))
        .map_err(|_| std::io::Error::other("the working directory contains a NUL byte"))?;
    cmd.envs(profile.env.iter()).process_group(0);
    let spawned = probe::spawn::spawn_attached_with(
        &mut cmd,
        |pid| tree.add(pid),
        move |report| plan.apply(report, &ccwd),
    );
    let program = cmd.get_program().to_string_lossy().into_owned();
    match spawned {
        Ok((Ok(child), _)) => Ok((child, tree)),
        Ok((Err(e), _)) | Err(probe::spawn::SpawnError::Spawn(e)) => {
            Err(std::io::Error::new(e.kind(), format!("`{program}`: {e}")))
        }
        Err(probe::spawn::SpawnError::Attach(e)) => Err(std::io::Error::other(format!(
            "cannot place `{program}` in its cgroup: {e}"
        ))),
    }
}

/// A server's `id: null` error as the answer to request `id`.
fn with_id(line: &[u8], id: &str) -> Bytes {
    match serde_json::from_slice::<Value>(line) {
        Ok(v) => Bytes::from(frame::with_raw_id(v, id)),
        Err(_) => Bytes::copy_from_slice(line),
    }
}

async fn write_line(child: &Child, line: &[u8]) -> std::io::Result<()> {
    let mut stdin = child.stdin.lock().await;
    let Some(stdin) = stdin.as_mut() else {
        return Err(std::io::ErrorKind::BrokenPipe.into());
    };
    if line.len() < 64 << 10 {
        // one write: the server wakes once, to a whole line
        let mut whole = Vec::with_capacity(line.len() + 1);
        whole.extend_from_slice(line);
        whole.push(b'\n');
        stdin.write_all(&whole).await?;
    } else {
        stdin.write_all(line).await?;
        stdin.write_all(b"\n").await?;
    }
    stdin.flush().await
}

/// The server's stdout: lines to the dispatcher until it ends; a line that
/// is not JSON-RPC, or is over the limit, kills the server.
fn read_child(
    stdout: std::process::ChildStdout,
    max: usize,
    child: &Child,
    lines: &mpsc::UnboundedSender<(Bytes, ChildHead)>,
) {
    lines::read_lines(
        stdout.into(),
        max,
        |lines::Line {
             bytes: mut line,
             cuts,
         }| {
            let text = strip_newline(&mut line);
            let head = match &cuts {
                // the whole line again for the error it deserves
                Some(cuts) => {
                    frame::child_head_cut(text, cuts).or_else(|_| frame::child_head(text))
                }
                None => frame::child_head(text),
            };
            match head {
                Ok(head) => lines.send((Bytes::from(line), head)).is_ok(),
                Err(e) => {
                    let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                    child.kill(format!(
                        "it wrote a line that is not a JSON-RPC message on stdout ({e}): {shown:?}; it was killed"
                    ));
                    true
                }
            }
        },
        |seen| {
            child.kill(format!(
                "it sent a message of at least {seen} bytes, over this server's limit of {max} bytes (--max-message); it was killed"
            ));
        },
    );
}

/// `line` without its line end (`\n` or `\r\n`).
fn strip_newline(line: &mut Vec<u8>) -> &[u8] {
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    line
}

/// Passes the server's stderr through to ours, keeping its tail.
fn pass_stderr(stderr: std::process::ChildStderr, tail: &Mutex<VecDeque<u8>>) {
    use std::io::{Read as _, Write as _};
    let mut stderr = stderr;
    let mut buf = [0u8; 8192];
    while let Ok(n @ 1..) = stderr.read(&mut buf) {
        let _ = std::io::stderr().write_all(&buf[..n]);
        let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
        t.extend(&buf[..n]);
        let excess = t.len().saturating_sub(STDERR_TAIL);
        t.drain(..excess);
    }
}

/// Serves one client on stdin/stdout until stdin ends.
pub async fn serve_stdio(opts: Arc<Options>) -> anyhow::Result<()> {
    use std::os::fd::AsFd as _;
    let stdin = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    crate::workload::widen_pipe(stdin.as_fd());
    crate::workload::widen_pipe(stdout.as_fd());
    let out = crate::stdio::spawn_writer(stdout);
    let sink = Arc::new(StdioSink(Mutex::new(out.clone())));
    let relay = Relay::new(opts.clone(), sink)?;
    let (tx, mut rx) = mpsc::channel::<(Vec<u8>, ClientHead)>(64);
    let errors = out.clone();
    let max = opts.max_message;
    std::thread::spawn(move || {
        crate::stdio::read_lines(
            stdin,
            max,
            "--max-message",
            |mut line| match frame::client_head(strip_newline(&mut line)) {
                Ok(head) => tx.blocking_send((line, head)).is_ok(),
                Err(answer) => errors.send(crate::stdio::Outgoing::Raw(answer)).is_ok(),
            },
            |answer| {
                let _ = errors.send(crate::stdio::Outgoing::Raw(answer));
            },
        );
    });
    // in order: initialize before initialized before the first call
    while let Some((line, head)) = rx.recv().await {
        let out = out.clone();
        let deliver: Deliver = Box::new(move |chunks| {
            let _ = out.send(crate::stdio::Outgoing::Chunks(chunks));
        });
        relay.on_client_message(line, head, deliver).await;
    }
    // the client is done sending: answer what is in flight, then stop
    relay.drain().await;
    relay.shutdown().await;
    Ok(())
}

struct StdioSink(Mutex<std::sync::mpsc::Sender<crate::stdio::Outgoing>>);

impl ClientSink for StdioSink {
    fn server_message(&self, line: Bytes, _head: &ChildHead, _related: Option<&str>) -> bool {
        let out = self.0.lock().unwrap_or_else(|p| p.into_inner());
        out.send(crate::stdio::Outgoing::Chunks(vec![line])).is_ok()
    }
}
