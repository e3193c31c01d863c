//! gVisor points → the probe's [`KernelEvent`]s: the same kinds the eBPF
//! programs send, so spans, attribution, store and exports do not know
//! which source an event came from. Pids are the sandbox's own (its root
//! PID namespace); nothing here reads the host's /proc about them.

use crate::event::{KernelEvent, Kind, errno_name, signal_name, sockaddr};

use super::wire::{ContextData, Exit, Point, SyscallPoint};

/// The sandbox's CLOCK_REALTIME → the host's CLOCK_MONOTONIC, in which
/// spans begin (the offset is taken once; both run at the same rate).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    realtime_minus_monotonic: i128,
}

impl Clock {
    pub fn now() -> Clock {
        let real = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME)
            .map(|t| t.tv_sec() as i128 * 1_000_000_000 + t.tv_nsec() as i128)
            .unwrap_or(0);
        Clock {
            realtime_minus_monotonic: real - crate::clock::monotonic_ns() as i128,
        }
    }

    fn monotonic(&self, realtime_ns: i64) -> u64 {
        (realtime_ns as i128 - self.realtime_minus_monotonic).max(0) as u64
    }
}

/// What one point says, in the probe's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct Converted {
    /// The container the point came from (`runsc-<pid>` under `runsc do`).
    pub container: String,
    /// `ts_ns` is CLOCK_MONOTONIC (absolute): subtract a span's start.
    pub events: Vec<KernelEvent>,
}

/// The events a point makes; `None` for one that says nothing the probe
/// keeps (a successful syscall that changes no file, a point without its
/// context).
pub fn convert(point: &Point, clock: &Clock) -> Option<Converted> {
    let (ctx, events) = match point {
        Point::Syscall(p) => (p.context_data.as_ref()?, syscall(p, clock)?),
        Point::Raw(r) => {
            let ctx = r.context_data.as_ref()?;
            let exit = r.exit.as_ref()?;
            let errno = failed(exit)?;
            let mut ev = base(Kind::SyscallFailed, ctx, clock);
            set_failure(&mut ev, r.sysno as i64, errno);
            ev.flags = r.flags();
            (ctx, vec![ev])
        }
        Point::Clone(c) => {
            let ctx = c.context_data.as_ref()?;
            let mut ev = base(Kind::Fork, ctx, clock);
            ev.child_pid = Some(c.created_thread_id as u32);
            ev.thread = Some(c.created_thread_group_id == ctx.thread_group_id);
            (ctx, vec![ev])
        }
        Point::Execve(x) => {
            let ctx = x.context_data.as_ref()?;
            let mut ev = base(Kind::Exec, ctx, clock);
            ev.path = Some(x.binary_path.clone());
            // the new image's name as the kernel's comm would be: argv[0]'s
            // (`sh`, not the `/usr/bin/dash` it resolves to), as later
            // points name the process
            let named = x.argv.first().unwrap_or(&x.binary_path);
            if let Some(name) = named.rsplit('/').next().filter(|n| !n.is_empty()) {
                ev.comm = name.chars().take(15).collect();
            }
            (ctx, vec![ev])
        }
        Point::TaskExit(t) => {
            let ctx = t.context_data.as_ref()?;
            // one exit per process, as the eBPF side reports it
            if ctx.thread_id != ctx.thread_group_id {
                return None;
            }
            (ctx, exit_events(ctx, t.exit_status, clock))
        }
        Point::ContainerStart(_) | Point::Other(_) => return None,
    };
    Some(Converted {
        container: ctx.container_id.clone(),
        events,
    })
}

/// A wait status: `code << 8`, or the signal that killed the process. The
/// signal comes first as its own event (there is no signal point; this is
/// the only trace a fatal signal leaves), then the exit.
fn exit_events(ctx: &ContextData, status: i32, clock: &Clock) -> Vec<KernelEvent> {
    let signal = status & 0x7f;
    let mut exit = base(Kind::Exit, ctx, clock);
    if signal == 0 {
        exit.exit_code = Some((status >> 8) & 0xff);
        return vec![exit];
    }
    let mut sig = base(Kind::Signal, ctx, clock);
    sig.signal = Some(signal_name(signal));
    vec![sig, exit]
}

fn syscall(p: &SyscallPoint, clock: &Clock) -> Option<Vec<KernelEvent>> {
    let ctx = p.context_data.as_ref()?;
    let exit = p.exit.as_ref()?;
    let nr = p.sysno as i64;
    let Some(errno) = failed(exit) else {
        // a file opened for writing names a later ENOSPC/EROFS write
        let flags = p.flags?;
        if !probe_abi::open_flags_write(flags) {
            return None;
        }
        let mut ev = base(Kind::FileWrite, ctx, clock);
        ev.syscall = Some(crate::syscalls::name(nr));
        ev.syscall_nr = Some(nr);
        ev.ret = Some(exit.result);
        ev.flags = Some(flags);
        ev.path = p.pathname.as_deref().map(|path| full_path(path, p, ctx));
        return Some(vec![ev]);
    };
    let mut ev = base(Kind::SyscallFailed, ctx, clock);
    set_failure(&mut ev, nr, errno);
    ev.flags = p.flags;
    if let Some(path) = p.pathname.as_deref().filter(|s| !s.is_empty()) {
        ev.path = Some(full_path(path, p, ctx));
    } else if let Some(addr) = &p.address {
        ev.addr = sockaddr(addr);
        ev.fd = p.fd;
    } else if let Some(fd) = p.fd {
        ev.fd = Some(fd);
        if !p.fd_path.is_empty() {
            ev.path = Some(p.fd_path.clone());
        }
    }
    Some(vec![ev])
}

/// A relative path joined to the directory it was resolved in (`fd_path`
/// for `*at` calls, else the cwd), as the eBPF side reports what the
/// program passed: absolute stays as it is.
fn full_path(path: &str, p: &SyscallPoint, ctx: &ContextData) -> String {
    if path.starts_with('/') {
        return path.to_string();
    }
    let dir = if !p.fd_path.is_empty() {
        &p.fd_path
    } else {
        &ctx.cwd
    };
    if dir.is_empty() {
        path.to_string()
    } else {
        format!("{}/{path}", dir.trim_end_matches('/'))
    }
}

/// The positive errno of a failed call (gVisor sets `result` 0 then).
fn failed(exit: &Exit) -> Option<i32> {
    (exit.errorno > 0 && exit.errorno <= 4095).then_some(exit.errorno as i32)
}

fn set_failure(ev: &mut KernelEvent, nr: i64, errno: i32) {
    ev.syscall = Some(crate::syscalls::name(nr));
    ev.syscall_nr = Some(nr);
    ev.ret = Some(-(errno as i64));
    ev.errno = Some(errno_name(errno));
}

fn base(kind: Kind, ctx: &ContextData, clock: &Clock) -> KernelEvent {
    KernelEvent::bare(
        kind,
        clock.monotonic(ctx.time_ns),
        ctx.thread_group_id as u32,
        ctx.thread_id as u32,
        ctx.process_name.clone(),
    )
}

/// The sentence a report gives for what gVisor's points cannot show.
/// What gVisor's points leave unseen, said where nothing explains a failure.
pub use crate::spans::GVISOR_BLIND_SPOTS as BLIND_SPOTS;
