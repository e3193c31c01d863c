//! The eBPF source: the probe's programs in this kernel. A traced thread
//! carries its span in the kernel's maps, so each ring-buffer record names
//! its span; forks inherit it, a followed cgroup adds what starts in it.

use std::collections::HashMap;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{EvidenceSource, Follow, SpanSink, Stop, TraceSource};
use crate::event::{decode, read_raw};
use crate::loader::Probe;
use crate::protocol::{ErrorBody, ErrorCode};
use crate::spans::{Source, SpanEvidence};
use crate::status::{DaemonStatus, Features, PidNamespaceId, StatusDrops};

/// What the source keeps of a span it follows.
struct Followed {
    /// The kernel's drop count when it began: its drops are the growth.
    drops_before: u64,
    /// The id of the cgroup it follows, to stop following at its end.
    cgroup: Option<u64>,
}

pub struct EbpfSource {
    probe: Probe,
    /// The ring buffer's descriptor, to poll without the probe.
    ring_fd: OwnedFd,
    followed: HashMap<u64, Followed>,
    /// It serves one span that owns the programs (`probe trace`): every
    /// thread they trace at the end is that span's.
    sole: bool,
}

impl EbpfSource {
    pub fn new(mut probe: Probe) -> std::io::Result<EbpfSource> {
        let ring_fd = probe.events().as_fd().try_clone_to_owned()?;
        Ok(EbpfSource {
            probe,
            ring_fd,
            followed: HashMap::new(),
            sole: false,
        })
    }

    /// For `probe trace`: one span, whose end takes every traced thread.
    pub fn sole(probe: Probe) -> std::io::Result<EbpfSource> {
        let mut source = EbpfSource::new(probe)?;
        source.sole = true;
        Ok(source)
    }

    /// The loaded programs back (to detach them).
    pub fn into_probe(self) -> Probe {
        self.probe
    }

    fn drops_total(&self) -> u64 {
        self.probe.drops().iter().sum()
    }

    /// Follows `path` for `span`: the threads in it now are attached, the
    /// kernel adds what forks or execs in it. How many.
    fn follow_cgroup(
        &mut self,
        span: &mut SpanEvidence,
        path: &std::path::Path,
    ) -> Result<usize, ErrorBody> {
        let bad =
            |e: crate::cgroup::CgroupError| ErrorBody::new(ErrorCode::BadRequest, e.to_string());
        let cg = crate::cgroup::Cgroup::open(path).map_err(bad)?;
        if self.probe.pid_namespace().is_some() {
            return Err(ErrorBody::new(
                ErrorCode::Unavailable,
                "following a cgroup needs a probe in the host's PID namespace (this one runs in \
                 another): run it on the host, or follow the workload's process tree instead",
            ));
        }
        self.probe.follow_cgroup(cg.id, span.id).map_err(|e| {
            ErrorBody::new(
                ErrorCode::Unavailable,
                format!("cannot follow {}: {e}", path.display()),
            )
        })?;
        if let Some(f) = self.followed.get_mut(&span.id) {
            f.cgroup = Some(cg.id);
        }
        let threads = cg.threads().map_err(bad)?;
        let mut attached = 0;
        for tid in threads {
            // one that exited meanwhile is simply not traced. Its seccomp
            // mode is not read (a /proc read per thread, most of a walk's
            // cost): a denial it meets is confirmed when its event arrives
            if self.probe.track_with_seccomp(tid, span.id, 0).is_ok() {
                attached += 1;
                span.tids.insert(tid);
            }
        }
        Ok(attached)
    }

    /// Attaches a running process as it is now: every thread of `pid` and
    /// of each descendant (forks and clones after this inherit the span in
    /// the kernel). A thread that another span tracked moves to this one.
    /// Threads started while the tree is walked are caught by walking it
    /// again, until a walk finds nothing new.
    fn attach_tree(&mut self, span: &mut SpanEvidence, pid: u32) -> Result<usize, ErrorBody> {
        self.attach_one(span, pid, None)?;
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
                if self.probe.track(tid, span.id).is_ok() {
                    span.tids.insert(tid);
                }
                attached.insert(tid);
            }
        }
        Ok(attached.len())
    }

    /// Traces `pid` in `span`. `seccomp` is its seccomp mode when the
    /// caller knows it; else it is read from the process's status.
    fn attach_one(
        &mut self,
        span: &mut SpanEvidence,
        pid: u32,
        seccomp: Option<u32>,
    ) -> Result<(), ErrorBody> {
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
            .track_with_seccomp(pid, span.id, seccomp)
            .map_err(|e| {
                ErrorBody::new(
                    ErrorCode::Unavailable,
                    format!("cannot trace pid {pid}: {e}"),
                )
            })?;
        span.root_pid.get_or_insert(pid);
        span.tids.insert(pid);
        Ok(())
    }

    fn follow(
        &mut self,
        span: &mut SpanEvidence,
        what: &Follow,
    ) -> Result<Option<usize>, ErrorBody> {
        let in_cgroup = match &what.cgroup {
            Some(path) => Some(self.follow_cgroup(span, path)?),
            None => None,
        };
        let in_tree = match what.pid {
            None => None,
            Some(pid) if what.tree => Some(self.attach_tree(span, pid)?),
            Some(pid) => {
                self.attach_one(span, pid, what.seccomp)?;
                None
            }
        };
        if what.memory_limited
            && let Some(pid) = what.pid
        {
            span.memory_cgroup = crate::cgroup::memory_of(pid);
        }
        // how many threads were attached by walking
        Ok(match (in_tree, in_cgroup) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        })
    }
}

impl EvidenceSource for EbpfSource {
    fn kind(&self) -> Source {
        Source::Ebpf
    }

    fn begin(
        &mut self,
        span: &mut SpanEvidence,
        what: &Follow,
        _sink: &mut dyn SpanSink,
    ) -> Result<Option<usize>, ErrorBody> {
        let drops_before = self.drops_total();
        self.followed.insert(
            span.id,
            Followed {
                drops_before,
                cgroup: None,
            },
        );
        let followed = self.follow(span, what);
        if followed.is_err() {
            // the span never existed: what was followed before the error
            // (a cgroup's threads, then a process that was gone) stops
            if let Some(Followed {
                cgroup: Some(id), ..
            }) = self.followed.remove(&span.id)
            {
                self.probe.unfollow_cgroup(id, span.id);
            }
            self.probe.untrack_span(span.id);
        }
        followed
    }

    fn attach(&mut self, span: &mut SpanEvidence, pid: u32) -> Result<(), ErrorBody> {
        self.attach_one(span, pid, None)
    }

    fn drain(&mut self, max: usize, sink: &mut dyn SpanSink) -> usize {
        let ring = self.probe.events();
        let mut read = 0;
        while read < max {
            let Some(item) = ring.next() else { break };
            read += 1;
            sink.read();
            let raw = match read_raw(&item) {
                Ok(raw) => raw,
                Err(e) => {
                    sink.undecodable();
                    tracing::warn!("undecodable ring buffer record: {e}");
                    continue;
                }
            };
            drop(item);
            let Some(evidence) = sink.evidence(raw.span) else {
                // a descendant outliving its ended span: counted, not hidden
                sink.late();
                continue;
            };
            let mut ev = match decode(&raw, evidence.start_ns) {
                Ok(ev) => ev,
                Err(e) => {
                    sink.undecodable();
                    tracing::warn!("{e}");
                    continue;
                }
            };
            evidence.name(&mut ev);
            sink.deliver(raw.span, ev);
        }
        read
    }

    fn close(&mut self, span: u64, sink: &mut dyn SpanSink) {
        let followed = self.followed.remove(&span);
        if let Some(id) = followed.as_ref().and_then(|f| f.cgroup) {
            self.probe.unfollow_cgroup(id, span);
        }
        self.drain(usize::MAX, sink);
        let pending = if self.sole {
            self.probe.untrack_span(span)
        } else {
            let tids: Vec<u32> = sink
                .evidence(span)
                .map(|e| e.tids.iter().copied().collect())
                .unwrap_or_default();
            // threads that a later span took over (overlapping calls into
            // one server) stay traced for that span
            self.probe.untrack_own(span, tids)
        };
        self.drain(usize::MAX, sink);
        let drops_after = self.drops_total();
        if let Some(evidence) = sink.evidence(span) {
            evidence.add_pending(&pending);
            evidence.drops.kernel =
                drops_after.saturating_sub(followed.map_or(drops_after, |f| f.drops_before));
        }
    }

    fn poll_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.ring_fd.as_fd())
    }

    fn sweep(&mut self, open: &dyn Fn(u64) -> bool) -> u64 {
        let mut lost = 0;
        for (span, _) in self.probe.tracked_spans() {
            if !open(span) {
                let pending = self.probe.untrack_span(span);
                let repeats: u64 = pending.iter().map(|p| p.repeats).sum();
                // the span is stored already: its late repeats are counted, like late events
                lost += repeats;
                tracing::debug!("swept stale threads of ended span {span}; {repeats} late repeats");
            }
        }
        let forgotten = self.probe.forget_uring_requests(open);
        if forgotten > 0 {
            tracing::debug!("forgot {forgotten} io_uring requests of ended spans");
        }
        lost
    }

    fn describe(&self, status: &mut DaemonStatus) {
        let drops = self.probe.drops();
        let untracked = drops[probe_abi::EventKind::TaskUntracked as usize];
        status.pid_namespace = self.probe.pid_namespace().map(|ns| PidNamespaceId {
            dev: ns.dev,
            inode: ns.ino,
        });
        status.features = Features {
            btf: self.probe.rung == crate::loader::Rung::Btf,
            ring_buffer: true,
            raw_tracepoints: true,
            kprobes: std::path::Path::new("/sys/kernel/tracing/kprobe_events").exists(),
            rung: self.probe.rung.name().to_owned(),
            jit: crate::preflight::jit(),
        };
        status.programs = self.probe.attached.clone();
        status.missing_optional = self.probe.missing.clone();
        status.drops = StatusDrops {
            kernel_total: drops.iter().sum::<u64>() - untracked,
            untracked_children: untracked,
            kernel_by_kind: probe_abi::EventKind::ALL
                .iter()
                .map(|k| (format!("{k:?}"), drops[*k as usize]))
                .collect(),
            retention_events_total: status.drops.retention_events_total,
        };
        status.tracked_tasks = self.probe.tracked_tasks();
    }
}

impl TraceSource for EbpfSource {
    fn spawn(
        &mut self,
        cmd: &mut Command,
        span: &mut SpanEvidence,
    ) -> anyhow::Result<Result<Child, std::io::Error>> {
        use crate::spawn::{SpawnError, spawn_attached};
        let id = span.id;
        match spawn_attached(cmd, |pid| self.probe.track(pid, id)) {
            Ok((child, pid)) => {
                span.root_pid = Some(pid);
                Ok(child)
            }
            Err(SpawnError::Attach(e)) => {
                anyhow::bail!("cannot attach the workload to the probe: {e}")
            }
            Err(SpawnError::Spawn(e)) => {
                anyhow::bail!("cannot start {}: {e}", cmd.get_program().to_string_lossy())
            }
        }
    }

    fn on_timeout(&self) -> Stop {
        // the kernel sees every process: stop them all now
        Stop::Kill
    }

    fn stop(&self, span: &SpanEvidence, child: u32, how: Stop) {
        match how {
            Stop::Ask => {
                let _ = kill(Pid::from_raw(child as i32), Signal::SIGTERM);
            }
            // the root and every process it started that we saw
            Stop::Kill => {
                let _ = kill(Pid::from_raw(child as i32), Signal::SIGKILL);
                for (pid, p) in &span.processes {
                    if !p.exited {
                        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
                    }
                }
            }
        }
    }

    /// Reads events until no process of the span is alive, or for
    /// [`LEFTOVERS_SETTLE`].
    fn settle(&mut self, span: &mut SpanEvidence) {
        let deadline = Instant::now() + LEFTOVERS_SETTLE;
        loop {
            self.drain(usize::MAX, span);
            let alive = span.processes.iter().any(|(pid, p)| {
                !p.exited && std::path::Path::new(&format!("/proc/{pid}")).exists()
            });
            if !alive || Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// How long the command's leftovers may take to die after it: the kernel
/// tears down a PID namespace whose init went (bwrap's), a PDEATHSIG fires,
/// a wrapper kills its helpers, each a moment after the command's exit.
/// Their deaths belong in the explanation ("stopped on the way out, not a
/// cause"); a leftover that lives on is not waited for longer than this.
const LEFTOVERS_SETTLE: Duration = Duration::from_millis(250);

/// Whether process `pid` exists (kill(2) with signal 0: only ESRCH says no).
pub fn process_exists(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|p| {
        p > 0 && !matches!(kill(Pid::from_raw(p), None), Err(nix::errno::Errno::ESRCH))
    })
}
