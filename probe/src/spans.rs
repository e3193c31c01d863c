//! Spans: the evidence collected for one unit of work (one command, one MCP
//! tool call), bounded in memory, with what retention removed counted.
//!
//! Events are enriched on arrival, while the process is most likely still
//! alive: an unconfirmed seccomp denial is checked against the task's
//! seccomp mode, an execve EACCES against the mount flags of its path.

use std::collections::{HashMap, HashSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::event::{Errno, KernelEvent, Kind};

/// Events kept per span by default; older ones are evicted and counted.
pub const DEFAULT_EVENT_CAP: usize = 20_000;

/// What became of one process of the span.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessInfo {
    pub comm: String,
    pub parent: Option<u32>,
    /// Program of the last successful exec.
    pub exe: Option<String>,
    /// Code passed to exit/exit_group.
    pub exit_code: Option<i32>,
    /// Fatal signal generated for it, and by whom.
    pub signal: Option<String>,
    pub signal_code: Option<i32>,
    pub signal_sender: Option<(u32, String)>,
    pub exited: bool,
    pub oom_killed: bool,
}

impl ProcessInfo {
    /// Exited with a non-zero code or by a signal.
    pub fn failed(&self) -> bool {
        self.exit_code.is_some_and(|c| c != 0)
            || (self.exited && self.exit_code.is_none() && self.signal.is_some())
    }
}

/// Counts of what was not kept or not delivered.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Drops {
    /// Records the ring buffer had no room for while the span was open.
    pub kernel: u64,
    /// Events delivered but evicted by the per-span cap.
    pub retention: u64,
    /// Events the store did not keep (`[retention] keep_events =
    /// "failed"`): all of a span that explained nothing, the failed
    /// lookups of one that explained (docs/RETENTION.md). Counted in
    /// `counts`, not stored. Zero in a live reply; set on what is stored.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_kept: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where a span's events came from.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The probe's eBPF programs in the host's (or VM's) kernel.
    #[default]
    Ebpf,
    /// gVisor's runtime monitoring (its points), for a workload whose
    /// kernel is gVisor's Sentry. Pids are the sandbox's own.
    Gvisor,
}

/// What a source of evidence cannot see, as data: attribution reads it and
/// never asks which source ran. Each text completes a sentence of the
/// explanation that meets the gap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sight {
    /// When a failed lookup's event carries no path: why ("…'s points for
    /// these carry no path"). A shell's "not found" is then taken from its
    /// words, with its failed lookups and its 127.
    pub lookups_without_paths: Option<&'static str>,
    /// When a non-blocking connect's outcome is not seen: why.
    pub connect_outcomes_unseen: Option<&'static str>,
    /// When the workload runs on a kernel of the sandbox's own, which may
    /// refuse calls Linux accepts: its name ("gVisor's kernel").
    pub own_kernel: Option<&'static str>,
    /// Said after a seccomp kill: what the source shows of it.
    pub seccomp_kill: Option<&'static str>,
    /// Said after an OOM kill: how it was learnt.
    pub oom_kill: Option<&'static str>,
    /// Said when nothing explains a failure: what would not have been seen.
    pub blind_spots: Option<&'static str>,
}

impl Sight {
    /// Sees what the rules ask about.
    pub const FULL: Sight = Sight {
        lookups_without_paths: None,
        connect_outcomes_unseen: None,
        own_kernel: None,
        seccomp_kill: None,
        oom_kill: None,
        blind_spots: None,
    };
}

/// What gVisor's points do not show (its points: `crate::gvisor::events`).
pub const GVISOR_SIGHT: Sight = Sight {
    lookups_without_paths: Some("gVisor's points for these carry no path"),
    connect_outcomes_unseen: Some(
        "gVisor's points do not say which (a non-blocking connect's outcome is read through \
         getsockopt, which has no point)",
    ),
    own_kernel: Some("gVisor's kernel"),
    seccomp_kill: Some(
        "gVisor sends no point for the denied syscall itself: the exit by SIGSYS is the only \
         trace a seccomp kill leaves there",
    ),
    oom_kill: Some(
        "the host's OOM killer killed the whole gVisor sandbox (its Sentry), as the sandbox's \
         host cgroup and the kernel log say: gVisor sends no point for it",
    ),
    blind_spots: Some(GVISOR_BLIND_SPOTS),
};

pub const GVISOR_BLIND_SPOTS: &str = "not seen either way: under gVisor a seccomp ERRNO denial, a signal that does not kill, \
     an OOM kill inside the sandbox and a mount error leave no event (gVisor has no point for them), \
     nor does a failed read or close unless the sandbox's session asks for them \
     (`probe gvisor-session --io-points all`), or a failed write under a session made with \
     `--io-points none`";

impl Source {
    /// What this source cannot see.
    pub fn sight(self) -> &'static Sight {
        match self {
            Source::Ebpf => &Sight::FULL,
            Source::Gvisor => &GVISOR_SIGHT,
        }
    }

    /// Why a daemon that did not open this source cannot begin a span on it.
    pub fn not_listening(self) -> &'static str {
        match self {
            Source::Ebpf => "this daemon has not loaded its eBPF programs",
            Source::Gvisor => {
                "this daemon does not listen for gVisor sandboxes (it was started without a \
                 gVisor socket)"
            }
        }
    }

    pub fn id(self) -> &'static str {
        match self {
            Source::Ebpf => "ebpf",
            Source::Gvisor => "gvisor",
        }
    }
}

/// What the host said when the span closed ([`crate::facts::capture`]):
/// all attribution knows of the host, so stored evidence judges the same
/// replayed later, on another machine.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Closing {
    /// Memory PSI `some` total (µs) at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi_some_us: Option<u64>,
    /// Wall-clock ms at the end.
    pub closed_ms: i64,
    /// Absolute paths a crashing process found missing that exist where
    /// the probe runs: hidden from the workload.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub present_outside: std::collections::BTreeSet<String>,
}

/// What replaying a stored span needs besides its stored events: its
/// header when it closed and what its caller knew. Stored beside the
/// events of a span that kept them all (`probe show --reattribute`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Replay {
    /// Bumped when what a replay needs changes; an older one is refused.
    pub version: u32,
    pub source: Source,
    pub start_ns: u64,
    pub root_pid: Option<u32>,
    pub root_serves: bool,
    pub memory_cgroup: Option<(String, Option<u64>)>,
    pub reclaim_ns: u64,
    pub psi_some_us_at_start: Option<u64>,
    pub closing: Closing,
    pub timed_out_ms: Option<u64>,
    pub duration_ns: u64,
    pub words: crate::attribution::Words,
}

impl Replay {
    pub const VERSION: u32 = 1;
}

/// Evidence of one span.
#[derive(Debug)]
pub struct SpanEvidence {
    pub id: u64,
    /// Where its events come from: host procfs and mounts speak of the
    /// span's pids only when it is [`Source::Ebpf`].
    pub source: Source,
    pub session: Option<String>,
    pub label: String,
    /// CLOCK_MONOTONIC at begin, in ns (the eBPF clock).
    pub start_ns: u64,
    /// Pid of the first process of the span.
    pub root_pid: Option<u32>,
    /// The first process was already running when the span began, a
    /// server the span covers one call of (`begin_span` with `tree` or
    /// `server`), not a process started for the span.
    pub root_serves: bool,
    /// The memory cgroup the span's workload runs in and its limit in KiB,
    /// noted while it was alive (see `memory_limited` of `begin_span`).
    pub memory_cgroup: Option<(String, Option<u64>)>,
    pub events: VecDeque<KernelEvent>,
    pub cap: usize,
    pub processes: HashMap<u32, ProcessInfo>,
    /// fd → path of files opened for writing, per pid (to name an ENOSPC write).
    pub write_fds: HashMap<(u32, i64), String>,
    /// Total reclaim stall of the span's threads: direct reclaim and their
    /// memory cgroup's reclaim at its limit.
    pub reclaim_ns: u64,
    /// System-wide memory PSI `some` total (µs) when the span began; the
    /// delta at the end says how much the whole machine stalled meanwhile.
    pub psi_some_us_at_start: Option<u64>,
    /// The host's facts at the end (empty until it closes).
    pub closing: Closing,
    pub counts: HashMap<Kind, u64>,
    pub drops: Drops,
    /// Every thread the span's events named (root, forks, clones): what to
    /// stop tracing when it ends.
    pub tids: HashSet<u32>,
    /// Thread id → its process, for threads seen being created: a signal
    /// aimed at a worker thread belongs to its process.
    pub thread_group: HashMap<u32, u32>,
    /// Processes procfs could not name (gone): not asked again.
    unnamed: HashSet<u32>,
    /// Whether arriving events are completed from the host (procfs, mount
    /// flags, seccomp mode, memory cgroups): for a live eBPF span, never
    /// for a rebuilt one, whose events were completed when they arrived.
    reads_host: bool,
}

impl SpanEvidence {
    /// The span's first process when it did not end within the span: a
    /// server the span covers one call of (the proxy's server, a browser,
    /// a shell kept between calls). Its own programs come and go around
    /// the call; the call is judged by its own work and words.
    pub fn outliving_root(&self) -> Option<u32> {
        self.root_pid
            .filter(|r| self.root_serves && !self.processes.get(r).is_some_and(|p| p.exited))
    }

    pub fn new(id: u64, session: Option<String>, label: String, start_ns: u64) -> Self {
        SpanEvidence {
            id,
            source: Source::Ebpf,
            session,
            label,
            start_ns,
            root_pid: None,
            root_serves: false,
            memory_cgroup: None,
            events: VecDeque::new(),
            cap: DEFAULT_EVENT_CAP,
            processes: HashMap::new(),
            write_fds: HashMap::new(),
            reclaim_ns: 0,
            psi_some_us_at_start: psi_memory_some_us(),
            closing: Closing::default(),
            counts: HashMap::new(),
            drops: Drops::default(),
            tids: HashSet::new(),
            thread_group: HashMap::new(),
            unnamed: HashSet::new(),
            reads_host: true,
        }
    }

    /// What a replay of this span needs besides its events.
    pub fn replay(&self, outcome: &crate::attribution::Outcome) -> Replay {
        Replay {
            version: Replay::VERSION,
            source: self.source,
            start_ns: self.start_ns,
            root_pid: self.root_pid,
            root_serves: self.root_serves,
            memory_cgroup: self.memory_cgroup.clone(),
            reclaim_ns: self.reclaim_ns,
            psi_some_us_at_start: self.psi_some_us_at_start,
            closing: self.closing.clone(),
            timed_out_ms: outcome.timed_out.map(|d| d.as_millis() as u64),
            duration_ns: outcome.duration_ns,
            words: outcome.words.clone(),
        }
    }

    /// The span again from its stored events and [`Replay`], reading
    /// nothing of the host: what attribution saw when it closed.
    pub fn rebuild(
        id: u64,
        session: Option<String>,
        label: String,
        replay: &Replay,
        events: impl IntoIterator<Item = KernelEvent>,
    ) -> SpanEvidence {
        let mut span = SpanEvidence::new(id, session, label, replay.start_ns);
        span.reads_host = false;
        span.source = replay.source;
        span.root_pid = replay.root_pid;
        span.root_serves = replay.root_serves;
        span.memory_cgroup = replay.memory_cgroup.clone();
        span.cap = usize::MAX;
        for e in events {
            span.add(e);
        }
        // its stall included events the span cap had evicted
        span.reclaim_ns = replay.reclaim_ns;
        span.psi_some_us_at_start = replay.psi_some_us_at_start;
        span.closing = replay.closing.clone();
        span
    }

    /// Repeats still pending in the kernel when tracing stopped.
    pub fn add_pending(&mut self, pending: &[crate::loader::PendingRepeats]) {
        for p in pending {
            self.credit_repeats(p.tid, p.syscall, p.ret, p.repeats);
        }
    }

    /// Credits a run of identical failures the kernel counted to the
    /// thread's last failure event, and counts them (`counts.repeated`).
    fn credit_repeats(&mut self, tid: u32, syscall: i64, ret: i64, n: u64) {
        *self.counts.entry(Kind::Repeated).or_default() += n;
        let last = self.events.iter_mut().rev().find(|e| {
            e.kind == Kind::SyscallFailed
                && e.tid == tid
                && e.syscall_nr == Some(syscall)
                && e.ret == Some(ret)
        });
        if let Some(e) = last {
            e.repeats = Some(e.repeats.unwrap_or(0) + n);
        }
    }

    /// Names an event the kernel sent without `comm` (the high-volume
    /// syscall kinds): from the process's fork/exec/exit events, else from
    /// procfs while it still runs (a process attached after its exec).
    pub fn name(&mut self, ev: &mut KernelEvent) {
        if !ev.comm.is_empty() {
            return;
        }
        if let Some(p) = self.processes.get(&ev.pid)
            && !p.comm.is_empty()
        {
            ev.comm = p.comm.clone();
            return;
        }
        if self.unnamed.contains(&ev.pid) || self.source != Source::Ebpf || !self.reads_host {
            return;
        }
        match std::fs::read_to_string(format!("/proc/{}/comm", ev.pid)) {
            Ok(comm) => {
                let comm = comm.trim_end_matches('\n').to_string();
                self.processes.entry(ev.pid).or_default().comm = comm.clone();
                ev.comm = comm;
            }
            Err(_) => {
                self.unnamed.insert(ev.pid);
            }
        }
    }

    /// Adds one decoded event: updates process facts, enriches, keeps it.
    pub fn add(&mut self, mut ev: KernelEvent) {
        if ev.kind == Kind::Repeated {
            self.credit_repeats(
                ev.tid,
                ev.syscall_nr.unwrap_or(-1),
                ev.ret.unwrap_or(0),
                ev.repeats.unwrap_or(0),
            );
            return;
        }
        self.name(&mut ev);
        *self.counts.entry(ev.kind).or_default() += 1;
        match ev.kind {
            Kind::Fork => {
                if let Some(child) = ev.child_pid {
                    self.tids.insert(child);
                    if ev.thread == Some(true) {
                        self.thread_group.insert(child, ev.pid);
                    }
                }
                if let (Some(child), Some(false)) = (ev.child_pid, ev.thread) {
                    let p = self.processes.entry(child).or_default();
                    p.parent = Some(ev.pid);
                    p.comm = ev.comm.clone();
                }
            }
            Kind::Exec => {
                let p = self.processes.entry(ev.pid).or_default();
                p.comm = ev.comm.clone();
                p.exe = ev.path.clone();
            }
            Kind::Exit => {
                let p = self.processes.entry(ev.pid).or_default();
                p.comm = ev.comm.clone();
                p.exited = true;
                p.exit_code = ev.exit_code;
            }
            Kind::Signal => {
                if let Some(&tgid) = self.thread_group.get(&ev.pid) {
                    ev.tid = ev.pid;
                    ev.pid = tgid;
                }
                let p = self.processes.entry(ev.pid).or_default();
                // the first fatal signal is the one that counts
                if p.signal.is_none() {
                    p.signal = ev.signal.clone();
                    p.signal_code = ev.si_code;
                    p.signal_sender = ev.sender_pid.zip(ev.sender_comm.clone());
                }
                if ev.comm.is_empty() {
                    ev.comm = p.comm.clone();
                }
            }
            Kind::OomVictim => {
                self.processes.entry(ev.pid).or_default().oom_killed = true;
                // where the limit was: the victim's cgroup, or (once it is
                // reaped; events arrive in batches) its nearest living
                // ancestor's in the span, which shares it but for nesting,
                // or the one noted when the span began
                if ev.cgroup.is_none() && self.reads_host {
                    let mut pid = Some(ev.pid);
                    let mut found = None;
                    for _ in 0..64 {
                        let Some(p) = pid else { break };
                        found = crate::cgroup::memory_of(p);
                        if found.is_some() {
                            break;
                        }
                        pid = self.processes.get(&p).and_then(|i| i.parent);
                    }
                    if let Some((path, max)) = found
                        .or_else(|| self.root_pid.and_then(crate::cgroup::memory_of))
                        .or_else(|| self.memory_cgroup.clone())
                    {
                        ev.cgroup = Some(path);
                        ev.memory_max_kb = max;
                    }
                }
            }
            Kind::FileWrite => {
                if let (Some(fd), Some(path)) = (ev.ret, &ev.path) {
                    self.write_fds.insert((ev.pid, fd), path.clone());
                }
            }
            Kind::FdDup => {
                // plumbing, not evidence: follow the file, keep no event
                if let (Some(old), Some(new)) = (ev.fd, ev.ret) {
                    match self.write_fds.get(&(ev.pid, old)).cloned() {
                        Some(path) => self.write_fds.insert((ev.pid, new), path),
                        None => self.write_fds.remove(&(ev.pid, new)),
                    };
                }
                return;
            }
            Kind::ReclaimStall => self.reclaim_ns += ev.duration_ns.unwrap_or(0),
            Kind::SeccompDenied => {
                if ev.seccomp_filter.is_none()
                    && self.source == Source::Ebpf
                    && self.reads_host
                    && crate::loader::seccomp_mode(ev.pid).is_some_and(|m| m != 0)
                {
                    ev.seccomp_filter = Some(true);
                }
            }
            Kind::SyscallFailed | Kind::UringFailed => {
                self.enrich_failure(&mut ev);
            }
            Kind::Mount | Kind::UringUnderSeccomp => {}
            Kind::Repeated => return, // credited by credit_repeats above, never kept
        }
        if self.events.len() >= self.cap {
            // evidence that stands alone (an OOM kill, a seccomp denial, a
            // fatal signal) outlives the routine events around it: a tab the
            // OOM killer took early in a busy call must not be evicted
            let evictable = self
                .events
                .iter()
                .position(|e| !stands_alone(e.kind))
                .unwrap_or(0);
            self.events.remove(evictable);
            self.drops.retention += 1;
        }
        self.events.push_back(ev);
    }

    fn enrich_failure(&mut self, ev: &mut KernelEvent) {
        // a non-blocking connect's outcome, learnt through getsockopt(SO_ERROR):
        // it is that connect's failure (ECONNREFUSED, not the EINPROGRESS
        // its own return said), so it takes the connect's name and address
        if ev.via.is_some()
            && let Some(connect) = self.events.iter().rev().find(|c| {
                c.kind == Kind::SyscallFailed
                    && c.syscall_is(syscalls::Sysno::connect)
                    && c.errno_is(Errno::EINPROGRESS)
                    && c.pid == ev.pid
                    && c.fd == ev.fd
            })
        {
            ev.syscall = connect.syscall.clone();
            ev.syscall_nr = connect.syscall_nr;
            ev.addr = connect.addr.clone();
            ev.duration_ns = Some(ev.ts_ns.saturating_sub(connect.ts_ns));
        }
        let nr = ev.syscall_nr.unwrap_or(-1);
        // write-family: name the file behind the fd
        if probe_abi::is_fd_syscall(nr)
            && ev.path.is_none()
            && let Some(fd) = ev.fd
            && let Some(path) = self.write_fds.get(&(ev.pid, fd))
        {
            ev.path = Some(path.clone());
        }
        // execve EACCES: is the file on a noexec mount?
        if ev
            .syscall
            .as_deref()
            .is_some_and(|s| crate::syscalls::EXEC.contains(&s))
            && self.source == Source::Ebpf
            && self.reads_host
            && ev.errno_is(Errno::EACCES)
            && let Some(path) = &ev.path
        {
            let root = self.root_pid;
            ev.mount_noexec = crate::mounts::is_noexec(path, ev.pid, root);
        }
    }
}

/// `some total=` of /proc/pressure/memory (µs), when PSI is available.
/// Read at every span's begin and end: the file is opened once and read
/// again from offset 0 (one pread instead of open, stat, reads and close).
pub fn psi_memory_some_us() -> Option<u64> {
    use std::os::unix::fs::FileExt as _;
    static PSI: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    let file = PSI
        .get_or_init(|| std::fs::File::open("/proc/pressure/memory").ok())
        .as_ref()?;
    let mut buf = [0u8; 512];
    let n = file.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    text.lines()
        .find(|l| l.starts_with("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Kinds retention keeps while it can: each names a cause on its own.
fn stands_alone(kind: Kind) -> bool {
    matches!(kind, Kind::OomVictim | Kind::SeccompDenied | Kind::Signal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: Kind, pid: u32) -> KernelEvent {
        serde_json::from_value(
            serde_json::json!({"kind": kind, "ts_ns": 0, "pid": pid, "tid": pid, "comm": "x"}),
        )
        .unwrap()
    }

    #[test]
    fn retention_keeps_an_oom_kill_over_routine_events() {
        // a tab OOM-killed early in a busy call: hundreds of failures later
        // the kill is still the span's evidence
        let mut s = SpanEvidence::new(1, None, "t".into(), 0);
        s.cap = 3;
        s.add(ev(Kind::OomVictim, 7));
        for i in 1..6 {
            let mut e = ev(Kind::ReclaimStall, 1);
            e.ts_ns = i;
            s.add(e);
        }
        assert_eq!(s.events.len(), 3);
        assert_eq!(s.events.front().unwrap().kind, Kind::OomVictim);
        assert_eq!(s.events.back().unwrap().ts_ns, 5);
        assert_eq!(s.drops.retention, 3);
    }

    #[test]
    fn retention_evicts_oldest_and_counts() {
        let mut s = SpanEvidence::new(1, None, "t".into(), 0);
        s.cap = 3;
        for i in 0..5 {
            let mut e = ev(Kind::ReclaimStall, 1);
            e.ts_ns = i;
            s.add(e);
        }
        assert_eq!(s.events.len(), 3);
        assert_eq!(s.drops.retention, 2);
        assert_eq!(s.events.front().unwrap().ts_ns, 2);
        assert_eq!(s.counts[&Kind::ReclaimStall], 5);
    }

    #[test]
    fn an_oom_kill_read_after_the_whole_call_is_gone_names_the_cgroup_noted_at_begin() {
        let mut s = SpanEvidence::new(1, None, "t".into(), 0);
        // pids that do not exist: victim and root were reaped before the
        // daemon read the kill from the ring buffer
        s.root_pid = Some(u32::MAX - 1);
        s.memory_cgroup = Some(("/agent-bridge/mcp-1-call-3".into(), Some(64 * 1024)));
        s.add(ev(Kind::OomVictim, u32::MAX - 2));
        let oom = s.events.back().unwrap();
        assert_eq!(oom.cgroup.as_deref(), Some("/agent-bridge/mcp-1-call-3"));
        assert_eq!(oom.memory_max_kb, Some(64 * 1024));
    }

    #[test]
    fn exit_and_signal_shape_process_facts() {
        let mut s = SpanEvidence::new(1, None, "t".into(), 0);
        let mut sig = ev(Kind::Signal, 7);
        sig.signal = Some("SIGSEGV".into());
        sig.sender_pid = Some(7);
        sig.sender_comm = Some("crash".into());
        s.add(sig);
        s.add(ev(Kind::Exit, 7));
        let p = &s.processes[&7];
        assert!(p.exited && p.failed());
        assert_eq!(p.signal.as_deref(), Some("SIGSEGV"));
    }

    #[test]
    fn a_socket_error_completes_the_non_blocking_connect_on_that_socket() {
        let mut s = SpanEvidence::new(1, None, "t".into(), 0);
        let connect = |fd: i64, addr: &str, ts: u64| {
            let mut c = ev(Kind::SyscallFailed, 7);
            c.syscall = Some("connect".into());
            c.syscall_nr = Some(42);
            c.errno = Some("EINPROGRESS".into());
            c.ret = Some(-115);
            c.fd = Some(fd);
            c.addr = Some(addr.into());
            c.ts_ns = ts;
            c
        };
        s.add(connect(5, "127.66.0.1:8080", 1_000_000));
        s.add(connect(6, "127.66.0.1:9090", 2_000_000));
        let mut err = ev(Kind::SyscallFailed, 7);
        err.syscall = Some("getsockopt".into());
        err.syscall_nr = Some(55);
        err.errno = Some("ECONNREFUSED".into());
        err.ret = Some(-111);
        err.fd = Some(5);
        err.via = Some("getsockopt(SO_ERROR)".into());
        err.ts_ns = 4_000_000;
        s.add(err.clone());
        let got = s.events.back().unwrap();
        assert_eq!(got.syscall.as_deref(), Some("connect"));
        assert_eq!(got.syscall_nr, Some(42));
        assert_eq!(
            got.addr.as_deref(),
            Some("127.66.0.1:8080"),
            "the connect on fd 5"
        );
        assert_eq!(got.duration_ns, Some(3_000_000));
        // no pending connect on that socket: it stays what it was
        err.fd = Some(9);
        s.add(err);
        assert_eq!(
            s.events.back().unwrap().syscall.as_deref(),
            Some("getsockopt")
        );
    }

    #[test]
    fn enospc_write_is_named_by_fd() {
        let mut s = SpanEvidence::new(1, None, "t".into(), 0);
        let mut open = ev(Kind::FileWrite, 3);
        open.ret = Some(4);
        open.path = Some("/mnt/small/blob".into());
        s.add(open);
        let mut write = ev(Kind::SyscallFailed, 3);
        write.syscall_nr = Some(1);
        write.fd = Some(4);
        write.ret = Some(-28);
        write.errno = Some("ENOSPC".into());
        s.add(write);
        assert_eq!(
            s.events.back().unwrap().path.as_deref(),
            Some("/mnt/small/blob")
        );
    }

    #[test]
    fn syscall_events_without_comm_are_named_from_exec_or_procfs() {
        let mut s = SpanEvidence::new(1, None, "t".into(), 0);
        let mut exec = ev(Kind::Exec, 7);
        exec.comm = "python3".into();
        s.add(exec);
        let mut fail = ev(Kind::SyscallFailed, 7);
        fail.comm.clear();
        s.add(fail);
        assert_eq!(s.events.back().unwrap().comm, "python3");
        // a process seen first by a failure (attached after its exec): procfs names it
        let me = std::process::id();
        let mut fail = ev(Kind::SyscallFailed, me);
        fail.comm.clear();
        s.add(fail);
        let own = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(s.events.back().unwrap().comm, own.trim_end());
        // a process gone before it was named stays unnamed, and is asked once
        let mut fail = ev(Kind::SyscallFailed, u32::MAX - 1);
        fail.comm.clear();
        s.add(fail);
        assert_eq!(s.events.back().unwrap().comm, "");
        assert!(s.unnamed.contains(&(u32::MAX - 1)));
    }

    #[test]
    fn repeats_are_credited_to_the_threads_matching_failure() {
        let mut s = SpanEvidence::new(1, None, "t".into(), 0);
        let failure = |tid: u32, nr: i64, ret: i64| {
            let mut e = ev(Kind::SyscallFailed, 7);
            e.tid = tid;
            e.syscall_nr = Some(nr);
            e.ret = Some(ret);
            e
        };
        s.add(failure(7, 257, -2));
        s.add(failure(8, 257, -2)); // another thread, same failure
        let mut rep = ev(Kind::Repeated, 7);
        rep.syscall_nr = Some(257);
        rep.ret = Some(-2);
        rep.repeats = Some(41);
        s.add(rep);
        s.add_pending(&[crate::loader::PendingRepeats {
            tid: 7,
            syscall: 257,
            ret: -2,
            repeats: 8,
        }]);
        assert_eq!(s.events.len(), 2, "a Repeated event is credited, not kept");
        assert_eq!(s.events[0].repeats, Some(49));
        assert_eq!(s.events[1].repeats, None);
        assert_eq!(s.counts[&Kind::Repeated], 49);
    }
}
