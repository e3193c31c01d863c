//! The kernel/userspace ABI of the probe, in one place.
//!
//! Layout:
//! - [`Event`]: the one record the eBPF programs write to the ring buffer.
//! - [`EventKind`]: what an event is; also the index of its drop counter.
//! - [`TaskState`]: the per-thread value of the `TASKS` map (thread id → span).
//! - [`Offsets`]: tracepoint field offsets, parsed from tracefs by userspace
//!   because their layout varies across kernels.
//! - [`syscall_arg_role`]: which syscall argument holds a path or an address.
//! - `syscalls` ([`SyscallNumbers`], [`NATIVE`]): the syscall numbers of
//!   x86_64 and aarch64, the only place a number stands for a syscall.
//!
//! Everything here is `#[repr(C)]`, `Copy`, with explicit padding: `u32` flags,
//! never `bool`.
#![no_std]

mod syscalls;

use syscalls::one_of;
pub use syscalls::{AARCH64, ABSENT, NATIVE, SyscallNumbers, X86_64};

/// Bytes of path or socket address carried by one event.
pub const DATA_LEN: usize = 256;

/// `Event::kind` values. Also the index into the per-CPU `DROPS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A traced syscall returned a negative errno after a matching enter.
    SyscallFailed = 0,
    /// A syscall exit with no matching enter: seccomp stopped it before it ran.
    SeccompDenied = 1,
    /// A signal generated for a traced task (fatal signals only).
    Signal = 2,
    /// The OOM killer chose a traced task.
    OomVictim = 3,
    /// A traced task forked or cloned.
    Fork = 4,
    /// A traced task executed a new program.
    Exec = 5,
    /// A traced process exited (last thread of the group).
    Exit = 6,
    /// A traced task opened a file for writing, or created one.
    FileWrite = 7,
    /// A traced task came back from memory reclaim: direct (the machine
    /// short of memory) or its memory cgroup's (at its limit,
    /// [`flags::MEMCG_RECLAIM`]).
    ReclaimStall = 8,
    /// Not an event: a fork whose child could not be tracked (TASKS full).
    TaskUntracked = 9,
    /// A traced task mounted a filesystem (`aux[0]`: mount flags).
    Mount = 10,
    /// dup2/dup3 succeeded (`aux[0]`: old fd, `ret`: new fd), so userspace
    /// can follow a file opened for writing to the fd it is written through.
    FdDup = 11,
    /// The thread's last SyscallFailed repeated identically (same syscall,
    /// errno, argument and path or address) `aux[0]` more times in a row;
    /// sent when the run ends (a different failure, the thread's exit).
    /// `syscall`/`ret` name the failure that repeated.
    Repeated = 12,
    /// An io_uring request of a traced task failed (`ret`: the completion's
    /// negative errno; `aux[0]`: the `IORING_OP_*` opcode, named in
    /// userspace as the syscall it stands for, [`uring_op_syscall`]). No
    /// syscall failed: the operation ran inside `io_uring_enter` or on an
    /// io-wq worker. `pid`/`tid` are the submitter's.
    UringFailed = 13,
    /// An io_uring request that names a path or an address succeeded while
    /// its submitter ran under a seccomp filter, which never sees io_uring
    /// operations. Once per thread and opcode.
    UringUnderSeccomp = 14,
}

/// Number of event kinds, i.e. length of the `DROPS` array.
pub const EVENT_KINDS: u32 = 15;

/// The value of the single per-CPU `DROPS` slot: one counter per kind, so
/// userspace reads all of them with one lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DropCounters {
    pub by_kind: [u64; EVENT_KINDS as usize],
}

impl EventKind {
    pub const ALL: [EventKind; EVENT_KINDS as usize] = [
        EventKind::SyscallFailed,
        EventKind::SeccompDenied,
        EventKind::Signal,
        EventKind::OomVictim,
        EventKind::Fork,
        EventKind::Exec,
        EventKind::Exit,
        EventKind::FileWrite,
        EventKind::ReclaimStall,
        EventKind::TaskUntracked,
        EventKind::Mount,
        EventKind::FdDup,
        EventKind::Repeated,
        EventKind::UringFailed,
        EventKind::UringUnderSeccomp,
    ];

    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }
}

/// `Event::flags` bits.
pub mod flags {
    /// `data` holds a NUL-terminated path.
    pub const DATA_PATH: u32 = 1 << 0;
    /// `data` holds a `struct sockaddr` of `data_len` bytes.
    pub const DATA_SOCKADDR: u32 = 1 << 1;
    /// The task had a seccomp filter (seen installed, or present at attach).
    pub const SECCOMP_ON: u32 = 1 << 2;
    /// Fork: the child is a thread (CLONE_THREAD).
    pub const THREAD: u32 = 1 << 3;
    /// Exit: `aux[0]` holds the code passed to exit/exit_group.
    pub const HAS_EXIT_CODE: u32 = 1 << 4;
    /// Exit: the whole thread group is gone.
    pub const GROUP_DEAD: u32 = 1 << 5;
    /// Reading the path or address from user memory failed.
    pub const DATA_FAULT: u32 = 1 << 6;
    /// ReclaimStall: the memory cgroup's reclaim at its limit
    /// (`vmscan:mm_vmscan_memcg_reclaim_*`), not direct reclaim.
    pub const MEMCG_RECLAIM: u32 = 1 << 7;
    /// `syscall_failed` for a getsockopt(SO_ERROR) that returned 0 but
    /// reported an error (`ret` is minus that error): how a non-blocking
    /// connect learns it was refused, unreachable or timed out.
    pub const SOCKET_ERROR: u32 = 1 << 8;
    /// An in-flight io_uring request ([`UringReq`]) whose success is
    /// reported too (`UringUnderSeccomp`); never in an [`Event`].
    pub const REPORT_SUCCESS: u32 = 1 << 9;
    /// `data` holds the first `DATA_LEN - 1` bytes of a longer path.
    pub const DATA_TRUNCATED: u32 = 1 << 10;
}

/// Layout of a `TRACKED` slot (one u64 per thread id): the span in the
/// high 32 bits, [`task`] flags in bits 16..32, the syscall in flight + 1
/// in bits 0..16 (0: none). One inlined array access per syscall.
pub mod slot {
    pub const NR_MASK: u64 = 0xffff;
    pub const FLAGS_SHIFT: u32 = 16;
    pub const SPAN_SHIFT: u32 = 32;
    /// In flight, but a syscall number that does not fit (or is negative).
    pub const NR_UNKNOWN: u64 = 0xffff;

    #[inline(always)]
    pub const fn pack(span: u32, flags: u32) -> u64 {
        ((span as u64) << SPAN_SHIFT) | (((flags as u64) & 0xffff) << FLAGS_SHIFT)
    }
    #[inline(always)]
    pub const fn span(v: u64) -> u32 {
        (v >> SPAN_SHIFT) as u32
    }
    #[inline(always)]
    pub const fn flags(v: u64) -> u32 {
        ((v >> FLAGS_SHIFT) & 0xffff) as u32
    }
}

/// Task flag bits (in a `TRACKED` slot).
pub mod task {
    /// The next syscall exit without an enter is expected (a fresh child's
    /// return from fork/clone, or a syscall in flight when userspace attached).
    pub const SKIP_ORPHAN_EXIT: u32 = 1 << 0;
    /// The task runs under a seccomp filter.
    pub const SECCOMP_ON: u32 = 1 << 1;
    /// PID-namespace mode: a fresh child whose Fork event is sent from its
    /// own first syscall exit, the first moment its namespace ids are
    /// readable (`bpf_get_ns_current_pid_tgid` sees only the current task).
    pub const REPORT_FORK: u32 = 1 << 2;
}

/// One record in the ring buffer. Field meanings per kind are documented on
/// each field; `aux` is kind-specific.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Event {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// The span the task belongs to.
    pub span: u64,
    /// An [`EventKind`] as u32.
    pub kind: u32,
    /// [`flags`] bits.
    pub flags: u32,
    /// Thread-group id of the current task (for `Signal`: the sender; for
    /// `OomVictim`: the victim).
    pub pid: u32,
    /// Thread id of the current task.
    pub tid: u32,
    /// Syscall number (syscall events).
    pub syscall: i64,
    /// Syscall return value (syscall events).
    pub ret: i64,
    /// Syscall or reclaim duration.
    pub duration_ns: u64,
    /// SyscallFailed/FileWrite: [open flags or fd, -, -, -]; Fork: [child pid, clone
    /// flags, -, -]; Exec: [old pid]; Exit: [exit code]; Signal: [signo, si_code,
    /// target pid, result]; OomVictim: [total_vm kB, anon_rss kB, -, -].
    pub aux: [u64; 4],
    /// Valid bytes in `data`.
    pub data_len: u32,
    pub _pad: u32,
    /// `comm` of the current task (OomVictim: the victim's). Empty on
    /// SyscallFailed, FileWrite and FdDup: userspace names those from the
    /// process's Fork/Exec/Exit events.
    pub comm: [u8; 16],
    /// Path, socket address or exec filename, see `flags`.
    pub data: [u8; DATA_LEN],
}

/// Bytes of an [`Event`] before `data`. A SyscallFailed record is this
/// header plus only the words of `data` its path or address fills (the
/// rest of the field is not sent); readers zero-fill what is missing.
pub const EVENT_HEADER_LEN: usize = core::mem::offset_of!(Event, data);

/// Per-thread state in the `TASKS` map, keyed by thread id, for tracked
/// threads only; what does not fit in their `TRACKED` slot.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskState {
    pub span: u64,
    /// Enter time of the syscall in flight, when it is timed.
    pub enter_ts: u64,
    /// Clone flags of the clone/clone3 in flight (read at fork).
    pub clone_flags: u64,
    /// Start of the reclaim in progress (direct or memory cgroup), 0 when
    /// none.
    pub reclaim_ts: u64,
    /// The thread's last failure sent, to fold identical ones that follow
    /// into a count instead of an event each.
    pub last: Failure,
    /// Identical failures since `last` was sent, not sent yet.
    pub repeats: u64,
    /// PID-namespace mode: the thread's ids in the probe's namespace
    /// (`ns_tgid << 32 | ns_tid`, 0 when outside it). Host mode: 0.
    pub ns_ids: u64,
    /// PID-namespace mode, fresh children (`task::REPORT_FORK`): the
    /// parent's namespace ids, for the Fork event the child sends.
    pub fork_parent: u64,
    /// io_uring opcodes (bit per opcode below 64) this thread already
    /// reported as `UringUnderSeccomp`.
    pub uring_reported: u64,
}

/// An io_uring request of a traced task between submission and completion
/// (`URING_REQS`, keyed by the kernel's request pointer): what the
/// completion, which may run on an io-wq worker thread, reports.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UringReq {
    /// The submitter's span.
    pub span: u64,
    /// The submitter's ids as reported (`tgid << 32 | tid`).
    pub ids: u64,
    /// `IORING_OP_*`.
    pub opcode: u32,
    /// [`flags`] bits: DATA_*, SECCOMP_ON, REPORT_SUCCESS.
    pub flags: u32,
    pub data_len: u32,
    pub _pad: u32,
    /// OPENAT/OPENAT2: the open flags (a write open of a read-only file
    /// is `fs.readonly`, a read open is not).
    pub open_flags: u64,
    /// Path or socket address, read at submission.
    pub data: [u8; DATA_LEN],
}

/// What identifies a failing syscall: the syscall, its result, its first
/// argument (flags or fd) and its path or address.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Failure {
    /// Syscall number, -1 when none yet.
    pub nr: i64,
    pub ret: i64,
    pub aux0: u64,
    pub data_len: u32,
    /// [`flags`] DATA_* bits of `data`.
    pub data_flags: u32,
    pub data: [u8; DATA_LEN],
}

impl Failure {
    pub const NONE: Failure = Failure {
        nr: -1,
        ret: 0,
        aux0: 0,
        data_len: 0,
        data_flags: 0,
        data: [0; DATA_LEN],
    };
}

impl TaskState {
    pub const fn new(span: u64) -> Self {
        TaskState {
            span,
            enter_ts: 0,
            clone_flags: 0,
            reclaim_ts: 0,
            last: Failure::NONE,
            repeats: 0,
            ns_ids: 0,
            fork_parent: 0,
            uring_reported: 0,
        }
    }
}

/// Tracepoint field offsets that vary across kernels, read from
/// `/sys/kernel/tracing/events/*/*/format` and stored in the `OFFSETS` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offsets {
    pub fork_parent_pid: u32,
    pub fork_child_pid: u32,
    pub exec_filename: u32,
    pub exec_old_pid: u32,
    pub exit_pid: u32,
    pub exit_group_dead: u32,
    pub signal_sig: u32,
    pub signal_code: u32,
    pub signal_pid: u32,
    pub signal_result: u32,
    pub oom_pid: u32,
    pub oom_comm: u32,
    pub oom_total_vm: u32,
    pub oom_anon_rss: u32,
    /// io_uring tracepoints (u32::MAX: this kernel has none).
    pub uring_submit_req: u32,
    pub uring_submit_opcode: u32,
    pub uring_complete_req: u32,
    pub uring_complete_res: u32,
    pub uring_complete_cflags: u32,
    pub uring_failed_opcode: u32,
    pub uring_failed_addr: u32,
    pub uring_failed_addr2: u32,
    pub uring_failed_op_flags: u32,
    pub uring_failed_error: u32,
    /// raw_syscalls:sys_enter/sys_exit, read by the classic-tracepoint
    /// programs of the tracepoint rung (kernels without BTF).
    pub sys_enter_id: u32,
    pub sys_enter_args: u32,
    pub sys_exit_id: u32,
    pub sys_exit_ret: u32,
}

/// What the eBPF side keeps from a syscall's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgRole {
    /// Nothing worth reading.
    None,
    /// `args[path]` is a path; `args[flags]` (if any) are open flags.
    Path { path: u8, flags: Option<u8> },
    /// `args[addr]` is a `struct sockaddr *` of `args[len]` bytes.
    SockAddr { addr: u8, len: u8 },
    /// `args[0]` matters: clone flags, seccomp op, prctl option, exit
    /// code, the fd of a write, the old fd of a dup.
    First,
}

impl ArgRole {
    /// Whether a failure of a syscall with this role carries its duration
    /// (`Event::duration_ns`): connect and sendto, where seconds mean a timeout.
    #[inline(always)]
    pub const fn is_timed(self) -> bool {
        matches!(self, ArgRole::SockAddr { .. })
    }
}

/// write, pwrite64, writev, ftruncate, fallocate, pwritev: `args[0]` is
/// the fd written through.
#[inline(always)]
pub const fn is_fd_syscall(nr: i64) -> bool {
    is_fd_syscall_in(&NATIVE.1, nr)
}

/// [`is_fd_syscall`] on the architecture of `t`.
pub const fn is_fd_syscall_in(t: &SyscallNumbers, nr: i64) -> bool {
    one_of(
        nr,
        &[
            t.write,
            t.pwrite64,
            t.writev,
            t.ftruncate,
            t.fallocate,
            t.pwritev,
        ],
    )
}

/// Whether `sys_enter` must do more than mark the syscall in flight for
/// `nr`: time it (connect, sendto: a failure after seconds is a timeout) or
/// keep an argument that is gone or needed before `sys_exit` (exit code,
/// clone flags). Everything else is read from the saved registers at
/// `sys_exit`, and only on failure. Path syscalls are not timed: a failing
/// open takes microseconds, and the clock read plus the map lookup on both
/// sides cost more than the rest of the probe's enter path.
/// `role` is `syscall_arg_role(nr)`, looked up once by the caller.
#[inline(always)]
pub const fn needs_enter_state(nr: i64, role: ArgRole) -> bool {
    needs_enter_state_in(&NATIVE.1, nr, role)
}

/// [`needs_enter_state`] on the architecture of `t`.
pub const fn needs_enter_state_in(t: &SyscallNumbers, nr: i64, role: ArgRole) -> bool {
    match role {
        ArgRole::SockAddr { .. } => true,
        ArgRole::First => one_of(nr, &[t.clone, t.exit, t.exit_group, t.clone3]),
        ArgRole::Path { .. } | ArgRole::None => false,
    }
}

/// This architecture's numbers of the syscalls the eBPF side treats
/// specially ([`ABSENT`] where it has no such syscall).
pub mod nr {
    use super::NATIVE;

    pub const OPEN: i64 = NATIVE.1.open;
    pub const DUP2: i64 = NATIVE.1.dup2;
    pub const CONNECT: i64 = NATIVE.1.connect;
    pub const GETSOCKOPT: i64 = NATIVE.1.getsockopt;
    /// getsockopt level and option of a socket's pending error.
    pub const SOL_SOCKET: u64 = 1;
    pub const SO_ERROR: u64 = 4;
    pub const SENDTO: i64 = NATIVE.1.sendto;
    pub const CLONE: i64 = NATIVE.1.clone;
    pub const FORK: i64 = NATIVE.1.fork;
    pub const VFORK: i64 = NATIVE.1.vfork;
    pub const EXECVE: i64 = NATIVE.1.execve;
    pub const EXIT: i64 = NATIVE.1.exit;
    pub const MKDIR: i64 = NATIVE.1.mkdir;
    pub const CREAT: i64 = NATIVE.1.creat;
    pub const PRCTL: i64 = NATIVE.1.prctl;
    pub const MOUNT: i64 = NATIVE.1.mount;
    pub const EXIT_GROUP: i64 = NATIVE.1.exit_group;
    pub const OPENAT: i64 = NATIVE.1.openat;
    pub const MKDIRAT: i64 = NATIVE.1.mkdirat;
    pub const SECCOMP: i64 = NATIVE.1.seccomp;
    pub const CLONE3: i64 = NATIVE.1.clone3;
    pub const OPENAT2: i64 = NATIVE.1.openat2;
    pub const DUP3: i64 = NATIVE.1.dup3;
    pub const EXECVEAT: i64 = NATIVE.1.execveat;
    /// prctl option that installs a filter.
    pub const PR_SET_SECCOMP: u64 = 22;
}

/// Which argument of syscall `nr` carries a path or an address.
/// The same table drives the eBPF programs and the userspace decoder.
#[inline(always)]
pub const fn syscall_arg_role(nr: i64) -> ArgRole {
    syscall_arg_role_in(&NATIVE.1, nr)
}

/// [`syscall_arg_role`] on the architecture of `t`.
pub const fn syscall_arg_role_in(t: &SyscallNumbers, nr: i64) -> ArgRole {
    const fn p(path: u8) -> ArgRole {
        ArgRole::Path { path, flags: None }
    }
    if nr < 0 {
        ArgRole::None
    } else if nr == t.open {
        // open(path, flags)
        ArgRole::Path {
            path: 0,
            flags: Some(1),
        }
    } else if nr == t.openat {
        // openat(dfd, path, flags)
        ArgRole::Path {
            path: 1,
            flags: Some(2),
        }
    } else if one_of(nr, &[t.openat2, t.symlink]) {
        // openat2: flags live in a struct; symlink(target, linkpath): the
        // new link is what gets created
        p(1)
    } else if one_of(
        nr,
        &[
            t.creat, t.stat, t.lstat, t.access, t.truncate, t.chdir, t.rename, t.mkdir, t.rmdir,
            t.link, t.unlink, t.readlink, t.chmod, t.chown, t.lchown, t.mknod, t.statfs, t.chroot,
            t.umount2, t.execve,
        ],
    ) {
        p(0)
    } else if nr == t.mount {
        // mount(source, target, fstype, flags, data): the target and flags
        ArgRole::Path {
            path: 1,
            flags: Some(3),
        }
    } else if one_of(
        nr,
        &[
            t.mkdirat,
            t.mknodat,
            t.fchownat,
            t.newfstatat,
            t.unlinkat,
            t.renameat,
            t.linkat,
            t.readlinkat,
            t.fchmodat,
            t.faccessat,
            t.utimensat,
            t.renameat2,
            t.execveat,
            t.statx,
            t.faccessat2,
            t.fchmodat2,
        ],
    ) {
        // *at(dfd, path, ...)
        p(1)
    } else if nr == t.symlinkat {
        // symlinkat(target, newdfd, linkpath)
        p(2)
    } else if one_of(nr, &[t.connect, t.bind]) {
        // connect(fd, addr, len), bind(fd, addr, len)
        ArgRole::SockAddr { addr: 1, len: 2 }
    } else if nr == t.sendto {
        // sendto(fd, buf, len, flags, addr, addrlen)
        ArgRole::SockAddr { addr: 4, len: 5 }
    } else if one_of(
        nr,
        &[t.clone, t.exit, t.prctl, t.exit_group, t.seccomp, t.clone3],
    )
        // write and friends: the fd, so userspace can name the file an
        // ENOSPC hit; dup2, dup3: the old fd
        || is_fd_syscall_in(t, nr)
        || one_of(nr, &[t.dup2, t.dup3])
    {
        ArgRole::First
    } else {
        ArgRole::None
    }
}

/// Syscall numbers covered by [`ROLES`]: every x86_64 and aarch64 syscall
/// (the highest is below 512).
pub const ROLES_LEN: usize = 512;

/// [`syscall_arg_role`] as a table indexed by syscall number, for the eBPF
/// side: one load instead of a chain of compares on every traced syscall.
pub const ROLES: [ArgRole; ROLES_LEN] = {
    let mut table = [ArgRole::None; ROLES_LEN];
    let mut nr = 0;
    while nr < ROLES_LEN {
        table[nr] = syscall_arg_role(nr as i64);
        nr += 1;
    }
    table
};

/// Syscalls a success of which `sys_exit` looks at (seccomp filters
/// installed, a socket's pending error, fd dups, files opened for writing,
/// mounts): `on_success` in the eBPF programs handles exactly these.
#[inline(always)]
pub const fn success_matters(nr: i64) -> bool {
    success_matters_in(&NATIVE.1, nr)
}

/// [`success_matters`] on the architecture of `t`.
pub const fn success_matters_in(t: &SyscallNumbers, nr: i64) -> bool {
    one_of(
        nr,
        &[
            t.seccomp,
            t.prctl,
            t.getsockopt,
            t.dup2,
            t.dup3,
            t.open,
            t.openat,
            t.creat,
            t.mkdir,
            t.mkdirat,
            t.mount,
        ],
    )
}

/// A set of syscall numbers below [`ROLES_LEN`], one bit each: one load
/// and a mask on the eBPF side where a `matches!` is a chain of compares.
pub type SyscallSet = [u64; ROLES_LEN / 64];

/// The set of syscalls with `needs_enter_state` (`enter`) or
/// `success_matters` (otherwise). Const fns cannot take a closure.
const fn syscall_set(enter: bool) -> SyscallSet {
    let mut set = [0u64; ROLES_LEN / 64];
    let mut nr = 0;
    while nr < ROLES_LEN {
        let n = nr as i64;
        let member = if enter {
            needs_enter_state(n, syscall_arg_role(n))
        } else {
            success_matters(n)
        };
        if member {
            set[nr / 64] |= 1 << (nr % 64);
        }
        nr += 1;
    }
    set
}

/// [`needs_enter_state`] for every syscall number.
pub const ENTER_STATE: SyscallSet = syscall_set(true);

/// [`success_matters`] for every syscall number.
pub const SUCCESS_MATTERS: SyscallSet = syscall_set(false);

/// io_uring opcodes (`enum io_uring_op`, a stable uAPI) the eBPF side
/// reads a path or an address for.
pub mod uring {
    pub const CONNECT: u32 = 16;
    pub const OPENAT: u32 = 18;
    pub const STATX: u32 = 21;
    pub const OPENAT2: u32 = 28;
    pub const RENAMEAT: u32 = 35;
    pub const UNLINKAT: u32 = 36;
    pub const MKDIRAT: u32 = 37;
    pub const SYMLINKAT: u32 = 38;
    pub const LINKAT: u32 = 39;
    /// `io_uring_cqe.flags`: more completions follow for this request
    /// (multishot): it stays in flight.
    pub const CQE_F_MORE: u32 = 1 << 1;
}

/// The syscall an io_uring opcode does the work of (`IORING_OP_READ`
/// → read), so a failed request is judged like that syscall's failure;
/// -1 for opcodes with no syscall of their own (NOP, timeouts, buffers…).
pub const fn uring_op_syscall(opcode: u32) -> i64 {
    uring_op_syscall_in(&NATIVE.1, opcode)
}

/// [`uring_op_syscall`] on the architecture of `t`. Where the legacy
/// syscall is missing (arm64 has no poll, no epoll_wait) the newer one
/// stands in.
pub const fn uring_op_syscall_in(t: &SyscallNumbers, opcode: u32) -> i64 {
    const fn or(n: i64, instead: i64) -> i64 {
        if n == ABSENT { instead } else { n }
    }
    match opcode {
        1 | 60 => t.readv,                     // READV, READV_FIXED
        2 | 61 => t.writev,                    // WRITEV, WRITEV_FIXED
        3 => t.fsync,                          // FSYNC
        4 | 22 | 49 => t.read,                 // READ_FIXED, READ, READ_MULTISHOT
        5 | 23 => t.write,                     // WRITE_FIXED, WRITE
        6 => or(t.poll, t.ppoll),              // POLL_ADD
        8 => t.sync_file_range,                // SYNC_FILE_RANGE
        9 | 48 => t.sendmsg,                   // SENDMSG(_ZC)
        10 => t.recvmsg,                       // RECVMSG
        13 => t.accept4,                       // ACCEPT
        16 => t.connect,                       // CONNECT
        17 => t.fallocate,                     // FALLOCATE
        18 => t.openat,                        // OPENAT
        19 => t.close,                         // CLOSE
        21 => t.statx,                         // STATX
        24 => t.fadvise64,                     // FADVISE
        25 => t.madvise,                       // MADVISE
        26 | 47 => t.sendto,                   // SEND(_ZC)
        27 => t.recvfrom,                      // RECV
        28 => t.openat2,                       // OPENAT2
        29 => t.epoll_ctl,                     // EPOLL_CTL
        30 => t.splice,                        // SPLICE
        33 => t.tee,                           // TEE
        34 => t.shutdown,                      // SHUTDOWN
        35 => t.renameat2,                     // RENAMEAT
        36 => t.unlinkat,                      // UNLINKAT
        37 => t.mkdirat,                       // MKDIRAT
        38 => t.symlinkat,                     // SYMLINKAT
        39 => t.linkat,                        // LINKAT
        41 => t.fsetxattr,                     // FSETXATTR
        42 => t.setxattr,                      // SETXATTR
        43 => t.fgetxattr,                     // FGETXATTR
        44 => t.getxattr,                      // GETXATTR
        45 => t.socket,                        // SOCKET
        50 => t.waitid,                        // WAITID
        51..=53 => t.futex,                    // FUTEX_*
        55 => t.ftruncate,                     // FTRUNCATE
        56 => t.bind,                          // BIND
        57 => t.listen,                        // LISTEN
        59 => or(t.epoll_wait, t.epoll_pwait), // EPOLL_WAIT
        _ => -1,
    }
}

/// True for open flags that make an open a write (O_WRONLY, O_RDWR, O_CREAT, O_TRUNC).
#[inline(always)]
pub const fn open_flags_write(flags: u64) -> bool {
    const O_WRONLY: u64 = 0o1;
    const O_RDWR: u64 = 0o2;
    const O_CREAT: u64 = 0o100;
    const O_TRUNC: u64 = 0o1000;
    flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC) != 0
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: all four are repr(C), Copy, contain only integers and arrays of
    // integers with explicit padding, so every bit pattern is valid.
    unsafe impl aya::Pod for super::TaskState {}
    unsafe impl aya::Pod for super::Offsets {}
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::DropCounters {}
    unsafe impl aya::Pod for super::UringReq {}
}

// The eBPF side copies and compares `data` arrays a word at a time with
// aligned loads: they must stay at 8-aligned offsets.
const _: () = assert!(core::mem::offset_of!(Event, data) % 8 == 0);
const _: () = assert!(core::mem::offset_of!(Failure, data) % 8 == 0);
const _: () = assert!(core::mem::offset_of!(TaskState, last) % 8 == 0);
const _: () = assert!(core::mem::align_of::<Failure>() == 8);
const _: () = assert!(core::mem::offset_of!(UringReq, data) % 8 == 0);

#[cfg(test)]
mod set_tests {
    use super::*;

    /// What the eBPF side's `in_syscall_set` answers (it reads the word
    /// volatile, to keep the set in read-only data).
    fn in_set(set: &SyscallSet, nr: i64) -> bool {
        nr >= 0
            && (nr as usize) < ROLES_LEN
            && set[nr as usize / 64] & (1 << (nr as usize % 64)) != 0
    }

    #[test]
    fn the_bit_sets_agree_with_the_functions_they_tabulate() {
        for n in -1..(ROLES_LEN as i64 + 64) {
            let in_table = (0..ROLES_LEN as i64).contains(&n);
            assert_eq!(
                in_set(&ENTER_STATE, n),
                in_table && needs_enter_state(n, syscall_arg_role(n)),
                "{n}"
            );
            assert_eq!(
                in_set(&SUCCESS_MATTERS, n),
                in_table && success_matters(n),
                "{n}"
            );
        }
        assert!(in_set(&ENTER_STATE, nr::CONNECT) && in_set(&ENTER_STATE, nr::CLONE3));
        assert!(!in_set(&ENTER_STATE, 110)); // getppid
        assert!(in_set(&SUCCESS_MATTERS, nr::OPENAT) && !in_set(&SUCCESS_MATTERS, 110));
    }
}

#[cfg(test)]
mod arch_tests {
    use super::*;

    fn name_of(t: &SyscallNumbers, nr: i64) -> Option<&'static str> {
        t.entries()
            .into_iter()
            .find(|(_, n)| *n == nr && nr != ABSENT)
            .map(|(name, _)| name)
    }

    /// A syscall both architectures have is read the same way on both:
    /// the same argument roles, the same enter and success handling.
    #[test]
    fn a_syscall_is_handled_alike_on_both_architectures() {
        for ((name, x), (_, a)) in X86_64.entries().into_iter().zip(AARCH64.entries()) {
            if a == ABSENT {
                continue;
            }
            let (rx, ra) = (
                syscall_arg_role_in(&X86_64, x),
                syscall_arg_role_in(&AARCH64, a),
            );
            assert_eq!(rx, ra, "{name}");
            assert_eq!(
                needs_enter_state_in(&X86_64, x, rx),
                needs_enter_state_in(&AARCH64, a, ra),
                "{name}"
            );
            assert_eq!(
                success_matters_in(&X86_64, x),
                success_matters_in(&AARCH64, a),
                "{name}"
            );
            assert_eq!(
                is_fd_syscall_in(&X86_64, x),
                is_fd_syscall_in(&AARCH64, a),
                "{name}"
            );
        }
        assert!((a_max() as usize) < ROLES_LEN);
    }

    fn a_max() -> i64 {
        X86_64
            .entries()
            .iter()
            .chain(AARCH64.entries().iter())
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }

    /// An io_uring request names the same syscall on both, or the newer
    /// form where arm64 lacks the legacy one.
    #[test]
    fn io_uring_opcodes_name_the_same_syscall_on_both() {
        for op in 0..80 {
            let x = name_of(&X86_64, uring_op_syscall_in(&X86_64, op));
            let a = name_of(&AARCH64, uring_op_syscall_in(&AARCH64, op));
            match (x, a) {
                (Some("poll"), a) => assert_eq!(a, Some("ppoll")),
                (Some("epoll_wait"), a) => assert_eq!(a, Some("epoll_pwait")),
                (x, a) => assert_eq!(x, a, "opcode {op}"),
            }
        }
        assert_eq!(uring_op_syscall_in(&AARCH64, uring::OPENAT), 56);
    }

    #[test]
    fn arm64_reads_openat_like_x86_64() {
        assert_eq!(
            syscall_arg_role_in(&AARCH64, AARCH64.openat),
            ArgRole::Path {
                path: 1,
                flags: Some(2)
            }
        );
        // on arm64, 2 is io_submit, not open
        assert_eq!(syscall_arg_role_in(&AARCH64, 2), ArgRole::None);
    }
}
