//! Records out: the ring buffer, its per-kind drop counters, the scratch
//! record of a failure, and when a reader is woken.

use super::*;

/// The SyscallFailed record being built, one per CPU (too big for the
/// 512-byte stack), indexed by CPU number (the loader sizes it to the
/// possible CPUs): sent by `output_failure` with only the bytes its path
/// fills. Mmapable so it is vmalloc memory: the kernel's hardened-usercopy
/// check of the path read into it then stops at "vmalloc, faults off",
/// where per-CPU memory (and the programs' private stack, which is per-CPU
/// too) takes its page lookups (~30 ns a failure, measured).
#[map]
pub(crate) static RECORD: Array<Event> = Array::with_max_entries(1, BPF_F_MMAPABLE);

pub(crate) const BPF_F_MMAPABLE: u32 = 1 << 10;

#[map]
pub(crate) static OFFSETS: Array<Offsets> = Array::with_max_entries(1, 0);

pub(crate) const CLONE_THREAD: u64 = 0x0001_0000;

/// Fatal-by-default signals worth reporting (SIGCHLD, SIGWINCH, SIGCONT… are not).
pub(crate) const FATAL_SIGNALS: u64 = (1 << 1)
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
pub(crate) fn now() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub(crate) fn count_drop(kind: EventKind) {
    count_drops(kind, 1);
}

#[inline(always)]
pub(crate) fn count_drops(kind: EventKind, n: u64) {
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
pub(crate) fn reserve(
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
pub(crate) unsafe fn write_header(
    ev: *mut Event,
    kind: EventKind,
    span: u64,
    ts: u64,
    with_comm: bool,
) {
    // SAFETY: the caller's promise.
    unsafe { write_header_as(ev, kind, span, ts, with_comm, None) }
}

/// `write_header` with the current thread's ids when the caller has them.
///
/// # Safety
/// As for `write_header`.
#[inline(always)]
pub(crate) unsafe fn write_header_as(
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
pub(crate) fn submit(entry: aya_ebpf::maps::ring_buf::RingBufEntry<Event>, urgent: bool) {
    entry.submit(wakeup_flags(urgent));
}

/// The ring-buffer flags for a record `submit` or `output_failure` sends.
#[inline(always)]
pub(crate) fn wakeup_flags(urgent: bool) -> u64 {
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
pub(crate) fn output_failure(ev: &Event, urgent: bool) -> bool {
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
pub(crate) fn offsets() -> Option<&'static Offsets> {
    OFFSETS.get(0)
}
