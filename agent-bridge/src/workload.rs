//! Starting a workload under the session's profile and the probe, and
//! running it to its end: output capture with explicit caps, deadlines and
//! cancellation that kill the whole tree, then the kernel's attribution.

use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use probe::attribution::{ExitStatus, Words};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

use crate::attach::SelfAttach;
use crate::cgroup::{CallCgroups, Limits, Spare, procs_file};
use crate::kernel::{CallTrace, Kernel, Span};
use crate::launch::{Launch, Launched, drain, nonblocking_pipe};
use crate::sandbox::Plan;
use crate::self_exec::{CArgs, ExecByFd};
use tokio::net::unix::pipe;

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    pub argv: Vec<OsString>,
    pub cwd: Option<PathBuf>,
    pub env: Vec<(OsString, OsString)>,
    /// Keep stdin open as a pipe (background processes); otherwise stdin is
    /// a pipe only when there is data to write.
    pub stdin_pipe: bool,
    pub label: String,
    /// argv[0] is the bridge's own binary (a file tool's worker): exec'd by
    /// fd where the kernel then names the process after it.
    pub own_binary: bool,
    /// Why the probe is not asked to trace it (the bridge's own
    /// measurement, not a workload's work); None: traced.
    pub untraced: Option<&'static str>,
}

/// Everything a session applies to its workloads.
pub struct Context {
    pub plan: Arc<Plan>,
    pub limits: Limits,
    pub profile_env: Vec<(OsString, OsString)>,
    pub kernel: Arc<Kernel>,
    /// Directory workloads start in when the call names none.
    pub workdir: PathBuf,
    pub call_prefix: String,
    /// Empty call cgroups kept for the next calls.
    pub spare: Arc<Spare>,
}

/// A started workload.
pub struct Running {
    pub pid: u32,
    pub stdin: Option<pipe::Sender>,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub waiter: tokio::task::JoinHandle<io::Result<std::process::ExitStatus>>,
    pub tree: Arc<CallCgroups>,
    /// Where `tree` goes back once the call is over and it is empty.
    pub spare: Arc<Spare>,
    pub span: Span,
    pub kernel: Arc<Kernel>,
    pub started: Instant,
    /// A failed exit makes the tool's result an error (file tools'
    /// workers; not exec, whose failures are results).
    pub fails_on_exit: bool,
    /// Counts this workload as live until it is dropped.
    pub live: Live,
}

/// Workloads starting or running in this bridge, all sessions together.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// One workload counted in [`LIVE`] while it starts and runs. A launch
/// with no other workload live runs on the runtime's thread: it holds that
/// thread for the clone-to-exec window (a few hundred µs), which then
/// stalls no one's workload, and saves the hand-off to a blocking thread
/// and back (two cross-thread wake-ups, ~50 µs of a lone `exec` call).
/// With others live it goes to a blocking thread, so their output and
/// exits keep flowing while it starts.
pub struct Live {
    alone: bool,
}

impl Live {
    fn enter() -> Live {
        Live {
            alone: LIVE.fetch_add(1, Ordering::AcqRel) == 0,
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Bytes captured from one stream, at most the cap.
#[derive(Debug, Default, Clone)]
pub struct Captured {
    pub data: Vec<u8>,
    pub total: u64,
}

/// How a workload ended.
#[derive(Debug)]
pub struct Finished {
    pub exit: ExitStatus,
    pub duration: Duration,
    pub stdout: Captured,
    pub stderr: Captured,
    pub timed_out: bool,
    pub cancelled: bool,
    pub kernel: Value,
}

/// Why a workload could not be started (a tool error, with the reason).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(pub String);

impl Context {
    /// Starts `spec`: a call cgroup, a span, the profile applied in the
    /// child after the probe attached it, then exec.
    pub async fn start(&self, spec: Spec, call: u64) -> Result<Running, StartError> {
        let plan = self.plan.clone();
        let kernel = self.kernel.clone();
        let limits = self.limits;
        let name = format!("{}-{call}", self.call_prefix);
        let cwd = spec.cwd.clone().unwrap_or_else(|| self.workdir.clone());
        // looked up here, with stat(2), rather than by execvp(3) in the
        // child trying every PATH entry: each miss there is a failed
        // execve the probe must record and the daemon sort through
        let path = path_of(&spec.env, &self.profile_env);
        let found = plan
            .sees_what_the_bridge_sees()
            .then(|| find_on_path(&spec.argv[0], path.clone()))
            .flatten();
        let program = spec.argv[0].clone();
        let c =
            |e: io::Error| StartError(format!("cannot run `{}`: {e}", program.to_string_lossy()));
        let mut launch = Launch {
            candidates: crate::launch::candidates(&spec.argv[0], found, path).map_err(c)?,
            args: CArgs::new(
                &spec.argv,
                spec.env
                    .iter()
                    .chain(&self.profile_env)
                    .map(|(k, v)| (k, v)),
            )
            .map_err(c)?,
            // entered again after the profile's mounts (see Plan::apply)
            cwd: crate::self_exec::cstring(cwd.as_os_str())
                .map_err(|_| StartError("the working directory contains a NUL byte".into()))?,
            stdin_pipe: spec.stdin_pipe,
            cgroup: None,
        };
        let by_fd = if spec.own_binary && !plan.denies_execveat {
            let env = spec
                .env
                .iter()
                .chain(&self.profile_env)
                .map(|(k, v)| (k, v));
            ExecByFd::new(&spec.argv, env)
                .map_err(|e| StartError(format!("cannot prepare the worker's exec: {e}")))?
        } else {
            None
        };
        let label = spec.label.clone();
        let untraced = spec.untraced;
        let fails_on_exit = spec.own_binary;
        let call = CallTrace::current();
        let spare = self.spare.clone();
        let live = Live::enter();
        let mut launch_in_cgroup = move || {
            let tree = spare
                .take(&name, limits)
                .map_err(|e| StartError(format!("cannot set up the call's cgroup: {e}")))?;
            let cgroup_error = |e| StartError(format!("cannot set up the call's cgroup: {e}"));
            let attach = SelfAttach {
                join: tree
                    .v2_dir()
                    .map(procs_file)
                    .transpose()
                    .map_err(cgroup_error)?,
                procs: tree.v1_procs_files().map_err(cgroup_error)?,
                begin: None,
                answer: -1,
            };
            // None (unopenable): the child joins it by its cgroup.procs instead
            launch.cgroup = tree.v2_fd();
            let memory_limited = limits.memory_bytes.is_some();
            let (spawned, span) = match untraced {
                Some(why) => (
                    spawn_attaching_itself(&launch, attach, None, &plan, by_fd.as_ref()).0,
                    Span::Unavailable(why.into()),
                ),
                None => kernel.begin_in_child(&label, call.as_ref(), memory_limited, |begin| {
                    spawn_attaching_itself(&launch, attach, begin, &plan, by_fd.as_ref())
                }),
            };
            let child = match spawned {
                Ok(child) => child,
                Err(e) => {
                    // the probe saw the failed exec: its attribution explains it
                    let kernel_view = kernel.end_blocking(&span, None, None);
                    return Err(StartError(start_failure(&program, &e, &kernel_view)));
                }
            };
            Ok((child, tree, span))
        };
        let (child, tree, span) = if live.alone {
            launch_in_cgroup()?
        } else {
            tokio::task::spawn_blocking(launch_in_cgroup)
                .await
                .map_err(|e| StartError(format!("internal: {e}")))??
        };
        for pipe in [child.stdin.as_ref(), Some(&child.stdout)]
            .into_iter()
            .flatten()
        {
            widen_pipe(pipe.as_fd());
        }
        let take = |e: io::Error| StartError(format!("cannot take the workload's pipes: {e}"));
        let stdin = match child.stdin {
            Some(s) => Some(pipe::Sender::from_owned_fd(s).map_err(take)?),
            None => None,
        };
        let stdout = pipe::Receiver::from_owned_fd(child.stdout).map_err(take)?;
        let stderr = pipe::Receiver::from_owned_fd(child.stderr).map_err(take)?;
        let waiter = tokio::spawn(wait_for_exit(child.pid));
        Ok(Running {
            pid: child.pid,
            stdin,
            stdout,
            stderr,
            waiter,
            tree: Arc::new(tree),
            spare: self.spare.clone(),
            span,
            kernel: self.kernel.clone(),
            started: Instant::now(),
            fails_on_exit,
            live,
        })
    }
}

/// Launches the workload, whose child joins its cgroups (`attach`) and
/// opens its span (`begin`) itself, then applies the profile and execs
/// (see `attach`). Returns the launch result, with what the child reported
/// before failing, and the daemon's answer the child forwarded.
fn spawn_attaching_itself(
    launch: &Launch,
    attach: SelfAttach,
    begin: Option<(std::os::fd::RawFd, probe::client::PidRequest)>,
    plan: &Plan,
    by_fd: Option<&ExecByFd>,
) -> (io::Result<Launched>, Option<Vec<u8>>) {
    use std::os::fd::AsRawFd as _;
    let pipes = (|| Ok::<_, io::Error>((nonblocking_pipe()?, nonblocking_pipe()?)))();
    let ((answer_r, answer_w), (report_r, report_w)) = match pipes {
        Ok(p) => p,
        Err(e) => return (Err(e), None),
    };
    let attach = SelfAttach {
        begin,
        answer: answer_w.as_raw_fd(),
        ..attach
    };
    let report = report_w.as_raw_fd();
    let mut setup = |placed| {
        attach.run(report, placed)?;
        plan.apply(report, &launch.cwd)?;
        // the candidates are tried next: at once, or where an exec by fd
        // failed (an outer seccomp policy, say)
        if let Some(e) = by_fd {
            let _ = e.exec();
        }
        Ok(())
    };
    let mut spawned = crate::launch::launch(launch, &mut setup);
    drop((answer_w, report_w));
    // whatever the child wrote, it wrote before its exec (or exit), which
    // the launch waited for: the pipes hold it all, nothing more is coming
    let answer = Some(drain(answer_r)).filter(|a| !a.is_empty());
    if let Err(e) = &spawned {
        let why = drain(report_r);
        if !why.is_empty() {
            let why = String::from_utf8_lossy(&why);
            spawned = Err(io::Error::new(e.kind(), format!("{why}: {e}")));
        }
    }
    (spawned, answer)
}

/// Waits for the child `pid` to exit on the runtime, through a pidfd: no
/// blocking thread to hand the wait to and the exit back from. Without
/// pidfds (Linux before 5.3), on a blocking thread.
async fn wait_for_exit(pid: u32) -> io::Result<std::process::ExitStatus> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    let reap = move |flags| {
        let mut status = 0;
        // SAFETY: waitpid(2) of our own child.
        match unsafe { libc::waitpid(pid as i32, &mut status, flags) } {
            0 => Ok(None),
            n if n > 0 => Ok(Some(std::process::ExitStatus::from_raw(status))),
            _ => Err(io::Error::last_os_error()),
        }
    };
    // SAFETY: pidfd_open(2) of our own unreaped child; the fd it returns
    // is new, close-on-exec and ours alone, and is registered once.
    let pidfd = unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        (fd >= 0)
            .then(|| tokio::io::unix::AsyncFd::register(OwnedFd::from_raw_fd(fd as i32)).ok())
            .flatten()
    };
    let Some(pidfd) = pidfd else {
        return tokio::task::spawn_blocking(move || reap(0))
            .await
            .map_err(io::Error::other)?
            .map(|s| s.expect("waitpid without WNOHANG returned"));
    };
    loop {
        let mut ready = pidfd.readable().await?;
        if let Some(status) = reap(libc::WNOHANG)? {
            return Ok(status);
        }
        ready.clear_ready();
    }
}

/// The PATH the workload's execvp would search: the profile's, else the
/// call's, else the bridge's own (as `Command` resolves it).
fn path_of(
    call_env: &[(OsString, OsString)],
    profile_env: &[(OsString, OsString)],
) -> Option<OsString> {
    let set = |env: &[(OsString, OsString)]| {
        env.iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
    };
    set(profile_env)
        .or_else(|| set(call_env))
        .or_else(|| std::env::var_os("PATH"))
}

/// The first executable regular file named `program` on `path`, as
/// execvp(3) would find it; None for a name with a slash (used as it is)
/// or one found nowhere (the child's execvp then fails where the kernel
/// sees it: `exec.missing`).
fn find_on_path(program: &std::ffi::OsStr, path: Option<OsString>) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt as _;
    let bytes = program.as_bytes();
    if bytes.is_empty() || bytes.contains(&b'/') {
        return None;
    }
    std::env::split_paths(&path?)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(program))
        .find(|candidate| {
            candidate.metadata().is_ok_and(|m| m.is_file())
                && nix::unistd::access(candidate.as_path(), nix::unistd::AccessFlags::X_OK).is_ok()
        })
}

/// The message for a workload that never started, with the kernel's view
/// when there is one (e.g. `exec.missing`).
fn start_failure(program: &std::ffi::OsStr, e: &io::Error, kernel: &Value) -> String {
    let program = program.to_string_lossy();
    let mut msg = format!("cannot run `{program}`: {e}");
    if let Some(line) = crate::kernel::summary_line(kernel) {
        msg.push_str(&format!(" ({line})"));
    }
    msg
}

/// How much output to keep.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// Bytes kept per stream; the rest is counted, not kept.
    pub cap: usize,
    /// Expected stdout size (a file being read): allocated once up front
    /// instead of growing by doubling.
    pub stdout_hint: usize,
}

/// Reads `r` to its end, keeping the first `cap` bytes and counting the rest.
pub async fn capture(mut r: impl AsyncRead + Unpin, cap: usize, hint: usize) -> Captured {
    use bytes::BufMut as _;
    let mut data = Vec::with_capacity(hint.min(cap));
    let mut total = 0;
    // straight into the kept bytes while there is room: no second copy, and
    // as much per wake-up as the pipe holds
    while data.len() < cap {
        let room = cap - data.len();
        match r.read_buf(&mut (&mut data).limit(room)).await {
            Ok(0) | Err(_) => return Captured { data, total },
            Ok(n) => total += n as u64,
        }
    }
    let mut scratch = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = r.read(&mut scratch).await {
        total += n as u64;
    }
    Captured { data, total }
}

/// Signals the process group the workload leads: the fallback when no
/// cgroup tracks the tree (no root). Once the leader is reaped its pid may
/// be reused, so where a cgroup holds the tree the cgroup is signalled
/// instead: a workload cannot leave it, and it names no one else.
pub fn kill_group(leader: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(leader as i32), sig);
}

pub fn exit_status(s: std::process::ExitStatus) -> ExitStatus {
    s.into()
}

/// A stream's capture: the one that finished before the span ended, else
/// what its task gets within 2 s more (a handle that finished must not be
/// awaited again).
async fn rest_of(done: Option<Captured>, task: tokio::task::JoinHandle<Captured>) -> Captured {
    match done {
        Some(c) => c,
        None => tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default(),
    }
}

/// How long a call's end waits for the workload's output to close, so its
/// words can corroborate the attribution. A background process still
/// holding the pipes costs the call this much; its words are then only
/// the command.
const WORDS_WAIT: Duration = Duration::from_millis(200);

/// What ends a run early.
pub struct Stops {
    pub timeout: Duration,
    pub cancel: CancellationToken,
}

impl Running {
    /// Kills the whole tree (its cgroup, or its process group without one)
    /// and waits (up to 2 s) until it is gone: blocking.
    pub fn kill_tree(tree: &CallCgroups, pid: u32) {
        Running::signal_tree(tree, pid);
        tree.kill_all();
    }

    /// SIGKILLs the whole tree once, without waiting: for the runtime's
    /// threads (the protocol side may be a single thread).
    pub fn signal_tree(tree: &CallCgroups, pid: u32) {
        if tree.tracks() {
            tree.signal_all();
        } else {
            kill_group(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// Feeds `stdin`, captures output, enforces the deadline and the
    /// cancellation, calls `tick` about once a second, and ends the span.
    pub async fn run_to_end(
        mut self,
        stdin: Option<std::sync::Arc<Vec<u8>>>,
        output: Output,
        stops: Stops,
        mut tick: impl FnMut(Duration),
        command: String,
    ) -> Finished {
        if let (Some(mut pipe), Some(data)) = (self.stdin.take(), stdin) {
            tokio::spawn(async move {
                let _ = pipe.write_all(&data).await; // EPIPE: the workload did not read it all
            });
        }
        let mut out = tokio::spawn(capture(self.stdout, output.cap, output.stdout_hint));
        let mut err = tokio::spawn(capture(self.stderr, output.cap, 0));
        let deadline = tokio::time::sleep(stops.timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let (mut timed_out, mut cancelled) = (false, false);
        let status = loop {
            tokio::select! {
                s = &mut self.waiter => break s,
                // the waiter sees the exit; what outlives the root is
                // killed (and waited for) after the span ends
                () = &mut deadline, if !timed_out && !cancelled => {
                    timed_out = true;
                    Running::signal_tree(&self.tree, self.pid);
                }
                () = stops.cancel.cancelled(), if !timed_out && !cancelled => {
                    cancelled = true;
                    Running::signal_tree(&self.tree, self.pid);
                }
                _ = ticker.tick() => tick(self.started.elapsed()),
            }
        };
        let duration = self.started.elapsed();
        let exit = match status {
            Ok(Ok(s)) => exit_status(s),
            _ => ExitStatus::default(),
        };
        // the attribution covers the workload up to its exit; the kill of
        // whatever it left behind is ours and must not be blamed on it
        let timed_out_ms = timed_out.then_some(stops.timeout.as_millis() as u64);
        let is_error = timed_out || cancelled || (self.fails_on_exit && !exit.success());
        // its output is a witness for the attribution: the pipes close at
        // once unless something it left running holds them
        let (mut stdout, mut stderr) = (None, None);
        let _ = tokio::time::timeout(WORDS_WAIT, async {
            stdout = Some((&mut out).await.unwrap_or_default());
            stderr = Some((&mut err).await.unwrap_or_default());
        })
        .await;
        let said = stderr.as_ref().map(|e| {
            let mut said = Vec::new();
            for c in [stdout.as_ref(), Some(e)].into_iter().flatten() {
                said.extend_from_slice(&c.data[c.data.len().saturating_sub(Words::MAX)..]);
                said.push(b'\n');
            }
            said
        });
        let words = Words::new(Some(command), said.as_deref());
        let kernel = self
            .kernel
            .end_with_words(&self.span, Some(&exit), timed_out_ms, is_error, &words)
            .await;
        // whatever the workload left running dies with the call (usually
        // nothing is left: then no blocking kill-and-wait on the reply path)
        if !self.tree.tracks() {
            kill_group(self.pid, nix::sys::signal::Signal::SIGKILL);
        } else if self.tree.populated() {
            let tree = self.tree.clone();
            let _ = tokio::task::spawn_blocking(move || tree.kill_all()).await;
        }
        let stdout = rest_of(stdout, out).await;
        let stderr = rest_of(stderr, err).await;
        // the tree's cgroups serve the next call unless something in them
        // was killed (see `Spare::give_back`); the others are removed when
        // the last reference goes, off the runtime's threads (see
        // `CallCgroups`'s Drop)
        if let Ok(tree) = Arc::try_unwrap(self.tree) {
            self.spare.give_back(tree);
        }
        Finished {
            exit,
            duration,
            stdout,
            stderr,
            timed_out,
            cancelled,
            kernel,
        }
    }
}

/// Raises a pipe's buffer from 64 KiB to 1 MiB (the unprivileged maximum):
/// a 64 MiB file then crosses it in 64 wake-ups instead of 1,024. Not a
/// pipe, or not allowed: left as it is.
pub fn widen_pipe(fd: std::os::fd::BorrowedFd<'_>) {
    let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `data` through a pipe that holds 7 bytes at a time.
    async fn captured(data: &'static [u8], cap: usize, hint: usize) -> Captured {
        let (mut w, r) = tokio::io::duplex(7);
        tokio::spawn(async move { w.write_all(data).await });
        capture(r, cap, hint).await
    }

    #[tokio::test]
    async fn capture_keeps_the_cap_and_counts_the_rest() {
        let data: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
        for (cap, hint) in [(100, 0), (100, 36), (36, 0), (10, 36), (1, 0), (0, 0)] {
            let c = captured(data, cap, hint).await;
            assert_eq!(c.data, &data[..cap.min(36)], "cap {cap}, hint {hint}");
            assert_eq!(c.total, 36, "cap {cap}, hint {hint}");
        }
    }

    #[test]
    fn find_on_path_takes_the_first_executable_file_like_execvp() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        for d in [&a, &b, &c] {
            std::fs::create_dir(d).unwrap();
        }
        let file = |p: PathBuf, mode: u32| {
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        file(a.join("tool"), 0o644); // not executable: skipped
        std::fs::create_dir(b.join("tool")).unwrap(); // a directory: skipped
        let wanted = file(c.join("tool"), 0o755);
        let path = std::env::join_paths([&a, &b, &c]).unwrap();
        assert_eq!(
            find_on_path("tool".as_ref(), Some(path.clone())),
            Some(wanted)
        );
        assert_eq!(find_on_path("absent".as_ref(), Some(path.clone())), None);
        assert_eq!(find_on_path("./tool".as_ref(), Some(path.clone())), None);
        assert_eq!(find_on_path("".as_ref(), Some(path)), None);
        assert_eq!(find_on_path("tool".as_ref(), None), None);
    }

    #[test]
    fn path_of_prefers_the_profile_then_the_call_then_the_bridge() {
        let env = |v: &str| vec![(OsString::from("PATH"), OsString::from(v))];
        assert_eq!(
            path_of(&env("/call"), &env("/profile")),
            Some("/profile".into())
        );
        assert_eq!(path_of(&env("/call"), &[]), Some("/call".into()));
        assert_eq!(path_of(&[], &[]), std::env::var_os("PATH"));
    }
}
