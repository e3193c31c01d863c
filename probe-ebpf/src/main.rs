//! The probe's eBPF programs: tracepoints only (this kernel has no kprobes).
//!
//! Layout:
//! - `TRACKED` (thread id → span, an array) decides what is traced, and
//!   `TASKS` (thread id → [`TaskState`]) holds traced threads' state.
//!   Userspace marks the first task of a span; `sched_process_fork` copies
//!   both to every child, so nothing a traced task starts escapes. An
//!   untracked thread pays one inlined array lookup and emits nothing.
//! - `CGROUP_SPANS` (cgroup v2 id → span): a span may follow a cgroup as
//!   well; an untraced task that forks or execs inside a followed cgroup
//!   joins its span (only forks and execs look, and only while
//!   `CGROUP_ANY` is set: the syscall programs' path is unchanged).
//! - `EVENTS`, one ring buffer; `DROPS`, per-CPU counters per event kind for
//!   every record the ring buffer had no room for.
//! - PID namespaces: when the probe runs in a PID namespace (a container-like
//!   sandbox), the loader sets `PIDNS_DEV`/`PIDNS_INO` and every id the
//!   programs report is the one the sandbox sees (`bpf_get_ns_current_pid_tgid`),
//!   while `TRACKED`/`TASKS` stay keyed by host ids. Userspace attaches by
//!   namespace id through `PENDING`; a thread is moved to `TRACKED` at its
//!   next syscall enter or exit. The host path never reads either.
//! - Seccomp denials: the kernel runs seccomp before `sys_enter` fires but
//!   always fires `sys_exit`, so an exit with no enter is a syscall that never
//!   ran. Fresh fork children and tasks attached mid-syscall are excluded with
//!   `SKIP_ORPHAN_EXIT`.
#![no_std]
#![no_main]
// the BPF target has no 64-bit atomics in core: the add is the intrinsic
// (BPF_ATOMIC add)
#![allow(internal_features)]
#![feature(core_intrinsics)]

use core::ptr::{read_volatile, write_volatile};

use aya_ebpf::{
    EbpfContext,
    bindings::bpf_pidns_info,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes, bpf_probe_read_user, bpf_probe_read_user_buf,
        bpf_probe_read_user_str_bytes, generated as helper,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
};
use probe_abi::{
    ArgRole, DATA_LEN, DropCounters, ENTER_STATE, EVENT_HEADER_LEN, EVENT_KINDS, Event, EventKind,
    Failure, Offsets, ROLES, ROLES_LEN, SUCCESS_MATTERS, SyscallSet, TaskState, UringReq, flags,
    nr, open_flags_write, slot, task, uring,
};

/// tid → packed span/flags/syscall-in-flight (`probe_abi::slot`; 0: untracked). An array, sized to pid_max by userspace,
/// because its lookup is inlined by the verifier: the whole cost an
/// untracked thread pays per syscall.
#[map]
static TRACKED: Array<u64> = Array::with_max_entries(32768, 0);

/// tid → per-thread state, for tracked threads only.
#[map]
static TASKS: HashMap<u32, TaskState> = HashMap::with_max_entries(65536, 0);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(8 * 1024 * 1024, 0);

#[map]
static DROPS: PerCpuArray<DropCounters> = PerCpuArray::with_max_entries(1, 0);

/// tgid → code passed to exit/exit_group. Per process, not per thread:
/// the thread that exits last (and fires the group-dead exit) is often not
/// the one that called exit_group.
#[map]
static EXIT_CODES: HashMap<u32, i32> = HashMap::with_max_entries(65536, 0);

/// The probe's PID namespace (`stat /proc/self/ns/pid`), set by the loader
/// when it is not the host's; 0 in the host's namespace. Plain statics read
/// with volatile loads (aya's `Global` wraps a `MaybeUninit`, whose BTF name
/// this kernel rejects).
#[unsafe(no_mangle)]
static PIDNS_DEV: u64 = 0;
#[unsafe(no_mangle)]
static PIDNS_INO: u64 = 0;

#[inline(always)]
fn pidns() -> (u64, u64) {
    // SAFETY: plain loads of statics the loader may have rewritten.
    unsafe { (read_volatile(&PIDNS_DEV), read_volatile(&PIDNS_INO)) }
}

/// PID-namespace mode: namespace thread id → the `TRACKED` slot value it
/// gets when the kernel adopts it (`probe_abi::pending`).
#[map]
static PENDING: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// Non-zero while `PENDING` may hold entries: set by userspace when it adds
/// one, cleared by it once the map is empty (it checks as it drains events).
/// The programs look `PENDING` up only while it is set.
#[map]
static PENDING_ANY: Array<u64> = Array::with_max_entries(1, 0);

/// cgroup (v2) id → span: a task that forks or execs in a followed cgroup
/// joins its span (a container's processes, which are not the children of
/// whoever asked: containerd-shim starts Docker's). Set by userspace.
#[map]
static CGROUP_SPANS: HashMap<u64, u64> = HashMap::with_max_entries(256, 0);

/// Non-zero while `CGROUP_SPANS` has entries: an untracked fork or exec
/// looks at it only then (one array load otherwise).
#[map]
static CGROUP_ANY: Array<u64> = Array::with_max_entries(1, 0);

/// The span of the followed cgroup the current task is in, if any. Not in
/// PID-namespace mode (its ids are handed over through `PENDING`).
#[inline(always)]
fn cgroup_span() -> Option<u64> {
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
static TASK_PID_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u64 = 0;

/// The current thread's ids packed like `bpf_get_current_pid_tgid`
/// (tgid << 32 | tid), as loads from the current task. Measured on the
/// traced getppid storm, that is ~5 ns cheaper per program than the
/// pid_tgid helper, which also checks for a task and builds the pair; on
/// kernels whose JIT inlines `bpf_get_current_task_btf` it is cheaper still.
#[inline(always)]
fn current_pid_tgid() -> u64 {
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
struct LastTask {
    regs: u64,
    generation: u64,
    ids: u64,
}

#[map]
static LAST_TASK: PerCpuArray<LastTask> = PerCpuArray::with_max_entries(1, 0);

/// Bumped by every task exit on the machine: a kernel stack is reused only
/// after its task exited, and a thread's id changes only when a non-leader
/// execs and takes over its leader's id, which waits for the leader's exit.
/// So an unchanged generation keeps every CPU's `LAST_TASK` true.
#[map]
static TASK_GEN: Array<u64> = Array::with_max_entries(1, 0);

/// The current thread's ids (as `current_pid_tgid`) for the syscall
/// programs, whose tracepoints pass the task's saved registers: while the
/// same task keeps making syscalls on a CPU (a storm, a busy loop), the
/// ids come from this CPU's `LAST_TASK` without a helper call (a call and
/// its return cost ~8 ns each here, with this CPU's return-thunk mitigation).
#[inline(always)]
fn syscall_task_ids(regs: *const u8) -> u64 {
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
fn bump_task_gen() {
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
fn current_tid() -> u32 {
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
fn ns_mode() -> bool {
    pidns().1 != 0
}

/// The current task's ids in the probe's PID namespace, packed like
/// `bpf_get_current_pid_tgid` (tgid << 32 | tid); 0 outside it.
#[inline(always)]
fn ns_current() -> u64 {
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
fn reported_tid(host_tid: u32) -> u32 {
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
fn adopt(tid: u32) -> Option<*mut u64> {
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

/// `probe_abi::ROLES` in the object's read-only data.
static ROLE_TABLE: [ArgRole; ROLES_LEN] = ROLES;

/// `probe_abi::ENTER_STATE` and `SUCCESS_MATTERS`, likewise: the common
/// path of both syscall programs asks one of them, by one load and a mask.
static ENTER_STATE_SET: SyscallSet = ENTER_STATE;
static SUCCESS_SET: SyscallSet = SUCCESS_MATTERS;

/// Whether syscall `nr` is in `set` (one of the two above).
#[inline(always)]
fn in_syscall_set(set: &'static SyscallSet, nr: i64) -> bool {
    if nr < 0 || nr as usize >= ROLES_LEN {
        return false;
    }
    let nr = bounded_nr(nr);
    // SAFETY: in bounds; volatile for the reason given in `role`.
    let word = unsafe { read_volatile(set.as_ptr().add(nr / 64)) };
    word & (1 << (nr % 64)) != 0
}

/// `ROLES_LEN - 1`, in read-only data: see [`bounded_nr`].
#[unsafe(no_mangle)]
static ROLE_INDEX_MASK: u64 = ROLES_LEN as u64 - 1;
const _: () = assert!(
    ROLES_LEN.is_power_of_two(),
    "bounded_nr masks with ROLES_LEN - 1"
);

/// A syscall number already checked against `ROLES_LEN`, masked once
/// more right before it indexes a table. LLVM may spill the checked value
/// and reload it for the index; verifiers before 6.x lose the bounds of a
/// reloaded scalar ("math between map_value pointer and register with
/// unbounded min value", seen on 6.1). The mask is a volatile read of a
/// read-only global, so LLVM keeps the AND and the verifier knows its value.
#[inline(always)]
fn bounded_nr(nr: i64) -> usize {
    // SAFETY: plain read of a read-only static.
    (nr as u64 & unsafe { read_volatile(&ROLE_INDEX_MASK) }) as usize
}

/// What syscall `nr`'s arguments carry (`probe_abi::syscall_arg_role`), by
/// one table load.
#[inline(always)]
fn role(nr: i64) -> ArgRole {
    if nr >= 0 && (nr as usize) < ROLES_LEN {
        // SAFETY: in bounds; a volatile read keeps the table in .rodata
        // instead of a chain of compares the optimizer would rebuild.
        unsafe { read_volatile(ROLE_TABLE.as_ptr().add(bounded_nr(nr))) }
    } else {
        ArgRole::None
    }
}

/// The SyscallFailed record being built, one per CPU (too big for the
/// 512-byte stack), indexed by CPU number (the loader sizes it to the
/// possible CPUs): sent by `output_failure` with only the bytes its path
/// fills. Mmapable so it is vmalloc memory: the kernel's hardened-usercopy
/// check of the path read into it then stops at "vmalloc, faults off",
/// where per-CPU memory (and the programs' private stack, which is per-CPU
/// too) takes its page lookups (~30 ns a failure, measured).
#[map]
static RECORD: Array<Event> = Array::with_max_entries(1, BPF_F_MMAPABLE);

const BPF_F_MMAPABLE: u32 = 1 << 10;

#[map]
static OFFSETS: Array<Offsets> = Array::with_max_entries(1, 0);

const CLONE_THREAD: u64 = 0x0001_0000;

/// Fatal-by-default signals worth reporting (SIGCHLD, SIGWINCH, SIGCONT… are not).
const FATAL_SIGNALS: u64 = (1 << 1)
    | (1 << 2)
    | (1 << 3)
    | (1 << 4)
    | (1 << 5)
    | (1 << 6)
    | (1 << 7)
    | (1 << 8)
    | (1 << 9)
    | (1 << 11)
    | (1 << 13)
    | (1 << 14)
    | (1 << 15)
    | (1 << 24)
    | (1 << 25)
    | (1 << 31);

#[inline(always)]
fn now() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn count_drop(kind: EventKind) {
    count_drops(kind, 1);
}

#[inline(always)]
fn count_drops(kind: EventKind, n: u64) {
    let i = kind as usize;
    if let Some(counters) = DROPS.get_ptr_mut(0) {
        if i < EVENT_KINDS as usize {
            // SAFETY: this CPU's slot; only this CPU writes it, preemption off.
            unsafe { (*counters).by_kind[i] += n };
        }
    }
}

/// Reserves an event and fills the common header; `None` (counted as a drop)
/// when the ring buffer is full. The high-volume syscall kinds (failures,
/// file writes, dups) leave `comm` empty: userspace names them from the
/// process's fork/exec/exit events, which saves the helper's string copy on
/// every failing syscall.
#[inline(always)]
fn reserve(
    kind: EventKind,
    span: u64,
    ts: u64,
) -> Option<aya_ebpf::maps::ring_buf::RingBufEntry<Event>> {
    let with_comm = !matches!(
        kind,
        EventKind::SyscallFailed
            | EventKind::FileWrite
            | EventKind::FdDup
            | EventKind::Repeated
            | EventKind::UringFailed
            | EventKind::UringUnderSeccomp
    );
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count_drop(kind);
        return None;
    };
    // SAFETY: ring-buffer memory sized for one Event.
    unsafe { write_header(entry.as_mut_ptr(), kind, span, ts, with_comm) };
    Some(entry)
}

/// Fills the common header of the Event at `ev` (ring-buffer or per-CPU
/// scratch memory), `comm` included only `with_comm`.
///
/// # Safety
/// `ev` points at writable memory sized for one Event.
#[inline(always)]
unsafe fn write_header(ev: *mut Event, kind: EventKind, span: u64, ts: u64, with_comm: bool) {
    // SAFETY: the caller's promise.
    unsafe { write_header_as(ev, kind, span, ts, with_comm, None) }
}

/// `write_header` with the current thread's ids when the caller has them.
///
/// # Safety
/// As for `write_header`.
#[inline(always)]
unsafe fn write_header_as(
    ev: *mut Event,
    kind: EventKind,
    span: u64,
    ts: u64,
    with_comm: bool,
    ids: Option<u64>,
) {
    let pid_tgid = if ns_mode() {
        ns_current()
    } else {
        ids.unwrap_or_else(current_pid_tgid)
    };
    // SAFETY: the caller's promise; fields are written in place so the
    // 368-byte record never lands on the 512-byte stack. Volatile stores
    // keep LLVM from turning runs of zero stores into a call to BPF's
    // byte-at-a-time memset.
    unsafe {
        write_volatile(&raw mut (*ev).ts_ns, ts);
        write_volatile(&raw mut (*ev).span, span);
        write_volatile(&raw mut (*ev).kind, kind as u32);
        write_volatile(&raw mut (*ev).flags, 0);
        write_volatile(&raw mut (*ev).pid, (pid_tgid >> 32) as u32);
        write_volatile(&raw mut (*ev).tid, pid_tgid as u32);
        write_volatile(&raw mut (*ev).syscall, 0);
        write_volatile(&raw mut (*ev).ret, 0);
        write_volatile(&raw mut (*ev).duration_ns, 0);
        write_volatile(&raw mut (*ev).aux[0], 0);
        write_volatile(&raw mut (*ev).aux[1], 0);
        write_volatile(&raw mut (*ev).aux[2], 0);
        write_volatile(&raw mut (*ev).aux[3], 0);
        write_volatile(&raw mut (*ev).data_len, 0);
        write_volatile(&raw mut (*ev)._pad, 0);
        if with_comm {
            // the helper writes the comm straight into the record
            helper::bpf_get_current_comm((&raw mut (*ev).comm).cast(), 16);
        } else {
            write_volatile((&raw mut (*ev).comm).cast::<u64>(), 0);
            write_volatile((&raw mut (*ev).comm).cast::<u64>().add(1), 0);
        }
    }
}

/// The span of thread `tid`, or None when it is not traced.
#[inline(always)]
fn span_of(tid: u32) -> Option<u64> {
    TRACKED
        .get(tid)
        .map(|v| slot::span(*v) as u64)
        .filter(|&span| span != 0)
}

/// Sets `tid`'s slot: `slot::pack(span, flags)`, or 0 to stop tracing it.
#[inline(always)]
fn set_tracked(tid: u32, value: u64) {
    if let Some(ptr) = TRACKED.get_ptr_mut(tid) {
        // SAFETY: an array slot; written by fork (before the child runs),
        // exit (after it stopped) and the thread itself.
        unsafe { *ptr = value };
    }
}

/// Submits with a wake-up only when it matters. High-volume kinds wake the
/// reader when they carry the pending data across 1 MiB: the reader polls
/// every 10 ms and never sleeps while data is pending (the ring's poll
/// reports any), so one wake-up per crossing is enough for a reader that
/// dozed off. A wake-up costs the producing task a self-IPI (an MSR write,
/// so a VM exit): paid on every event, it was 7% of a failing-open storm.
/// Past half the ring the reader is awake but behind, and every event pays
/// that wake-up again: the back-pressure that slows a storm to the reader's
/// pace, so events are delivered rather than dropped.
#[inline(always)]
fn submit(entry: aya_ebpf::maps::ring_buf::RingBufEntry<Event>, urgent: bool) {
    entry.submit(wakeup_flags(urgent));
}

/// The ring-buffer flags for a record `submit` or `output_failure` sends.
#[inline(always)]
fn wakeup_flags(urgent: bool) -> u64 {
    const WAKEUP_BYTES: u64 = 1 << 20;
    const BEHIND_BYTES: u64 = 4 << 20;
    // a few records (with the ring's 8-byte header) past the mark: the
    // window in which this event's data, or a concurrent CPU's, crossed it
    const WINDOW: u64 = 4 * ((core::mem::size_of::<Event>() as u64 + 8 + 7) & !7);
    const BPF_RB_NO_WAKEUP: u64 = 1;
    const BPF_RB_FORCE_WAKEUP: u64 = 2;
    const BPF_RB_AVAIL_DATA: u64 = 0;
    if urgent {
        0
    } else {
        let pending = EVENTS.query(BPF_RB_AVAIL_DATA);
        if pending >= BEHIND_BYTES || (WAKEUP_BYTES..WAKEUP_BYTES + WINDOW).contains(&pending) {
            BPF_RB_FORCE_WAKEUP
        } else {
            BPF_RB_NO_WAKEUP
        }
    }
}

/// Sends the SyscallFailed record built in `ev` with only the words of
/// `data` it fills: a path of 45 bytes makes a 160-byte record, not 368,
/// so a storm of distinct failures moves less than half the bytes through
/// the producer's and the reader's caches. `bpf_ringbuf_reserve` wants a
/// constant size, hence the scratch record and the copy by
/// `bpf_ringbuf_output`. False (counted as a drop) when the ring is full.
#[inline(always)]
fn output_failure(ev: &Event, urgent: bool) -> bool {
    let n = words(ev.data_len).min(DATA_LEN / 8);
    let size = EVENT_HEADER_LEN + n * 8;
    // SAFETY: `size` is at most size_of::<Event>(): inside `ev`.
    let bytes = unsafe { core::slice::from_raw_parts((ev as *const Event).cast::<u8>(), size) };
    if EVENTS.output::<[u8]>(bytes, wakeup_flags(urgent)).is_err() {
        count_drop(EventKind::SyscallFailed);
        return false;
    }
    true
}

#[inline(always)]
fn offsets() -> Option<&'static Offsets> {
    OFFSETS.get(0)
}

// ---------------------------------------------------------------- syscalls

/// Where `struct pt_regs` keeps a syscall's number and arguments (the
/// ptrace ABI of each architecture; stable). The argument registers still
/// hold the arguments at `sys_exit`, except arm64's x0, which holds the
/// return value by then: its first argument is `orig_x0`, as the kernel's
/// own `syscall_get_arguments` reads it.
#[cfg(bpf_target_arch = "x86_64")]
mod regs {
    /// di, si, dx, r10, r8, r9.
    pub const ARGS: [usize; 6] = [112, 104, 96, 56, 72, 64];
    /// orig_ax (a u64).
    pub const NR: usize = 120;
    pub type Nr = i64;
}

#[cfg(bpf_target_arch = "aarch64")]
mod regs {
    /// orig_x0, then x1..x5 of `regs[31]`.
    pub const ARGS: [usize; 6] = [272, 8, 16, 24, 32, 40];
    /// syscallno (an s32: the verifier refuses a wider load of it).
    pub const NR: usize = 280;
    pub type Nr = i32;
}

/// Syscall argument `i` from the saved user registers.
#[inline(always)]
fn reg_arg(regs: *const u8, i: u8) -> u64 {
    // SAFETY: `regs` is the BTF tracepoint's `struct pt_regs *`, a pointer
    // the verifier types from kernel BTF: it checks the offset against the
    // struct and turns the load into a fault-tolerant one (no helper call).
    // It wants that offset constant, so each argument has its own load.
    let at = |off: usize| unsafe { core::ptr::read_volatile(regs.add(off) as *const u64) };
    match i {
        0 => at(regs::ARGS[0]),
        1 => at(regs::ARGS[1]),
        2 => at(regs::ARGS[2]),
        3 => at(regs::ARGS[3]),
        4 => at(regs::ARGS[4]),
        5 => at(regs::ARGS[5]),
        _ => 0,
    }
}

/// Where a traced syscall's number and arguments come from: the BTF
/// tracepoints' typed `pt_regs` (plain loads), or, on the tracepoint rung
/// (a kernel without BTF), what the classic `sys_enter` program saved.
trait SyscallArgs: Copy {
    /// Argument `i` (0..6).
    fn arg(self, i: u8) -> u64;
    /// The number of the syscall in flight (read for one seccomp stopped
    /// before its enter).
    fn nr(self) -> i64;
    /// False when the arguments are unknown: a syscall seccomp stopped
    /// never reached the classic `sys_enter`, which saves them.
    fn known(self) -> bool {
        true
    }
}

#[derive(Clone, Copy)]
struct BtfRegs(*const u8);

impl SyscallArgs for BtfRegs {
    #[inline(always)]
    fn arg(self, i: u8) -> u64 {
        reg_arg(self.0, i)
    }
    #[inline(always)]
    fn nr(self) -> i64 {
        // SAFETY: BTF-typed pt_regs pointer, see `reg_arg`.
        unsafe { core::ptr::read_volatile(self.0.add(regs::NR) as *const regs::Nr) as i64 }
    }
}

/// The six arguments the classic `sys_enter` read from its record (on the
/// stack there, in `ARGS` at the exit; null: not known) and the syscall's
/// number.
#[derive(Clone, Copy)]
struct SavedArgs {
    args: *const u64,
    nr: i64,
}

impl SyscallArgs for SavedArgs {
    #[inline(always)]
    fn arg(self, i: u8) -> u64 {
        if self.args.is_null() || i > 5 {
            return 0;
        }
        // SAFETY: six u64s on the stack or in a map value; i < 6.
        unsafe { read_volatile(self.args.add(i as usize)) }
    }
    #[inline(always)]
    fn nr(self) -> i64 {
        self.nr
    }
    #[inline(always)]
    fn known(self) -> bool {
        !self.args.is_null()
    }
}

/// Tracepoint rung: thread id → the arguments of its syscall in flight,
/// saved by the classic `sys_enter` for its exit (traced threads only;
/// sized 1 by the loader on the BTF rung, which reads `pt_regs`).
#[map]
static ARGS: LruHashMap<u32, [u64; 6]> = LruHashMap::with_max_entries(65536, 0);

/// This thread's `TRACKED` slot, when it is traced.
#[inline(always)]
fn tracked_slot(tid: u32) -> Option<*mut u64> {
    let ptr = TRACKED.get_ptr_mut(tid)?;
    // SAFETY: an array slot of this map, valid for the program's run.
    if slot::span(unsafe { *ptr }) == 0 {
        None
    } else {
        Some(ptr)
    }
}

/// BTF tracepoint on `raw_syscalls:sys_enter(struct pt_regs *regs, long id)`:
/// the same tracepoint as the classic one, without the perf-record copy,
/// and with `regs` typed so its fields are read by plain loads.
/// The common case is one array load and one store.
#[btf_tracepoint(function = "sys_enter")]
pub fn sys_enter(ctx: BtfTracePointContext) -> u32 {
    let regs: *const u8 = ctx.arg(0);
    let tid = syscall_task_ids(regs) as u32;
    let Some(ptr) = tracked_slot(tid).or_else(|| adopt(tid)) else {
        return 0;
    };
    let id: i64 = ctx.arg(1);
    on_enter(ptr, tid, id, BtfRegs(regs));
    0
}

/// Tracepoint rung: the classic `raw_syscalls:sys_enter`, fields at the
/// offsets of its tracefs format. Saves a traced thread's arguments for
/// its exit.
#[tracepoint]
pub fn sys_enter_tp(ctx: TracePointContext) -> u32 {
    let tid = current_tid();
    let Some(ptr) = tracked_slot(tid).or_else(|| adopt(tid)) else {
        return 0;
    };
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offsets parsed from this kernel's format file.
    let id = unsafe { ctx.read_at::<i64>(off.sys_enter_id as usize) }.unwrap_or(-1);
    // SAFETY: as above.
    let args = unsafe { ctx.read_at::<[u64; 6]>(off.sys_enter_args as usize) }.unwrap_or([0; 6]);
    let _ = ARGS.insert(tid, args, 0);
    on_enter(
        ptr,
        tid,
        id,
        SavedArgs {
            args: args.as_ptr(),
            nr: id,
        },
    );
    0
}

/// A traced thread enters syscall `id`: marks it in flight, keeps what
/// its exit or its process's end needs. The common case is one store.
#[inline(always)]
fn on_enter<A: SyscallArgs>(ptr: *mut u64, tid: u32, id: i64, args: A) {
    let marker = if id >= 0 && (id as u64) < slot::NR_UNKNOWN - 1 {
        id as u64 + 1
    } else {
        slot::NR_UNKNOWN
    };
    // SAFETY: this thread's own slot; only this thread writes it while it
    // runs (fork writes a child's slot before the child runs).
    unsafe { *ptr = (*ptr & !slot::NR_MASK) | marker };
    if !in_syscall_set(&ENTER_STATE_SET, id) {
        return;
    }
    if id == nr::EXIT_GROUP {
        // the process's status; a thread's own exit(2) (glibc ends every
        // pthread that way) says nothing about the process
        let tgid = (current_pid_tgid() >> 32) as u32;
        let _ = EXIT_CODES.insert(tgid, args.arg(0) as i32, 0);
        return;
    }
    if id == nr::EXIT {
        return;
    }
    if let Some(state) = TASKS.get_ptr_mut(tid) {
        // SAFETY: this thread's own TASKS entry.
        let st = unsafe { &mut *state };
        st.enter_ts = now();
        if id == nr::CLONE {
            st.clone_flags = args.arg(0);
        } else if id == nr::CLONE3 {
            // clone3(struct clone_args *): flags is the first u64
            // SAFETY: user pointer read with the fault-tolerant helper.
            st.clone_flags = unsafe { bpf_probe_read_user(args.arg(0) as *const u64) }.unwrap_or(0);
        }
    }
}

/// Empty programs on the same two tracepoints, attached only by the
/// benchmark (`probe floor`): what any tracer on these tracepoints costs
/// every task of the machine before it does anything.
#[btf_tracepoint(function = "sys_enter")]
pub fn floor_enter(_ctx: BtfTracePointContext) -> u32 {
    0
}

#[btf_tracepoint(function = "sys_exit")]
pub fn floor_exit(_ctx: BtfTracePointContext) -> u32 {
    0
}

/// BTF tracepoint on `raw_syscalls:sys_exit(struct pt_regs *regs, long ret)`.
#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit(ctx: BtfTracePointContext) -> u32 {
    // both ids now: a failure's record needs the tgid
    let regs: *const u8 = ctx.arg(0);
    let ids = syscall_task_ids(regs);
    let tid = ids as u32;
    let Some(ptr) = tracked_slot(tid) else {
        // adopted in the middle of a syscall it entered untraced: traced
        // from its next one
        let _ = adopt(tid);
        return 0;
    };
    let ret: i64 = ctx.arg(1);
    on_exit(ptr, ids, ret, BtfRegs(regs));
    0
}

/// Tracepoint rung: the classic `raw_syscalls:sys_exit`. The arguments
/// are the ones `sys_enter_tp` saved; a syscall seccomp stopped before its
/// enter has its number (the record's `id`) but no arguments.
#[tracepoint]
pub fn sys_exit_tp(ctx: TracePointContext) -> u32 {
    let ids = current_pid_tgid();
    let tid = ids as u32;
    let Some(ptr) = tracked_slot(tid) else {
        let _ = adopt(tid);
        return 0;
    };
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offsets parsed from this kernel's format file.
    let ret = unsafe { ctx.read_at::<i64>(off.sys_exit_ret as usize) }.unwrap_or(0);
    // SAFETY: as above.
    let id = unsafe { ctx.read_at::<i64>(off.sys_exit_id as usize) }.unwrap_or(-1);
    // SAFETY: this thread's own slot, read only.
    let entered = unsafe { *ptr } & slot::NR_MASK != 0;
    let saved = match ARGS.get_ptr(tid) {
        Some(a) if entered => a as *const u64,
        _ => core::ptr::null(),
    };
    on_exit(
        ptr,
        ids,
        ret,
        SavedArgs {
            args: saved,
            nr: id,
        },
    );
    0
}

/// A traced thread's syscall returned `ret`: a seccomp denial (an exit
/// with no enter), a success worth recording, or a failure.
#[inline(always)]
fn on_exit<A: SyscallArgs>(ptr: *mut u64, ids: u64, ret: i64, args: A) {
    let tid = ids as u32;
    // SAFETY: this thread's own slot, see sys_enter.
    let v = unsafe { *ptr };
    let marker = v & slot::NR_MASK;
    let tflags = slot::flags(v);
    let span = slot::span(v) as u64;
    // nothing in flight any more, and the one-time orphan allowance is spent
    let cleared = v
        & !slot::NR_MASK
        & !(((task::SKIP_ORPHAN_EXIT | task::REPORT_FORK) as u64) << slot::FLAGS_SHIFT);
    // SAFETY: as above.
    unsafe { *ptr = cleared };

    if marker == 0 {
        if tflags & task::SKIP_ORPHAN_EXIT != 0 {
            if tflags & task::REPORT_FORK != 0 {
                report_fork(tid, span);
            }
            return;
        }
        // An exit with no enter: seccomp stopped the syscall before it ran.
        // The registers still hold its number and arguments.
        let id = args.nr();
        if let Some(mut entry) = reserve(EventKind::SeccompDenied, span, now()) {
            let ev = entry.as_mut_ptr();
            // SAFETY: reserved Event, header already written.
            unsafe {
                (*ev).syscall = id;
                (*ev).ret = ret;
                fill_data(
                    &mut (*ev).data,
                    &mut (*ev).data_len,
                    &mut (*ev).flags,
                    args,
                    role(id),
                );
                if tflags & task::SECCOMP_ON != 0 {
                    (*ev).flags |= flags::SECCOMP_ON;
                }
            }
            submit(entry, true);
        }
        return;
    }
    let entered = if marker == slot::NR_UNKNOWN {
        -1
    } else {
        marker as i64 - 1
    };

    if ret >= 0 {
        if in_syscall_set(&SUCCESS_SET, entered) {
            on_success(ptr, args, span, entered, ret);
        }
        return;
    }

    on_failure(ids, args, span, entered, ret, tflags);
}

/// PID-namespace mode: a fresh child's first syscall exit (its return from
/// clone) sends the Fork event its parent could not: only now are the
/// child's namespace ids readable.
#[inline(always)]
fn report_fork(tid: u32, span: u64) {
    let Some(st) = TASKS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: this thread's own entry.
    let st = unsafe { &mut *st };
    let ids = ns_current();
    st.ns_ids = ids;
    let (parent, clone_flags) = (st.fork_parent, st.clone_flags);
    st.fork_parent = 0;
    st.clone_flags = 0;
    if let Some(mut entry) = reserve(EventKind::Fork, span, now()) {
        let ev = entry.as_mut_ptr();
        // SAFETY: reserved Event, header already written (the child's ids:
        // the event is the parent's).
        unsafe {
            (*ev).pid = (parent >> 32) as u32;
            (*ev).tid = parent as u32;
            (*ev).aux[0] = ids as u32 as u64;
            (*ev).aux[1] = clone_flags;
            if clone_flags & CLONE_THREAD != 0 {
                (*ev).flags |= flags::THREAD;
            }
        }
        submit(entry, false);
    }
}

/// A traced syscall failed. The same failure as the thread's previous one
/// (syscall, errno, first argument, path or address) is only counted: a
/// retry loop or a storm costs a compare, not a ring-buffer record each.
/// Otherwise the count so far goes out as a Repeated event, then the
/// failure as a SyscallFailed event.
#[inline(always)]
fn on_failure<A: SyscallArgs>(ids: u64, args: A, span: u64, entered: i64, ret: i64, tflags: u32) {
    // SAFETY: no preconditions (inlined by the verifier).
    let cpu = unsafe { helper::bpf_get_smp_processor_id() };
    let Some(ev) = RECORD.get_ptr_mut(cpu) else {
        // a CPU past the possible ones the loader sized it for: never, but
        // a failure is counted, not lost without a trace
        count_drop(EventKind::SyscallFailed);
        return;
    };
    // The path or address goes straight into the record that may be sent:
    // compared from there with the thread's last failure, and copied once
    // more only into `last` when it is new.
    // SAFETY: this CPU's record scratch; sys_exit does not nest on a CPU.
    let ev = unsafe { &mut *ev };
    let role = role(entered);
    let aux0 = match role {
        ArgRole::Path { flags: Some(f), .. } => args.arg(f),
        // the socket: a later getsockopt(SO_ERROR) on it completes a
        // non-blocking connect
        ArgRole::First | ArgRole::SockAddr { .. } => args.arg(0),
        _ => 0,
    };
    let (mut data_len, mut data_flags) = (0u32, 0u32);
    fill_data(&mut ev.data, &mut data_len, &mut data_flags, args, role);
    let cur = FailureKey {
        nr: entered,
        ret,
        aux0,
        data_len,
        data_flags,
    };
    let tid = ids as u32;
    let state = TASKS.get_ptr_mut(tid);
    if let Some(st) = state {
        // SAFETY: this thread's own TASKS entry.
        let st = unsafe { &mut *st };
        if same_failure(&st.last, &cur, &ev.data) {
            st.repeats += 1;
            return;
        }
        if st.repeats > 0 {
            if !send_repeats(st, span) {
                // ring full: this failure is counted as dropped, the
                // repeats stay pending, so nothing is credited to the wrong one
                count_drop(EventKind::SyscallFailed);
                return;
            }
            st.repeats = 0;
        }
    }
    let ts = now();
    // SAFETY: this CPU's record, as above; the header leaves `data` alone.
    unsafe { write_header_as(ev, EventKind::SyscallFailed, span, ts, false, Some(ids)) };
    ev.syscall = entered;
    ev.ret = ret;
    if role.is_timed() {
        if let Some(st) = state {
            // SAFETY: as above.
            ev.duration_ns = ts.wrapping_sub(unsafe { (*st).enter_ts });
        }
    }
    ev.aux[0] = aux0;
    ev.data_len = data_len;
    ev.flags |= data_flags;
    if tflags & task::SECCOMP_ON != 0 {
        ev.flags |= flags::SECCOMP_ON;
    }
    // an exec refused with EACCES is checked against mountinfo on arrival
    // (noexec), while its mount namespace still exists; the ENOENTs of a
    // PATH search are not urgent (a dozen wake-ups per command otherwise)
    const EACCES: i64 = 13;
    let urgent = (entered == nr::EXECVE || entered == nr::EXECVEAT) && ret == -EACCES;
    if !output_failure(ev, urgent) {
        return;
    }
    if let Some(st) = state {
        // SAFETY: as above; remembered only once sent, so a repeat is never
        // counted against a failure that was dropped
        let last = unsafe { &mut (*st).last };
        // a cut path is never repeated: paths alike up to the cut may
        // differ after it (module resolution tries name.js, name.json…),
        // so the next failure is not compared with it
        last.nr = if cur.data_flags & flags::DATA_TRUNCATED != 0 {
            NEVER_REPEATED
        } else {
            cur.nr
        };
        last.ret = cur.ret;
        last.aux0 = cur.aux0;
        last.data_len = cur.data_len;
        last.data_flags = cur.data_flags;
        copy_data(&mut last.data, &ev.data);
    }
}

/// The syscall number a thread's last failure is remembered under when no
/// later failure may count as its repeat (no syscall has it: entered
/// syscalls are -1 or more).
const NEVER_REPEATED: i64 = -2;

/// A failure's fields besides its path or address.
struct FailureKey {
    nr: i64,
    ret: i64,
    aux0: u64,
    data_len: u32,
    data_flags: u32,
}

/// Sends the thread's pending repeat count; false when the ring is full.
#[inline(always)]
fn send_repeats(st: &TaskState, span: u64) -> bool {
    let Some(mut entry) = reserve(EventKind::Repeated, span, now()) else {
        return false;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event, header already written.
    unsafe {
        (*ev).syscall = st.last.nr;
        (*ev).ret = st.last.ret;
        (*ev).aux[0] = st.repeats;
        (*ev).aux[1] = st.last.aux0;
    }
    submit(entry, false);
    true
}

/// Words of `data` that hold its first `len` bytes.
#[inline(always)]
fn words(len: u32) -> usize {
    (len as usize).div_ceil(8)
}

/// Whether `cur` is the same failure as `last`.
#[inline(always)]
fn same_failure(last: &Failure, cur: &FailureKey, data: &[u8; DATA_LEN]) -> bool {
    if last.nr != cur.nr
        || last.ret != cur.ret
        || last.aux0 != cur.aux0
        || last.data_len != cur.data_len
        || last.data_flags != cur.data_flags
    {
        return false;
    }
    let n = words(cur.data_len);
    // the bytes past `data_len` in the last word are left over from earlier
    // failures: they must not decide (little endian: the low bytes count)
    let tail = cur.data_len % 8;
    let last_mask = if tail == 0 {
        u64::MAX
    } else {
        (1u64 << (tail * 8)) - 1
    };
    let (a, b) = (
        last.data.as_ptr() as *const u64,
        data.as_ptr() as *const u64,
    );
    // every word, the ones past `n` masked out: a loop whose bound is a
    // constant (see `copy_data`)
    let mut diff = 0;
    let mut w = 0;
    while w < DATA_LEN / 8 {
        let mask = if w + 1 < n {
            u64::MAX
        } else if w + 1 == n {
            last_mask
        } else {
            0
        };
        // SAFETY: w < DATA_LEN / 8: both reads are inside the arrays, which
        // sit 8-aligned in their repr(C) structs (see `copy_data`).
        let (x, y) = unsafe { (read_volatile(a.add(w)), read_volatile(b.add(w))) };
        diff |= (x ^ y) & mask;
        w += 1;
    }
    diff == 0
}

/// Copies the first `len` bytes (whole words) of `src` into `dst`. Word by
/// word, with aligned loads: a plain array copy becomes BPF's byte-at-a-time
/// memcpy, and an unaligned load eight byte loads. Every `data` array sits
/// at an 8-aligned offset of an 8-aligned repr(C) struct (`Event`,
/// `Failure`), so the words are aligned.
#[inline(always)]
fn copy_data(dst: &mut [u8; DATA_LEN], src: &[u8; DATA_LEN]) {
    let (d, s) = (dst.as_mut_ptr() as *mut u64, src.as_ptr() as *const u64);
    // Every word, whatever `len`: a loop bounded by the length let LLVM
    // advance a pointer next to a counter derived from it, which verifiers
    // before 6.x cannot tie together ("invalid access to map value …
    // off=368" on 5.10 and 6.1). With a constant bound each step's offset
    // is a constant.
    let mut w = 0;
    while w < DATA_LEN / 8 {
        // SAFETY: w < DATA_LEN / 8: both accesses are inside the arrays.
        unsafe { write_volatile(d.add(w), read_volatile(s.add(w))) };
        w += 1;
    }
}

/// A syscall succeeded: record file writes, mounts, fd dups and seccomp
/// filters installed. Everything else costs nothing more.
#[inline(always)]
fn on_success<A: SyscallArgs>(ptr: *mut u64, args: A, span: u64, entered: i64, ret: i64) {
    let set_seccomp = || {
        // SAFETY: this thread's own slot, see sys_enter.
        unsafe { *ptr |= (task::SECCOMP_ON as u64) << slot::FLAGS_SHIFT };
    };
    match entered {
        nr::SECCOMP => set_seccomp(),
        nr::PRCTL if args.arg(0) == nr::PR_SET_SECCOMP => set_seccomp(),
        // a non-blocking connect's outcome: the call succeeds and writes
        // the connection's error into *optval (ECONNREFUSED, ETIMEDOUT…)
        nr::GETSOCKOPT if args.arg(1) == nr::SOL_SOCKET && args.arg(2) == nr::SO_ERROR => {
            // SAFETY: user pointer read with the fault-tolerant helper.
            let err = unsafe { bpf_probe_read_user(args.arg(3) as *const i32) }.unwrap_or(0);
            if err <= 0 {
                return;
            }
            if let Some(mut entry) = reserve(EventKind::SyscallFailed, span, now()) {
                let ev = entry.as_mut_ptr();
                // SAFETY: reserved Event, header already written.
                unsafe {
                    (*ev).syscall = entered;
                    (*ev).ret = -(err as i64);
                    (*ev).aux[0] = args.arg(0);
                    (*ev).flags |= flags::SOCKET_ERROR;
                }
                submit(entry, false);
            }
        }
        // guards, not patterns: on arm64 dup2, open, creat and mkdir are
        // all `ABSENT`, which would repeat a pattern
        e if e == nr::DUP2 || e == nr::DUP3 => {
            if let Some(mut entry) = reserve(EventKind::FdDup, span, now()) {
                let ev = entry.as_mut_ptr();
                // SAFETY: reserved Event, header already written.
                unsafe {
                    (*ev).syscall = entered;
                    (*ev).ret = ret;
                    (*ev).aux[0] = args.arg(0);
                }
                submit(entry, false);
            }
        }
        e if [
            nr::OPEN,
            nr::OPENAT,
            nr::CREAT,
            nr::MKDIR,
            nr::MKDIRAT,
            nr::MOUNT,
        ]
        .contains(&e) =>
        {
            let open_flags = match role(entered) {
                ArgRole::Path { flags: Some(f), .. } => args.arg(f),
                // creat and mkdir always create
                _ => 0o100,
            };
            if entered != nr::MOUNT && !open_flags_write(open_flags) {
                return;
            }
            let kind = if entered == nr::MOUNT {
                EventKind::Mount
            } else {
                EventKind::FileWrite
            };
            let Some(mut entry) = reserve(kind, span, now()) else {
                return;
            };
            let ev = entry.as_mut_ptr();
            // SAFETY: reserved Event, header already written.
            unsafe {
                (*ev).syscall = entered;
                (*ev).ret = ret;
                (*ev).aux[0] = open_flags;
                fill_data(
                    &mut (*ev).data,
                    &mut (*ev).data_len,
                    &mut (*ev).flags,
                    args,
                    role(entered),
                );
            }
            submit(entry, false);
        }
        _ => {}
    }
}

/// DATA_TRUNCATED for a user path that filled `data` (`read` bytes before
/// the NUL the helper wrote) and goes on past it; else 0.
#[inline(always)]
fn path_cut(ptr: *const u8, read: usize) -> u32 {
    if read < DATA_LEN - 1 {
        return 0;
    }
    // SAFETY: a user pointer read with the fault-tolerant helper.
    match unsafe { bpf_probe_read_user(ptr.wrapping_add(DATA_LEN - 1)) } {
        Ok(0u8) | Err(_) => 0,
        Ok(_) => flags::DATA_TRUNCATED,
    }
}

/// Copies the path or socket address a syscall's `role` names into `data`,
/// setting its length and the DATA_* flag that says which it is.
#[inline(always)]
fn fill_data<A: SyscallArgs>(
    data: &mut [u8; DATA_LEN],
    len: &mut u32,
    data_flags: &mut u32,
    args: A,
    role: ArgRole,
) {
    if !args.known() {
        return;
    }
    match role {
        ArgRole::Path { path, .. } => {
            let ptr = args.arg(path);
            // SAFETY: a user pointer read with the fault-tolerant helper.
            match unsafe { bpf_probe_read_user_str_bytes(ptr as *const u8, data) } {
                Ok(s) => {
                    *len = s.len() as u32;
                    *data_flags |= flags::DATA_PATH | path_cut(ptr as *const u8, s.len());
                }
                Err(_) => *data_flags |= flags::DATA_FAULT,
            }
        }
        ArgRole::SockAddr { addr, len: len_arg } => {
            // sockaddr_in6 is 28 bytes, sockaddr_un 110: copy a fixed 112.
            const N: usize = 112;
            let ptr = args.arg(addr);
            let buf = &mut data[..N];
            // SAFETY: a user pointer read with the fault-tolerant helper.
            match unsafe { bpf_probe_read_user_buf(ptr as *const u8, buf) } {
                Ok(()) => {
                    let n = args.arg(len_arg) as u32;
                    *len = if n > N as u32 { N as u32 } else { n };
                    *data_flags |= flags::DATA_SOCKADDR;
                }
                Err(_) => *data_flags |= flags::DATA_FAULT,
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------- processes

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    let tid = current_tid();
    let v = match tracked_slot(tid) {
        // SAFETY: the parent's own slot; read only.
        Some(ptr) => unsafe { *ptr },
        // an untraced parent in a followed cgroup: its child is the span's
        None => match cgroup_span() {
            Some(span) => slot::pack(span as u32, 0),
            None => return 0,
        },
    };
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offset parsed from this kernel's format file.
    let Ok(child) = (unsafe { ctx.read_at::<i32>(off.fork_child_pid as usize) }) else {
        return 0;
    };
    let span = slot::span(v);
    // clone flags only when the syscall in flight is clone/clone3 (fork and
    // vfork have none; a value left by an earlier clone must not leak in)
    let in_flight = (v & slot::NR_MASK) as i64 - 1;
    let clone_flags = match (in_flight, TASKS.get_ptr(tid)) {
        // SAFETY: the parent's own entry; read only.
        (nr::CLONE | nr::CLONE3, Some(st)) => unsafe { (*st).clone_flags },
        _ => 0,
    };
    let inherited = slot::flags(v) & task::SECCOMP_ON;
    let mut child_state = TaskState::new(span as u64);
    // PID-namespace mode: the child reports its own Fork event (its
    // namespace id is not readable from here)
    let ns = ns_mode();
    let report = if ns {
        child_state.fork_parent = ns_current();
        child_state.clone_flags = clone_flags;
        task::REPORT_FORK
    } else {
        0
    };
    if TASKS.insert(child as u32, child_state, 0).is_ok() {
        // the child's first event is its return from clone: no enter seen
        set_tracked(
            child as u32,
            slot::pack(span, task::SKIP_ORPHAN_EXIT | inherited | report),
        );
    } else {
        // TASKS is full: the child escapes. Say so rather than lose it silently.
        count_drop(EventKind::TaskUntracked);
    }
    if ns {
        return 0;
    }
    if let Some(mut entry) = reserve(EventKind::Fork, span as u64, now()) {
        let ev = entry.as_mut_ptr();
        // SAFETY: reserved Event, header already written.
        unsafe {
            (*ev).aux[0] = child as u64;
            (*ev).aux[1] = clone_flags;
            if clone_flags & CLONE_THREAD != 0 {
                (*ev).flags |= flags::THREAD;
            }
        }
        submit(entry, false);
    }
    0
}

/// A non-leader thread exec'd: the kernel gave it the leader's id `old`,
/// whose slot the leader's exit just cleared. Moves its state over.
#[inline(always)]
fn take_over(tid: u32, old: u32) -> Option<u64> {
    let v = TRACKED.get(old).copied().filter(|&v| slot::span(v) != 0)?;
    set_tracked(tid, v);
    set_tracked(old, 0);
    // SAFETY: plain copy of the thread's own entry before removing it.
    if let Some(st) = unsafe { TASKS.get(old) }.copied() {
        let _ = TASKS.insert(tid, st, 0);
        let _ = TASKS.remove(old);
    }
    Some(slot::span(v) as u64)
}

/// The current task, untraced, runs a program in a followed cgroup: traced
/// from here as part of that cgroup's span. It is in the middle of its
/// execve, whose exit comes with no enter seen.
#[inline(always)]
fn cgroup_join(tid: u32) -> Option<u64> {
    let span = cgroup_span()?;
    if TASKS.insert(tid, TaskState::new(span), 0).is_err() {
        count_drop(EventKind::TaskUntracked);
        return None;
    }
    set_tracked(tid, slot::pack(span as u32, task::SKIP_ORPHAN_EXIT));
    Some(span)
}

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let tid = current_tid();
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offset parsed from this kernel's format file.
    let old = unsafe { ctx.read_at::<i32>(off.exec_old_pid as usize) }
        .map(|p| p as u32)
        .unwrap_or(tid);
    let ns = ns_mode();
    // the old id as reported: read before a non-leader's state moves
    let old_reported = if ns { reported_tid(old) } else { old };
    let span = match span_of(tid) {
        Some(span) => span,
        None => {
            let moved = if old != tid {
                take_over(tid, old)
            } else {
                None
            };
            // a task in a followed cgroup runs a program (runc init execs
            // the container's command; `docker exec`): it joins the span
            match moved.or_else(|| cgroup_join(tid)) {
                Some(span) => span,
                None => return 0,
            }
        }
    };
    if ns && let Some(st) = TASKS.get_ptr_mut(tid) {
        // SAFETY: this thread's own entry; it now has the leader's ids.
        unsafe { (*st).ns_ids = ns_current() };
    }
    let Some(mut entry) = reserve(EventKind::Exec, span, now()) else {
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event; offsets parsed from this kernel's format file;
    // __data_loc is (len << 16 | offset) from the record start.
    unsafe {
        (*ev).aux[0] = old_reported as u64;
        if let Ok(loc) = ctx.read_at::<u32>(off.exec_filename as usize) {
            let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
            if let Ok(s) = bpf_probe_read_kernel_str_bytes(src, &mut (*ev).data) {
                (*ev).data_len = s.len() as u32;
                (*ev).flags |= flags::DATA_PATH;
                // the record's copy says how long it is, NUL included
                if (loc >> 16) as usize > DATA_LEN {
                    (*ev).flags |= flags::DATA_TRUNCATED;
                }
            }
        }
    }
    submit(entry, false);
    0
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    bump_task_gen();
    let pid_tgid = current_pid_tgid();
    let (tid, tgid) = (pid_tgid as u32, (pid_tgid >> 32) as u32);
    let span = span_of(tid);
    if let Some(span) = span {
        if let Some(st) = TASKS.get_ptr(tid) {
            // SAFETY: this thread's own entry, read before it is removed.
            let st = unsafe { &*st };
            if st.repeats > 0 && !send_repeats(st, span) {
                // ring full: the failures the count stood for are the drops
                count_drops(EventKind::SyscallFailed, st.repeats);
            }
        }
        set_tracked(tid, 0);
        let _ = TASKS.remove(tid);
        let _ = ARGS.remove(&tid);
    }
    let Some(off) = offsets() else { return 0 };
    let group_dead = if off.exit_group_dead == u32::MAX {
        tgid == tid
    } else {
        // SAFETY: offset parsed from this kernel's format file.
        unsafe { ctx.read_at::<u8>(off.exit_group_dead as usize) }.unwrap_or(1) != 0
    };
    if !group_dead {
        return 0; // a thread ended; the process goes on
    }
    // also for untracked processes: one that was untracked after its
    // exit_group must not leave a stale code for a later process
    // SAFETY: plain value read of this process's own entry.
    let exit_code = unsafe { EXIT_CODES.get(tgid) }.copied();
    if exit_code.is_some() {
        let _ = EXIT_CODES.remove(tgid);
    }
    let Some(span) = span else { return 0 };
    let Some(mut entry) = reserve(EventKind::Exit, span, now()) else {
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event, header already written.
    unsafe {
        (*ev).flags |= flags::GROUP_DEAD;
        if let Some(code) = exit_code {
            (*ev).flags |= flags::HAS_EXIT_CODE;
            (*ev).aux[0] = code as u32 as u64;
        }
    }
    submit(entry, true);
    0
}

// ---------------------------------------------------------------- signals, memory

#[tracepoint]
pub fn signal_generate(ctx: TracePointContext) -> u32 {
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offsets parsed from this kernel's format file.
    let (sig, target) = unsafe {
        (
            ctx.read_at::<i32>(off.signal_sig as usize).unwrap_or(0),
            ctx.read_at::<i32>(off.signal_pid as usize).unwrap_or(0),
        )
    };
    if !(1..64).contains(&sig) || FATAL_SIGNALS & (1u64 << sig) == 0 {
        return 0;
    }
    let Some(span) = span_of(target as u32) else {
        return 0;
    };
    // SAFETY: offsets parsed from this kernel's format file.
    let (code, result) = unsafe {
        (
            ctx.read_at::<i32>(off.signal_code as usize).unwrap_or(0),
            ctx.read_at::<i32>(off.signal_result as usize).unwrap_or(0),
        )
    };
    let Some(mut entry) = reserve(EventKind::Signal, span, now()) else {
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event, header already written (pid/comm = sender).
    unsafe {
        (*ev).aux[0] = sig as u64;
        (*ev).aux[1] = code as u32 as u64;
        (*ev).aux[2] = reported_tid(target as u32) as u64;
        (*ev).aux[3] = result as u64;
    }
    submit(entry, true);
    0
}

#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offset parsed from this kernel's format file.
    let victim = unsafe { ctx.read_at::<i32>(off.oom_pid as usize) }.unwrap_or(0);
    let Some(span) = span_of(victim as u32) else {
        return 0;
    };
    let Some(mut entry) = reserve(EventKind::OomVictim, span, now()) else {
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event; offsets parsed from this kernel's format file.
    unsafe {
        let reported = reported_tid(victim as u32);
        (*ev).pid = reported;
        (*ev).tid = reported;
        // u32::MAX: the field is not in this kernel's format
        if off.oom_total_vm != u32::MAX {
            (*ev).aux[0] = ctx.read_at::<u64>(off.oom_total_vm as usize).unwrap_or(0);
        }
        if off.oom_anon_rss != u32::MAX {
            (*ev).aux[1] = ctx.read_at::<u64>(off.oom_anon_rss as usize).unwrap_or(0);
        }
        if let Some(loc) = (off.oom_comm != u32::MAX)
            .then(|| ctx.read_at::<u32>(off.oom_comm as usize).ok())
            .flatten()
        {
            let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
            if let Ok(s) = bpf_probe_read_kernel_str_bytes(src, &mut (*ev).comm) {
                let _ = s;
            }
        }
    }
    submit(entry, true);
    0
}

// Direct reclaim (the machine is short of memory) and memory-cgroup reclaim
// (a cgroup at its limit charges a page: `try_to_free_mem_cgroup_pages`)
// stall the thread the same way and feed the same timing. They never nest:
// reclaim runs with PF_MEMALLOC, under which a charge does not reclaim again.

#[tracepoint]
pub fn direct_reclaim_begin(_ctx: TracePointContext) -> u32 {
    reclaim_begin();
    0
}

#[tracepoint]
pub fn direct_reclaim_end(_ctx: TracePointContext) -> u32 {
    reclaim_end(0);
    0
}

#[tracepoint]
pub fn memcg_reclaim_begin(_ctx: TracePointContext) -> u32 {
    reclaim_begin();
    0
}

#[tracepoint]
pub fn memcg_reclaim_end(_ctx: TracePointContext) -> u32 {
    reclaim_end(flags::MEMCG_RECLAIM);
    0
}

/// A traced thread entered reclaim: note when.
#[inline(always)]
fn reclaim_begin() {
    let tid = current_tid();
    if span_of(tid).is_none() {
        return;
    }
    if let Some(state) = TASKS.get_ptr_mut(tid) {
        // SAFETY: this thread's own entry.
        unsafe { (*state).reclaim_ts = now() };
    }
}

/// A traced thread left reclaim: send the stall, with `kind_flags` saying
/// which reclaim it was.
#[inline(always)]
fn reclaim_end(kind_flags: u32) {
    let tid = current_tid();
    if span_of(tid).is_none() {
        return;
    }
    let Some(state) = TASKS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: this thread's own entry.
    let st = unsafe { &mut *state };
    if st.reclaim_ts == 0 {
        return;
    }
    let ts = now();
    let began = st.reclaim_ts;
    st.reclaim_ts = 0;
    if let Some(mut entry) = reserve(EventKind::ReclaimStall, st.span, ts) {
        let ev = entry.as_mut_ptr();
        // SAFETY: reserved Event, header already written.
        unsafe {
            (*ev).duration_ns = ts.wrapping_sub(began);
            (*ev).flags |= kind_flags;
        }
        submit(entry, false);
    }
}

// ---------------------------------------------------------------- io_uring
//
// An io_uring operation makes no syscall of its own: it runs inside
// io_uring_enter, on an io-wq worker or from task work, and its error comes
// back in a completion entry. `io_uring_submit_req` fires in the submitter
// (or its SQPOLL thread) after the request was prepared: the request's
// path, already copied into the kernel, or its address, still in the
// submitter's memory, is read there and kept in `URING_REQS` by request
// pointer until `io_uring_complete` reports the result. io-wq workers and
// the SQPOLL thread are threads of the submitting process (no fork event
// tracks them), so a completion is checked against its thread and its
// thread group leader.

/// Traced requests in flight (kernel `struct io_kiocb *` → [`UringReq`]).
/// A request that never posts a completion (IOSQE_CQE_SKIP_SUCCESS, a ring
/// torn down by a kernel worker) is removed by userspace once its span has
/// ended; a full map is a counted drop. (A plain hash: an LRU one cost the
/// submission half again.)
#[map]
static URING_REQS: HashMap<u64, UringReq> = HashMap::with_max_entries(16384, 0);

/// The request being prepared, per CPU (too big for the stack).
#[map]
static URING_SCRATCH: PerCpuArray<UringReq> = PerCpuArray::with_max_entries(1, 0);

/// Where `struct filename *` sits in the prepared request: the op's struct
/// (`io_open`, `io_statx`, `io_mkdir`, `io_unlink`, `io_rename`, `io_link`)
/// is the first member of `struct io_kiocb`, and `filename->name` is the
/// struct's first field. These layouts have been stable since 5.19 (checked
/// against this kernel's BTF); a wrong read only loses the path.
#[inline(always)]
fn uring_filename_offset(opcode: u32) -> Option<usize> {
    match opcode {
        uring::OPENAT | uring::OPENAT2 | uring::MKDIRAT | uring::UNLINKAT => Some(16),
        uring::RENAMEAT | uring::LINKAT => Some(16), // oldpath
        uring::SYMLINKAT => Some(24),                // the link being created
        uring::STATX => Some(24),
        _ => None,
    }
}

/// The span of the current thread, or of its thread group leader (an io-wq
/// worker, an SQPOLL thread), with the slot's task flags.
#[inline(always)]
fn uring_task() -> Option<(u64, u32)> {
    let pid_tgid = current_pid_tgid();
    let v = TRACKED
        .get(pid_tgid as u32)
        .copied()
        .filter(|&v| slot::span(v) != 0)
        .or_else(|| {
            TRACKED
                .get((pid_tgid >> 32) as u32)
                .copied()
                .filter(|&v| slot::span(v) != 0)
        })?;
    Some((slot::span(v) as u64, slot::flags(v)))
}

#[tracepoint]
pub fn uring_submit_req(ctx: TracePointContext) -> u32 {
    let Some((span, tflags)) = uring_task() else {
        return 0;
    };
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offsets parsed from this kernel's format file.
    let (req, opcode) = unsafe {
        (
            ctx.read_at::<u64>(off.uring_submit_req as usize)
                .unwrap_or(0),
            ctx.read_at::<u8>(off.uring_submit_opcode as usize)
                .unwrap_or(0) as u32,
        )
    };
    if req == 0 {
        return 0;
    }
    let Some(r) = URING_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch slot; tracepoint programs do not nest on a CPU.
    let r = unsafe { &mut *r };
    r.span = span;
    r.ids = if ns_mode() {
        ns_current()
    } else {
        current_pid_tgid()
    };
    r.opcode = opcode;
    r.flags = 0;
    r.data_len = 0;
    r.open_flags = 0;
    if opcode == uring::OPENAT || opcode == uring::OPENAT2 {
        // io_open.how.flags, after file, dfd, file_slot and filename
        // SAFETY: kernel pointer read with the fault-tolerant helper.
        r.open_flags =
            unsafe { bpf_probe_read_kernel((req as usize + 24) as *const u64) }.unwrap_or(0);
    }
    if tflags & task::SECCOMP_ON != 0 {
        r.flags |= flags::SECCOMP_ON;
    }
    if let Some(at) = uring_filename_offset(opcode) {
        // SAFETY: kernel pointers read with the fault-tolerant helper.
        let name = unsafe {
            bpf_probe_read_kernel((req as usize + at) as *const u64)
                .and_then(|filename| bpf_probe_read_kernel(filename as *const u64))
        };
        match name.and_then(|name| unsafe {
            // SAFETY: as above.
            let n = bpf_probe_read_kernel_str_bytes(name as *const u8, &mut r.data)?.len();
            // a full `data`: does the name go on past it?
            let cut = n == DATA_LEN - 1
                && bpf_probe_read_kernel((name as *const u8).wrapping_add(n))
                    .is_ok_and(|b: u8| b != 0);
            Ok((n, cut))
        }) {
            Ok((n, cut)) => {
                r.data_len = n as u32;
                r.flags |= flags::DATA_PATH;
                if cut {
                    r.flags |= flags::DATA_TRUNCATED;
                }
            }
            Err(_) => r.flags |= flags::DATA_FAULT,
        }
    } else if opcode == uring::CONNECT {
        // struct io_connect { file; struct sockaddr __user *addr; int addr_len; }:
        // the submitter's memory, which is the current mm here
        // SAFETY: kernel and user pointers read with the fault-tolerant helpers.
        let read = unsafe {
            bpf_probe_read_kernel((req as usize + 8) as *const u64).and_then(|addr| {
                let len = bpf_probe_read_kernel((req as usize + 16) as *const i32)?;
                bpf_probe_read_user_buf(addr as *const u8, &mut r.data[..112]).map(|()| len)
            })
        };
        match read {
            Ok(len) => {
                r.data_len = (len as u32).min(112);
                r.flags |= flags::DATA_SOCKADDR;
            }
            Err(_) => r.flags |= flags::DATA_FAULT,
        }
    }
    // under a seccomp filter, the first success of each path or address
    // operation is reported too: seccomp never saw it
    if tflags & task::SECCOMP_ON != 0
        && opcode < 64
        && r.flags & (flags::DATA_PATH | flags::DATA_SOCKADDR) != 0
        && let Some(st) = TASKS.get_ptr_mut(current_tid())
    {
        // SAFETY: this thread's own entry.
        let st = unsafe { &mut *st };
        if st.uring_reported & (1u64 << opcode) == 0 {
            st.uring_reported |= 1u64 << opcode;
            r.flags |= flags::REPORT_SUCCESS;
        }
    }
    if URING_REQS.insert(&req, r, 0).is_err() {
        count_drop(EventKind::UringFailed);
    }
    0
}

#[tracepoint]
pub fn uring_complete(ctx: TracePointContext) -> u32 {
    if uring_task().is_none() {
        return 0;
    }
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offsets parsed from this kernel's format file.
    let (req, res, cflags) = unsafe {
        (
            ctx.read_at::<u64>(off.uring_complete_req as usize)
                .unwrap_or(0),
            ctx.read_at::<i32>(off.uring_complete_res as usize)
                .unwrap_or(0),
            ctx.read_at::<u32>(off.uring_complete_cflags as usize)
                .unwrap_or(0),
        )
    };
    // not kept: refused at preparation (`uring_req_failed` sent it), or
    // the map was full at submission (counted as a drop there)
    let Some(r) = URING_REQS.get_ptr(&req) else {
        return 0;
    };
    // SAFETY: a map value, valid until removed below.
    let r = unsafe { &*r };
    let kind = if res < 0 {
        Some(EventKind::UringFailed)
    } else if r.flags & flags::REPORT_SUCCESS != 0 {
        Some(EventKind::UringUnderSeccomp)
    } else {
        None
    };
    if let Some(kind) = kind
        && let Some(mut entry) = reserve(kind, r.span, now())
    {
        let ev = entry.as_mut_ptr();
        // SAFETY: reserved Event, header already written; the ids are the
        // submitter's, not the worker's that completes it.
        unsafe {
            (*ev).pid = (r.ids >> 32) as u32;
            (*ev).tid = r.ids as u32;
            (*ev).syscall = r.opcode as i64;
            (*ev).ret = res as i64;
            (*ev).aux[0] = r.opcode as u64;
            (*ev).aux[1] = r.open_flags;
            (*ev).flags |= r.flags & !flags::REPORT_SUCCESS;
            copy_data(&mut (*ev).data, &r.data);
            (*ev).data_len = r.data_len;
        }
        submit(entry, false);
    }
    if cflags & uring::CQE_F_MORE == 0 {
        let _ = URING_REQS.remove(&req);
    }
    0
}

/// A request refused while it was being prepared (bad address, flags or
/// fd): it never reaches `io_uring_submit_req`. Fires in the submitter,
/// so the path or address is read from its memory (`sqe->addr`).
#[tracepoint]
pub fn uring_req_failed(ctx: TracePointContext) -> u32 {
    let Some((span, tflags)) = uring_task() else {
        return 0;
    };
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offsets parsed from this kernel's format file.
    let (opcode, addr, addr2, op_flags, error) = unsafe {
        (
            ctx.read_at::<u8>(off.uring_failed_opcode as usize)
                .unwrap_or(0) as u32,
            ctx.read_at::<u64>(off.uring_failed_addr as usize)
                .unwrap_or(0),
            ctx.read_at::<u64>(off.uring_failed_addr2 as usize)
                .unwrap_or(0),
            ctx.read_at::<u32>(off.uring_failed_op_flags as usize)
                .unwrap_or(0),
            ctx.read_at::<i32>(off.uring_failed_error as usize)
                .unwrap_or(0),
        )
    };
    let Some(mut entry) = reserve(EventKind::UringFailed, span, now()) else {
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event, header already written; user memory read with
    // the fault-tolerant helpers.
    unsafe {
        (*ev).syscall = opcode as i64;
        (*ev).ret = error as i64;
        (*ev).aux[0] = opcode as u64;
        if opcode == uring::OPENAT {
            // sqe->open_flags
            (*ev).aux[1] = op_flags as u64;
        }
        if tflags & task::SECCOMP_ON != 0 {
            (*ev).flags |= flags::SECCOMP_ON;
        }
        if uring_filename_offset(opcode).is_some() {
            // symlinkat: sqe->addr is the target, addr2 the new link
            let path = if opcode == uring::SYMLINKAT {
                addr2
            } else {
                addr
            };
            if let Ok(s) = bpf_probe_read_user_str_bytes(path as *const u8, &mut (*ev).data) {
                (*ev).data_len = s.len() as u32;
                (*ev).flags |= flags::DATA_PATH | path_cut(path as *const u8, s.len());
            }
        } else if opcode == uring::CONNECT
            && bpf_probe_read_user_buf(addr as *const u8, &mut (&mut (*ev).data)[..112]).is_ok()
        {
            // sqe->addr2 (the `off` field) is the address length
            (*ev).data_len = (addr2 as u32).min(112);
            (*ev).flags |= flags::DATA_SOCKADDR;
        }
    }
    submit(entry, false);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
