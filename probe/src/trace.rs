//! `probe trace`: run one command as a span, without a daemon, and attribute
//! its outcome. One thread polls the ring buffer, the child's pidfd and a
//! signal pipe, so events are read (and enriched) as they happen.

use std::ffi::OsString;
use std::os::fd::{AsFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::attribution::{Attribution, ExitStatus, Outcome, Words, attribute};
use crate::event::{decode, read_raw};
use crate::loader::Probe;
use crate::spans::SpanEvidence;
use crate::spawn::{SpawnError, spawn_attached};
use crate::tee::{StderrTee, command_line};

/// What to run and how to report it.
#[derive(Debug, Clone, Default)]
pub struct TraceOptions {
    pub command: Vec<OsString>,
    /// Kill the workload after this long (attributed `timeout`).
    pub timeout: Option<Duration>,
    /// Keep every event in the attribution, not just the evidence.
    pub all_events: bool,
    /// Send the workload's stdout to our stderr (keeps stdout for JSON).
    pub stdout_to_stderr: bool,
    /// Events kept per span before the oldest are evicted.
    pub event_cap: Option<usize>,
    /// Also follow this cgroup (v2): what forks or execs in it during the
    /// span, and what is in it at the start, is the span's.
    pub cgroup: Option<crate::cgroup::Cgroup>,
}

/// The result of one traced command.
#[derive(Debug)]
pub struct Traced {
    pub attribution: Attribution,
    /// Interrupted by SIGINT/SIGTERM/SIGHUP sent to the probe.
    pub interrupted: bool,
}

/// How often the ring buffer is read when no urgent event wakes us.
pub const READ_INTERVAL: Duration = Duration::from_millis(10);

/// Span id used by `probe trace` (it owns its programs, so any non-zero id works).
const TRACE_SPAN: u64 = 1;

/// Drains everything the ring buffer holds into `span`. Returns records read.
pub fn drain(probe: &mut Probe, span: &mut SpanEvidence) -> usize {
    let mut n = 0;
    let ring = probe.events();
    while let Some(item) = ring.next() {
        n += 1;
        match read_raw(&item).and_then(|raw| decode(&raw, span.start_ns).map(|ev| (raw.span, ev))) {
            Ok((id, ev)) if id == span.id => span.add(ev),
            Ok(_) => {}
            Err(e) => tracing::warn!("undecodable ring buffer record: {e}"),
        }
    }
    n
}

/// Runs `opts.command` under `probe` and attributes the outcome.
pub fn trace(probe: &mut Probe, opts: &TraceOptions) -> anyhow::Result<Traced> {
    let (program, args) = opts.command.split_first().context("no command given")?;
    let label = command_line(&opts.command);

    let signals = StopSignals::register()?;

    let mut cmd = Command::new(program);
    cmd.args(args);
    if opts.stdout_to_stderr {
        cmd.stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?));
    }
    StderrTee::pipe(&mut cmd);

    let drops_before = probe.drops();
    let start_ns = crate::clock::monotonic_ns();
    let started = Instant::now();
    let mut span = SpanEvidence::new(TRACE_SPAN, None, label.clone(), start_ns);
    if let Some(cap) = opts.event_cap {
        span.cap = cap;
    }

    if let Some(cg) = &opts.cgroup {
        follow_cgroup(probe, cg)?;
    }
    let spawned = spawn_attached(&mut cmd, |pid| probe.track(pid, TRACE_SPAN));
    let (child, pid) = match spawned {
        Ok((child, pid)) => (child, pid),
        Err(SpawnError::Attach(e)) => anyhow::bail!("cannot attach the workload to the probe: {e}"),
        Err(SpawnError::Spawn(e)) => {
            anyhow::bail!("cannot start {}: {e}", program.to_string_lossy())
        }
    };
    span.root_pid = Some(pid);

    let mut interrupted = false;
    let mut timed_out = None;
    let mut stderr = None;
    let exit = match child {
        Ok(mut child) => {
            stderr = child.stderr.take().map(StderrTee::start);
            let (status, intr, tmo) =
                wait_collecting(probe, &mut span, child, signals.pipe(), opts.timeout)?;
            interrupted = intr;
            timed_out = tmo;
            settle_leftovers(probe, &mut span, LEFTOVERS_SETTLE);
            status
        }
        // exec failed (ENOENT, EACCES…): the kernel saw it; report like a shell
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            eprintln!("probe: {}: {e}", program.to_string_lossy());
            ExitStatus {
                code: Some(code),
                signal: None,
            }
        }
    };
    drain(probe, &mut span);
    if let Some(cg) = &opts.cgroup {
        probe.unfollow_cgroup(cg.id, TRACE_SPAN);
    }
    let pending = probe.untrack_span(TRACE_SPAN);
    drain(probe, &mut span);
    span.add_pending(&pending);
    let drops_after = probe.drops();
    span.drops.kernel = drops_after
        .iter()
        .zip(drops_before.iter())
        .map(|(a, b)| a - b)
        .sum();

    drop(signals);

    let outcome = Outcome {
        exit,
        timed_out,
        duration_ns: started.elapsed().as_nanos() as u64,
        all_events: opts.all_events,
        words: Words::new(Some(label), stderr.as_ref().map(|t| t.said()).as_deref()),
    };
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

/// SIGINT/SIGTERM/SIGHUP sent to the probe, noted on a pipe that can be
/// polled; unregistered when dropped.
pub(crate) struct StopSignals {
    read: UnixStream,
    ids: Vec<signal_hook::SigId>,
}

impl StopSignals {
    pub(crate) fn register() -> anyhow::Result<StopSignals> {
        let (read, write) = UnixStream::pair().context("signal pipe")?;
        read.set_nonblocking(true)?;
        let mut ids = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            ids.push(signal_hook::low_level::pipe::register(
                sig,
                write.try_clone()?,
            )?);
        }
        Ok(StopSignals { read, ids })
    }

    pub(crate) fn pipe(&self) -> &UnixStream {
        &self.read
    }

    /// Whether a signal arrived since the last call.
    pub(crate) fn caught(&self) -> bool {
        let mut buf = [0u8; 64];
        matches!(std::io::Read::read(&mut &self.read, &mut buf), Ok(n) if n > 0)
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Follows `cg` from now on and attaches the threads already in it.
fn follow_cgroup(probe: &mut Probe, cg: &crate::cgroup::Cgroup) -> anyhow::Result<()> {
    if probe.pid_namespace().is_some() {
        anyhow::bail!(
            "--cgroup needs the host's PID namespace (this probe runs in another): \
             run it on the host, or trace the workload's process tree instead"
        );
    }
    probe
        .follow_cgroup(cg.id, TRACE_SPAN)
        .context("following the cgroup in the kernel")?;
    for tid in cg.threads()? {
        // one that exited meanwhile is simply not traced
        let _ = probe.track(tid, TRACE_SPAN);
    }
    Ok(())
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; on success it returns a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits for `child` while reading events; handles our own signals and the
/// timeout by stopping the child. Returns (exit, interrupted, timed out).
fn wait_collecting(
    probe: &mut Probe,
    span: &mut SpanEvidence,
    mut child: Child,
    sig_r: &UnixStream,
    timeout: Option<Duration>,
) -> anyhow::Result<(ExitStatus, bool, Option<Duration>)> {
    let pidfd = match pidfd_open(child.id()) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e).context("pidfd_open");
        }
    };
    let ring_fd = probe.events().as_fd().try_clone_to_owned()?;
    let started = Instant::now();
    let mut interrupted = false;
    let mut timed_out = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        let mut fds = [
            PollFd::new(ring_fd.as_fd(), PollFlags::POLLIN),
            PollFd::new(pidfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(sig_r.as_fd(), PollFlags::POLLIN),
        ];
        let wait = match (timeout.filter(|_| timed_out.is_none()), kill_at) {
            (_, Some(at)) => at.saturating_duration_since(Instant::now()),
            (Some(t), None) => t.saturating_sub(started.elapsed()),
            (None, None) => READ_INTERVAL,
        };
        // high-volume events arrive without a wake-up: read them at least
        // every READ_INTERVAL
        let ms = wait.min(READ_INTERVAL).as_millis() as u16;
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e).context("poll"),
        }
        let child_done = fds[1]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        let got_signal = fds[2]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        drain(probe, span);

        if got_signal {
            let mut buf = [0u8; 64];
            let _ = std::io::Read::read(&mut &*sig_r, &mut buf);
            interrupted = true;
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            kill_at.get_or_insert(Instant::now() + Duration::from_secs(3));
        }
        if let Some(t) = timeout
            && timed_out.is_none()
            && started.elapsed() >= t
            && !child_done
        {
            timed_out = Some(t);
            kill_span(span, child.id());
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            kill_span(span, child.id());
            kill_at = None;
        }
        if child_done {
            let status = child.wait().context("wait for the workload")?;
            return Ok((status.into(), interrupted, timed_out));
        }
    }
}

/// How long the command's leftovers may take to die after it: the kernel
/// tears down a PID namespace whose init went (bwrap's), a PDEATHSIG fires,
/// a wrapper kills its helpers, each a moment after the command's exit.
/// Their deaths belong in the explanation ("stopped on the way out, not a
/// cause"); a leftover that lives on is not waited for longer than this.
const LEFTOVERS_SETTLE: Duration = Duration::from_millis(250);

/// Reads events until no process of the span is alive, or for `limit`.
fn settle_leftovers(probe: &mut Probe, span: &mut SpanEvidence, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        drain(probe, span);
        let alive = span
            .processes
            .iter()
            .any(|(pid, p)| !p.exited && std::path::Path::new(&format!("/proc/{pid}")).exists());
        if !alive || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGKILL to the span's root and every process it started that we saw.
fn kill_span(span: &SpanEvidence, root: u32) {
    let _ = kill(Pid::from_raw(root as i32), Signal::SIGKILL);
    for (pid, p) in &span.processes {
        if !p.exited {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
    }
}
