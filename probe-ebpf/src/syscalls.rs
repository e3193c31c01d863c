//! `sys_enter`/`sys_exit`: failing syscalls, seccomp denials (an exit
//! without an enter), file writes and other successes that matter, with
//! their arguments read by role (`probe_abi::ROLES`).

use super::*;

/// `probe_abi::ROLES` in the object's read-only data.
pub(crate) static ROLE_TABLE: [ArgRole; ROLES_LEN] = ROLES;

/// `probe_abi::ENTER_STATE` and `SUCCESS_MATTERS`, likewise: the common
/// path of both syscall programs asks one of them, by one load and a mask.
pub(crate) static ENTER_STATE_SET: SyscallSet = ENTER_STATE;
pub(crate) static SUCCESS_SET: SyscallSet = SUCCESS_MATTERS;

/// Whether syscall `nr` is in `set` (one of the two above).
#[inline(always)]
pub(crate) fn in_syscall_set(set: &'static SyscallSet, nr: i64) -> bool {
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
pub(crate) static ROLE_INDEX_MASK: u64 = ROLES_LEN as u64 - 1;
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
pub(crate) fn bounded_nr(nr: i64) -> usize {
    // SAFETY: plain read of a read-only static.
    (nr as u64 & unsafe { read_volatile(&ROLE_INDEX_MASK) }) as usize
}

/// What syscall `nr`'s arguments carry (`probe_abi::syscall_arg_role`), by
/// one table load.
#[inline(always)]
pub(crate) fn role(nr: i64) -> ArgRole {
    if nr >= 0 && (nr as usize) < ROLES_LEN {
        // SAFETY: in bounds; a volatile read keeps the table in .rodata
        // instead of a chain of compares the optimizer would rebuild.
        unsafe { read_volatile(ROLE_TABLE.as_ptr().add(bounded_nr(nr))) }
    } else {
        ArgRole::None
    }
}

/// Where `struct pt_regs` keeps a syscall's number and arguments (the
/// ptrace ABI of each architecture; stable). The argument registers still
/// hold the arguments at `sys_exit`, except arm64's x0, which holds the
/// return value by then: its first argument is `orig_x0`, as the kernel's
/// own `syscall_get_arguments` reads it.
#[cfg(bpf_target_arch = "x86_64")]
pub(crate) mod regs {
    /// di, si, dx, r10, r8, r9.
    pub const ARGS: [usize; 6] = [112, 104, 96, 56, 72, 64];
    /// orig_ax (a u64).
    pub const NR: usize = 120;
    pub type Nr = i64;
}

#[cfg(bpf_target_arch = "aarch64")]
pub(crate) mod regs {
    /// orig_x0, then x1..x5 of `regs[31]`.
    pub const ARGS: [usize; 6] = [272, 8, 16, 24, 32, 40];
    /// syscallno (an s32: the verifier refuses a wider load of it).
    pub const NR: usize = 280;
    pub type Nr = i32;
}

/// Syscall argument `i` from the saved user registers.
#[inline(always)]
pub(crate) fn reg_arg(regs: *const u8, i: u8) -> u64 {
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
pub(crate) trait SyscallArgs: Copy {
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
pub(crate) struct BtfRegs(*const u8);

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
pub(crate) struct SavedArgs {
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
pub(crate) static ARGS: LruHashMap<u32, [u64; 6]> = LruHashMap::with_max_entries(65536, 0);

/// This thread's `TRACKED` slot, when it is traced.
#[inline(always)]
pub(crate) fn tracked_slot(tid: u32) -> Option<*mut u64> {
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
pub(crate) fn on_enter<A: SyscallArgs>(ptr: *mut u64, tid: u32, id: i64, args: A) {
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
pub(crate) fn on_exit<A: SyscallArgs>(ptr: *mut u64, ids: u64, ret: i64, args: A) {
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
pub(crate) fn report_fork(tid: u32, span: u64) {
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
pub(crate) fn on_failure<A: SyscallArgs>(
    ids: u64,
    args: A,
    span: u64,
    entered: i64,
    ret: i64,
    tflags: u32,
) {
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
pub(crate) const NEVER_REPEATED: i64 = -2;

/// A failure's fields besides its path or address.
pub(crate) struct FailureKey {
    nr: i64,
    ret: i64,
    aux0: u64,
    data_len: u32,
    data_flags: u32,
}

/// Sends the thread's pending repeat count; false when the ring is full.
#[inline(always)]
pub(crate) fn send_repeats(st: &TaskState, span: u64) -> bool {
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
pub(crate) fn words(len: u32) -> usize {
    (len as usize).div_ceil(8)
}

/// Whether `cur` is the same failure as `last`.
#[inline(always)]
pub(crate) fn same_failure(last: &Failure, cur: &FailureKey, data: &[u8; DATA_LEN]) -> bool {
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
pub(crate) fn copy_data(dst: &mut [u8; DATA_LEN], src: &[u8; DATA_LEN]) {
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
pub(crate) fn on_success<A: SyscallArgs>(
    ptr: *mut u64,
    args: A,
    span: u64,
    entered: i64,
    ret: i64,
) {
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
pub(crate) fn path_cut(ptr: *const u8, read: usize) -> u32 {
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
pub(crate) fn fill_data<A: SyscallArgs>(
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
