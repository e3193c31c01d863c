//! `probe trace`: run one command as a span, without a daemon, and attribute
//! its outcome, on either evidence source ([`crate::source::TraceSource`]).
//! One thread polls the child's pidfd, a signal pipe and the source (its
//! ring buffer, where it has one), so events are read (and enriched) as
//! they happen.

use std::ffi::OsString;
use std::os::fd::{AsFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::attribution::{Attribution, ExitStatus, Outcome, Words, attribute};
use crate::source::{Follow, SpanSink, Stop, TraceSource};
use crate::spans::SpanEvidence;
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

/// Span id used by `probe trace` (it owns its source, so any non-zero id works).
const TRACE_SPAN: u64 = 1;

/// How long a workload asked to stop (SIGTERM) has before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Runs `opts.command` on `source` and attributes the outcome: the one
/// path of `probe trace`, whichever source sees the workload.
pub fn trace(source: &mut dyn TraceSource, opts: &TraceOptions) -> anyhow::Result<Traced> {
    anyhow::ensure!(!opts.command.is_empty(), "no command given");
    let label = command_line(&opts.command);
    let command = source.command(&opts.command)?;
    let (program, args) = command.split_first().context("no command given")?;

    let signals = StopSignals::register()?;

    let mut cmd = Command::new(program);
    cmd.args(args);
    if opts.stdout_to_stderr {
        cmd.stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?));
    }
    StderrTee::pipe(&mut cmd);

    let started = Instant::now();
    let mut span = SpanEvidence::new(
        TRACE_SPAN,
        None,
        label.clone(),
        crate::clock::monotonic_ns(),
    );
    if let Some(cap) = opts.event_cap {
        span.cap = cap;
    }
    let follow = Follow {
        cgroup: opts.cgroup.as_ref().map(|cg| cg.path.clone()),
        ..Follow::default()
    };
    source
        .begin(&mut span, &follow, &mut NoOtherSpans)
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;

    let mut interrupted = false;
    let mut timed_out = None;
    let mut stderr = None;
    let exit = match source.spawn(&mut cmd, &mut span)? {
        Ok(mut child) => {
            stderr = child.stderr.take().map(StderrTee::start);
            let (status, intr, tmo) =
                wait_collecting(source, &mut span, child, signals.pipe(), opts.timeout)?;
            interrupted = intr;
            timed_out = tmo;
            source.settle(&mut span);
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
    source.close(TRACE_SPAN, &mut span);
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

/// `probe trace` has no span besides its own to deliver to when it begins.
struct NoOtherSpans;

impl SpanSink for NoOtherSpans {
    fn evidence(&mut self, _span: u64) -> Option<&mut SpanEvidence> {
        None
    }

    fn deliver(&mut self, _span: u64, _ev: crate::event::KernelEvent) {}
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
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
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
    source: &mut dyn TraceSource,
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
    let source_fd = source
        .poll_fd()
        .map(|fd| fd.try_clone_to_owned())
        .transpose()?;
    let started = Instant::now();
    let mut interrupted = false;
    let mut timed_out = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        let mut fds = vec![
            PollFd::new(pidfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(sig_r.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(fd) = &source_fd {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
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
        let child_done = fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        let got_signal = fds[1]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        drop(fds);
        source.drain(usize::MAX, span);

        if got_signal {
            let mut buf = [0u8; 64];
            let _ = std::io::Read::read(&mut &*sig_r, &mut buf);
            interrupted = true;
            source.stop(span, child.id(), Stop::Ask);
            kill_at.get_or_insert(Instant::now() + STOP_GRACE);
        }
        if let Some(t) = timeout
            && timed_out.is_none()
            && started.elapsed() >= t
            && !child_done
        {
            timed_out = Some(t);
            let how = source.on_timeout();
            source.stop(span, child.id(), how);
            if how == Stop::Ask {
                kill_at.get_or_insert(Instant::now() + STOP_GRACE);
            }
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            source.stop(span, child.id(), Stop::Kill);
            kill_at = None;
        }
        if child_done {
            let status = child.wait().context("wait for the workload")?;
            return Ok((status.into(), interrupted, timed_out));
        }
    }
}
