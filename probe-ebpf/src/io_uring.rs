//! io_uring: requests submitted, completed and failed, tied to the span of
//! the task that submitted them (a kernel worker may complete them).

use super::*;

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
pub(crate) static URING_REQS: HashMap<u64, UringReq> = HashMap::with_max_entries(16384, 0);

/// The request being prepared, per CPU (too big for the stack).
#[map]
pub(crate) static URING_SCRATCH: PerCpuArray<UringReq> = PerCpuArray::with_max_entries(1, 0);

/// Where `struct filename *` sits in the prepared request: the op's struct
/// (`io_open`, `io_statx`, `io_mkdir`, `io_unlink`, `io_rename`, `io_link`)
/// is the first member of `struct io_kiocb`, and `filename->name` is the
/// struct's first field. These layouts have been stable since 5.19 (checked
/// against this kernel's BTF); a wrong read only loses the path.
#[inline(always)]
pub(crate) fn uring_filename_offset(opcode: u32) -> Option<usize> {
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
pub(crate) fn uring_task() -> Option<(u64, u32)> {
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
