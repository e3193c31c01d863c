//! Who produced the status the caller saw, and which signals were only
//! somebody shutting things down.
//!
//! A sandbox runtime wraps the workload in a chain of processes (srt: node →
//! bwrap → bwrap as the PID namespace's init → bash → the command), each
//! passing on the status of the one it waited for, and around that chain it
//! runs helpers (socat relays, a proxy) that it kills when the command is
//! done; when a PID namespace's init exits, the kernel SIGKILLs whatever is
//! left in it. The chain is the exit-status path; kills of helpers by an
//! ancestor and kills at namespace teardown are shutdown, not causes.

use std::collections::{HashMap, HashSet};

use crate::event::{KernelEvent, Kind, Signal, is_signal};
use crate::spans::SpanEvidence;

use super::ExitStatus;

/// `si_code` of a signal the kernel sent on its own behalf (`SEND_SIG_PRIV`):
/// the SIGKILL of a PID namespace's last processes when its init exits.
pub const SI_KERNEL: i32 = 0x80;

/// Signals a runtime (or the kernel) uses to stop what it started.
const STOP_SIGNALS: [Signal; 5] = [
    Signal::SIGKILL,
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// Where a process's fatal signal came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignalOrigin {
    /// The process itself (a fault, abort(), raise(), a trap).
    Own,
    /// The kernel SIGKILLed it because its PID namespace's init had exited.
    NamespaceTeardown { init: u32, init_comm: String },
    /// The kernel sent it another signal when a process exited (SIGHUP to
    /// a session whose leader exited).
    KernelAtExit { pid: u32, comm: String },
    /// A process that started it (directly or further up): a wrapper's
    /// cleanup, a shell's `kill %1`, `timeout`.
    Ancestor { pid: u32, comm: String },
    /// Any other process.
    Other { pid: u32, comm: String },
    /// Not seen being sent (the exit was seen, the signal event was not).
    Unknown,
}

/// How the span's processes relate to its outcome.
#[derive(Debug, Default)]
pub struct Lineage {
    /// Root first: each process passed on the status of the next one,
    /// which it waited for. The last one's own exit is the outcome.
    pub path: Vec<u32>,
    /// Processes stopped by an ancestor, at namespace teardown, or by
    /// anyone once the root had ended, with the time of that signal: their
    /// later failures are cleanup.
    pub stopped: HashMap<u32, u64>,
    /// Per process, the last time it went on to run a program (started a
    /// child that ran one, or exec'd one itself): failures it had before
    /// that, it got past.
    went_on_at: HashMap<u32, u64>,
    /// Processes that failed before their parent went on to start another
    /// program: the parent looked at their status and carried on.
    pub coped: HashSet<u32>,
    /// Processes that failed, whose parent then exited 0 after them: the
    /// parent saw their status and succeeded anyway (`cargo new`'s child
    /// that could not run `hg`). Not a parent that exited before its child
    /// failed (runc's CHILD, which leaves its INIT to run the container).
    pub outlived_by_a_succeeding_parent: HashSet<u32>,
}

impl Lineage {
    pub fn of(span: &SpanEvidence, exit: &ExitStatus) -> Lineage {
        let mut lineage = Lineage {
            path: exit_path(span, exit),
            ..Lineage::default()
        };
        let root_ended = span
            .root_pid
            .and_then(|r| exit_times(span).get(&r).copied())
            .unwrap_or(u64::MAX);
        for (&pid, p) in &span.processes {
            if Some(pid) == span.root_pid
                || !p
                    .signal
                    .as_deref()
                    .is_some_and(|s| STOP_SIGNALS.iter().any(|&stop| is_signal(Some(s), stop)))
            {
                continue;
            }
            let at = fatal_signal(span, pid).map(|e| e.ts_ns).unwrap_or(0);
            // after the root ended, whoever sends it, it is clearing up
            let after_the_end = at > root_ended;
            if after_the_end
                || matches!(
                    signal_origin(span, pid),
                    SignalOrigin::Ancestor { .. }
                        | SignalOrigin::NamespaceTeardown { .. }
                        | SignalOrigin::KernelAtExit { .. }
                )
            {
                lineage.stopped.insert(pid, at);
            }
        }
        // a child "ran a program" when it or anything it started exec'd
        let mut runs_program: HashSet<u32> = HashSet::new();
        for e in span.events.iter().filter(|e| e.kind == Kind::Exec) {
            let mut pid = e.pid;
            while runs_program.insert(pid) {
                match span.processes.get(&pid).and_then(|p| p.parent) {
                    Some(parent) => pid = parent,
                    None => break,
                }
            }
        }
        let exit_at = exit_times(span);
        for e in &span.events {
            let went_on = match e.kind {
                // or a background job that was stopped on the way out
                // before it got to exec (`sleep 30 & exit 3` under srt)
                Kind::Fork => {
                    e.thread == Some(false)
                        && e.child_pid.is_some_and(|c| {
                            runs_program.contains(&c) || lineage.stopped.contains_key(&c)
                        })
                }
                // the process became another program itself (a wrapper
                // script's final exec)
                Kind::Exec => true,
                _ => false,
            };
            if went_on {
                let at = lineage.went_on_at.entry(e.pid).or_default();
                *at = (*at).max(e.ts_ns);
            }
        }
        for (&pid, p) in &span.processes {
            let parent = p.parent.and_then(|pp| Some((pp, span.processes.get(&pp)?)));
            if let (Some((parent, info)), Some(&ended)) = (parent, exit_at.get(&pid))
                && p.failed()
                && info.exit_code == Some(0)
                && exit_at.get(&parent).is_some_and(|&at| at > ended)
            {
                lineage.outlived_by_a_succeeding_parent.insert(pid);
            }
        }
        // a child that failed and exited before its parent went on to
        // start another program was a check the parent coped with (srt's
        // `rg` scan, the chromium script's `ls` of a glob). Only a parent
        // that ended within the span, as a script does: a server that
        // outlives the call (the proxy's server, a browser, a shell kept
        // between calls) starts programs of its own around its calls
        // (version probes, housekeeping), and those say nothing of whether
        // the call's work coped; whether they come before the span ends is
        // a matter of timing, and a verdict is not
        for (&pid, p) in &span.processes {
            if let (Some(parent), Some(&ended)) = (p.parent, exit_at.get(&pid))
                && p.failed()
                && exit_at.contains_key(&parent)
                && lineage
                    .went_on_at
                    .get(&parent)
                    .is_some_and(|&at| at > ended)
            {
                lineage.coped.insert(pid);
            }
        }
        lineage
    }

    /// The process whose own exit is the outcome.
    pub fn leaf(&self) -> Option<u32> {
        self.path.last().copied()
    }

    pub fn on_path(&self, pid: u32) -> bool {
        self.path.contains(&pid)
    }

    /// `ev` happened in a process that was being stopped by its ancestor or
    /// the kernel: cleanup (socat unlinking its socket on SIGTERM).
    pub fn is_cleanup(&self, ev: &KernelEvent) -> bool {
        self.stopped.get(&ev.pid).is_some_and(|&at| ev.ts_ns >= at)
    }

    /// A failure its process got past: afterwards it started another
    /// process that ran a program (podman's own setrlimit EPERM, before it
    /// goes on to start the container).
    pub fn survived(&self, ev: &KernelEvent) -> bool {
        self.went_on_at
            .get(&ev.pid)
            .is_some_and(|&at| at > ev.ts_ns)
    }
}

/// How much later than its parent a child whose status the parent passed
/// on may be seen exiting: bwrap's PID-namespace init writes the command's
/// status to the outer bwrap before it exits itself, and the outer one
/// exits at once (microseconds apart; 50 ms is room for a loaded machine).
const REPORTED_EXIT_SLACK_NS: u64 = 50_000_000;

/// The exit-status path: from the root, while a process's status is the
/// status of a child it waited for (the same code, or 128+N for a child
/// killed by signal N, as shells and runtimes report it), the last such
/// child to exit before it (or just after: [`REPORTED_EXIT_SLACK_NS`]);
/// without such a child, the last such process it started further down. Stops at a process killed by a signal (that
/// signal is the outcome) and at a success (every child "passes on" 0).
fn exit_path(span: &SpanEvidence, exit: &ExitStatus) -> Vec<u32> {
    let Some(root) = span.root_pid else {
        return Vec::new();
    };
    let exit_ts = exit_times(span);
    let mut path = vec![root];
    let (mut pid, mut code) = (root, exit.code);
    let exec_ts = last_exec_times(span);
    while let Some(c) = code.filter(|&c| c != 0) {
        let ended = exit_ts.get(&pid).copied().unwrap_or(u64::MAX);
        // a process that ran a new program after a child ended does not
        // report that child's status (pyenv's shim runs `readlink`, which
        // exits 1, then execs python)
        let became = exec_ts.get(&pid).copied().unwrap_or(0);
        // the last process to end, before `pid` did (or just after), with
        // a status `pid` may have passed on
        let last_passing = |candidate: &dyn Fn(u32) -> bool| {
            span.processes
                .iter()
                .filter(|(p, info)| {
                    info.exited && !path.contains(*p) && passes_on(info, c) && candidate(**p)
                })
                .filter_map(|(&p, _)| Some((exit_ts.get(&p).copied()?, p)))
                .filter(|&(at, _)| {
                    at > became && at <= ended.saturating_add(REPORTED_EXIT_SLACK_NS)
                })
                .max()
                .map(|(_, p)| p)
        };
        // a child it waited for; else a process further down whose status
        // reached it another way (podman reads the container's status from
        // the file conmon wrote; conmon is no longer the container's parent)
        let parent_of = |p: u32| span.processes.get(&p).and_then(|i| i.parent);
        // and for the root, a process the span followed into its cgroup
        // without starting it (`docker exec`: the daemon's shim started it)
        let Some(next) = last_passing(&|p| parent_of(p) == Some(pid))
            .or_else(|| last_passing(&|p| is_ancestor(span, pid, p)))
            .or_else(|| last_passing(&|p| pid == root && !is_ancestor(span, root, p)))
        else {
            break;
        };
        path.push(next);
        pid = next;
        code = span.processes[&next].exit_code;
    }
    path
}

/// Per process, the time of its last exec.
fn last_exec_times(span: &SpanEvidence) -> HashMap<u32, u64> {
    times_of(span, Kind::Exec)
}

fn exit_times(span: &SpanEvidence) -> HashMap<u32, u64> {
    times_of(span, Kind::Exit)
}

/// Per process, the time of its last event of `kind`.
fn times_of(span: &SpanEvidence, kind: Kind) -> HashMap<u32, u64> {
    span.events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| (e.pid, e.ts_ns))
        .collect()
}

/// A parent that exited `code` may have passed on this child's status.
fn passes_on(child: &crate::spans::ProcessInfo, code: i32) -> bool {
    match (child.exit_code, child.signal.as_deref()) {
        (Some(c), _) => c == code,
        (None, Some(sig)) => sig
            .parse::<nix::sys::signal::Signal>()
            .is_ok_and(|s| 128 + s as i32 == code),
        _ => false,
    }
}

/// The signal event that killed `pid` (its first fatal one).
pub fn fatal_signal(span: &SpanEvidence, pid: u32) -> Option<&KernelEvent> {
    let sig = span.processes.get(&pid)?.signal.as_deref()?;
    span.events
        .iter()
        .find(|e| e.kind == Kind::Signal && e.pid == pid && e.signal.as_deref() == Some(sig))
}

/// Where the fatal signal of `pid` came from.
pub fn signal_origin(span: &SpanEvidence, pid: u32) -> SignalOrigin {
    let Some(p) = span.processes.get(&pid) else {
        return SignalOrigin::Unknown;
    };
    let Some((sender, comm)) = p.signal_sender.clone() else {
        return SignalOrigin::Unknown;
    };
    if sender == pid {
        return SignalOrigin::Own;
    }
    let sent_at = fatal_signal(span, pid).map(|e| e.ts_ns);
    // the kernel's SIGKILL at teardown is generated while the init exits:
    // its exit event comes first, and the "sender" is that init
    let sender_exited = span
        .events
        .iter()
        .any(|e| e.kind == Kind::Exit && e.pid == sender && sent_at.is_none_or(|at| e.ts_ns <= at));
    if p.signal_code == Some(SI_KERNEL) && !p.oom_killed && sender_exited {
        return if is_signal(p.signal.as_deref(), Signal::SIGKILL) {
            SignalOrigin::NamespaceTeardown {
                init: sender,
                init_comm: comm,
            }
        } else {
            SignalOrigin::KernelAtExit { pid: sender, comm }
        };
    }
    if is_ancestor(span, sender, pid) {
        SignalOrigin::Ancestor { pid: sender, comm }
    } else {
        SignalOrigin::Other { pid: sender, comm }
    }
}

/// `a` started `pid`, directly or further up.
fn is_ancestor(span: &SpanEvidence, a: u32, pid: u32) -> bool {
    let mut cur = pid;
    // a bound, in case a reused pid made a loop of parents
    for _ in 0..64 {
        match span.processes.get(&cur).and_then(|p| p.parent) {
            Some(parent) if parent == a => return true,
            Some(parent) => cur = parent,
            None => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::super::testing::{exit_with, exited, fork, signal_from, span};
    use super::*;

    fn exit(pid: u32, ts: u64, code: Option<i32>) -> KernelEvent {
        exit_with(pid, ts, code)
    }

    fn signal(pid: u32, ts: u64, sig: &str, sender: u32, si_code: i32) -> KernelEvent {
        signal_from(pid, ts, sig, (sender, &format!("p{sender}")), si_code)
    }

    fn code(c: i32) -> ExitStatus {
        exited(c)
    }

    #[test]
    fn the_path_follows_the_status_each_process_passed_on() {
        // runtime 10 → init 11 → shell 12 → command 13 (exit 1); the shell
        // also ran 14, which exited 1 earlier, and a helper 15
        let s = span(vec![
            fork(10, 11, 1),
            fork(11, 12, 2),
            fork(12, 14, 3),
            exit(14, 4, Some(1)),
            fork(12, 15, 5),
            fork(12, 13, 6),
            exit(13, 7, Some(1)),
            exit(12, 8, Some(1)),
            exit(15, 9, None),
            exit(11, 10, Some(1)),
            exit(10, 11, Some(1)),
        ]);
        let l = Lineage::of(&s, &code(1));
        assert_eq!(l.path, vec![10, 11, 12, 13]);
        assert_eq!(l.leaf(), Some(13));
    }

    #[test]
    fn a_child_killed_by_signal_n_is_passed_on_as_128_plus_n() {
        let s = span(vec![
            fork(10, 11, 1),
            signal(11, 2, "SIGKILL", 99, 0),
            exit(11, 3, None),
            exit(10, 4, Some(137)),
        ]);
        assert_eq!(Lineage::of(&s, &code(137)).path, vec![10, 11]);
        // a status that is not the child's stops the path at the parent
        assert_eq!(Lineage::of(&s, &code(1)).path, vec![10]);
    }

    #[test]
    fn a_success_path_is_the_root_alone() {
        let s = span(vec![
            fork(10, 11, 1),
            exit(11, 2, Some(0)),
            exit(10, 3, Some(0)),
        ]);
        assert_eq!(Lineage::of(&s, &code(0)).path, vec![10]);
    }

    #[test]
    fn the_kernels_sigkill_after_the_init_exited_is_namespace_teardown() {
        // init 11 exits; the kernel SIGKILLs the leftover 12 (SI_KERNEL),
        // the tracepoint naming the exiting init as the sender
        let s = span(vec![
            fork(10, 11, 1),
            fork(11, 12, 2),
            exit(11, 5, Some(1)),
            signal(12, 6, "SIGKILL", 11, SI_KERNEL),
            exit(12, 7, None),
        ]);
        assert_eq!(
            signal_origin(&s, 12),
            SignalOrigin::NamespaceTeardown {
                init: 11,
                init_comm: "p11".into()
            }
        );
        let l = Lineage::of(&s, &code(1));
        assert!(l.stopped.contains_key(&12));
    }

    #[test]
    fn a_kill_by_a_process_that_started_it_is_an_ancestors_and_a_strangers_is_not() {
        let s = span(vec![
            fork(10, 11, 1),
            fork(11, 12, 2),
            fork(10, 13, 2),
            signal(12, 3, "SIGTERM", 10, 0),
            exit(12, 4, Some(143)),
            signal(13, 3, "SIGTERM", 77, 0),
            exit(13, 4, None),
        ]);
        assert!(matches!(
            signal_origin(&s, 12),
            SignalOrigin::Ancestor { pid: 10, .. }
        ));
        assert!(matches!(
            signal_origin(&s, 13),
            SignalOrigin::Other { pid: 77, .. }
        ));
        let l = Lineage::of(&s, &code(0));
        assert!(l.stopped.contains_key(&12) && !l.stopped.contains_key(&13));
        // what 12 did after its SIGTERM is cleanup, before it is not
        let mut unlink = super::super::testing::ev(Kind::SyscallFailed, 12, 3);
        assert!(l.is_cleanup(&unlink));
        unlink.ts_ns = 2;
        assert!(!l.is_cleanup(&unlink));
    }

    #[test]
    fn a_failure_before_starting_a_program_is_survived() {
        let exec = super::super::testing::exec(11, 3, "conmon");
        let s = span(vec![fork(10, 11, 2), exec, exit(11, 4, Some(0))]);
        let l = Lineage::of(&s, &code(127));
        let mut setrlimit = super::super::testing::ev(Kind::SyscallFailed, 10, 1);
        assert!(l.survived(&setrlimit));
        setrlimit.ts_ns = 5;
        assert!(!l.survived(&setrlimit), "a failure after the last start");
    }
}
