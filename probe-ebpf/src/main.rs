//! The probe's eBPF programs: tracepoints only (this kernel has no kprobes).
//!
//! Modules: [`tracking`] (which threads are traced, as which span),
//! [`output`] (the ring buffer and its drop counters), and the programs by
//! family: [`syscalls`], [`processes`], [`signals`] (and memory),
//! [`io_uring`].
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

mod io_uring;
mod output;
mod processes;
mod signals;
mod syscalls;
mod tracking;

use output::*;
use syscalls::*;
use tracking::*;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
