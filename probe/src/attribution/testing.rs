//! Span evidence built by hand for the attribution's unit tests: a root
//! process 10, events at explicit times.

use crate::event::{KernelEvent, Kind};
use crate::spans::SpanEvidence;

use super::grade::Grades;
use super::lineage::Lineage;
use super::{Attribution, attribute};
use super::{Case, ExitStatus, Outcome, Words};
use crate::facts::Host;

pub const MS: u64 = 1_000_000;

/// An event of process `pid` (its only thread), named `w`.
pub fn ev(kind: Kind, pid: u32, ts: u64) -> KernelEvent {
    serde_json::from_value(
        serde_json::json!({"kind": kind, "ts_ns": ts, "pid": pid, "tid": pid, "comm": "w"}),
    )
    .unwrap()
}

/// `ev` with another name.
pub fn named(mut e: KernelEvent, comm: &str) -> KernelEvent {
    e.comm = comm.into();
    e
}

pub fn failed(pid: u32, ts: u64, syscall: &'static str, errno: i32, path: &str) -> KernelEvent {
    let mut e = ev(Kind::SyscallFailed, pid, ts);
    e.syscall = Some(syscall.into());
    e.syscall_nr = Some(crate::syscalls::number(syscall).unwrap());
    e.ret = Some(-(errno as i64));
    e.errno = Some(crate::event::errno_name(errno));
    e.path = (!path.is_empty()).then(|| path.into());
    e
}

/// Process `pid` exits with `code` (None: killed by its signal).
pub fn exit_with(pid: u32, ts: u64, code: Option<i32>) -> KernelEvent {
    let mut e = ev(Kind::Exit, pid, ts);
    e.exit_code = code;
    e
}

pub fn exit(pid: u32, ts: u64, code: i32) -> KernelEvent {
    exit_with(pid, ts, Some(code))
}

/// `parent` starts process `child`.
pub fn fork(parent: u32, child: u32, ts: u64) -> KernelEvent {
    let mut e = ev(Kind::Fork, parent, ts);
    e.child_pid = Some(child);
    e.thread = Some(false);
    e
}

/// `pid` runs /usr/bin/`comm`.
pub fn exec(pid: u32, ts: u64, comm: &str) -> KernelEvent {
    let mut e = named(ev(Kind::Exec, pid, ts), comm);
    e.path = Some(format!("/usr/bin/{comm}"));
    e
}

/// A fatal `sig` generated for `pid` by `sender`, with `si_code`.
pub fn signal_from(pid: u32, ts: u64, sig: &str, sender: (u32, &str), si_code: i32) -> KernelEvent {
    let mut e = ev(Kind::Signal, pid, ts);
    e.signal = Some(sig.into());
    e.si_code = Some(si_code);
    e.sender_pid = Some(sender.0);
    e.sender_comm = Some(sender.1.into());
    e
}

/// The span of `events`, root process 10.
pub fn span(events: Vec<KernelEvent>) -> SpanEvidence {
    let mut s = SpanEvidence::new(1, Some("t-1".into()), "unit".into(), 0);
    s.root_pid = Some(10);
    for e in events {
        s.add(e);
    }
    s
}

pub fn exited(code: i32) -> ExitStatus {
    ExitStatus {
        code: Some(code),
        signal: None,
    }
}

pub fn outcome(code: i32) -> Outcome {
    Outcome {
        exit: exited(code),
        ..Default::default()
    }
}

pub fn killed_by(sig: &str) -> Outcome {
    Outcome {
        exit: ExitStatus {
            code: None,
            signal: Some(sig.into()),
        },
        ..Default::default()
    }
}

/// `outcome(code)` of a workload that said `output`.
pub fn said(code: i32, output: &str) -> Outcome {
    Outcome {
        words: Words {
            command: None,
            output: Some(output.into()),
        },
        ..outcome(code)
    }
}

/// The case the stages judge, for calling one stage directly.
pub fn case<'a>(span: &'a SpanEvidence, outcome: &'a Outcome) -> Case<'a> {
    Case {
        span,
        outcome,
        lineage: Lineage::of(span, &outcome.exit),
        grades: Grades::of(span, &outcome.words),
    }
}

/// A host for tests: these paths exist, its clock reads `now_ms`, no PSI.
pub struct FixedHost {
    pub existing: &'static [&'static str],
    pub now_ms: i64,
}

impl Host for FixedHost {
    fn psi_memory_some_us(&self) -> Option<u64> {
        None
    }
    fn now_ms(&self) -> i64 {
        self.now_ms
    }
    fn path_exists(&self, path: &str) -> bool {
        self.existing.contains(&path)
    }
}

/// `attribute`, after `host` gave the facts at close.
pub fn attribute_on(host: &FixedHost, mut span: SpanEvidence, outcome: &Outcome) -> Attribution {
    crate::facts::capture(&mut span, outcome.exit.signal.as_deref(), host);
    attribute(&span, outcome)
}
