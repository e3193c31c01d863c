//! Why a failed span failed: the stages, in the order they outrank each
//! other. Each stage is one function that gives a verdict or passes:
//!
//! 1. [`oom_kill`]: the OOM killer took a process of the span (a browser
//!    whose renderer it took then hangs until the caller's timeout).
//! 2. [`caller_timeout`]: the caller's time limit killed the workload.
//! 3. [`seccomp_kill`]: a seccomp filter raised SIGSYS.
//! 4. [`signal_on_path`]: a signal killed the process whose status the
//!    caller got (the root, or the end of the exit-status path).
//! 5. [`strong_failure_on_path`]: a denial or a hard limit (weight 0.9 or
//!    more) in the exit-status path's last process, or a shell's "command
//!    not found".
//! 6. [`signal_off_path`]: a crash, or a kill by a process that did not
//!    start it, elsewhere in the span (a renderer that crashed on a refused
//!    mmap outranks its browser's weaker failures).
//! 7. [`failure_on_path`]: any other failure of that last process, unless
//!    [`failure_reported_before`] it explains it: a refused connection, a
//!    full disk or a read-only filesystem that another process reported
//!    instead of failing on (Chromium's network service: the page never
//!    loaded, so the PDF the next program opens was never written).
//! 8. [`failure_off_path`]: the strongest failure of another process that
//!    exited non-zero.
//! 9. [`disk_refused_anywhere`]: a full disk or a read-only filesystem
//!    in any process, also one its parent stopped afterwards (Chromium's
//!    writers on ENOSPC, stopped by the browser on its way out).
//! 10. [`reported_elsewhere`]: a refused connection, a full disk or a
//!     read-only filesystem that a process still running reported rather
//!     than failed on: a browser MCP server whose navigation failed while
//!     Chromium's network service lives on.
//! 11. [`memory_pressure`], then [`no_kernel_cause`].
//!
//! Never a cause, at any stage ([`Lineage`](super::lineage::Lineage)): a kill of a helper by the
//! process that started it, by the kernel at PID-namespace teardown, or by
//! anyone after the traced command ended; what a process did once it was
//! being stopped (cleanup); a failure its process got past by going on to
//! start another program (a runtime's own setrlimit EPERM before it starts
//! the container); a check whose failure its parent looked at before
//! starting the next program (srt's `rg` scan).

use crate::event::{Errno, KernelEvent, Kind, SYS_SECCOMP, Signal, is_signal};
use crate::primitive::Primitive;
use crate::spans::SpanEvidence;

use super::confidence::{Basis, Level, REPORTED_ELSEWHERE, STOPPED_HELPER};
use super::failures::{
    command_not_found, command_not_found_said, latest_failure_from, reported_failure,
    resource_failure_behind_crash, strongest_failure,
};
use super::lineage::{SignalOrigin, fatal_signal, signal_origin};
use super::{Case, Outcome, Verdict};

/// The verdict for a span whose workload failed.
pub(super) fn failure_verdict(case: &Case) -> Verdict {
    let (span, outcome) = (case.span, case.outcome);
    oom_kill(span, outcome)
        .or_else(|| caller_timeout(outcome))
        .or_else(|| seccomp_kill(span, outcome))
        .or_else(|| signal_on_path(case))
        .or_else(|| strong_failure_on_path(case))
        .or_else(|| signal_off_path(case))
        .or_else(|| failure_on_path(case).map(|v| failure_reported_before(case, &v).unwrap_or(v)))
        .or_else(|| failure_off_path(case))
        .or_else(|| unsupported_by_sandbox_kernel(case))
        .or_else(|| disk_refused_anywhere(case))
        .or_else(|| reported_elsewhere(case))
        .or_else(|| memory_pressure(span, outcome))
        .unwrap_or_else(|| no_kernel_cause(case))
}

/// "comm (pid N)".
fn who(span: &SpanEvidence, pid: u32) -> String {
    let comm = span
        .processes
        .get(&pid)
        .map(|p| p.comm.as_str())
        .filter(|c| !c.is_empty());
    format!("{} (pid {pid})", comm.unwrap_or("process"))
}

fn oom_kill(span: &SpanEvidence, outcome: &Outcome) -> Option<Verdict> {
    let oom = span.events.iter().find(|e| e.kind == Kind::OomVictim)?;
    let then = outcome
        .timed_out
        .map(|limit| {
            format!(
                "; the workload then hung until the time limit of {:.1}s killed it",
                limit.as_secs_f64()
            )
        })
        .unwrap_or_default();
    Some(Verdict::new(
        Primitive::MemOom,
        Basis::OomKill,
        format!("{}{then}", oom_sentence(oom)),
        Some(oom.clone()),
    ))
}

/// "chromium (pid 12) was killed by the OOM killer at 300 MiB anon RSS in
/// /agent-bridge/call-3 (memory limit 512 MiB)": the victim, its RSS, and where
/// the limit was, as far as they are known.
pub(super) fn oom_sentence(oom: &KernelEvent) -> String {
    let rss = oom
        .anon_rss_kb
        .map(|kb| format!(" at {} MiB anon RSS", kb / 1024))
        .unwrap_or_default();
    let cgroup = match (&oom.cgroup, oom.memory_max_kb) {
        (Some(path), Some(max)) => format!(" in cgroup {path} (memory limit {} MiB)", max / 1024),
        (Some(path), None) => format!(" in cgroup {path}"),
        (None, _) => String::new(),
    };
    format!(
        "{} (pid {}) was killed by the OOM killer{rss}{cgroup}",
        oom.comm, oom.pid
    )
}

fn caller_timeout(outcome: &Outcome) -> Option<Verdict> {
    let limit = outcome.timed_out?;
    Some(Verdict::new(
        Primitive::Timeout,
        Basis::CallerTimeout,
        format!(
            "the workload was still running after the time limit of {:.1}s and was killed",
            limit.as_secs_f64()
        ),
        None,
    ))
}

/// SIGSYS from a filter (RET_TRAP, RET_KILL_*), wherever it landed.
fn seccomp_kill(span: &SpanEvidence, outcome: &Outcome) -> Option<Verdict> {
    let sigsys = span.events.iter().find(|e| {
        e.kind == Kind::Signal && e.signal_is(Signal::SIGSYS) && e.si_code == Some(SYS_SECCOMP)
    });
    let killed_by_sigsys = span
        .processes
        .iter()
        .filter(|(_, p)| {
            p.exited && p.exit_code.is_none() && is_signal(p.signal.as_deref(), Signal::SIGSYS)
        })
        .map(|(pid, _)| *pid)
        .min();
    if sigsys.is_none()
        && killed_by_sigsys.is_none()
        && !is_signal(outcome.exit.signal.as_deref(), Signal::SIGSYS)
    {
        return None;
    }
    let pid = sigsys.map(|e| e.pid).or(killed_by_sigsys).or(span.root_pid);
    let denial = span
        .events
        .iter()
        .rev()
        .find(|e| e.kind == Kind::SeccompDenied && (pid.is_none() || Some(e.pid) == pid));
    let whom = pid
        .map(|p| who(span, p))
        .unwrap_or_else(|| "the workload".into());
    let (explanation, decisive) = match denial {
        Some(d) => (
            format!(
                "{} was blocked by the seccomp filter: the kernel raised SIGSYS in {whom} and the syscall never ran",
                d.call()
            ),
            Some(d.clone()),
        ),
        None => (
            format!("the seccomp filter raised SIGSYS in {whom}"),
            sigsys.cloned(),
        ),
    };
    Some(Verdict::new(
        Primitive::Seccomp,
        Basis::SeccompKill,
        explanation,
        decisive,
    ))
}

/// The status the caller got is a signal's: the root was killed, or the
/// exit-status path ends in a process a signal killed (a shell's 128+N).
/// That signal is the outcome, whoever sent it.
fn signal_on_path(case: &Case) -> Option<Verdict> {
    let (span, outcome, lineage) = (case.span, case.outcome, &case.lineage);
    let pid = match &outcome.exit.signal {
        Some(_) => span.root_pid?,
        None => lineage
            .leaf()
            .filter(|l| Some(*l) != span.root_pid)
            .filter(|l| killed_by_signal(span, *l))?,
    };
    let sig = span
        .processes
        .get(&pid)
        .and_then(|p| p.signal.clone())
        .or_else(|| outcome.exit.signal.clone())
        .unwrap_or_else(|| "a signal".into());
    Some(explain_signal(case, pid, &sig))
}

/// A failure no program makes on purpose ([`reported_failure`]) in a
/// process that did not fail itself (it exited 0, or still runs), before
/// the last process's own weak failure `then`: it told someone instead,
/// and what it could not do is what `then` ran into.
fn failure_reported_before(case: &Case, then: &Verdict) -> Option<Verdict> {
    let (span, lineage) = (case.span, &case.lineage);
    let before = then.decisive.as_ref()?.ts_ns;
    strongest_failure(case, |ev, grade| {
        ev.ts_ns < before
            && reported_failure(ev, grade.primitive)
            && span.processes.get(&ev.pid).is_none_or(|p| !p.failed())
            && !lineage.stopped.contains_key(&ev.pid)
            && !lineage.survived(ev)
    })
}

/// A crash, or a kill by a process that did not start it, of a process off
/// the exit-status path (the earliest). Kills by an ancestor or at
/// namespace teardown are somebody shutting things down, not a cause; nor
/// is SIGPIPE off the path: a pipeline's writer whose reader had already
/// exited (`echo x | sed 's/(/'`), whose exit is the story.
fn signal_off_path(case: &Case) -> Option<Verdict> {
    let (span, lineage) = (case.span, &case.lineage);
    let sigpipe = |pid: u32| is_signal(span.processes[&pid].signal.as_deref(), Signal::SIGPIPE);
    let (_, pid) = span
        .processes
        .keys()
        .filter(|&&pid| killed_by_signal(span, pid) && !lineage.stopped.contains_key(&pid))
        .filter(|&&pid| !sigpipe(pid))
        .map(|&pid| {
            (
                fatal_signal(span, pid).map(|e| e.ts_ns).unwrap_or(u64::MAX),
                pid,
            )
        })
        .min()?;
    let sig = span.processes[&pid].signal.clone()?;
    Some(explain_signal(case, pid, &sig))
}

fn killed_by_signal(span: &SpanEvidence, pid: u32) -> bool {
    span.processes
        .get(&pid)
        .is_some_and(|p| p.failed() && p.exit_code.is_none())
}

/// A fatal signal's verdict: a file-size limit, a refusal the process
/// crashed on, or the signal itself with its real sender.
fn explain_signal(case: &Case, pid: u32, sig: &str) -> Verdict {
    let span = case.span;
    let decisive = span
        .events
        .iter()
        .find(|e| e.kind == Kind::Signal && e.pid == pid && e.signal.as_deref() == Some(sig))
        .cloned();
    let whom = who(span, pid);
    if is_signal(Some(sig), Signal::SIGXFSZ) {
        return Verdict::new(
            Primitive::FsSpace,
            Basis::FileSizeSignal,
            format!("{whom} exceeded the file-size limit (RLIMIT_FSIZE) and got SIGXFSZ"),
            decisive,
        );
    }
    let name = |p: u32| who(span, p);
    if let Some(v) =
        resource_failure_behind_crash(span, &case.grades, pid, sig, decisive.as_ref(), &name)
    {
        return v;
    }
    let crash = [
        Signal::SIGSEGV,
        Signal::SIGBUS,
        Signal::SIGILL,
        Signal::SIGFPE,
        Signal::SIGABRT,
        Signal::SIGTRAP,
    ]
    .into_iter()
    .any(|s| is_signal(Some(sig), s));
    let explanation = if crash {
        format!("{whom} crashed with {sig}")
    } else {
        format!("{whom} was killed by {sig}{}", sent_by(span, pid))
    };
    Verdict::new(Primitive::Signal, Basis::Signal, explanation, decisive)
}

/// " sent by …" naming the real sender of `pid`'s fatal signal.
fn sent_by(span: &SpanEvidence, pid: u32) -> String {
    match signal_origin(span, pid) {
        SignalOrigin::NamespaceTeardown { init, init_comm } => format!(
            " at PID-namespace teardown (its init, {init_comm} (pid {init}), had exited, and \
             the kernel kills what is left in the namespace)"
        ),
        SignalOrigin::KernelAtExit { pid: s, comm } => {
            format!(" sent by the kernel when {comm} (pid {s}) exited")
        }
        SignalOrigin::Ancestor { pid: s, comm } => {
            format!(" sent by {comm} (pid {s}), which started it")
        }
        SignalOrigin::Other { pid: s, comm } => format!(" sent by {comm} (pid {s})"),
        SignalOrigin::Own | SignalOrigin::Unknown => String::new(),
    }
}

/// The failures that decided the status are the exit-status path's last
/// process's own (a root that exited non-zero by itself is that process).
/// A seccomp denial or a hard limit there outranks a shell's "not found",
/// which outranks the other refusals.
fn strong_failure_on_path(case: &Case) -> Option<Verdict> {
    let (span, outcome, lineage) = (case.span, case.outcome, &case.lineage);
    let missing = || {
        command_not_found(
            span,
            outcome,
            |ev| lineage.survived(ev) || lineage.outlived_by_a_succeeding_parent.contains(&ev.pid),
            span.outliving_root().is_some(),
        )
        .or_else(|| command_not_found_said(span, outcome))
    };
    match failure_on_path(case) {
        // a shell that went on to look the command up after the denial (its
        // NSS lookup of the user hit a seccomp filter on unix sockets) did
        // without what was denied: its 127 is the missing command's
        Some(v) if v.level == Level::Decisive => match missing() {
            Some(m) if m.level == Level::Decisive && decided_later(&m, &v) => Some(m),
            _ => Some(v),
        },
        strongest => {
            let strong = strongest.filter(|v| v.level >= Level::Hard);
            match (missing(), strong) {
                (Some(missing), Some(v)) if v.confidence > missing.confidence => Some(v),
                (missing, v) => missing.or(v),
            }
        }
    }
}

/// Whether `a`'s decisive event came after `b`'s in the same process.
fn decided_later(a: &Verdict, b: &Verdict) -> bool {
    match (&a.decisive, &b.decisive) {
        (Some(a), Some(b)) => a.pid == b.pid && a.ts_ns > b.ts_ns,
        _ => false,
    }
}

fn failure_on_path(case: &Case) -> Option<Verdict> {
    let lineage = &case.lineage;
    let leaf = lineage.leaf();
    latest_failure_from(case, Level::Hard, |ev, _| {
        Some(ev.pid) == leaf && !lineage.survived(ev) && !lineage.is_cleanup(ev)
    })
}

/// Failures of the span's other processes that exited non-zero; not of the
/// path's processes that passed a status on (podman's own cleanup errors
/// when the container exited 3), nor of a check its parent coped with (it
/// went on to start another program, or exited 0 itself: `cargo new`'s
/// child that could not run `hg`), nor of a helper its ancestor stopped
/// (its non-zero exit is the stop's).
fn failure_off_path(case: &Case) -> Option<Verdict> {
    let (span, lineage) = (case.span, &case.lineage);
    strongest_failure(case, |ev, _| {
        let failing = Some(ev.pid) == lineage.leaf()
            || (!lineage.on_path(ev.pid)
                && span.processes.get(&ev.pid).is_some_and(|p| p.failed())
                && !lineage.outlived_by_a_succeeding_parent.contains(&ev.pid));
        failing
            && !lineage.survived(ev)
            && !lineage.stopped.contains_key(&ev.pid)
            && !lineage.coped.contains(&ev.pid)
    })
}

/// A full disk or a read-only filesystem met by any process of the span,
/// before anyone stopped it, that the process did not get past: no program
/// makes these on purpose. Chromium's writers hit ENOSPC in their profile
/// databases, then the browser stops them on its way out and exits 1: the
/// stop must not take their failure with it.
fn disk_refused_anywhere(case: &Case) -> Option<Verdict> {
    let (span, lineage) = (case.span, &case.lineage);
    let v = strongest_failure(case, |ev, grade| {
        let primitive = grade.primitive;
        // one that exited 0 coped with it
        let gave_up = lineage.stopped.contains_key(&ev.pid)
            || span.processes.get(&ev.pid).is_none_or(|p| p.failed());
        matches!(primitive, Primitive::FsSpace | Primitive::FsReadonly)
            && gave_up
            && !lineage.survived(ev)
            && !lineage.is_cleanup(ev)
            && !lineage.coped.contains(&ev.pid)
    })?;
    let failed = v.decisive.as_ref()?;
    // named as the failure names it (a thread's name may have replaced the
    // process's by the time it was stopped)
    let then = match lineage.stopped.contains_key(&failed.pid) {
        true => format!(
            ", then {} (pid {}) was stopped on the way out",
            failed.comm, failed.pid
        ),
        false => String::new(),
    };
    let v = v.scaled(STOPPED_HELPER);
    Some(Verdict {
        explanation: format!("{}{then}", v.explanation),
        ..v
    })
}

/// The call failed and nothing on its path did, but a process of the span
/// that is still running met a failure no program makes on purpose
/// ([`reported_failure`]) and reported it instead of failing: the server's
/// process lives, its helper's connect was refused.
fn reported_elsewhere(case: &Case) -> Option<Verdict> {
    let (span, lineage) = (case.span, &case.lineage);
    let v = strongest_failure(case, |ev, grade| {
        // still running when the call ended: it told someone (one that
        // exited 0 coped, and its parent failed for reasons of its own)
        reported_failure(ev, grade.primitive)
            && span.processes.get(&ev.pid).is_none_or(|p| !p.exited)
            && !lineage.survived(ev)
            && !lineage.stopped.contains_key(&ev.pid)
    })?;
    let v = v.scaled(REPORTED_ELSEWHERE);
    Some(Verdict {
        explanation: format!(
            "{}, which the failing call most likely reported",
            v.explanation
        ),
        ..v
    })
}

/// Less reclaim than this is routine, whatever its share of a short span.
pub(super) const RECLAIM_MIN_MS: f64 = 50.0;

/// The failed span spent a fifth of its time or more in memory reclaim.
fn memory_pressure(span: &SpanEvidence, outcome: &Outcome) -> Option<Verdict> {
    let duration = outcome.duration_ns.max(1);
    if span.reclaim_ns * 5 <= duration {
        return None;
    }
    Some(Verdict::new(
        Primitive::MemPressure,
        Basis::MemoryPressure,
        format!(
            "the workload {} after spending {:.0}% of its time in memory reclaim",
            outcome.exit.describe(),
            span.reclaim_ns as f64 * 100.0 / duration as f64
        ),
        span.events
            .iter()
            .rev()
            .find(|e| e.kind == Kind::ReclaimStall)
            .cloned(),
    ))
}

/// A call the sandbox's kernel refused although Linux accepts it: under
/// gVisor, ENOSYS (a syscall it does not implement), or EINVAL from a call
/// whose flags are all ones Linux takes (coreutils' statx with
/// AT_NO_AUTOMOUNT on runsc 20221219). Only in a process that failed and
/// did not go on, and only when its output reports that very error (its
/// strerror, as libc words it, or errno name): a program probing for a newer syscall and
/// falling back never says so.
fn unsupported_by_sandbox_kernel(case: &Case) -> Option<Verdict> {
    let (span, lineage) = (case.span, &case.lineage);
    let own_kernel = span.source.sight().own_kernel?;
    let output = case.outcome.words.output.as_deref().unwrap_or("");
    let ev = span.events.iter().rev().find(|ev| {
        ev.kind == Kind::SyscallFailed
            && linux_accepts(ev)
            && (Some(ev.pid) == lineage.leaf()
                || span.processes.get(&ev.pid).is_some_and(|p| p.failed()))
            && !lineage.survived(ev)
            && ev.errno_nr().is_some_and(|n| {
                // what a program prints: its libc's strerror, or the name
                output.contains(nix::errno::Errno::from_raw(n).desc())
                    || ev.errno.as_deref().is_some_and(|e| output.contains(e))
            })
    })?;
    let errno = ev.errno.as_deref().unwrap_or("");
    let why = match ev.flags {
        Some(f) if ev.errno_is(Errno::EINVAL) => {
            format!("whose flags ({f:#x}) are all valid on Linux")
        }
        _ => "that Linux implements".to_string(),
    };
    Some(Verdict::new(
        Primitive::SandboxKernel,
        Basis::SandboxKernel,
        format!(
            "{} failed with {errno} ({}) in {}, and its output says so: {own_kernel} refused \
             a call {why}; the sandbox's kernel is not Linux",
            ev.call(),
            ev.errno_nr()
                .map(|n| nix::errno::Errno::from_raw(n).desc().to_ascii_lowercase())
                .unwrap_or_default(),
            who(span, ev.pid),
        ),
        Some(ev.clone()),
    ))
}

/// ENOSYS, or EINVAL from a raw call whose flags are all ones Linux takes.
fn linux_accepts(ev: &KernelEvent) -> bool {
    const AT_SYMLINK_NOFOLLOW: u64 = 0x100;
    const AT_EACCESS: u64 = 0x200;
    const AT_REMOVEDIR: u64 = 0x200;
    const AT_NO_AUTOMOUNT: u64 = 0x800;
    const AT_EMPTY_PATH: u64 = 0x1000;
    const AT_STATX_SYNC_TYPE: u64 = 0x6000;
    const RENAME_ALL: u64 = 0x7;
    if ev.errno_is(Errno::ENOSYS) {
        return true;
    }
    if !ev.errno_is(Errno::EINVAL) {
        return false;
    }
    let valid = match ev.syscall.as_deref() {
        Some("statx") => AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_EMPTY_PATH | AT_STATX_SYNC_TYPE,
        Some("newfstatat") => AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_EMPTY_PATH,
        Some("faccessat2") => AT_EACCESS | AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH,
        Some("unlinkat") => AT_REMOVEDIR,
        Some("renameat2") => RENAME_ALL,
        _ => return false,
    };
    ev.flags.is_some_and(|f| f & !valid == 0)
}

/// Nothing the kernel saw explains the status. Processes stopped on the
/// way out are named, so the reader knows they were seen and why they
/// are not the cause.
fn no_kernel_cause(case: &Case) -> Verdict {
    let (span, outcome, lineage) = (case.span, case.outcome, &case.lineage);
    let mut stopped: Vec<(u64, u32)> = lineage.stopped.iter().map(|(&p, &at)| (at, p)).collect();
    stopped.sort();
    let stopped: Vec<String> = stopped
        .iter()
        .take(3)
        .filter_map(|&(_, pid)| {
            let sig = span.processes.get(&pid)?.signal.as_deref()?;
            Some(format!("{} by {sig}{}", who(span, pid), sent_by(span, pid)))
        })
        .collect();
    let shutdown = if stopped.is_empty() {
        String::new()
    } else {
        let more = lineage.stopped.len().saturating_sub(stopped.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!(
            "; stopped on the way out, not a cause: {}{more}",
            stopped.join(", ")
        )
    };
    Verdict::new(
        Primitive::None,
        Basis::NoKernelCause,
        format!(
            "the workload {}; the kernel saw no denial, limit, kill or missing file that explains it \
             (the cause is in the workload's own logic or its caller){shutdown}",
            outcome.exit.describe()
        ),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::{
        self, MS, exec, exit_with, failed, named, outcome, said, signal_from, span,
    };
    use super::super::{Attribution, ExitStatus, attribute};
    use super::*;
    use crate::attribution::lineage::SI_KERNEL;
    use crate::event::KernelEvent;

    fn fork(parent: u32, child: u32, ts: u64, comm: &str) -> KernelEvent {
        named(testing::fork(parent, child, ts), comm)
    }

    fn exit(pid: u32, ts: u64, code: Option<i32>, comm: &str) -> KernelEvent {
        named(exit_with(pid, ts, code), comm)
    }

    fn signal(pid: u32, ts: u64, sig: &str, sender: u32, comm: &str, code: i32) -> KernelEvent {
        signal_from(pid, ts, sig, (sender, comm), code)
    }

    fn status(code: i32) -> Outcome {
        outcome(code)
    }

    /// `name` looked up in each of `dirs` by `pid` (ENOENT), from `ms` on.
    fn lookups(pid: u32, ms: u64, dirs: &[&str], name: &str) -> Vec<KernelEvent> {
        dirs.iter()
            .enumerate()
            .map(|(i, dir)| {
                let path = format!("{dir}/{name}");
                failed(pid, (ms + i as u64) * MS, "newfstatat", libc::ENOENT, &path)
            })
            .collect()
    }

    /// srt's shape: node 10 → bwrap 11 → bwrap 12 (the namespace's init)
    /// → bash 13, which starts socat relays 14 and 15 and the command 16;
    /// bash kills its relays on exit and passes the command's status on;
    /// the init's exit SIGKILLs what is left. A host-side socat 17 (node's
    /// child) is stopped last and fails its socket's unlink on the way.
    fn srt(command: Vec<KernelEvent>, code: i32) -> SpanEvidence {
        let mut events = vec![
            fork(10, 11, MS, "node"),
            exec(11, 2 * MS, "bwrap"),
            fork(10, 17, 2 * MS, "node"),
            exec(17, 3 * MS, "socat"),
            fork(11, 12, 3 * MS, "bwrap"),
            fork(12, 13, 4 * MS, "bwrap"),
            exec(13, 5 * MS, "bash"),
            fork(13, 14, 6 * MS, "bash"),
            exec(14, 7 * MS, "socat"),
            fork(13, 15, 6 * MS, "bash"),
            exec(15, 7 * MS, "socat"),
            fork(13, 16, 8 * MS, "bash"),
        ];
        events.extend(command);
        events.extend([
            exit(16, 20 * MS, Some(code), "cmd"),
            signal(14, 21 * MS, "SIGTERM", 13, "bash", 0),
            exit(14, 22 * MS, None, "socat"),
            exit(13, 23 * MS, Some(code), "bash"),
            exit(12, 24 * MS, Some(code), "bwrap"),
            signal(15, 25 * MS, "SIGKILL", 12, "bwrap", SI_KERNEL),
            exit(15, 26 * MS, None, "socat"),
            exit(11, 27 * MS, Some(code), "bwrap"),
            signal(17, 28 * MS, "SIGTERM", 10, "node", 0),
            failed(17, 29 * MS, "unlink", libc::ENOENT, "/tmp/srt-proxy.sock"),
            exit(17, 30 * MS, Some(143), "socat"),
            exit(10, 31 * MS, Some(code), "node"),
        ]);
        span(events)
    }

    #[test]
    fn under_srt_the_commands_refusal_wins_over_the_relays_being_killed() {
        let mut refused = failed(16, 10 * MS, "connect", libc::ECONNREFUSED, "");
        refused.addr = Some("127.0.0.1:18080".into());
        let s = srt(vec![exec(16, 9 * MS, "curl"), refused], 7);
        let a = attribute(&s, &status(7));
        assert_eq!(a.primitive, Primitive::NetEgress, "{}", a.explanation);
        assert_eq!(a.decisive.unwrap().pid, 16);
        let s = srt(
            vec![
                exec(16, 9 * MS, "touch"),
                failed(16, 10 * MS, "openat", libc::EROFS, "/etc/x"),
            ],
            1,
        );
        let a = attribute(&s, &status(1));
        assert_eq!(a.primitive, Primitive::FsReadonly, "{}", a.explanation);
    }

    #[test]
    fn under_srt_a_shells_nss_lookup_refused_before_a_missing_command_is_not_the_cause() {
        // without $HOME, bash asks NSS for the user; libnss_systemd's unix
        // socket is refused by srt's filter, and bash goes on
        let mut denied = failed(16, 9 * MS, "socket", libc::EPERM, "");
        denied.kind = Kind::SeccompDenied;
        denied.seccomp_filter = Some(true);
        let mut command = vec![exec(16, 8 * MS, "bash"), denied.clone()];
        command.extend(lookups(
            16,
            10,
            &["/usr/local/bin", "/usr/bin", "/bin"],
            "nope",
        ));
        let a = attribute(&srt(command, 127), &status(127));
        assert_eq!(a.primitive, Primitive::ExecMissing, "{}", a.explanation);
        // nor when it went on to start a program, then exited by itself
        let mut command = vec![exec(16, 8 * MS, "bash"), denied.clone()];
        command.extend([fork(16, 18, 10 * MS, "bash"), exec(18, 11 * MS, "sleep")]);
        let a = attribute(&srt(command, 3), &status(3));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        // even when the background job is killed at teardown before its exec
        let mut command = vec![exec(16, 8 * MS, "bash"), denied.clone()];
        command.push(fork(16, 18, 10 * MS, "bash"));
        let mut s = srt(command, 3);
        s.events.extend([
            signal(18, 25 * MS, "SIGKILL", 12, "bwrap", SI_KERNEL),
            exit(18, 26 * MS, None, "bash"),
        ]);
        let s = span(s.events.into());
        let a = attribute(&s, &status(3));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        // a denial after the lookup (the program was found, then refused) wins
        let mut command = vec![exec(16, 8 * MS, "bash")];
        command.extend(lookups(
            16,
            10,
            &["/usr/local/bin", "/usr/bin", "/bin"],
            "nope",
        ));
        denied.ts_ns = 15 * MS;
        command.push(denied);
        let a = attribute(&srt(command, 1), &status(1));
        assert_eq!(a.primitive, Primitive::Seccomp, "{}", a.explanation);
    }

    #[test]
    fn under_srt_a_plain_exit_names_the_stopped_helpers_but_blames_none() {
        let s = srt(vec![exec(16, 9 * MS, "sh")], 3);
        let a = attribute(&s, &status(3));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        assert!(
            a.explanation
                .contains("stopped on the way out, not a cause")
                && a.explanation
                    .contains("sent by bash (pid 13), which started it")
                && a.explanation
                    .contains("at PID-namespace teardown (its init, bwrap (pid 12), had exited"),
            "{}",
            a.explanation
        );
    }

    #[test]
    fn a_clean_srt_run_hides_no_failure_in_a_helpers_cleanup() {
        let s = srt(vec![exec(16, 9 * MS, "echo")], 0);
        let a = attribute(&s, &status(0));
        assert_eq!(a.primitive, Primitive::None);
        assert_eq!(a.hidden_failure, None, "the host socat's unlink is cleanup");
    }

    #[test]
    fn a_kill_at_namespace_teardown_names_the_init_that_exited_not_a_sender() {
        // bwrap 10 → init 11 → sleep 12; the init exits, the kernel
        // SIGKILLs sleep (the tracepoint names the exiting init as sender)
        let s = span(vec![
            fork(10, 11, MS, "bwrap"),
            fork(11, 12, 2 * MS, "bwrap"),
            exec(12, 3 * MS, "sleep"),
            exit(11, 4 * MS, Some(0), "bwrap"),
            signal(12, 5 * MS, "SIGKILL", 11, "bwrap", SI_KERNEL),
            exit(12, 6 * MS, None, "sleep"),
            exit(10, 7 * MS, Some(0), "bwrap"),
        ]);
        let o = status(0);
        let v = explain_signal(&testing::case(&s, &o), 12, "SIGKILL");
        assert_eq!(v.primitive, Primitive::Signal);
        assert_eq!(
            v.explanation,
            "sleep (pid 12) was killed by SIGKILL at PID-namespace teardown (its init, bwrap \
             (pid 11), had exited, and the kernel kills what is left in the namespace)"
        );
        // a SIGKILL the root itself got is the outcome, with its real sender
        let s = span(vec![
            signal(10, MS, "SIGKILL", 99, "kill", 0),
            exit(10, 2 * MS, None, "sleep"),
        ]);
        let killed = Outcome {
            exit: ExitStatus {
                code: None,
                signal: Some("SIGKILL".into()),
            },
            ..Default::default()
        };
        let a = attribute(&s, &killed);
        assert_eq!(a.primitive, Primitive::Signal);
        assert!(
            a.explanation
                .ends_with("was killed by SIGKILL sent by kill (pid 99)"),
            "{}",
            a.explanation
        );
    }

    #[test]
    fn a_runtimes_own_survived_failure_is_not_the_missing_commands_cause() {
        // podman 10 fails a setrlimit, goes on to start runc 11, whose init
        // looks the command up in PATH and fails; podman reports 127
        let mut events = vec![
            failed(10, MS, "setrlimit", libc::EPERM, ""),
            fork(10, 11, 2 * MS, "podman"),
            exec(11, 3 * MS, "runc"),
        ];
        events.extend(lookups(
            11,
            4,
            &["/usr/local/bin", "/usr/bin", "/bin"],
            "nosuchcmd",
        ));
        events.push(exit(11, 8 * MS, Some(1), "runc"));
        events.push(exit(10, 9 * MS, Some(127), "podman"));
        let a = attribute(&span(events), &status(127));
        assert_eq!(a.primitive, Primitive::ExecMissing, "{}", a.explanation);
        assert!(
            a.explanation.contains("`nosuchcmd` is not installed"),
            "{}",
            a.explanation
        );
    }

    #[test]
    fn a_fork_refused_at_a_pids_limit_wins_over_killing_the_leftovers() {
        // sh 11 in a container started by 10 forks until EAGAIN and exits 2;
        // the runtime then SIGKILLs the sleeps left in the container
        let mut events = vec![fork(10, 11, MS, "conmon"), exec(11, 2 * MS, "sh")];
        for i in 0..3 {
            events.push(fork(11, 20 + i, (3 + i as u64) * MS, "sh"));
            events.push(exec(20 + i, (3 + i as u64) * MS + 1, "sleep"));
        }
        events.push(failed(11, 7 * MS, "clone", libc::EAGAIN, ""));
        events.push(exit(11, 8 * MS, Some(2), "sh"));
        for i in 0..3 {
            events.push(signal(20 + i, 9 * MS, "SIGKILL", 10, "conmon", 0));
            events.push(exit(20 + i, 10 * MS, None, "sleep"));
        }
        events.push(exit(10, 11 * MS, Some(2), "conmon"));
        let a = attribute(&span(events), &status(2));
        assert_eq!(a.primitive, Primitive::ProcLimit, "{}", a.explanation);
    }

    /// podman's shape: podman 10 starts conmon 11, which starts the
    /// container's process 13 (through runc, gone by then); podman reads
    /// the container's status from the file conmon wrote, not from a wait,
    /// and fails a cleanup step of its own on the way out.
    fn podman(container: Vec<KernelEvent>, code: i32) -> SpanEvidence {
        let mut events = vec![
            fork(10, 11, MS, "podman"),
            exec(11, 2 * MS, "conmon"),
            fork(11, 12, 3 * MS, "conmon"),
            exec(12, 4 * MS, "runc"),
            fork(12, 13, 5 * MS, "runc"),
            exit(12, 6 * MS, Some(0), "runc"),
        ];
        events.extend(container);
        events.extend([
            exit(13, 20 * MS, Some(code), "sh"),
            exit(11, 21 * MS, Some(0), "conmon"),
            failed(
                10,
                22 * MS,
                "unlinkat",
                libc::ENOENT,
                "/var/lib/containers/storage/overlay/staging",
            ),
            exit(10, 23 * MS, Some(code), "podman"),
        ]);
        span(events)
    }

    #[test]
    fn podmans_status_comes_from_the_container_through_conmons_file() {
        let s = podman(
            vec![
                exec(13, 7 * MS, "touch"),
                failed(13, 8 * MS, "openat", libc::EROFS, "/x"),
            ],
            1,
        );
        assert_eq!(
            super::super::lineage::Lineage::of(
                &s,
                &ExitStatus {
                    code: Some(1),
                    signal: None
                }
            )
            .path,
            vec![10, 13]
        );
        let a = attribute(&s, &status(1));
        assert_eq!(a.primitive, Primitive::FsReadonly, "{}", a.explanation);
        // a plain exit: podman's own cleanup error is not the cause
        let s = podman(vec![exec(13, 7 * MS, "sh")], 3);
        let a = attribute(&s, &status(3));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
    }

    #[test]
    fn firejails_own_lookup_of_a_missing_command_is_exec_missing_not_its_cleanup() {
        // firejail 10 → sandbox 11: it stats the name in PATH, unlinks its
        // run files (ENOENT) and exits 1
        let mut events = vec![fork(10, 11, MS, "firejail")];
        events.extend(lookups(
            11,
            2,
            &["/root/.cargo/bin", "/usr/local/bin", "/usr/bin", "/bin"],
            "nosuchcmd",
        ));
        events.push(failed(
            11,
            7 * MS,
            "unlink",
            libc::ENOENT,
            "/run/firejail/profile/2",
        ));
        events.push(exit(11, 8 * MS, Some(1), "firejail"));
        events.push(exit(10, 9 * MS, Some(1), "firejail"));
        let a = attribute(&span(events), &status(1));
        assert_eq!(a.primitive, Primitive::ExecMissing, "{}", a.explanation);
        assert!(a.explanation.ends_with("and exited 1"), "{}", a.explanation);
        // config files looked for in several places are no command
        let mut events = vec![fork(10, 11, MS, "app")];
        events.extend(lookups(
            11,
            2,
            &["/etc/app", "/root/.config/app"],
            "app.conf",
        ));
        events.push(exit(11, 8 * MS, Some(1), "app"));
        events.push(exit(10, 9 * MS, Some(1), "app"));
        let a = attribute(&span(events), &status(1));
        assert_ne!(a.primitive, Primitive::ExecMissing, "{}", a.explanation);
        // a shell looks `cat` up, its child runs /usr/bin/cat, which fails
        let mut events = vec![];
        events.extend(lookups(
            10,
            1,
            &["/root/.cargo/bin", "/usr/local/bin"],
            "cat",
        ));
        events.push(fork(10, 11, 3 * MS, "sh"));
        events.push(exec(11, 4 * MS, "cat"));
        events.push(failed(11, 5 * MS, "openat", libc::ENOENT, "/data/in.csv"));
        events.push(exit(11, 6 * MS, Some(1), "cat"));
        events.push(exit(10, 7 * MS, Some(1), "sh"));
        let a = attribute(
            &span(events),
            &testing::said(1, "cat: /data/in.csv: No such file or directory"),
        );
        assert_eq!(a.primitive, Primitive::FsMissing, "{}", a.explanation);
    }

    #[test]
    fn a_runtimes_setup_failure_before_it_starts_the_workload_is_no_hidden_failure() {
        // systemd-nspawn 10 → 11 sets up a read-only root (mkdir EROFS,
        // tolerated), starts 12, which runs the payload, and exits 0
        let s = span(vec![
            fork(10, 11, MS, "systemd-nspawn"),
            failed(
                11,
                2 * MS,
                "mkdir",
                libc::EROFS,
                "/srv/root/var/log/journal",
            ),
            fork(11, 12, 3 * MS, "systemd-nspawn"),
            exit(11, 4 * MS, Some(0), "systemd-nspawn"),
            exec(12, 5 * MS, "echo"),
            exit(12, 6 * MS, Some(0), "echo"),
            exit(10, 7 * MS, Some(0), "systemd-nspawn"),
        ]);
        let a = attribute(&s, &status(0));
        assert_eq!(a.hidden_failure, None);
    }

    #[test]
    fn a_sighup_the_kernel_sent_when_a_session_leader_exited_says_so() {
        let s = span(vec![
            fork(10, 11, MS, "sh"),
            exec(11, 2 * MS, "sleep"),
            exit(10, 3 * MS, Some(3), "sh"),
            signal(11, 4 * MS, "SIGHUP", 10, "sh", SI_KERNEL),
            exit(11, 5 * MS, None, "sleep"),
        ]);
        let a = attribute(&s, &status(3));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        assert!(
            a.explanation
                .contains("sleep (pid 11) by SIGHUP sent by the kernel when sh (pid 10) exited"),
            "{}",
            a.explanation
        );
    }

    #[test]
    fn a_refused_connection_a_browser_reported_explains_the_missing_pdf_after_it() {
        // sh 10 runs chromium 11 (its network service 12 is refused and
        // exits 0, so does the browser: no PDF), then python 13, which
        // cannot open the PDF and exits 1
        let mut refused = failed(12, 3 * MS, "connect", libc::ECONNREFUSED, "");
        refused.addr = Some("127.66.0.1:8080".into());
        let s = span(vec![
            fork(10, 11, MS, "sh"),
            exec(11, MS + 1, "chromium"),
            fork(11, 12, 2 * MS, "chromium"),
            refused,
            exit(12, 4 * MS, Some(0), "chromium"),
            exit(11, 5 * MS, Some(0), "chromium"),
            fork(10, 13, 6 * MS, "sh"),
            exec(13, 6 * MS + 1, "python3"),
            failed(13, 7 * MS, "openat", libc::ENOENT, "/tmp/t/report.pdf"),
            exit(13, 8 * MS, Some(1), "python3"),
            exit(10, 9 * MS, Some(1), "sh"),
        ]);
        let said = "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/t/report.pdf'";
        let a = attribute(&s, &testing::said(1, said));
        assert_eq!(a.primitive, Primitive::NetEgress, "{}", a.explanation);
        assert_eq!(a.decisive.unwrap().pid, 12);
    }

    #[test]
    fn a_command_a_shell_with_one_path_directory_could_not_find_is_exec_missing() {
        // `PATH=/bin sh -c no-such-tool`: one candidate, then 127
        let mut events = vec![exec(10, MS, "sh")];
        events.extend(lookups(10, 2, &["/bin"], "no-such-tool"));
        events.push(exit(10, 5 * MS, Some(127), "sh"));
        let a = attribute(&span(events), &status(127));
        assert_eq!(a.primitive, Primitive::ExecMissing, "{}", a.explanation);
        assert!(
            a.explanation
                .contains("looked in the one PATH directory (/bin/no-such-tool) and exited 127"),
            "{}",
            a.explanation
        );
        // bash's message catalogs, looked up in several places before its
        // "command not found", are no command
        let mut events = vec![exec(10, MS, "bash")];
        events.extend(lookups(
            10,
            2,
            &[
                "/usr/share/locale/C.UTF-8/LC_MESSAGES",
                "/usr/share/locale/C.utf8/LC_MESSAGES",
            ],
            "bash.mo",
        ));
        events.extend(lookups(10, 4, &["/usr/local/bin", "/usr/bin"], "nope"));
        events.extend(lookups(
            10,
            6,
            &[
                "/usr/share/locale/C/LC_MESSAGES",
                "/usr/share/locale-langpack/C/LC_MESSAGES",
            ],
            "bash.mo",
        ));
        events.push(exit(10, 9 * MS, Some(127), "bash"));
        let a = attribute(&span(events), &status(127));
        assert_eq!(a.primitive, Primitive::ExecMissing, "{}", a.explanation);
        assert!(
            a.explanation.starts_with("`nope` is not installed"),
            "{}",
            a.explanation
        );
    }

    #[test]
    fn a_full_disk_of_a_helper_its_browser_then_stopped_is_still_the_cause() {
        // chromium 11 starts a writer 12, which hits ENOSPC; the browser
        // stops it on its way out and exits 1
        let s = span(vec![
            fork(10, 11, MS, "sh"),
            exec(11, 2 * MS, "chromium"),
            fork(11, 12, 3 * MS, "chromium"),
            named(failed(12, 4 * MS, "pwrite64", libc::ENOSPC, ""), "chromium"),
            signal(12, 5 * MS, "SIGTERM", 11, "chromium", 0),
            exit(12, 6 * MS, None, "chromium"),
            exit(11, 7 * MS, Some(1), "chromium"),
            exit(10, 8 * MS, Some(1), "sh"),
        ]);
        let a = attribute(&s, &status(1));
        assert_eq!(a.primitive, Primitive::FsSpace, "{}", a.explanation);
        assert!(
            a.explanation
                .ends_with("then chromium (pid 12) was stopped on the way out"),
            "{}",
            a.explanation
        );
        // a failure it met once being stopped is cleanup
        let s = span(vec![
            fork(10, 11, MS, "sh"),
            exec(11, 2 * MS, "chromium"),
            fork(11, 12, 3 * MS, "chromium"),
            signal(12, 4 * MS, "SIGTERM", 11, "chromium", 0),
            failed(12, 5 * MS, "pwrite64", libc::ENOSPC, ""),
            exit(12, 6 * MS, None, "chromium"),
            exit(11, 7 * MS, Some(1), "chromium"),
            exit(10, 8 * MS, Some(1), "sh"),
        ]);
        let a = attribute(&s, &status(1));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
    }

    #[test]
    fn a_writer_killed_by_sigpipe_after_its_reader_failed_is_no_cause() {
        // `echo x | sed 's/(/'`: sed 12 exits 1 on its syntax error before
        // the subshell 11 writes; the kernel's SIGPIPE ends the writer
        let s = span(vec![
            fork(10, 11, MS, "sh"),
            fork(10, 12, MS, "sh"),
            exec(12, 2 * MS, "sed"),
            exit(12, 3 * MS, Some(1), "sed"),
            signal(11, 4 * MS, "SIGPIPE", 11, "sh", 0),
            exit(11, 5 * MS, None, "sh"),
            exit(10, 6 * MS, Some(1), "sh"),
        ]);
        let a = attribute(&s, &status(1));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        // on the path it is the outcome: the status the caller got
        let s = span(vec![
            signal(10, 4 * MS, "SIGPIPE", 10, "yes", 0),
            exit(10, 5 * MS, None, "yes"),
        ]);
        let killed = Outcome {
            exit: ExitStatus {
                code: None,
                signal: Some("SIGPIPE".into()),
            },
            ..Default::default()
        };
        assert_eq!(attribute(&s, &killed).primitive, Primitive::Signal);
    }

    #[test]
    fn a_command_a_child_could_not_start_is_no_cause_when_its_parent_coped() {
        // `cargo new` forks 11 to run `hg`, whose execs fail in every PATH
        // directory (11 exits 127); cargo goes on and exits 0; the span
        // fails later on `cargo test`'s own 101
        let mut events = vec![fork(10, 11, MS, "cargo")];
        for (i, dir) in ["/usr/local/bin", "/usr/bin", "/bin"].iter().enumerate() {
            events.push(failed(
                11,
                (2 + i as u64) * MS,
                "execve",
                libc::ENOENT,
                &format!("{dir}/hg"),
            ));
        }
        events.push(exit(11, 6 * MS, Some(127), "cargo"));
        events.push(exit(10, 7 * MS, Some(0), "cargo"));
        let mut s = span(events);
        s.root_pid = Some(9);
        s.add(testing::fork(9, 10, 0));
        let a = attribute(&s, &status(101));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        // runc's shape: the parent exits 0 first (it hands the container's
        // init on), then the init's shell looks the command up and exits
        // 127: nobody coped with that
        let mut events = vec![fork(10, 11, MS, "runc"), exit(10, 2 * MS, Some(0), "runc")];
        events.push(exec(11, 3 * MS, "sh"));
        events.extend(lookups(
            11,
            4,
            &["/usr/local/bin", "/usr/bin", "/bin"],
            "nope",
        ));
        events.push(exit(11, 8 * MS, Some(127), "sh"));
        let mut s = span(events);
        s.root_pid = Some(9);
        s.add(testing::fork(9, 10, 0));
        let a = attribute(&s, &status(127));
        assert_eq!(a.primitive, Primitive::ExecMissing, "{}", a.explanation);
    }

    /// The same events as gVisor's: its source decides, and the words.
    fn gvisor_span(events: Vec<KernelEvent>) -> SpanEvidence {
        let mut s = SpanEvidence::new(1, None, "unit".into(), 0);
        s.source = crate::spans::Source::Gvisor;
        s.root_pid = Some(10);
        for e in events {
            s.add(e);
        }
        s
    }

    #[test]
    fn a_call_gvisor_refuses_that_linux_accepts_is_sandbox_kernel_only_when_said() {
        let statx = || {
            let mut e = failed(10, MS, "statx", libc::EINVAL, "");
            e.flags = Some(0x800); // AT_NO_AUTOMOUNT: valid on Linux
            e
        };
        let ls = testing::said(2, "ls: cannot access '/x': Invalid argument\n");
        let a = attribute(
            &gvisor_span(vec![statx(), exit_with(10, 2 * MS, Some(2))]),
            &ls,
        );
        assert_eq!(a.primitive, Primitive::SandboxKernel, "{}", a.explanation);
        assert!(a.explanation.contains("0x800"), "{}", a.explanation);
        // a flag Linux does not know is the program's own EINVAL
        let mut bad = statx();
        bad.flags = Some(0x800 | 0x1_0000_0000);
        let a = attribute(&gvisor_span(vec![bad, exit_with(10, 2 * MS, Some(2))]), &ls);
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        // a probe for a newer syscall that fell back says nothing of it
        let clone3 = failed(10, MS, "clone3", libc::ENOSYS, "");
        let quiet = testing::said(1, "ValueError: bad input\n");
        let a = attribute(
            &gvisor_span(vec![clone3.clone(), exit_with(10, 2 * MS, Some(1))]),
            &quiet,
        );
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        let told = testing::said(1, "clone3: Function not implemented\n");
        let a = attribute(
            &gvisor_span(vec![clone3.clone(), exit_with(10, 2 * MS, Some(1))]),
            &told,
        );
        assert_eq!(a.primitive, Primitive::SandboxKernel, "{}", a.explanation);
        // the same events from the kernel's own eBPF are no sandbox-kernel gap
        let a = attribute(&span(vec![clone3, exit_with(10, 2 * MS, Some(1))]), &told);
        assert_ne!(a.primitive, Primitive::SandboxKernel, "{}", a.explanation);
    }

    /// A call to a server that outlives it: the server (10) runs the
    /// call's command (11) and, when `background`, a program of its own
    /// (12, a version probe that fails to find `git`) after the command
    /// ended. The call answered `code`, saying `output`.
    fn server_call(
        command: Vec<KernelEvent>,
        background: bool,
        code: i32,
        output: &str,
    ) -> Attribution {
        let mut events = vec![fork(10, 11, MS, "server")];
        events.extend(command);
        if background {
            events.push(fork(10, 12, 20 * MS, "server"));
            events.push(exec(12, 20 * MS + 1, "sh"));
            events.extend(lookups(
                12,
                21,
                &["/usr/local/bin", "/usr/bin", "/bin"],
                "git",
            ));
            events.push(exit(12, 25 * MS, Some(127), "sh"));
        }
        let mut s = span(events);
        s.root_serves = true;
        assert_eq!(s.outliving_root(), Some(10));
        let mut o = said(code, output);
        o.words.command = Some(r#"{"command":"cat /nonexistent/data.csv"}"#.into());
        attribute(&s, &o)
    }

    /// `cat /nonexistent/data.csv` in process 11: its failed open, its 1.
    fn cat_missing() -> Vec<KernelEvent> {
        vec![
            exec(11, 2 * MS, "cat"),
            failed(11, 3 * MS, "openat", libc::ENOENT, "/nonexistent/data.csv"),
            exit(11, 4 * MS, Some(1), "cat"),
        ]
    }

    #[test]
    fn a_servers_later_programs_never_make_a_calls_failure_look_handled() {
        let words = "cat: /nonexistent/data.csv: No such file or directory\nexit code 1";
        // the server answered without isError: the failure is hidden,
        // with or without the server's own program after it
        for background in [false, true] {
            let a = server_call(cat_missing(), background, 0, words);
            assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
            let h = a.hidden_failure.expect("the call's failure, hidden");
            assert_eq!(h.primitive, Primitive::FsMissing, "{}", h.explanation);
            assert!(
                h.explanation.contains("/nonexistent/data.csv"),
                "{}",
                h.explanation
            );
            // with isError, the call's failure
            let a = server_call(cat_missing(), background, 1, words);
            assert_eq!(a.primitive, Primitive::FsMissing, "{}", a.explanation);
        }
        // words that name nothing (a command read from elsewhere, an
        // answer without the error): noticed, never blamed
        let mut s = span(cat_missing());
        s.add(testing::fork(10, 11, MS));
        s.root_serves = true;
        let a = attribute(&s, &said(0, "exit code 1"));
        assert!(a.hidden_failure.is_none(), "{:?}", a.hidden_failure);
    }

    #[test]
    fn a_servers_own_missing_command_is_no_cause_unless_the_calls_words_name_it() {
        // a clean call while the server's version probe finds no `git`
        let a = server_call(
            vec![exec(11, 2 * MS, "echo"), exit(11, 3 * MS, Some(0), "echo")],
            true,
            0,
            "ok",
        );
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        assert!(a.hidden_failure.is_none(), "{:?}", a.hidden_failure);
        // a failed call that says something else: not the probe's 127
        let a = server_call(
            vec![
                exec(11, 2 * MS, "false"),
                exit(11, 3 * MS, Some(1), "false"),
            ],
            true,
            1,
            "exit code 1",
        );
        assert_ne!(a.primitive, Primitive::ExecMissing, "{}", a.explanation);
        // the call's own missing command, named by its words
        let mut own = vec![exec(11, 2 * MS, "sh")];
        own.extend(lookups(
            11,
            3,
            &["/usr/local/bin", "/usr/bin", "/bin"],
            "no-such-tool",
        ));
        own.push(exit(11, 7 * MS, Some(127), "sh"));
        let words = "sh: 1: no-such-tool: not found\nexit code 127";
        for code in [0, 1] {
            let a = server_call(own.clone(), true, code, words);
            let (primitive, why) = match &a.hidden_failure {
                Some(h) => (h.primitive, h.explanation.clone()),
                None => (a.primitive, a.explanation.clone()),
            };
            assert_eq!(primitive, Primitive::ExecMissing, "{why}");
            assert!(why.contains("`no-such-tool`"), "{why}");
        }
    }

    #[test]
    fn a_scripts_missing_command_its_words_name_is_a_hidden_failure() {
        // `sh -c 'no-such-tool --version; true'`: the child 11 looks the
        // name up and exits 127, sh goes on with a builtin and exits 0
        let mut events = vec![exec(10, 0, "sh"), fork(10, 11, MS, "sh")];
        events.extend(lookups(
            11,
            2,
            &["/usr/local/bin", "/usr/bin", "/bin"],
            "no-such-tool",
        ));
        events.push(exit(11, 6 * MS, Some(127), "sh"));
        events.push(exit(10, 7 * MS, Some(0), "sh"));
        let s = span(events);
        let a = attribute(&s, &said(0, "sh: 1: no-such-tool: not found"));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        let h = a.hidden_failure.expect("hidden");
        assert_eq!(h.primitive, Primitive::ExecMissing, "{}", h.explanation);
        // silenced (`2>/dev/null`): the script dealt with it
        let a = attribute(&s, &said(0, ""));
        assert!(a.hidden_failure.is_none(), "{:?}", a.hidden_failure);
        // dash looks the name up itself, says so and goes on to a builtin
        let mut events = vec![exec(10, 0, "sh")];
        events.extend(lookups(
            10,
            1,
            &["/usr/local/bin", "/usr/bin", "/bin"],
            "no-such-tool",
        ));
        events.push(exit(10, 5 * MS, Some(0), "sh"));
        let s = span(events);
        let a = attribute(&s, &said(0, "sh: 1: no-such-tool: not found"));
        let h = a.hidden_failure.expect("hidden");
        assert_eq!(h.primitive, Primitive::ExecMissing, "{}", h.explanation);
        assert!(
            h.explanation.contains("went on without it"),
            "{}",
            h.explanation
        );
        // and went on to run another program: it got past it
        let mut events = vec![exec(10, 0, "sh")];
        events.extend(lookups(
            10,
            1,
            &["/usr/local/bin", "/usr/bin", "/bin"],
            "no-such-tool",
        ));
        events.push(fork(10, 11, 5 * MS, "sh"));
        events.push(exec(11, 6 * MS, "ls"));
        events.push(exit(11, 7 * MS, Some(0), "ls"));
        events.push(exit(10, 8 * MS, Some(0), "sh"));
        let a = attribute(&span(events), &said(0, "sh: 1: no-such-tool: not found"));
        assert!(a.hidden_failure.is_none(), "{:?}", a.hidden_failure);
    }
}
