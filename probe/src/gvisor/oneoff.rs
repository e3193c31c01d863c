//! `probe trace --gvisor -- runsc … do|run … CMD`: the probe listens as
//! gVisor's monitor, starts the runsc command with its own session added,
//! collects the points of the sandbox it starts into one span, and
//! attributes the outcome as `probe trace` does (no eBPF is loaded: under
//! gVisor the workload's syscalls never reach the host kernel as its own).

use std::os::fd::AsFd as _;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::attribution::{Outcome, Words, attribute};
use crate::spans::{Source, SpanEvidence};
use crate::tee::{StderrTee, command_line};
use crate::trace::{StopSignals, TraceOptions, Traced};

use super::monitor::{Delivery, Monitor};
use super::session;

/// How long points may trail the runsc process's exit: the sandbox
/// hangs up its connection when it has sent its last point, usually
/// before runsc returns, but after it when the monitor fell behind.
const SETTLE: Duration = Duration::from_secs(5);

/// A private directory for the socket and the configuration, removed
/// when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> anyhow::Result<WorkDir> {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "probe-gvisor-{}-{}",
            std::process::id(),
            crate::clock::monotonic_ns()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `opts.command` (a runsc command line) with the probe as its
/// monitor and attributes the outcome.
pub fn trace_gvisor(opts: &TraceOptions) -> anyhow::Result<Traced> {
    let work = WorkDir::new()?;
    let socket = work.0.join("monitor.sock");
    let config = work.0.join("pod-init.json");
    let command = session::with_pod_init_config(&opts.command, &config)?;
    let (tx, rx) = channel();
    let monitor = Monitor::listen(&socket, tx)?;
    std::fs::write(
        &config,
        serde_json::to_vec_pretty(&session::pod_init_config(
            &socket,
            session::IfNoMonitor::Fail,
        ))?,
    )
    .with_context(|| format!("writing {}", config.display()))?;

    let label = command_line(&opts.command);
    let (program, args) = command.split_first().context("no command given")?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    if opts.stdout_to_stderr {
        cmd.stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?));
    }
    StderrTee::pipe(&mut cmd);

    let signals = StopSignals::register()?;
    let start_ns = crate::clock::monotonic_ns();
    let started = Instant::now();
    let mut span = SpanEvidence::new(1, None, label.clone(), start_ns);
    span.source = Source::Gvisor;
    if let Some(cap) = opts.event_cap {
        span.cap = cap;
    }
    let mut collector = Collector::default();
    let mut memory = SandboxMemory::new();

    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            anyhow::bail!(
                "cannot start {} (exit {code}): {e}",
                program.to_string_lossy()
            );
        }
    };
    let stderr = child.stderr.take().map(StderrTee::start);
    let runsc = Pid::from_raw(child.id() as i32);
    let mut interrupted = false;
    let mut timed_out = None;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        collector.drain(&rx, &mut span, Duration::from_millis(10));
        memory.watch(child.id());
        if let Some(status) = child.try_wait().context("waiting for runsc")? {
            break status;
        }
        if signals.caught() {
            interrupted = true;
            // runsc passes SIGTERM on to the container
            let _ = kill(runsc, Signal::SIGTERM);
            kill_at.get_or_insert(Instant::now() + Duration::from_secs(3));
        }
        if let Some(t) = opts.timeout
            && timed_out.is_none()
            && started.elapsed() >= t
        {
            timed_out = Some(t);
            let _ = kill(runsc, Signal::SIGTERM);
            kill_at.get_or_insert(Instant::now() + Duration::from_secs(3));
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            let _ = kill(runsc, Signal::SIGKILL);
            kill_at = None;
        }
    };
    // the sandbox hangs up when it has said everything (one that never
    // connected has nothing to say)
    let settle_until = Instant::now() + SETTLE;
    while collector.connections > 0 && !collector.all_closed() && Instant::now() < settle_until {
        collector.drain(&rx, &mut span, Duration::from_millis(20));
    }
    // what arrived by now is kept; what a sandbox still sends is not waited for
    while let Ok(d) = rx.try_recv() {
        collector.take(d, &mut span);
    }
    if !collector.all_closed() && collector.connections > 0 {
        tracing::warn!(
            "the sandbox still held its monitor connection {} s after runsc exited: later \
             points are not in this report",
            SETTLE.as_secs()
        );
    }
    drop(monitor);
    span.root_pid = sandbox_root(&span);
    if let Some(oom) = memory.kill(&span) {
        span.add(oom);
    }

    let outcome = Outcome {
        exit: status.into(),
        timed_out,
        duration_ns: started.elapsed().as_nanos() as u64,
        all_events: opts.all_events,
        words: Words::new(Some(label), stderr.as_ref().map(|t| t.said()).as_deref()),
    };
    if collector.connections == 0 {
        tracing::warn!(
            "runsc never connected to the probe's monitor: no sandbox was started, or this \
             runsc has no runtime monitoring (it needs release-20220905 or later)"
        );
    }
    crate::facts::capture(
        &mut span,
        outcome.exit.signal.as_deref(),
        &crate::facts::LiveHost,
    );
    Ok(Traced {
        attribution: attribute(&span, &outcome),
        interrupted,
    })
}

/// The span's root: the lowest pid seen, the container's init (pid 1 in
/// the sandbox, or the first process of a container that is not the pod's
/// first).
fn sandbox_root(span: &SpanEvidence) -> Option<u32> {
    span.processes
        .keys()
        .copied()
        .chain(span.events.iter().map(|e| e.pid))
        .min()
}

/// The sandbox's memory on the host, watched while it runs: gVisor has no
/// point for an OOM kill (the host's OOM killer kills the whole sandbox
/// process). Two witnesses: the `oom_kill` count of the sandbox's own
/// memory cgroup, read as the run goes (runsc removes the cgroup once the
/// sandbox is gone), and the kernel log's record of the kill, read at the
/// end (it outlives the cgroup: a kill between two reads is not missed).
struct SandboxMemory {
    sandbox: Option<u32>,
    cgroup: Option<crate::cgroup::MemoryCgroup>,
    limit_kb: Option<u64>,
    kills: u64,
    log: Option<KernelLog>,
}

impl SandboxMemory {
    fn new() -> SandboxMemory {
        SandboxMemory {
            sandbox: None,
            cgroup: None,
            limit_kb: None,
            kills: 0,
            log: KernelLog::open_at_end(),
        }
    }

    /// Finds the sandbox and its cgroup, then reads its count.
    fn watch(&mut self, runsc: u32) {
        if let Some(cg) = &self.cgroup {
            if let Some(n) = cg.oom_kills() {
                self.kills = n;
            }
            return;
        }
        let Some(sandbox) = self.sandbox.or_else(|| sandbox_process(runsc)) else {
            return;
        };
        self.sandbox = Some(sandbox);
        // its own cgroup, once runsc has moved it there (until then it is
        // in runsc's, which is not the sandbox's limit)
        let own = crate::cgroup::MemoryCgroup::of(sandbox);
        let parents = crate::cgroup::MemoryCgroup::of(runsc);
        if let Some(cg) = own.filter(|c| parents.as_ref().is_none_or(|p| p.path != c.path)) {
            // runsc makes the cgroup for this sandbox: every kill counted
            // there is this run's, even one before it was found
            self.kills = cg.oom_kills().unwrap_or(0);
            self.limit_kb = crate::cgroup::memory_of(sandbox).and_then(|(_, limit)| limit);
            self.cgroup = Some(cg);
        }
    }

    /// The OOM kill a witness saw, as the event the eBPF side sends for
    /// its victim: here the container's init, which died with the sandbox.
    fn kill(&mut self, span: &SpanEvidence) -> Option<crate::event::KernelEvent> {
        let logged = match (self.sandbox, self.log.as_mut()) {
            (Some(pid), Some(log)) => log.oom_killed(pid),
            _ => false,
        };
        if self.kills == 0 && !logged {
            return None;
        }
        let pid = span.root_pid.unwrap_or(1);
        let comm = span
            .processes
            .get(&pid)
            .map(|p| p.comm.clone())
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "the sandbox".into());
        let at = crate::clock::monotonic_ns().saturating_sub(span.start_ns);
        let mut ev =
            crate::event::KernelEvent::bare(crate::event::Kind::OomVictim, at, pid, pid, comm);
        ev.cgroup = self.cgroup.as_ref().map(|c| c.path.clone());
        ev.memory_max_kb = self.limit_kb;
        Some(ev)
    }
}

/// The kernel log (`/dev/kmsg`), read from where it stood when opened.
struct KernelLog(std::fs::File);

impl KernelLog {
    /// `None` where the log cannot be read (no root, a container without it).
    fn open_at_end() -> Option<KernelLog> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()?;
        // SAFETY: lseek on an fd we own; SEEK_END on /dev/kmsg moves to
        // the next record to be written
        unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(&file), 0, libc::SEEK_END) };
        Some(KernelLog(file))
    }

    /// Whether a record since opening says the OOM killer killed `pid`
    /// ("Killed process PID (comm) …"). Its anon RSS is not taken: the
    /// Sentry keeps the workload's memory in a memory file, not anon.
    fn oom_killed(&mut self, pid: u32) -> bool {
        let needle = format!("Killed process {pid} (");
        let mut buf = vec![0u8; 8192];
        let mut found = false;
        loop {
            // one record per read; EAGAIN at the end, EPIPE when records
            // were overwritten (the next read goes on)
            match std::io::Read::read(&mut self.0, &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let record = String::from_utf8_lossy(&buf[..n]);
                    let text = record.split_once(';').map_or(record.as_ref(), |(_, t)| t);
                    found |= text.contains(&needle);
                }
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        found
    }
}

/// The runsc-sandbox process under `top` (runsc, or a wrapper of it:
/// `timeout 60 runsc …`; runsc re-executes itself: argv[0] names the
/// part, its comm is `exe`).
pub fn sandbox_process(top: u32) -> Option<u32> {
    crate::proctree::descendants(top).into_iter().find(|&pid| {
        crate::proctree::argv(pid)
            .is_some_and(|w| w.first().map(String::as_str) == Some("runsc-sandbox"))
    })
}

/// Feeds deliveries into the span and keeps what the monitor said of its
/// connections.
#[derive(Default)]
struct Collector {
    connections: u64,
    open: std::collections::HashSet<u64>,
}

impl Collector {
    /// Takes what arrives within `wait` (at least one delivery's worth).
    fn drain(&mut self, rx: &Receiver<Delivery>, span: &mut SpanEvidence, wait: Duration) {
        let deadline = Instant::now() + wait;
        while let Ok(d) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.take(d, span);
        }
    }

    fn take(&mut self, delivery: Delivery, span: &mut SpanEvidence) {
        match delivery {
            Delivery::Connected { conn, .. } => {
                self.connections += 1;
                self.open.insert(conn);
            }
            Delivery::Closed { conn } => {
                self.open.remove(&conn);
            }
            Delivery::Container { .. } => {}
            Delivery::Dropped { dropped, .. } => span.drops.kernel += dropped,
            Delivery::Point {
                converted, dropped, ..
            } => {
                span.drops.kernel += dropped;
                for mut ev in converted.events {
                    ev.ts_ns = ev.ts_ns.saturating_sub(span.start_ns);
                    span.add(ev);
                }
            }
        }
    }

    fn all_closed(&self) -> bool {
        self.connections > 0 && self.open.is_empty()
    }
}
