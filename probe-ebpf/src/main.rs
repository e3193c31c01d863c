//! The probe's eBPF programs: tracepoints only (this kernel has no kprobes).
//!
//! Layout:
//! - `TASKS` (thread id → [`TaskState`]) decides what is traced. Userspace
//!   inserts the first task of a span; `sched_process_fork` copies the entry
//!   to every child, so nothing a traced task starts escapes. An untracked
//!   thread pays one failed lookup per tracepoint hit and emits nothing.
//! - `EVENTS`, one ring buffer; `DROPS`, per-CPU counters per event kind for
//!   every record the ring buffer had no room for.
//! - Seccomp denials: the kernel runs seccomp before `sys_enter` fires but
//!   always fires `sys_exit`, so an exit with no enter is a syscall that never
//!   ran. Fresh fork children and tasks attached mid-syscall are excluded with
//!   `SKIP_ORPHAN_EXIT`.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes, bpf_probe_read_user, bpf_probe_read_user_buf,
        bpf_probe_read_user_str_bytes,
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{RawTracePointContext, TracePointContext},
};
use probe_abi::{
    ArgRole, DATA_LEN, EVENT_KINDS, Event, EventKind, NO_SYSCALL, Offsets, TaskState, flags, nr,
    open_flags_write, syscall_arg_role, task,
};

#[map]
static TASKS: HashMap<u32, TaskState> = HashMap::with_max_entries(65536, 0);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

#[map]
static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(EVENT_KINDS, 0);

/// tgid → code passed to exit/exit_group. Per process, not per thread:
/// the thread that exits last (and fires the group-dead exit) is often not
/// the one that called exit_group.
#[map]
static EXIT_CODES: HashMap<u32, i32> = HashMap::with_max_entries(65536, 0);

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
    if let Some(counter) = DROPS.get_ptr_mut(kind as u32) {
        // SAFETY: per-CPU slot, only this CPU writes it while preemption is off.
        unsafe { *counter += 1 };
    }
}

/// Reserves an event and fills the common header; `None` (counted as a drop)
/// when the ring buffer is full.
#[inline(always)]
fn reserve(
    kind: EventKind,
    span: u64,
    ts: u64,
) -> Option<aya_ebpf::maps::ring_buf::RingBufEntry<Event>> {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count_drop(kind);
        return None;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at ring-buffer memory sized for one Event; we write
    // fields in place so the 400-byte record never lands on the 512-byte stack.
    unsafe {
        (*ev).ts_ns = ts;
        (*ev).span = span;
        (*ev).kind = kind as u32;
        (*ev).flags = 0;
        (*ev).pid = (pid_tgid >> 32) as u32;
        (*ev).tid = pid_tgid as u32;
        (*ev).syscall = 0;
        (*ev).ret = 0;
        (*ev).duration_ns = 0;
        (*ev).aux = [0; 4];
        (*ev).data_len = 0;
        (*ev)._pad = 0;
        (*ev).comm = bpf_get_current_comm().unwrap_or([0; 16]);
    }
    Some(entry)
}

#[inline(always)]
fn offsets() -> Option<&'static Offsets> {
    OFFSETS.get(0)
}

// ---------------------------------------------------------------- syscalls

/// x86_64 `struct pt_regs` offsets (the ptrace ABI; stable).
const REG_OFFSETS: [usize; 6] = [112, 104, 96, 56, 72, 64]; // di si dx r10 r8 r9
const REG_ORIG_AX: usize = 120;

/// Syscall argument `i` from the saved user registers.
#[inline(always)]
fn reg_arg(regs: *const u8, i: u8) -> u64 {
    let off = if (i as usize) < REG_OFFSETS.len() { REG_OFFSETS[i as usize] } else { return 0 };
    // SAFETY: `regs` is the tracepoint's pt_regs pointer; read with the
    // fault-tolerant helper.
    unsafe { bpf_probe_read_kernel(regs.add(off) as *const u64) }.unwrap_or(0)
}

/// Saves what `sys_exit` will need from the arguments of syscall `id`.
#[inline(always)]
fn save_args(st: &mut TaskState, regs: *const u8, id: i64) {
    match syscall_arg_role(id) {
        ArgRole::None => {}
        ArgRole::Path { path, flags } => {
            st.arg_ptr = reg_arg(regs, path);
            st.arg_aux = match flags {
                Some(f) => reg_arg(regs, f),
                // creat and mkdir always create
                None if id == nr::CREAT || id == nr::MKDIR || id == nr::MKDIRAT => 0o100,
                None => 0,
            };
        }
        ArgRole::SockAddr { addr, len } => {
            st.arg_ptr = reg_arg(regs, addr);
            st.arg_aux = reg_arg(regs, len);
        }
        ArgRole::First => {
            st.arg_aux = reg_arg(regs, 0);
            if id == nr::EXIT_GROUP || id == nr::EXIT {
                let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
                let _ = EXIT_CODES.insert(tgid, st.arg_aux as i32, 0);
            }
            if id == nr::CLONE3 {
                // clone3(struct clone_args *): flags is the first u64
                // SAFETY: user pointer read with the fault-tolerant helper.
                st.arg_aux = unsafe { bpf_probe_read_user(st.arg_aux as *const u64) }.unwrap_or(0);
            }
        }
    }
}

/// Raw tracepoint on `raw_syscalls:sys_enter(struct pt_regs *regs, long id)`:
/// the same tracepoint as the classic one, without the perf-record copy.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(state) = TASKS.get_ptr_mut(tid) else {
        return 0;
    };
    let regs: *const u8 = ctx.arg(0);
    let id: i64 = ctx.arg(1);
    // SAFETY: `state` is this thread's own TASKS entry; only this thread
    // writes it while it runs a syscall.
    let st = unsafe { &mut *state };
    st.enter_nr = id;
    st.enter_ts = now();
    save_args(st, regs, id);
    0
}

/// Raw tracepoint on `raw_syscalls:sys_exit(struct pt_regs *regs, long ret)`.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(state) = TASKS.get_ptr_mut(tid) else {
        return 0;
    };
    let regs: *const u8 = ctx.arg(0);
    let ret: i64 = ctx.arg(1);
    // SAFETY: this thread's own TASKS entry, see sys_enter.
    let st = unsafe { &mut *state };
    let entered = st.enter_nr;
    st.enter_nr = NO_SYSCALL;

    if entered == NO_SYSCALL {
        if st.flags & task::SKIP_ORPHAN_EXIT != 0 {
            st.flags &= !task::SKIP_ORPHAN_EXIT;
            return 0;
        }
        // An exit with no enter: seccomp stopped the syscall before it ran.
        // The registers still hold its number and arguments.
        // SAFETY: pt_regs pointer of this tracepoint, fault-tolerant read.
        let id = unsafe { bpf_probe_read_kernel(regs.add(REG_ORIG_AX) as *const i64) }.unwrap_or(-1);
        save_args(st, regs, id);
        let ts = now();
        if let Some(mut entry) = reserve(EventKind::SeccompDenied, st.span, ts) {
            let ev = entry.as_mut_ptr();
            // SAFETY: reserved Event, header already written.
            unsafe {
                (*ev).syscall = id;
                (*ev).ret = ret;
                fill_data(&mut *ev, id, st);
                if st.flags & task::SECCOMP_ON != 0 {
                    (*ev).flags |= flags::SECCOMP_ON;
                }
            }
            entry.submit(0);
        }
        return 0;
    }
    st.flags &= !task::SKIP_ORPHAN_EXIT;

    if ret >= 0 {
        on_success(st, entered, ret);
        return 0;
    }

    let ts = now();
    let Some(mut entry) = reserve(EventKind::SyscallFailed, st.span, ts) else {
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event, header already written.
    unsafe {
        (*ev).syscall = entered;
        (*ev).ret = ret;
        (*ev).duration_ns = ts.wrapping_sub(st.enter_ts);
        (*ev).aux[0] = st.arg_aux;
        fill_data(&mut *ev, entered, st);
        if st.flags & task::SECCOMP_ON != 0 {
            (*ev).flags |= flags::SECCOMP_ON;
        }
    }
    entry.submit(0);
    0
}

/// A syscall succeeded: record file writes and seccomp filters installed.
#[inline(always)]
fn on_success(st: &mut TaskState, entered: i64, ret: i64) {
    match entered {
        nr::SECCOMP => st.flags |= task::SECCOMP_ON,
        nr::DUP2 | nr::DUP3 => {
            if let Some(mut entry) = reserve(EventKind::FdDup, st.span, now()) {
                let ev = entry.as_mut_ptr();
                // SAFETY: reserved Event, header already written.
                unsafe {
                    (*ev).syscall = entered;
                    (*ev).ret = ret;
                    (*ev).aux[0] = st.arg_aux;
                }
                entry.submit(0);
            }
        }
        nr::PRCTL if st.arg_aux == nr::PR_SET_SECCOMP => st.flags |= task::SECCOMP_ON,
        nr::OPEN | nr::OPENAT | nr::CREAT | nr::MKDIR | nr::MKDIRAT | nr::MOUNT
            if entered == nr::MOUNT || open_flags_write(st.arg_aux) =>
        {
            let ts = now();
            let kind = if entered == nr::MOUNT { EventKind::Mount } else { EventKind::FileWrite };
            let Some(mut entry) = reserve(kind, st.span, ts) else {
                return;
            };
            let ev = entry.as_mut_ptr();
            // SAFETY: reserved Event, header already written.
            unsafe {
                (*ev).syscall = entered;
                (*ev).ret = ret;
                (*ev).duration_ns = ts.wrapping_sub(st.enter_ts);
                (*ev).aux[0] = st.arg_aux;
                fill_data(&mut *ev, entered, st);
            }
            entry.submit(0);
        }
        _ => {}
    }
}

/// Copies the path or socket address of the syscall into `ev.data`.
#[inline(always)]
fn fill_data(ev: &mut Event, nr: i64, st: &TaskState) {
    match syscall_arg_role(nr) {
        ArgRole::Path { .. } => {
            // SAFETY: a user pointer read with the fault-tolerant helper.
            match unsafe { bpf_probe_read_user_str_bytes(st.arg_ptr as *const u8, &mut ev.data) } {
                Ok(s) => {
                    ev.data_len = s.len() as u32;
                    ev.flags |= flags::DATA_PATH;
                }
                Err(_) => ev.flags |= flags::DATA_FAULT,
            }
        }
        ArgRole::SockAddr { .. } => {
            // sockaddr_in6 is 28 bytes, sockaddr_un 110: copy a fixed 112.
            const N: usize = 112;
            let buf = &mut ev.data[..N];
            // SAFETY: a user pointer read with the fault-tolerant helper.
            match unsafe { bpf_probe_read_user_buf(st.arg_ptr as *const u8, buf) } {
                Ok(()) => {
                    let len = st.arg_aux as u32;
                    ev.data_len = if len > N as u32 { N as u32 } else { len };
                    ev.flags |= flags::DATA_SOCKADDR;
                }
                Err(_) => ev.flags |= flags::DATA_FAULT,
            }
        }
        _ => {}
    }
    let _ = DATA_LEN;
}

// ---------------------------------------------------------------- processes

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(parent) = TASKS.get_ptr(tid) else {
        return 0;
    };
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offset parsed from this kernel's format file.
    let Ok(child) = (unsafe { ctx.read_at::<i32>(off.fork_child_pid as usize) }) else {
        return 0;
    };
    // SAFETY: the parent's own entry; read-only here.
    let parent = unsafe { &*parent };
    let clone_flags = match parent.enter_nr {
        nr::CLONE | nr::CLONE3 => parent.arg_aux,
        _ => 0,
    };
    let inherited = parent.flags & task::SECCOMP_ON;
    let child_state = TaskState::new(parent.span, task::SKIP_ORPHAN_EXIT | inherited);
    let ts = now();
    if TASKS.insert(child as u32, child_state, 0).is_err() {
        // TASKS is full: the child escapes. Say so rather than lose it silently.
        count_drop(EventKind::TaskUntracked);
    }
    if let Some(mut entry) = reserve(EventKind::Fork, parent.span, ts) {
        let ev = entry.as_mut_ptr();
        // SAFETY: reserved Event, header already written.
        unsafe {
            (*ev).aux[0] = child as u64;
            (*ev).aux[1] = clone_flags;
            if clone_flags & CLONE_THREAD != 0 {
                (*ev).flags |= flags::THREAD;
            }
        }
        entry.submit(0);
    }
    0
}

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(state) = TASKS.get_ptr(tid) else {
        return 0;
    };
    let Some(off) = offsets() else { return 0 };
    // SAFETY: the task's own entry, read-only.
    let span = unsafe { (*state).span };
    let Some(mut entry) = reserve(EventKind::Exec, span, now()) else {
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event; offsets parsed from this kernel's format file;
    // __data_loc is (len << 16 | offset) from the record start.
    unsafe {
        if let Ok(old) = ctx.read_at::<i32>(off.exec_old_pid as usize) {
            (*ev).aux[0] = old as u64;
        }
        if let Ok(loc) = ctx.read_at::<u32>(off.exec_filename as usize) {
            let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
            if let Ok(s) = bpf_probe_read_kernel_str_bytes(src, &mut (*ev).data) {
                (*ev).data_len = s.len() as u32;
                (*ev).flags |= flags::DATA_PATH;
            }
        }
    }
    entry.submit(0);
    0
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(state) = TASKS.get_ptr(tid) else {
        return 0;
    };
    // SAFETY: the task's own entry; copied before it is removed below.
    let st = unsafe { *state };
    let _ = TASKS.remove(tid);
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offset parsed from this kernel's format file.
    let group_dead = if off.exit_group_dead == u32::MAX {
        (bpf_get_current_pid_tgid() >> 32) as u32 == tid
    } else {
        unsafe { ctx.read_at::<u8>(off.exit_group_dead as usize) }.unwrap_or(1) != 0
    };
    if !group_dead {
        return 0; // a thread ended; the process goes on
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: plain value read of this process's own entry.
    let exit_code = unsafe { EXIT_CODES.get(tgid) }.copied();
    let _ = EXIT_CODES.remove(tgid);
    let Some(mut entry) = reserve(EventKind::Exit, st.span, now()) else {
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
    entry.submit(0);
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
    let Some(state) = TASKS.get_ptr(target as u32) else {
        return 0;
    };
    // SAFETY: offsets parsed from this kernel's format file.
    let (code, result) = unsafe {
        (
            ctx.read_at::<i32>(off.signal_code as usize).unwrap_or(0),
            ctx.read_at::<i32>(off.signal_result as usize).unwrap_or(0),
        )
    };
    // SAFETY: read-only access to the target's entry.
    let span = unsafe { (*state).span };
    let Some(mut entry) = reserve(EventKind::Signal, span, now()) else {
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event, header already written (pid/comm = sender).
    unsafe {
        (*ev).aux = [sig as u64, code as u32 as u64, target as u64, result as u64];
    }
    entry.submit(0);
    0
}

#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    let Some(off) = offsets() else { return 0 };
    // SAFETY: offset parsed from this kernel's format file.
    let victim = unsafe { ctx.read_at::<i32>(off.oom_pid as usize) }.unwrap_or(0);
    let Some(state) = TASKS.get_ptr(victim as u32) else {
        return 0;
    };
    // SAFETY: read-only access to the victim's entry.
    let span = unsafe { (*state).span };
    let Some(mut entry) = reserve(EventKind::OomVictim, span, now()) else {
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved Event; offsets parsed from this kernel's format file.
    unsafe {
        (*ev).pid = victim as u32;
        (*ev).tid = victim as u32;
        (*ev).aux[0] = ctx.read_at::<u64>(off.oom_total_vm as usize).unwrap_or(0);
        (*ev).aux[1] = ctx.read_at::<u64>(off.oom_anon_rss as usize).unwrap_or(0);
        if let Ok(loc) = ctx.read_at::<u32>(off.oom_comm as usize) {
            let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
            if let Ok(s) = bpf_probe_read_kernel_str_bytes(src, &mut (*ev).comm) {
                let _ = s;
            }
        }
    }
    entry.submit(0);
    0
}

#[tracepoint]
pub fn direct_reclaim_begin(_ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(state) = TASKS.get_ptr_mut(tid) {
        // SAFETY: this thread's own entry.
        unsafe { (*state).reclaim_ts = now() };
    }
    0
}

#[tracepoint]
pub fn direct_reclaim_end(_ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(state) = TASKS.get_ptr_mut(tid) else {
        return 0;
    };
    // SAFETY: this thread's own entry.
    let st = unsafe { &mut *state };
    if st.reclaim_ts == 0 {
        return 0;
    }
    let ts = now();
    let began = st.reclaim_ts;
    st.reclaim_ts = 0;
    if let Some(mut entry) = reserve(EventKind::ReclaimStall, st.span, ts) {
        let ev = entry.as_mut_ptr();
        // SAFETY: reserved Event, header already written.
        unsafe { (*ev).duration_ns = ts.wrapping_sub(began) };
        entry.submit(0);
    }
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
