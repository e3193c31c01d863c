//! Loader: checks the machine, loads the embedded eBPF object, attaches the
//! tracepoints, and hands out the maps (`TASKS`, `EVENTS`, `DROPS`).

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, TracePoint, tp_btf::BtfTracePointLink, trace_point::TracePointLink},
};
use probe_abi::{EVENT_KINDS, TaskState, UringReq, slot, task};

use crate::tracefs;

/// The eBPF object, built by build.rs and embedded in the binary (empty in
/// a build with `AYA_BUILD_SKIP=1`, for checks and lints only).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probe"));

/// The embedded object, or why there is none.
fn object() -> Result<&'static [u8], LoadError> {
    if EBPF_OBJECT.is_empty() {
        return Err(LoadError::Load(
            "this probe was built with AYA_BUILD_SKIP=1 and has no eBPF programs: \
             rebuild it without that variable (`cargo xtask setup` installs the eBPF toolchain)"
                .into(),
        ));
    }
    Ok(EBPF_OBJECT)
}

/// (program name in the object, tracepoint category, tracepoint name, required).
/// The two syscall programs are BTF tracepoints (raw tracepoints typed by
/// kernel BTF) on the same tracepoints: they get `pt_regs` (arguments of a
/// syscall seccomp stopped), skip the perf-record copy, and read registers
/// with plain loads instead of a helper call each. Reclaim is timed from
/// two optional pairs: direct reclaim (the machine short of memory) and
/// memory-cgroup reclaim (a cgroup at its limit, which never enters direct
/// reclaim).
/// io_uring requests of traced tasks are followed from submission to
/// completion (optional: kernels without io_uring lack the tracepoints).
pub const PROGRAMS: [(&str, &str, &str, bool); 14] = [
    // exit first: the syscall programs trust their per-CPU task cache only
    // while it invalidates it
    ("sched_process_exit", "sched", "sched_process_exit", true),
    ("sys_enter", "raw_syscalls", "sys_enter", true),
    ("sys_exit", "raw_syscalls", "sys_exit", true),
    ("sched_process_fork", "sched", "sched_process_fork", true),
    ("sched_process_exec", "sched", "sched_process_exec", true),
    ("signal_generate", "signal", "signal_generate", true),
    ("mark_victim", "oom", "mark_victim", true),
    (
        "direct_reclaim_begin",
        "vmscan",
        "mm_vmscan_direct_reclaim_begin",
        false,
    ),
    (
        "direct_reclaim_end",
        "vmscan",
        "mm_vmscan_direct_reclaim_end",
        false,
    ),
    (
        "memcg_reclaim_begin",
        "vmscan",
        "mm_vmscan_memcg_reclaim_begin",
        false,
    ),
    (
        "memcg_reclaim_end",
        "vmscan",
        "mm_vmscan_memcg_reclaim_end",
        false,
    ),
    ("uring_submit_req", "io_uring", "io_uring_submit_req", false),
    ("uring_complete", "io_uring", "io_uring_complete", false),
    ("uring_req_failed", "io_uring", "io_uring_req_failed", false),
];

/// Why the probe could not start. Each message says what is missing and
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// This kernel cannot run tracing programs at all: the sentence says
    /// what is missing or what the sandbox is.
    #[error("{0}")]
    Unsupported(String),
    /// Not root and without the capabilities eBPF tracing needs.
    #[error(
        "cannot load eBPF programs: permission denied (run as root, or grant \
         CAP_BPF+CAP_PERFMON+CAP_SYS_RESOURCE; effective uid is {0})"
    )]
    NotPermitted(u32),
    /// tracefs or a tracepoint is missing.
    #[error(transparent)]
    Tracefs(#[from] tracefs::TracefsError),
    /// The kernel refused the object (verifier, BTF, map creation).
    #[error("the kernel refused the probe's eBPF object: {0}")]
    Load(String),
    /// Attaching one tracepoint failed.
    #[error("cannot attach {0}: {1}")]
    Attach(String, String),
    /// A map the object should contain is missing: binary and object disagree.
    #[error("the embedded eBPF object has no map `{0}` (rebuild the probe)")]
    Map(&'static str),
}

/// An attached program's link, owned here so that dropping it detaches.
enum Link {
    Classic(#[allow(dead_code)] TracePointLink),
    Btf(#[allow(dead_code)] BtfTracePointLink),
}

/// Loaded and attached programs. Dropping it detaches everything.
pub struct Probe {
    /// Keeps the programs and maps alive.
    _ebpf: Ebpf,
    /// Dropped first, all at once (see `Drop`).
    links: Vec<Link>,
    tracked: Array<MapData, u64>,
    tasks: HashMap<MapData, u32, TaskState>,
    /// Set when the probe runs in a PID namespace other than the host's:
    /// the ids userspace hands in and gets back are that namespace's.
    pidns: Option<PidNamespace>,
    pending: HashMap<MapData, u32, u64>,
    pending_any: Array<MapData, u64>,
    events: RingBuf<MapData>,
    drops: PerCpuArray<MapData, probe_abi::DropCounters>,
    uring_reqs: HashMap<MapData, u64, UringReq>,
    cgroup_spans: HashMap<MapData, u64, u64>,
    cgroup_any: Array<MapData, u64>,
    /// Tracepoints attached, as `category:name`.
    pub attached: Vec<String>,
    /// Optional tracepoints this kernel lacks.
    pub missing: Vec<String>,
    /// How the syscall programs are attached.
    pub rung: Rung,
    /// Why the probe is on a lower rung than the kernel seemed to offer
    /// (the kernel refused the BTF programs), or None.
    pub fell_back: Option<String>,
}

/// How the syscall programs attach: the rungs of the ladder the loader
/// climbs down until the kernel accepts the programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rung {
    /// BTF tracepoints (`tp_btf`) on raw_syscalls: typed `pt_regs`, no
    /// record copy. Needs the kernel's own BTF (/sys/kernel/btf/vmlinux).
    Btf,
    /// Classic tracepoints on raw_syscalls, fields at the offsets of their
    /// tracefs formats; a traced thread's arguments are saved at the enter.
    /// Needs no BTF at all.
    Tracepoint,
}

impl Rung {
    pub fn name(self) -> &'static str {
        match self {
            Rung::Btf => "btf",
            Rung::Tracepoint => "tracepoint",
        }
    }

    /// What this rung cannot see that the top one does, in one sentence.
    pub fn cannot_see(self) -> Option<&'static str> {
        match self {
            Rung::Btf => None,
            Rung::Tracepoint => Some(crate::preflight::TRACEPOINT_RUNG_CANNOT_SEE),
        }
    }

    /// The object's programs for raw_syscalls:sys_enter and sys_exit.
    fn syscall_programs(self) -> (&'static str, &'static str) {
        match self {
            Rung::Btf => ("sys_enter", "sys_exit"),
            Rung::Tracepoint => ("sys_enter_tp", "sys_exit_tp"),
        }
    }
}

/// The PID namespace the probe runs in, when it is not the host's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PidNamespace {
    pub dev: u64,
    pub ino: u64,
}

impl PidNamespace {
    /// The kernel's fixed inode number of the initial PID namespace
    /// (`PROC_PID_INIT_INO`).
    const HOST_INO: u64 = 0xEFFF_FFFC;

    /// This process's PID namespace, or None in the host's. Pids in
    /// `/proc` and in every request are this namespace's; the kernel's
    /// tracepoints speak host pids, so the programs translate.
    pub fn current() -> std::io::Result<Option<PidNamespace>> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata("/proc/self/ns/pid")?;
        Ok((meta.ino() != Self::HOST_INO).then(|| PidNamespace {
            dev: meta.dev(),
            ino: meta.ino(),
        }))
    }
}

/// Attaches only the empty `floor_enter`/`floor_exit` programs to the
/// syscall tracepoints, for the benchmark's floor: the cost of any program
/// there, paid by every task of the machine. Detached when dropped.
pub fn attach_floor() -> Result<Ebpf, LoadError> {
    let btf = kernel_btf()?;
    let mut ebpf = EbpfLoader::new()
        .load(object()?)
        .map_err(|e| LoadError::Load(error_chain(&e)))?;
    for (prog, name) in [("floor_enter", "sys_enter"), ("floor_exit", "sys_exit")] {
        let what = format!("raw_syscalls:{name}");
        let attach_err =
            |e: aya::programs::ProgramError| LoadError::Attach(what.clone(), error_chain(&e));
        let program: &mut BtfTracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| LoadError::Load(format!("program {prog} missing from object")))?
            .try_into()
            .map_err(attach_err)?;
        program.load(name, &btf).map_err(attach_err)?;
        program.attach().map_err(attach_err)?;
    }
    Ok(ebpf)
}

/// The kernel's own BTF, which types the syscall programs' `pt_regs`.
fn kernel_btf() -> Result<aya::Btf, LoadError> {
    aya::Btf::from_sys_fs().map_err(|e| {
        LoadError::Load(format!(
            "kernel BTF is missing or unreadable at /sys/kernel/btf/vmlinux ({e}); \
             the probe needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (5.5 or newer)"
        ))
    })
}

impl Drop for Probe {
    /// Detaching one tracepoint program waits for a grace period, and the
    /// kernel does them one at a time under a mutex: 14 dropped one after
    /// another took 0.9 s here, dropped from threads of their own (all
    /// queued at once) 0.46 s. `probe trace` does not wait even for that
    /// ([`Probe::detach_after_exit`]).
    fn drop(&mut self) {
        let links = std::mem::take(&mut self.links);
        std::thread::scope(|scope| {
            for link in links {
                scope.spawn(move || drop(link));
            }
        });
    }
}

impl Probe {
    /// Says on stderr when the probe runs on a rung that sees less, and why.
    pub fn warn_if_lower_rung(&self) {
        if let Some(cannot_see) = self.rung.cannot_see() {
            let why = self.fell_back.as_deref().unwrap_or("no kernel BTF");
            tracing::warn!("on the {} rung ({why}): {cannot_see}", self.rung.name());
        }
    }

    /// Detaches for a command-line run that is about to exit, without
    /// making it wait: the kernel detaches tracepoint programs one after
    /// another, each after a grace period (~35 ms here, under a mutex, so
    /// threads do not overlap them: 14 programs, ~0.45 s). A forked child
    /// holds the last references until this process has exited, then exits
    /// itself and does that work in its own exit; this process's closes
    /// are only reference drops. Call it last, just before exiting.
    pub fn detach_after_exit(self) {
        // The child must hold its references until this process is gone:
        // it waits for EOF on a pipe whose write end only this one holds.
        let mut pipe = [0i32; 2];
        // SAFETY: pipe(2) into a two-int array.
        let piped = unsafe { libc::pipe(pipe.as_mut_ptr()) } == 0;
        // SAFETY: fork(2); the child only calls close(2), read(2) and
        // _exit(2), which are async-signal-safe (this process may have
        // threads).
        let pid = if piped { unsafe { libc::fork() } } else { -1 };
        if pid == 0 {
            // SAFETY: as above.
            unsafe {
                // nobody waits on its output: a pipe reader sees EOF when
                // this process exits, not when the child does
                libc::close(0);
                libc::close(1);
                libc::close(2);
                libc::close(pipe[1]);
                let mut byte = 0u8;
                while libc::read(pipe[0], (&raw mut byte).cast(), 1) < 0 {}
                libc::_exit(0);
            }
        }
        if pid < 0 {
            // no child: the whole detach happens here
            drop(self);
            return;
        }
        // SAFETY: the read end is the child's.
        unsafe { libc::close(pipe[0]) };
        // Not dropped: aya's links detach actively (a perf event is
        // disabled by ioctl before its close), which would wait here for
        // the grace periods. This process exits next; its exit closes the
        // fds, only dropping references the child still holds.
        std::mem::forget(self);
    }

    /// Checks privileges and tracefs, loads the object and attaches all
    /// programs on the highest rung the kernel accepts: BTF tracepoints
    /// where it has BTF, else (or when it refuses them) classic ones.
    pub fn load() -> Result<Probe, LoadError> {
        if let Some(reason) = crate::preflight::cannot_run() {
            return Err(LoadError::Unsupported(reason));
        }
        let btf = if crate::preflight::btf_switched_off() {
            None
        } else {
            aya::Btf::from_sys_fs().ok()
        };
        let Some(btf) = btf else {
            return Self::load_on(Rung::Tracepoint, None);
        };
        match Self::load_on(Rung::Btf, Some(&btf)) {
            Err(LoadError::Attach(what, why)) if what.starts_with("raw_syscalls:") => {
                let mut probe = Self::load_on(Rung::Tracepoint, None)?;
                probe.fell_back = Some(format!(
                    "the kernel refused the BTF program on {what} ({}); on the tracepoint rung",
                    why.lines().last().unwrap_or(&why).trim()
                ));
                Ok(probe)
            }
            other => other,
        }
    }

    fn load_on(rung: Rung, btf: Option<&aya::Btf>) -> Result<Probe, LoadError> {
        const CAP_SYS_ADMIN: u64 = 1 << 21;
        const CAP_PERFMON: u64 = 1 << 38;
        const CAP_BPF: u64 = 1 << 39;
        let caps = crate::preflight::effective_caps();
        let euid = nix::unistd::geteuid().as_raw();
        if caps & CAP_SYS_ADMIN == 0 && caps & (CAP_BPF | CAP_PERFMON) != (CAP_BPF | CAP_PERFMON) {
            return Err(LoadError::NotPermitted(euid));
        }
        let root = tracefs::root()?;
        let mut missing = Vec::new();
        for (_, cat, name, required) in PROGRAMS {
            let tp = format!("{cat}/{name}");
            if !root.join("events").join(&tp).is_dir() {
                if required {
                    return Err(
                        tracefs::TracefsError::Missing(tp, "not in tracefs events".into()).into(),
                    );
                }
                missing.push(format!("{cat}:{name}"));
            }
        }
        let offsets = tracefs::offsets(&root)?;

        // TRACKED is indexed by thread id
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(4_194_304);
        let pidns = PidNamespace::current()
            .map_err(|e| LoadError::Load(format!("reading /proc/self/ns/pid: {e}")))?;
        let (ns_dev, ns_ino) = pidns.map_or((0, 0), |ns| (ns.dev, ns.ino));
        // 0 (not found) makes the programs call bpf_get_current_pid_tgid
        let task_ids = match rung {
            Rung::Btf => crate::btf::task_id_offsets(),
            Rung::Tracepoint => None,
        };
        let (pid_at, tgid_at) =
            task_ids.map_or((0u64, 0u64), |o| (u64::from(o.pid), u64::from(o.tgid)));
        // the tracepoint rung saves a traced thread's arguments per thread
        let saved_args = match rung {
            Rung::Btf => 1,
            Rung::Tracepoint => 65536,
        };
        // RECORD is indexed by CPU number
        let cpus = aya::util::nr_cpus().map_err(|(path, e)| {
            LoadError::Load(format!("reading the possible CPUs from {path}: {e}"))
        })? as u32;
        let mut ebpf = EbpfLoader::new()
            // parsed once, by `load` (aya would read and parse it again)
            .btf(btf)
            .map_max_entries("TRACKED", pid_max)
            .map_max_entries("RECORD", cpus)
            .map_max_entries("ARGS", saved_args)
            .override_global("PIDNS_DEV", &ns_dev, true)
            .override_global("PIDNS_INO", &ns_ino, true)
            .override_global("TASK_PID_OFFSET", &pid_at, true)
            .override_global("TASK_TGID_OFFSET", &tgid_at, true)
            .load(object()?)
            .map_err(|e| match e {
                aya::EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. })
                    if io_error.raw_os_error() == Some(libc::EPERM) =>
                {
                    LoadError::NotPermitted(euid)
                }
                other => LoadError::Load(error_chain(&other)),
            })?;
        {
            let map = ebpf.map_mut("OFFSETS").ok_or(LoadError::Map("OFFSETS"))?;
            let mut arr: Array<&mut MapData, probe_abi::Offsets> =
                Array::try_from(map).map_err(|e| LoadError::Load(e.to_string()))?;
            arr.set(0, offsets, 0)
                .map_err(|e| LoadError::Load(e.to_string()))?;
        }
        let (enter_prog, exit_prog) = rung.syscall_programs();
        let mut attached = Vec::new();
        let mut links = Vec::new();
        for (prog, cat, name, _) in PROGRAMS {
            let prog = match prog {
                "sys_enter" => enter_prog,
                "sys_exit" => exit_prog,
                other => other,
            };
            if missing.contains(&format!("{cat}:{name}")) {
                continue;
            }
            let what = format!("{cat}:{name}");
            let program = ebpf
                .program_mut(prog)
                .ok_or_else(|| LoadError::Load(format!("program {prog} missing from object")))?;
            let attach_err =
                |e: aya::programs::ProgramError| LoadError::Attach(what.clone(), error_chain(&e));
            if let (Some(btf), "raw_syscalls") = (btf, cat) {
                let program: &mut BtfTracePoint = program.try_into().map_err(attach_err)?;
                program.load(name, btf).map_err(attach_err)?;
                let id = program.attach().map_err(attach_err)?;
                links.push(Link::Btf(program.take_link(id).map_err(attach_err)?));
            } else {
                let program: &mut TracePoint = program.try_into().map_err(attach_err)?;
                program.load().map_err(attach_err)?;
                let id = program.attach(cat, name).map_err(attach_err)?;
                links.push(Link::Classic(program.take_link(id).map_err(attach_err)?));
            }
            attached.push(what);
        }
        let tracked = Array::try_from(ebpf.take_map("TRACKED").ok_or(LoadError::Map("TRACKED"))?)
            .map_err(|e| LoadError::Load(e.to_string()))?;
        let tasks = HashMap::try_from(ebpf.take_map("TASKS").ok_or(LoadError::Map("TASKS"))?)
            .map_err(|e| LoadError::Load(e.to_string()))?;
        let pending = HashMap::try_from(ebpf.take_map("PENDING").ok_or(LoadError::Map("PENDING"))?)
            .map_err(|e| LoadError::Load(e.to_string()))?;
        let pending_any = Array::try_from(
            ebpf.take_map("PENDING_ANY")
                .ok_or(LoadError::Map("PENDING_ANY"))?,
        )
        .map_err(|e| LoadError::Load(e.to_string()))?;
        let events = RingBuf::try_from(ebpf.take_map("EVENTS").ok_or(LoadError::Map("EVENTS"))?)
            .map_err(|e| LoadError::Load(e.to_string()))?;
        let drops = PerCpuArray::try_from(ebpf.take_map("DROPS").ok_or(LoadError::Map("DROPS"))?)
            .map_err(|e| LoadError::Load(e.to_string()))?;
        let uring_reqs = HashMap::try_from(
            ebpf.take_map("URING_REQS")
                .ok_or(LoadError::Map("URING_REQS"))?,
        )
        .map_err(|e| LoadError::Load(e.to_string()))?;
        let cgroup_spans = HashMap::try_from(
            ebpf.take_map("CGROUP_SPANS")
                .ok_or(LoadError::Map("CGROUP_SPANS"))?,
        )
        .map_err(|e| LoadError::Load(e.to_string()))?;
        let cgroup_any = Array::try_from(
            ebpf.take_map("CGROUP_ANY")
                .ok_or(LoadError::Map("CGROUP_ANY"))?,
        )
        .map_err(|e| LoadError::Load(e.to_string()))?;
        Ok(Probe {
            _ebpf: ebpf,
            links,
            tracked,
            tasks,
            cgroup_spans,
            cgroup_any,
            pidns,
            pending,
            pending_any,
            events,
            drops,
            uring_reqs,
            attached,
            missing,
            rung,
            fell_back: None,
        })
    }

    /// The PID namespace the probe runs in, when not the host's.
    pub fn pid_namespace(&self) -> Option<PidNamespace> {
        self.pidns
    }

    /// Starts tracing `pid` (and, in the kernel, everything it forks) as
    /// part of `span` (1..=u32::MAX: the kernel keeps span ids in 32 bits).
    /// Call it while `pid` is blocked before exec.
    ///
    /// In a PID namespace `pid` is that namespace's: the thread is handed
    /// to the kernel through `PENDING` and traced from its next syscall
    /// enter or exit (a blocked thread, from the moment its syscall returns).
    pub fn track(&mut self, pid: u32, span: u64) -> Result<(), aya::maps::MapError> {
        self.track_with_seccomp(pid, span, seccomp_mode(pid).unwrap_or(0))
    }

    /// [`Probe::track`] for a caller that has read `pid`'s seccomp mode
    /// (`Seccomp:` of its status) already.
    pub fn track_with_seccomp(
        &mut self,
        pid: u32,
        span: u64,
        seccomp: u32,
    ) -> Result<(), aya::maps::MapError> {
        let mut flags = task::SKIP_ORPHAN_EXIT;
        if seccomp != 0 {
            flags |= task::SECCOMP_ON;
        }
        let span32 = u32::try_from(span)
            .ok()
            .filter(|&s| s != 0)
            .ok_or(aya::maps::MapError::KeyNotFound)?;
        if self.pidns.is_none() {
            self.tasks.insert(pid, TaskState::new(span), 0)?;
            return self.tracked.set(pid, slot::pack(span32, flags), 0);
        }
        // already traced (by another span): move it, by its host id
        if let Some(host) = self.host_ids().get(&pid).copied() {
            if let Ok(mut st) = self.tasks.get(&host, 0) {
                st.span = span;
                self.tasks.insert(host, st, 0)?;
            }
            let old = self.tracked.get(&host, 0).unwrap_or(0);
            // as on the host: the syscall it may be in was entered under the
            // old slot, so its exit is allowed to come without an enter
            let keep = slot::flags(old) & task::SECCOMP_ON;
            return self.tracked.set(host, slot::pack(span32, keep | flags), 0);
        }
        self.pending.insert(pid, slot::pack(span32, flags), 0)?;
        self.pending_any.set(0, 1, 0)
    }

    /// From now on, a task that forks or execs in cgroup `id` (v2) joins
    /// `span` in the kernel; the tasks already in it are attached by the
    /// caller ([`crate::cgroup::Cgroup::threads`]). Host PID namespace only.
    pub fn follow_cgroup(&mut self, id: u64, span: u64) -> Result<(), aya::maps::MapError> {
        self.cgroup_spans.insert(id, span, 0)?;
        self.cgroup_any.set(0, 1, 0)
    }

    /// Stops following cgroup `id` for `span` (its traced tasks stay the
    /// span's until the span is untracked). A later span that follows the
    /// same cgroup (an overlapping call, a span kept between calls) keeps it.
    pub fn unfollow_cgroup(&mut self, id: u64, span: u64) {
        if self
            .cgroup_spans
            .get(&id, 0)
            .is_ok_and(|owner| owner == span)
        {
            let _ = self.cgroup_spans.remove(&id);
        }
        if self.cgroup_spans.keys().next().is_none() {
            let _ = self.cgroup_any.set(0, 0, 0);
        }
    }

    /// PID-namespace mode: namespace thread id → host thread id of every
    /// thread the kernel traces (one walk of `TASKS`).
    fn host_ids(&self) -> std::collections::HashMap<u32, u32> {
        self.tasks
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, st)| st.ns_ids as u32 != 0)
            .map(|(host, st)| (st.ns_ids as u32, host))
            .collect()
    }

    /// Stops tracing every task of `span` (descendants that outlive it).
    /// Returns their counts of repeated failures not sent yet.
    pub fn untrack_span(&mut self, span: u64) -> Vec<PendingRepeats> {
        let stale: Vec<(u32, u32)> = self
            .tasks
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, st)| st.span == span)
            .map(|(host, st)| (host, self.reported(host, &st)))
            .collect();
        let never_seen: Vec<u32> = self
            .pending
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, v)| u64::from(slot::span(*v)) == span)
            .map(|(tid, _)| tid)
            .collect();
        for tid in never_seen {
            let _ = self.pending.remove(&tid);
        }
        self.untrack_hosts(stale)
    }

    /// The id a traced thread is reported under: its host id, or in a PID
    /// namespace its id there.
    fn reported(&self, host: u32, st: &TaskState) -> u32 {
        if self.pidns.is_some() {
            st.ns_ids as u32
        } else {
            host
        }
    }

    /// The ring buffer is drained: a good moment to tell the kernel that
    /// every pending attach was adopted, so untraced threads stop looking.
    fn settle_pending(&mut self) {
        if self.pidns.is_some()
            && self.pending_any.get(&0, 0).unwrap_or(0) != 0
            && self.pending.keys().next().is_none()
        {
            let _ = self.pending_any.set(0, 0, 0);
        }
    }

    /// Threads currently traced.
    pub fn tracked_tasks(&self) -> usize {
        self.tasks.keys().count()
    }

    /// The ring buffer, to poll and drain.
    pub fn events(&mut self) -> &mut RingBuf<MapData> {
        self.settle_pending();
        &mut self.events
    }

    /// Kernel drop counters summed over CPUs, indexed by `probe_abi::EventKind`
    /// (one map lookup).
    pub fn drops(&self) -> [u64; EVENT_KINDS as usize] {
        let mut out = [0u64; EVENT_KINDS as usize];
        if let Ok(per_cpu) = self.drops.get(&0, 0) {
            for cpu in per_cpu.iter() {
                for (total, n) in out.iter_mut().zip(cpu.by_kind.iter()) {
                    *total += n;
                }
            }
        }
        out
    }

    /// Stops tracing the given threads of a span (the ones its events named).
    /// The ids are the ones events report (namespace ids in a PID namespace).
    pub fn untrack(&mut self, tids: impl IntoIterator<Item = u32>) -> Vec<PendingRepeats> {
        let hosts = self.host_pairs(tids, None);
        self.untrack_hosts(hosts)
    }

    /// (host id, reported id) of the given reported ids that the kernel
    /// traces; in a PID namespace, attaches it never adopted are dropped
    /// (only `span`'s, when given: a later span may have attached it since).
    fn host_pairs(
        &mut self,
        tids: impl IntoIterator<Item = u32>,
        span: Option<u64>,
    ) -> Vec<(u32, u32)> {
        if self.pidns.is_none() {
            return tids.into_iter().map(|t| (t, t)).collect();
        }
        let hosts = self.host_ids();
        let mut out = Vec::new();
        for tid in tids {
            match hosts.get(&tid) {
                Some(&host) => out.push((host, tid)),
                None => {
                    let mine = match (span, self.pending.get(&tid, 0)) {
                        (Some(span), Ok(v)) => u64::from(slot::span(v)) == span,
                        (None, Ok(_)) => true,
                        (_, Err(_)) => false,
                    };
                    if mine {
                        let _ = self.pending.remove(&tid);
                    }
                }
            }
        }
        out
    }

    fn untrack_hosts(&mut self, hosts: Vec<(u32, u32)>) -> Vec<PendingRepeats> {
        let mut pending = Vec::new();
        for (host, tid) in hosts {
            let _ = self.tracked.set(host, 0, 0);
            // a thread that outlives its span: its run of identical failures
            // was counted in the kernel but not sent (that happens at exit)
            if let Ok(st) = self.tasks.get(&host, 0)
                && st.repeats > 0
            {
                pending.push(PendingRepeats {
                    tid,
                    syscall: st.last.nr,
                    ret: st.last.ret,
                    repeats: st.repeats,
                });
            }
            let _ = self.tasks.remove(&host);
        }
        pending
    }

    /// [`Probe::untrack`] for the threads among `tids` that `span` still
    /// traces: a thread another span has since taken over stays traced.
    pub fn untrack_own(
        &mut self,
        span: u64,
        tids: impl IntoIterator<Item = u32>,
    ) -> Vec<PendingRepeats> {
        let hosts = self.host_pairs(tids, Some(span));
        let own: Vec<(u32, u32)> = hosts
            .into_iter()
            .filter(|(host, _)| match self.tracked.get(host, 0) {
                Ok(v) => v == 0 || u64::from(slot::span(v)) == span,
                Err(_) => true,
            })
            .collect();
        self.untrack_hosts(own)
    }

    /// Forgets io_uring requests of spans that are no longer open: ones
    /// that never post a completion (IOSQE_CQE_SKIP_SUCCESS, a ring torn
    /// down by a kernel worker) would otherwise hold their map entry for
    /// good. Returns how many were forgotten.
    pub fn forget_uring_requests(&mut self, open: impl Fn(u64) -> bool) -> usize {
        let stale: Vec<u64> = self
            .uring_reqs
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, r)| !open(r.span))
            .map(|(req, _)| req)
            .collect();
        for req in &stale {
            let _ = self.uring_reqs.remove(req);
        }
        stale.len()
    }

    /// Spans that still have traced threads, with how many.
    pub fn tracked_spans(&self) -> std::collections::HashMap<u64, usize> {
        let mut out = std::collections::HashMap::new();
        for (_, st) in self.tasks.iter().filter_map(Result::ok) {
            *out.entry(st.span).or_default() += 1;
        }
        out
    }
}

/// Identical failures a thread repeated after its last SyscallFailed event,
/// counted in the kernel and not sent when its tracing stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingRepeats {
    pub tid: u32,
    pub syscall: i64,
    pub ret: i64,
    pub repeats: u64,
}

/// `Seccomp:` of /proc/PID/status: 0 none, 1 strict, 2 filter.
pub fn seccomp_mode(pid: u32) -> Option<u32> {
    seccomp_mode_in(&read_proc(format!("/proc/{pid}/status"))?)
}

/// `Seccomp:` of a /proc/PID/status text already read.
pub fn seccomp_mode_in(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A small /proc file (at most 16 KiB), read in one or two read(2)s:
/// `fs::read_to_string` sizes the buffer by stat (0 for /proc) and then
/// grows it from 32 bytes, a read per doubling. Asked at every span begin.
pub fn read_proc(path: impl AsRef<std::path::Path>) -> Option<String> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(got) => n += got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    buf.truncate(n);
    String::from_utf8(buf).ok()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}
