//! Loader: checks the machine, loads the embedded eBPF object, attaches the
//! tracepoints, and hands out the maps (`TASKS`, `EVENTS`, `DROPS`).

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, TracePoint},
};
use probe_abi::{EVENT_KINDS, TaskState, slot, task};

use crate::tracefs;

/// The eBPF object, built by build.rs and embedded in the binary.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probe"));

/// (program name in the object, tracepoint category, tracepoint name, required).
/// The two syscall programs are BTF tracepoints (raw tracepoints typed by
/// kernel BTF) on the same tracepoints: they get `pt_regs` (arguments of a
/// syscall seccomp stopped), skip the perf-record copy, and read registers
/// with plain loads instead of a helper call each. Reclaim is timed from
/// two optional pairs: direct reclaim (the machine short of memory) and
/// memory-cgroup reclaim (a cgroup at its limit, which never enters direct
/// reclaim).
const PROGRAMS: [(&str, &str, &str, bool); 11] = [
    ("sys_enter", "raw_syscalls", "sys_enter", true),
    ("sys_exit", "raw_syscalls", "sys_exit", true),
    ("sched_process_fork", "sched", "sched_process_fork", true),
    ("sched_process_exec", "sched", "sched_process_exec", true),
    ("sched_process_exit", "sched", "sched_process_exit", true),
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
];

/// Why the probe could not start. Each message says what is missing and
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
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

/// Loaded and attached programs. Dropping it detaches everything.
pub struct Probe {
    /// Keeps programs and links alive.
    _ebpf: Ebpf,
    tracked: Array<MapData, u64>,
    tasks: HashMap<MapData, u32, TaskState>,
    events: RingBuf<MapData>,
    drops: PerCpuArray<MapData, probe_abi::DropCounters>,
    /// Tracepoints attached, as `category:name`.
    pub attached: Vec<String>,
    /// Optional tracepoints this kernel lacks.
    pub missing: Vec<String>,
}

/// Effective capabilities from /proc/self/status.
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Attaches only the empty `floor_enter`/`floor_exit` programs to the
/// syscall tracepoints, for the benchmark's floor: the cost of any program
/// there, paid by every task of the machine. Detached when dropped.
pub fn attach_floor() -> Result<Ebpf, LoadError> {
    let btf = kernel_btf()?;
    let mut ebpf = EbpfLoader::new()
        .load(EBPF_OBJECT)
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

impl Probe {
    /// Checks privileges and tracefs, loads the object and attaches all
    /// programs.
    pub fn load() -> Result<Probe, LoadError> {
        const CAP_SYS_ADMIN: u64 = 1 << 21;
        const CAP_PERFMON: u64 = 1 << 38;
        const CAP_BPF: u64 = 1 << 39;
        let caps = effective_caps();
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
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("TRACKED", pid_max)
            .load(EBPF_OBJECT)
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
        let btf = kernel_btf()?;
        let mut attached = Vec::new();
        for (prog, cat, name, _) in PROGRAMS {
            if missing.contains(&format!("{cat}:{name}")) {
                continue;
            }
            let what = format!("{cat}:{name}");
            let program = ebpf
                .program_mut(prog)
                .ok_or_else(|| LoadError::Load(format!("program {prog} missing from object")))?;
            let attach_err =
                |e: aya::programs::ProgramError| LoadError::Attach(what.clone(), error_chain(&e));
            if cat == "raw_syscalls" {
                let program: &mut BtfTracePoint = program.try_into().map_err(attach_err)?;
                program.load(name, &btf).map_err(attach_err)?;
                program.attach().map_err(attach_err)?;
            } else {
                let program: &mut TracePoint = program.try_into().map_err(attach_err)?;
                program.load().map_err(attach_err)?;
                program.attach(cat, name).map_err(attach_err)?;
            }
            attached.push(what);
        }
        let tracked = Array::try_from(ebpf.take_map("TRACKED").ok_or(LoadError::Map("TRACKED"))?)
            .map_err(|e| LoadError::Load(e.to_string()))?;
        let tasks = HashMap::try_from(ebpf.take_map("TASKS").ok_or(LoadError::Map("TASKS"))?)
            .map_err(|e| LoadError::Load(e.to_string()))?;
        let events = RingBuf::try_from(ebpf.take_map("EVENTS").ok_or(LoadError::Map("EVENTS"))?)
            .map_err(|e| LoadError::Load(e.to_string()))?;
        let drops = PerCpuArray::try_from(ebpf.take_map("DROPS").ok_or(LoadError::Map("DROPS"))?)
            .map_err(|e| LoadError::Load(e.to_string()))?;
        Ok(Probe {
            _ebpf: ebpf,
            tracked,
            tasks,
            events,
            drops,
            attached,
            missing,
        })
    }

    /// Starts tracing `pid` (and, in the kernel, everything it forks) as
    /// part of `span` (1..=u32::MAX: the kernel keeps span ids in 32 bits).
    /// Call it while `pid` is blocked before exec.
    pub fn track(&mut self, pid: u32, span: u64) -> Result<(), aya::maps::MapError> {
        let mut flags = task::SKIP_ORPHAN_EXIT;
        if seccomp_mode(pid).unwrap_or(0) != 0 {
            flags |= task::SECCOMP_ON;
        }
        let span32 = u32::try_from(span)
            .ok()
            .filter(|&s| s != 0)
            .ok_or(aya::maps::MapError::KeyNotFound)?;
        self.tasks.insert(pid, TaskState::new(span), 0)?;
        self.tracked.set(pid, slot::pack(span32, flags), 0)
    }

    /// Stops tracing every task of `span` (descendants that outlive it).
    /// Returns their counts of repeated failures not sent yet.
    pub fn untrack_span(&mut self, span: u64) -> Vec<PendingRepeats> {
        let stale: Vec<u32> = self
            .tasks
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, st)| st.span == span)
            .map(|(tid, _)| tid)
            .collect();
        self.untrack(stale)
    }

    /// Threads currently traced.
    pub fn tracked_tasks(&self) -> usize {
        self.tasks.keys().count()
    }

    /// The ring buffer, to poll and drain.
    pub fn events(&mut self) -> &mut RingBuf<MapData> {
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
    pub fn untrack(&mut self, tids: impl IntoIterator<Item = u32>) -> Vec<PendingRepeats> {
        let mut pending = Vec::new();
        for tid in tids {
            let _ = self.tracked.set(tid, 0, 0);
            // a thread that outlives its span: its run of identical failures
            // was counted in the kernel but not sent (that happens at exit)
            if let Ok(st) = self.tasks.get(&tid, 0)
                && st.repeats > 0
            {
                pending.push(PendingRepeats {
                    tid,
                    syscall: st.last.nr,
                    ret: st.last.ret,
                    repeats: st.repeats,
                });
            }
            let _ = self.tasks.remove(&tid);
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
        let own: Vec<u32> = tids
            .into_iter()
            .filter(|tid| match self.tracked.get(tid, 0) {
                Ok(v) => v == 0 || u64::from(slot::span(v)) == span,
                Err(_) => true,
            })
            .collect();
        self.untrack(own)
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
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
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
