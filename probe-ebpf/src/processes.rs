//! Forks, execs and exits: a traced task's children inherit its span, and
//! an untraced one that starts in a followed cgroup joins that cgroup's.

use super::*;

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
pub(crate) fn take_over(tid: u32, old: u32) -> Option<u64> {
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
pub(crate) fn cgroup_join(tid: u32) -> Option<u64> {
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
