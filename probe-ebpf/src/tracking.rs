//! Which threads are traced, and as which span: `TRACKED` and `TASKS`,
//! pid namespaces, followed cgroups, and the ids the programs report.

use super::*;

/// tid → packed span/flags/syscall-in-flight (`probe_abi::slot`; 0: untracked). An array, sized to pid_max by userspace,
/// because its lookup is inlined by the verifier: the whole cost an
/// untracked thread pays per syscall.
#[map]
pub(crate) static TRACKED: Array<u64> = Array::with_max_entries(32768, 0);

/// tid → per-thread state, for tracked threads only.
#[map]
pub(crate) static TASKS: HashMap<u32, TaskState> = HashMap::with_max_entries(65536, 0);

#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(8 * 1024 * 1024, 0);

#[map]
pub(crate) static DROPS: PerCpuArray<DropCounters> = PerCpuArray::with_max_entries(1, 0);

/// tgid → code passed to exit/exit_group. Per process, not per thread:
/// the thread that exits last (and fires the group-dead exit) is often not
/// the one that called exit_group.
#[map]
pub(crate) static EXIT_CODES: HashMap<u32, i32> = HashMap::with_max_entries(65536, 0);

/// The probe's PID namespace (`stat /proc/self/ns/pid`), set by the loader
/// when it is not the host's; 0 in the host's namespace. Plain statics read
/// with volatile loads (aya's `Global` wraps a `MaybeUninit`, whose BTF name
/// this kernel rejects).
#[unsafe(no_mangle)]
pub(crate) static PIDNS_DEV: u64 = 0;
#[unsafe(no_mangle)]
pub(crate) static PIDNS_INO: u64 = 0;

#[inline(always)]
pub(crate) fn pidns() -> (u64, u64) {
    // SAFETY: plain loads of statics the loader may have rewritten.
    unsafe { (read_volatile(&PIDNS_DEV), read_volatile(&PIDNS_INO)) }
}

/// PID-namespace mode: namespace thread id → the `TRACKED` slot value it
/// gets when the kernel adopts it (`probe_abi::pending`).
#[map]
pub(crate) static PENDING: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// Non-zero while `PENDING` may hold entries: set by userspace when it adds
/// one, cleared by it once the map is empty (it checks as it drains events).
/// The programs look `PENDING` up only while it is set.
#[map]
pub(crate) static PENDING_ANY: Array<u64> = Array::with_max_entries(1, 0);

/// cgroup (v2) id → span: a task that forks or execs in a followed cgroup
/// joins its span (a container's processes, which are not the children of
/// whoever asked: containerd-shim starts Docker's). Set by userspace.
#[map]
pub(crate) static CGROUP_SPANS: HashMap<u64, u64> = HashMap::with_max_entries(256, 0);

/// Non-zero while `CGROUP_SPANS` has entries: an untracked fork or exec
/// looks at it only then (one array load otherwise).
#[map]
pub(crate) static CGROUP_ANY: Array<u64> = Array::with_max_entries(1, 0);

/// The span of the followed cgroup the current task is in, if any. Not in
/// PID-namespace mode (its ids are handed over through `PENDING`).
#[inline(always)]
pub(crate) fn cgroup_span() -> Option<u64> {
    if CGROUP_ANY.get(0).copied().unwrap_or(0) == 0 || ns_mode() {
        return None;
    }
    // SAFETY: a helper without arguments.
    let id = unsafe { helper::bpf_get_current_cgroup_id() };
    // SAFETY: plain value read.
    unsafe { CGROUP_SPANS.get(&id) }
        .copied()
        .filter(|&span| span != 0)
}

/// Byte offsets of `task_struct.pid` and `.tgid` in this kernel, set by the
/// loader from its BTF; 0 when it could not find them. Read-only data, so
/// the verifier knows them as constants and accepts the loads below.
#[unsafe(no_mangle)]
pub(crate) static TASK_PID_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
pub(crate) static TASK_TGID_OFFSET: u64 = 0;

/// The current thread's ids packed like `bpf_get_current_pid_tgid`
/// (tgid << 32 | tid), as loads from the current task. Measured on the
/// traced getppid storm, that is ~5 ns cheaper per program than the
/// pid_tgid helper, which also checks for a task and builds the pair; on
/// kernels whose JIT inlines `bpf_get_current_task_btf` it is cheaper still.
#[inline(always)]
pub(crate) fn current_pid_tgid() -> u64 {
    // SAFETY: plain loads of statics the loader may have rewritten, then
    // loads at constant offsets of the BTF-typed current task, which the
    // verifier checks against task_struct.
    unsafe {
        let (pid_at, tgid_at) = (
            read_volatile(&TASK_PID_OFFSET),
            read_volatile(&TASK_TGID_OFFSET),
        );
        if pid_at == 0 || tgid_at == 0 {
            return bpf_get_current_pid_tgid();
        }
        let task = helper::bpf_get_current_task_btf() as *const u8;
        let tid = read_volatile(task.add(pid_at as usize) as *const u32);
        let tgid = read_volatile(task.add(tgid_at as usize) as *const u32);
        ((tgid as u64) << 32) | tid as u64
    }
}

/// The task a CPU last ran the syscall programs for: its saved registers
/// (`pt_regs` sits at the top of its kernel stack, so the address names the
/// task while it lives), its ids, and the `TASK_GEN` they were read under.
#[repr(C)]
pub(crate) struct LastTask {
    regs: u64,
    generation: u64,
    ids: u64,
}

#[map]
pub(crate) static LAST_TASK: PerCpuArray<LastTask> = PerCpuArray::with_max_entries(1, 0);

/// Bumped by every task exit on the machine: a kernel stack is reused only
/// after its task exited, and a thread's id changes only when a non-leader
/// execs and takes over its leader's id, which waits for the leader's exit.
/// So an unchanged generation keeps every CPU's `LAST_TASK` true.
#[map]
pub(crate) static TASK_GEN: Array<u64> = Array::with_max_entries(1, 0);

/// The current thread's ids (as `current_pid_tgid`) for the syscall
/// programs, whose tracepoints pass the task's saved registers: while the
/// same task keeps making syscalls on a CPU (a storm, a busy loop), the
/// ids come from this CPU's `LAST_TASK` without a helper call (a call and
/// its return cost ~8 ns each here, with this CPU's return-thunk mitigation).
#[inline(always)]
pub(crate) fn syscall_task_ids(regs: *const u8) -> u64 {
    // SAFETY: array slot 0; a plain load of a counter others add to.
    let generation = TASK_GEN
        .get_ptr(0)
        .map(|g| unsafe { read_volatile(g) })
        .unwrap_or(0);
    let Some(last) = LAST_TASK.get_ptr_mut(0) else {
        return current_pid_tgid();
    };
    // SAFETY: this CPU's slot; the syscall programs run with preemption
    // off, so nothing else on this CPU touches it meanwhile.
    let last = unsafe { &mut *last };
    if last.regs == regs as u64 && last.generation == generation {
        return last.ids;
    }
    let ids = current_pid_tgid();
    last.regs = regs as u64;
    last.generation = generation;
    last.ids = ids;
    ids
}

/// A task exits: every CPU's `LAST_TASK` is stale from here.
#[inline(always)]
pub(crate) fn bump_task_gen() {
    if let Some(g) = TASK_GEN.get_ptr_mut(0) {
        // SAFETY: array slot 0, aligned; an atomic add (all CPUs add to it).
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                g, 1,
            )
        };
    }
}

/// The current thread's id (see `current_pid_tgid`).
#[inline(always)]
pub(crate) fn current_tid() -> u32 {
    // SAFETY: as in current_pid_tgid.
    unsafe {
        let pid_at = read_volatile(&TASK_PID_OFFSET);
        if pid_at == 0 {
            return bpf_get_current_pid_tgid() as u32;
        }
        let task = helper::bpf_get_current_task_btf() as *const u8;
        read_volatile(task.add(pid_at as usize) as *const u32)
    }
}

#[inline(always)]
pub(crate) fn ns_mode() -> bool {
    pidns().1 != 0
}

/// The current task's ids in the probe's PID namespace, packed like
/// `bpf_get_current_pid_tgid` (tgid << 32 | tid); 0 outside it.
#[inline(always)]
pub(crate) fn ns_current() -> u64 {
    let mut info = bpf_pidns_info { pid: 0, tgid: 0 };
    let (dev, ino) = pidns();
    // SAFETY: `info` is a stack struct of the size passed.
    let r = unsafe {
        helper::bpf_get_ns_current_pid_tgid(
            dev,
            ino,
            &mut info,
            core::mem::size_of::<bpf_pidns_info>() as u32,
        )
    };
    if r == 0 {
        ((info.tgid as u64) << 32) | info.pid as u64
    } else {
        0
    }
}

/// The ids a task is reported under: its namespace ids in PID-namespace
/// mode (from its `TASKS` entry, which is not the current task's), else
/// host `tid` itself.
#[inline(always)]
pub(crate) fn reported_tid(host_tid: u32) -> u32 {
    if !ns_mode() {
        return host_tid;
    }
    // SAFETY: plain value read.
    unsafe { TASKS.get(host_tid) }.map_or(0, |st| st.ns_ids as u32)
}

/// PID-namespace mode: when userspace has attached threads by namespace id
/// that the kernel has not seen yet, and the current thread is one of them,
/// start tracing it (host id `tid`) and return its slot.
#[inline(always)]
pub(crate) fn adopt(tid: u32) -> Option<*mut u64> {
    if !ns_mode() {
        return None;
    }
    if *PENDING_ANY.get(0)? == 0 {
        return None;
    }
    let ids = ns_current();
    let ns_tid = ids as u32;
    if ns_tid == 0 {
        return None;
    }
    // SAFETY: plain value read.
    let value = *unsafe { PENDING.get(ns_tid) }?;
    if PENDING.remove(ns_tid).is_err() {
        return None;
    }
    let mut st = TaskState::new(slot::span(value) as u64);
    st.ns_ids = ids;
    if TASKS.insert(tid, st, 0).is_err() {
        count_drop(EventKind::TaskUntracked);
        return None;
    }
    // this enter is seen, or this exit is skipped by the caller: no orphan
    // exit to allow for
    set_tracked(
        tid,
        value & !((task::SKIP_ORPHAN_EXIT as u64) << slot::FLAGS_SHIFT),
    );
    TRACKED.get_ptr_mut(tid)
}

/// The span of thread `tid`, or None when it is not traced.
#[inline(always)]
pub(crate) fn span_of(tid: u32) -> Option<u64> {
    TRACKED
        .get(tid)
        .map(|v| slot::span(*v) as u64)
        .filter(|&span| span != 0)
}

/// Sets `tid`'s slot: `slot::pack(span, flags)`, or 0 to stop tracing it.
#[inline(always)]
pub(crate) fn set_tracked(tid: u32, value: u64) {
    if let Some(ptr) = TRACKED.get_ptr_mut(tid) {
        // SAFETY: an array slot; written by fork (before the child runs),
        // exit (after it stopped) and the thread itself.
        unsafe { *ptr = value };
    }
}
