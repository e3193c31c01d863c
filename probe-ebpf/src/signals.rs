//! Signals and memory: fatal signals generated, OOM victims marked, and
//! reclaim stalls (direct and memory-cgroup reclaim).

use super::*;

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
pub(crate) fn reclaim_begin() {
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
pub(crate) fn reclaim_end(kind_flags: u32) {
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
