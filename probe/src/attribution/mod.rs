//! Attribution: from a span's evidence and its exit, the one primitive that
//! made it fail, with a confidence and a sentence a person can act on.
//!
//! Layout:
//! - `lineage`: the exit-status path (which process's status the caller
//!   got) and where each fatal signal came from (its own hand, an
//!   ancestor shutting a helper down, the kernel at PID-namespace teardown).
//! - `grade`: every failure graded once: strong (a denial, a hard limit)
//!   or weak (a failed lookup), and for weak ones whether the workload's
//!   words or its command corroborate them. Only strong or corroborated
//!   failures are ever the cause; the others are `noticed`.
//! - `failures`: failure events as evidence, from their grades: a crash's
//!   refusal, a missing command, the strongest among a set, its sentence.
//! - `rank`: the stages of a failed span's verdict, in the order they
//!   outrank each other.
//! - here: the attribution object, a successful span's verdict and its
//!   hidden failure, the events worth showing, hints.
//!
//! Processes that exited 0 handled their own failures; failures that match
//! no rule (ENOTTY, EAGAIN on reads) are never blamed, nor are failed
//! lookups that nothing the workload said or was asked names (a compiler's
//! include search, a message catalog, an optional config file): those are
//! `noticed`.

mod confidence;
mod failures;
#[cfg(test)]
mod golden;
mod grade;
mod lineage;
mod rank;
pub mod steps;
#[cfg(test)]
pub(crate) mod testing;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::{Errno, KernelEvent, Kind};
use crate::primitive::{Layer, Primitive};
use crate::spans::{Drops, Replay, SpanEvidence};

use confidence::{Basis, Level};
use failures::{reported_failure, strongest_failure};
use grade::{Grade, Grades, Role};
use lineage::Lineage;
use rank::failure_verdict;

/// How the span's first process ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// Signal name, when a signal killed it.
    pub signal: Option<String>,
}

impl From<std::process::ExitStatus> for ExitStatus {
    /// A waited-for process's status: its code, or the signal that killed it.
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt as _;
        ExitStatus {
            code: status.code(),
            signal: status.signal().map(crate::event::signal_name),
        }
    }
}

impl ExitStatus {
    pub fn success(&self) -> bool {
        self.code == Some(0) && self.signal.is_none()
    }

    /// The shell convention: the code, or 128 + signal number.
    pub fn shell_code(&self) -> i32 {
        match (&self.code, &self.signal) {
            (Some(c), _) => *c,
            (None, Some(sig)) => {
                128 + sig
                    .parse::<nix::sys::signal::Signal>()
                    .map(|s| s as i32)
                    .unwrap_or(0)
            }
            (None, None) => 1,
        }
    }

    pub fn describe(&self) -> String {
        match (&self.code, &self.signal) {
            (Some(c), _) => format!("exited with status {c}"),
            (None, Some(s)) => format!("was killed by {s}"),
            (None, None) => "ended with an unknown status (its exit was not observed)".to_string(),
        }
    }
}

/// The attribution object of ARCHITECTURE.md (`probe trace --json`,
/// `end_span`, MCP `structuredContent.kernel`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Attribution {
    pub span: u64,
    /// Where the evidence came from: `ebpf` (the probe's programs in the
    /// kernel) or `gvisor` (gVisor's runtime monitoring). Absent in
    /// records made before there was a choice: those are `ebpf`.
    #[serde(default)]
    pub source: crate::spans::Source,
    pub session: Option<String>,
    pub label: String,
    pub exit: ExitStatus,
    pub failed: bool,
    pub primitive: Primitive,
    /// `sandbox`, `test` (no kernel cause), or null when nothing failed.
    pub layer: Option<Layer>,
    pub confidence: f64,
    pub explanation: String,
    /// What to do about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    pub decisive: Option<KernelEvent>,
    /// A span that exited 0 in which a child process failed on a sandbox
    /// primitive (e.g. `find` in `find | wc -l`): the failure the exit
    /// status hid. Never set on failed spans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_failure: Option<HiddenFailure>,
    pub events: Vec<KernelEvent>,
    /// Events seen per kind (before retention).
    pub counts: BTreeMap<String, u64>,
    pub drops: Drops,
    pub duration_ms: f64,
    /// Failed lookups of the failing processes that nothing corroborates
    /// (no word of the workload's output or of its command names the
    /// path): seen, never the cause. At most [`NOTICED_MAX`], latest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub noticed: Vec<String>,
    /// Memory stalls during the span: the span's own reclaim (direct, and
    /// its memory cgroup's at its limit), and the machine-wide PSI `some`
    /// time (where PSI exists).
    #[serde(default)]
    pub memory: MemoryStall,
    /// The sandbox whose client opened the span, when it is not the
    /// daemon's own namespace (a container's bridge on a host daemon):
    /// which one, and which namespace the pids above are numbered in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxView>,
}

/// Whose span this is, and how to read its pids (set by the daemon).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SandboxView {
    /// `pidns:INODE` (a PID namespace other than the daemon's) or
    /// `gvisor:CONTAINER`.
    pub id: String,
    /// `daemon`: the events' pids are the daemon's (the host's), as the
    /// kernel reports them; `sandbox`: the sandbox's own (gVisor).
    pub pids: PidsIn,
    /// The span's first process under both numberings, when the client
    /// named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_pid: Option<RootPid>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PidsIn {
    Daemon,
    Sandbox,
}

/// One process's pid in the daemon's namespace and in the sandbox's.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RootPid {
    pub daemon: u32,
    pub sandbox: u32,
}

impl Attribution {
    /// Whether the span's events explain something worth keeping them
    /// for: it failed, hid a failure behind exit 0, or met memory pressure
    /// of its own (a degraded run). A span that did none of these is a
    /// program that worked: its tolerated lookups explain nothing.
    /// (`store::EXPLAINS_SQL` says the same of a stored row.)
    pub fn explains(&self) -> bool {
        self.failed || self.hidden_failure.is_some() || self.memory.reclaim_ms > 0.0
    }
}

/// See [`Attribution::hidden_failure`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HiddenFailure {
    pub primitive: Primitive,
    pub confidence: f64,
    pub explanation: String,
    /// The event it names, when one does (what an environment difference
    /// is tied to: its path, its syscall).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decisive: Option<KernelEvent>,
}

/// Memory-pressure figures of a span.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MemoryStall {
    pub reclaim_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi_some_ms: Option<f64>,
}

/// What the caller knows beyond the kernel's evidence.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub exit: ExitStatus,
    /// The caller killed the workload on its deadline.
    pub timed_out: Option<std::time::Duration>,
    pub duration_ns: u64,
    /// Put every retained event in `events`, not just the evidence.
    pub all_events: bool,
    /// The workload's own words: what corroborates a failed lookup.
    pub words: Words,
}

/// What the workload was asked and what it said, as far as the caller
/// knows: the witnesses a weak failure needs ([`grade`]). Each is cut to
/// its [`Words::MAX`] bytes (the output's tail, the command's head).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Words {
    /// The command line or script the workload was asked to run, or a
    /// tool call's arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its output (stderr, and stdout where the caller has it), or the
    /// text of the tool's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl Words {
    /// Bytes kept of each.
    pub const MAX: usize = 32 * 1024;

    /// `command` and `output`, cut to size: errors come last, so the
    /// output's tail is kept, and the command's head.
    pub fn new(command: Option<String>, output: Option<&[u8]>) -> Words {
        Words {
            command: command.map(|c| head(&c, Words::MAX).to_string()),
            output: output.map(|o| {
                let tail = &o[o.len().saturating_sub(Words::MAX)..];
                String::from_utf8_lossy(tail).into_owned()
            }),
        }
    }

    /// Cut to size, as [`Words::new`] does (for words taken from a client).
    pub fn bounded(self) -> Words {
        Words {
            command: self.command.map(|c| head(&c, Words::MAX).to_string()),
            output: self.output.map(|o| tail(&o, Words::MAX).to_string()),
        }
    }
}

/// The first `max` bytes of `s`, on a character boundary.
fn head(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The last `max` bytes of `s`, on a character boundary.
fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// What the stages judge: the span, what the caller knows, whose status
/// went to whom, and every failure's grade (computed once).
pub(crate) struct Case<'a> {
    pub span: &'a SpanEvidence,
    pub outcome: &'a Outcome,
    pub lineage: Lineage,
    pub grades: Grades,
}

/// Most noticed lines an attribution carries.
pub const NOTICED_MAX: usize = 3;

/// One decision: primitive, level and confidence, sentence, decisive
/// event.
struct Verdict {
    primitive: Primitive,
    /// What ranking compares ([`confidence::Level`]).
    level: Level,
    /// From [`confidence::confidence`], scaled at most by one of its
    /// factors; orders verdicts within what a stage accepts.
    confidence: f64,
    explanation: String,
    decisive: Option<KernelEvent>,
}

impl Verdict {
    /// A verdict resting on `basis`.
    fn new(
        primitive: Primitive,
        basis: Basis,
        explanation: String,
        decisive: Option<KernelEvent>,
    ) -> Verdict {
        Verdict {
            primitive,
            level: confidence::level(basis),
            confidence: confidence::confidence(basis),
            explanation,
            decisive,
        }
    }

    /// A verdict that is one failure's grade.
    fn of_grade(grade: &Grade, explanation: String, decisive: KernelEvent) -> Verdict {
        Verdict {
            primitive: grade.primitive,
            level: grade.level,
            confidence: grade.weight(),
            explanation,
            decisive: Some(decisive),
        }
    }

    /// Less sure by `factor` (one of [`confidence`]'s).
    fn scaled(self, factor: f64) -> Verdict {
        Verdict {
            confidence: self.confidence * factor,
            ..self
        }
    }
}

/// Attributes a finished span.
pub fn attribute(span: &SpanEvidence, outcome: &Outcome) -> Attribution {
    let failed = !outcome.exit.success() || outcome.timed_out.is_some();
    let case = Case {
        span,
        outcome,
        lineage: Lineage::of(span, &outcome.exit),
        grades: Grades::of(span, &outcome.words),
    };
    let memory_death = (!failed).then(|| memory_death(span, outcome)).flatten();
    let verdict = if failed {
        failure_verdict(&case)
    } else {
        success_verdict(span, memory_death.as_ref())
    };
    let noticed = if failed {
        noticed(&case, verdict.decisive.as_ref())
    } else {
        Vec::new()
    };
    let mut verdict = verdict;
    if let Some(note) = uring_seccomp_note(span) {
        verdict.explanation = format!("{}; {note}", verdict.explanation);
    }
    if let Some(note) = blind_spot_note(span, failed, verdict.primitive) {
        verdict.explanation = format!("{}; {note}", verdict.explanation);
    }
    let layer = failed.then(|| verdict.primitive.layer());
    let hidden_failure = if failed {
        None
    } else {
        memory_death.or_else(|| hidden_failure(&case))
    };
    let events = if outcome.all_events {
        span.events.iter().cloned().collect()
    } else {
        evidence_events(&case, verdict.decisive.as_ref())
    };
    Attribution {
        span: span.id,
        source: span.source,
        session: span.session.clone(),
        label: span.label.clone(),
        exit: outcome.exit.clone(),
        failed,
        primitive: verdict.primitive,
        layer,
        confidence: (verdict.confidence * 100.0).round() / 100.0,
        explanation: verdict.explanation,
        hint: failed
            .then(|| hint(verdict.primitive).to_string())
            .filter(|h| !h.is_empty()),
        decisive: verdict.decisive,
        hidden_failure,
        noticed,
        events,
        counts: span
            .counts
            .iter()
            .map(|(k, v)| (k.id().to_string(), *v))
            .collect(),
        drops: span.drops,
        duration_ms: outcome.duration_ns as f64 / 1e6,
        memory: MemoryStall {
            reclaim_ms: span.reclaim_ns as f64 / 1e6,
            psi_some_ms: span
                .psi_some_us_at_start
                .zip(span.closing.psi_some_us)
                .map(|(a, b)| b.saturating_sub(a) as f64 / 1e3),
        },
        sandbox: None,
    }
}

/// A stored span attributed again from its stored events and what
/// [`Replay`] kept of its close: the verdict it gets today.
pub fn reattribute(stored: &Attribution, replay: &Replay) -> Attribution {
    let span = SpanEvidence::rebuild(
        stored.span,
        stored.session.clone(),
        stored.label.clone(),
        replay,
        stored.events.iter().cloned(),
    );
    let outcome = Outcome {
        exit: stored.exit.clone(),
        timed_out: replay.timed_out_ms.map(std::time::Duration::from_millis),
        duration_ns: replay.duration_ns,
        all_events: false,
        words: replay.words.clone(),
    };
    let mut again = attribute(&span, &outcome);
    again.sandbox = stored.sandbox.clone();
    again
}

/// What a verdict is, to compare a stored one with a replayed one: not the
/// events shown, the counts or the timings.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VerdictView {
    pub failed: bool,
    pub primitive: Primitive,
    pub layer: Option<Layer>,
    pub confidence: f64,
    pub explanation: String,
    pub hint: Option<String>,
    pub decisive: Option<KernelEvent>,
    pub hidden_failure: Option<HiddenFailure>,
    pub noticed: Vec<String>,
}

impl From<&Attribution> for VerdictView {
    fn from(a: &Attribution) -> VerdictView {
        VerdictView {
            failed: a.failed,
            primitive: a.primitive,
            layer: a.layer,
            confidence: a.confidence,
            explanation: a.explanation.clone(),
            hint: a.hint.clone(),
            decisive: a.decisive.clone(),
            hidden_failure: a.hidden_failure.clone(),
            noticed: a.noticed.clone(),
        }
    }
}

/// When a task under a seccomp filter used io_uring: the filter never sees
/// io_uring operations, so a syscall the profile denies can still be done
/// that way. Platform teams need to hear it whether or not it made the
/// workload fail; strongest when the same syscall was denied and then done.
fn uring_seccomp_note(span: &SpanEvidence) -> Option<String> {
    let unfiltered: Vec<&KernelEvent> = span
        .events
        .iter()
        .filter(|e| {
            e.kind == Kind::UringUnderSeccomp
                || (e.kind == Kind::UringFailed && e.seccomp_filter == Some(true))
        })
        .collect();
    if unfiltered.is_empty() {
        return None;
    }
    let denied_then_done = unfiltered.iter().find(|u| {
        u.kind == Kind::UringUnderSeccomp
            && span.events.iter().any(|d| {
                d.kind == Kind::SeccompDenied && d.pid == u.pid && d.syscall_nr == u.syscall_nr
            })
    });
    if let Some(u) = denied_then_done {
        return Some(format!(
            "io_uring bypassed the seccomp filter: {} was denied as a syscall, but {} ran \
             (seccomp does not see io_uring operations; deny io_uring_setup in the profile \
             or set kernel.io_uring_disabled)",
            u.syscall.as_deref().unwrap_or("the syscall"),
            u.call()
        ));
    }
    let mut calls: Vec<String> = unfiltered.iter().map(|e| e.call()).collect();
    calls.dedup();
    let more = calls.len().saturating_sub(3);
    calls.truncate(3);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Some(format!(
        "io_uring ran {}{more} under the task's seccomp filter, which does not see io_uring \
         operations: a syscall the profile denies can still be done that way",
        calls.join(", ")
    ))
}

/// A failure the successful status hid: in a child that exited non-zero
/// (`find` in `find | wc -l`), or one a process that exited 0 reported
/// rather than failed on ([`reported_failure`]). The root that exited 0
/// coped with its own failures, except losing state an earlier call wrote:
/// that is never the workload's intent. Not on the path that produced the
/// result, so nobody's hidden failure: helpers stopped by whoever started
/// them (a runtime's relays, killed at its exit), and checks whose failure
/// their parent looked at before going on to start another program (when
/// the failure was a weak one), and failures their process got past by
/// going on to start the workload (systemd-nspawn's EROFS while it sets up
/// a read-only root).
fn hidden_failure(case: &Case) -> Option<HiddenFailure> {
    let (span, lineage) = (case.span, &case.lineage);
    let strongest = strongest_failure(case, |ev, grade| {
        let primitive = grade.primitive;
        let failing = span.processes.get(&ev.pid).is_some_and(|p| p.failed());
        let root = Some(ev.pid) == span.root_pid;
        let eligible = if root {
            primitive == Primitive::FsPersistence
        } else {
            failing || reported_failure(ev, primitive)
        };
        // a check's weak failure (a search for an optional file) was the
        // check's answer; a denial or a hard limit is worth hearing anyway
        let coped_with = lineage.coped.contains(&ev.pid) && grade.level < Level::Hard;
        eligible && !lineage.stopped.contains_key(&ev.pid) && !coped_with && !lineage.survived(ev)
    });
    // a child that could not find its command, as the words say
    // (`no-such-tool --version; true`): weak evidence as any lookup, named
    // only where the call's words name it, on a hidden failure as on a
    // failing exit
    let missing = failures::command_not_found(
        span,
        case.outcome,
        |ev| {
            lineage.survived(ev)
                || lineage.coped.contains(&ev.pid)
                || lineage.stopped.contains_key(&ev.pid)
        },
        true,
    );
    let v = match (strongest, missing) {
        (Some(s), Some(m)) if m.confidence > s.confidence => m,
        (s, m) => s.or(m)?,
    };
    Some(HiddenFailure {
        primitive: v.primitive,
        confidence: (v.confidence * 100.0).round() / 100.0,
        explanation: v.explanation,
        decisive: v.decisive,
    })
}

/// The OOM killer took a process of a span that exited 0 (a browser's
/// renderer: the tab is gone, the browser lives on), or the span stalled a
/// fifth of its time or more in memory reclaim. Never "nothing failed":
/// the caller decides from its result whether the call failed or is
/// degraded; this says why.
fn memory_death(span: &SpanEvidence, outcome: &Outcome) -> Option<HiddenFailure> {
    let reclaim_ms = span.reclaim_ns as f64 / 1e6;
    let reclaim = if reclaim_ms >= 1.0 {
        format!(", after {reclaim_ms:.0} ms of memory reclaim")
    } else {
        String::new()
    };
    if let Some(oom) = span.events.iter().find(|e| e.kind == Kind::OomVictim) {
        let more = span
            .events
            .iter()
            .filter(|e| e.kind == Kind::OomVictim)
            .count()
            - 1;
        let more = match more {
            0 => String::new(),
            n => format!(" ({n} more process(es) of the span were OOM-killed too)"),
        };
        return Some(HiddenFailure {
            primitive: Primitive::MemOom,
            confidence: confidence::confidence(Basis::HiddenOom),
            explanation: format!("{}{reclaim}{more}", rank::oom_sentence(oom)),
            decisive: Some(oom.clone()),
        });
    }
    let duration = outcome.duration_ns.max(1);
    (span.reclaim_ns * 5 > duration && reclaim_ms >= rank::RECLAIM_MIN_MS).then(|| HiddenFailure {
        primitive: Primitive::MemPressure,
        confidence: confidence::confidence(Basis::HiddenPressure),
        explanation: format!(
            "it stalled {reclaim_ms:.0} ms ({:.0}% of its time) in memory reclaim",
            span.reclaim_ns as f64 * 100.0 / duration as f64
        ),
        decisive: None,
    })
}

fn success_verdict(span: &SpanEvidence, memory_death: Option<&HiddenFailure>) -> Verdict {
    if let Some(death) = memory_death {
        return Verdict::new(
            Primitive::None,
            Basis::SuccessAfterDeath,
            format!("exited 0, but {}", death.explanation),
            span.events
                .iter()
                .find(|e| e.kind == Kind::OomVictim)
                .cloned(),
        );
    }
    let denied = span
        .events
        .iter()
        .filter(|e| e.kind == Kind::SeccompDenied && e.seccomp_filter == Some(true))
        .count();
    let explanation = if denied > 0 {
        format!(
            "exited 0; {denied} syscall(s) were denied by seccomp along the way and the workload coped"
        )
    } else {
        "exited 0; nothing failed".to_string()
    };
    Verdict::new(Primitive::None, Basis::Success, explanation, None)
}

/// The events worth showing without `--events`: the decisive one, other
/// scored failures of failing processes, signals, OOM, seccomp denials and
/// failing exits. Repeats of the same call are shown once.
fn evidence_events(case: &Case, decisive: Option<&KernelEvent>) -> Vec<KernelEvent> {
    const MAX: usize = 30;
    let span = case.span;
    let events = &span.events;
    let failing = |pid: u32| {
        Some(pid) == span.root_pid || span.processes.get(&pid).is_some_and(|p| p.failed())
    };
    let mut out: Vec<KernelEvent> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let keep = match e.kind {
            Kind::SeccompDenied | Kind::Signal | Kind::OomVictim | Kind::UringUnderSeccomp => true,
            Kind::Exit => Some(e.pid) == span.root_pid || e.exit_code.is_none(),
            Kind::SyscallFailed | Kind::UringFailed => {
                // weak ones too, corroborated or not: shown, not blamed
                failing(e.pid) && case.grades.get(i).is_some_and(|g| g.role != Role::Probe)
            }
            _ => false,
        };
        let repeat = out.last().is_some_and(|l: &KernelEvent| {
            l.kind == e.kind
                && l.pid == e.pid
                && l.syscall == e.syscall
                && l.path == e.path
                && l.errno == e.errno
        });
        if keep && !repeat {
            out.push(e.clone());
        }
    }
    if out.len() > MAX {
        out.drain(..out.len() - MAX);
    }
    if let Some(d) = decisive
        && !out.contains(d)
    {
        out.push(d.clone());
    }
    out
}

/// The failing processes' failed lookups that nothing corroborated (see
/// [`grade`]), the latest [`NOTICED_MAX`] distinct paths, as sentences: a
/// user still sees them, never as the cause. Not what a process got past
/// by going on to start another program, nor cleanup.
fn noticed(case: &Case, decisive: Option<&KernelEvent>) -> Vec<String> {
    let span = case.span;
    let failing = |pid: u32| {
        Some(pid) == span.root_pid
            || case.lineage.leaf() == Some(pid)
            || span.processes.get(&pid).is_some_and(|p| p.failed())
    };
    let mut seen = std::collections::HashSet::new();
    let mut lines: Vec<String> = span
        .events
        .iter()
        .enumerate()
        .rev()
        .filter(|(i, e)| {
            case.grades.uncorroborated(*i)
                && failing(e.pid)
                && !case.lineage.survived(e)
                && !case.lineage.is_cleanup(e)
                && Some(*e) != decisive
        })
        .filter_map(|(_, e)| {
            let path = e.path.as_deref()?;
            seen.insert(path).then(|| {
                let what = if e.errno_is(Errno::EACCES) || e.errno_is(Errno::EPERM) {
                    "could not be read"
                } else {
                    "was missing"
                };
                format!(
                    "`{path}` {what} ({} {} in {} (pid {})); nothing the workload said or was \
                     asked names it, so it is not taken for the cause",
                    e.syscall.as_deref().unwrap_or("a syscall"),
                    e.errno.as_deref().unwrap_or("?"),
                    e.comm,
                    e.pid
                )
            })
        })
        .take(NOTICED_MAX)
        .collect();
    lines.reverse();
    lines
}

/// Under gVisor, what its points cannot show, said where it matters
/// rather than guessed: a seccomp kill leaves only the exit by SIGSYS, and
/// a failure with no kernel cause may hide a denial gVisor sends no point
/// for.
fn blind_spot_note(
    span: &SpanEvidence,
    failed: bool,
    primitive: Primitive,
) -> Option<&'static str> {
    let sight = span.source.sight();
    match primitive {
        _ if !failed => None,
        Primitive::Seccomp => sight.seccomp_kill,
        Primitive::MemOom => sight.oom_kill,
        Primitive::None => sight.blind_spots,
        _ => None,
    }
}

/// What to do about a primitive.
pub fn hint(p: Primitive) -> &'static str {
    match p {
        Primitive::Seccomp => {
            "allow the syscall in the sandbox's seccomp profile, or avoid it in the workload"
        }
        Primitive::FsPermission => {
            "write where the workload's user owns the directory, or fix the owner/mode"
        }
        Primitive::FsReadonly => {
            "write to a writable mount (a tmpfs or volume), or mount this one read-write"
        }
        Primitive::FsNoexec => {
            "run the program from a mount without noexec, or run it through its interpreter"
        }
        Primitive::FsSpace => "free space, or give the sandbox a larger disk/tmpfs/quota",
        Primitive::FsPersistence => {
            "write to a path that persists across calls (same mount namespace and host)"
        }
        Primitive::FsMissing => "create the file first, or fix the path the workload expects",
        Primitive::ExecMissing => "install the program in the sandbox image, or put it on PATH",
        Primitive::ProcLimit => {
            "raise the pids cgroup limit / RLIMIT_NPROC / RLIMIT_NOFILE, or use fewer processes"
        }
        Primitive::MemOom => {
            "raise the memory limit of the sandbox, or make the workload use less memory"
        }
        Primitive::MemLimit => "raise RLIMIT_AS or the overcommit setting, or allocate less",
        Primitive::MemPressure => "give the sandbox more memory headroom",
        Primitive::NetEgress => "allow this destination in the sandbox's egress rules, or route it",
        Primitive::Caps => {
            "grant the capability to the sandbox, or do without the privileged operation"
        }
        Primitive::SandboxKernel => {
            "avoid the call or the flag in the workload (or a newer gVisor that has it), or run this workload in a container or microVM"
        }
        Primitive::Signal => "find who sent the signal, or debug the crash",
        Primitive::Timeout => "raise the time limit, or make the workload faster",
        Primitive::None => "",
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{MS, ev, exit, failed, killed_by, outcome, said, signal_from, span};
    use super::*;
    use crate::primitive::SYMPTOM_WINDOW_NS;

    /// An io_uring twin of `failed`: the same syscall, done by a request.
    fn uring(kind: Kind, pid: u32, ts: u64, errno: i32, path: &str) -> KernelEvent {
        let mut e = failed(pid, ts, "openat", errno, path);
        e.kind = kind;
        if errno == 0 {
            (e.ret, e.errno) = (Some(3), None);
        }
        e.io_uring_op = Some("IORING_OP_OPENAT".into());
        e.seccomp_filter = Some(true);
        e
    }

    #[test]
    fn a_failed_io_uring_open_is_judged_like_the_syscall_and_says_io_uring() {
        let events = vec![
            uring(Kind::UringFailed, 10, 5, libc::EROFS, "/ro/out"),
            exit(10, 9, 1),
        ];
        let mut a = attribute(&span(events.clone()), &outcome(1));
        assert_eq!(a.primitive, Primitive::FsReadonly, "{}", a.explanation);
        assert!(
            a.explanation
                .starts_with("io_uring openat(\"/ro/out\") failed with EROFS")
        );
        // under a filter, the note says seccomp never saw it
        assert!(
            a.explanation.contains("under the task's seccomp filter"),
            "{}",
            a.explanation
        );
        // its syscall twin classifies the same, without the notes
        let mut plain = events;
        plain[0].kind = Kind::SyscallFailed;
        plain[0].seccomp_filter = None;
        a = attribute(&span(plain), &outcome(1));
        assert_eq!(a.primitive, Primitive::FsReadonly);
        assert!(!a.explanation.contains("io_uring"), "{}", a.explanation);
    }

    #[test]
    fn a_syscall_denied_then_done_through_io_uring_is_a_bypass() {
        let mut denied = failed(10, 1, "openat", libc::EPERM, "/etc/secret");
        denied.kind = Kind::SeccompDenied;
        denied.seccomp_filter = Some(true);
        let done = uring(Kind::UringUnderSeccomp, 10, 2, 0, "/etc/secret");
        let a = attribute(&span(vec![denied, done, exit(10, 3, 0)]), &outcome(0));
        assert_eq!(a.primitive, Primitive::None);
        assert!(
            a.explanation.contains(
                "io_uring bypassed the seccomp filter: openat was denied as a syscall, \
                 but io_uring openat(\"/etc/secret\") ran"
            ),
            "{}",
            a.explanation
        );
        assert!(a.events.iter().any(|e| e.kind == Kind::UringUnderSeccomp));
    }

    /// What python3 start-up looks like: module and library searches.
    fn python_noise(pid: u32) -> Vec<KernelEvent> {
        vec![
            failed(
                pid,
                1,
                "newfstatat",
                libc::ENOENT,
                "/usr/lib/x86_64-linux-gnu/tls/haswell",
            ),
            failed(
                pid,
                2,
                "openat",
                libc::ENOENT,
                "/usr/local/bin/python3._pth",
            ),
            failed(
                pid,
                3,
                "newfstatat",
                libc::ENOENT,
                "/usr/local/lib/python311.zip",
            ),
            failed(
                pid,
                4,
                "openat",
                libc::ENOENT,
                "/usr/local/lib/python3.11/encodings/__pycache__/x.pyc",
            ),
            failed(
                pid,
                5,
                "newfstatat",
                libc::ENOENT,
                "/root/.local/lib/python3.11/site-packages",
            ),
            failed(pid, 6, "ioctl", libc::ENOTTY, "/dev/null"),
        ]
    }

    #[test]
    fn benign_noise_with_exit_0_is_none_without_layer() {
        let mut events = python_noise(10);
        events.push(exit(10, 9, 0));
        let a = attribute(&span(events), &outcome(0));
        assert_eq!(a.primitive, Primitive::None);
        assert_eq!(a.layer, None);
        assert!(!a.failed);
    }

    #[test]
    fn benign_noise_with_exit_3_is_none_in_test_layer() {
        let mut events = python_noise(10);
        events.push(exit(10, 9, 3));
        let a = attribute(&span(events), &outcome(3));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        assert_eq!(a.layer, Some(Layer::Test));
        assert!(a.decisive.is_none());
    }

    #[test]
    fn missing_data_file_after_noise_is_fs_missing() {
        let mut events = python_noise(10);
        events.push(failed(10, 8, "openat", libc::ENOENT, "/data/in.csv"));
        events.push(exit(10, 9, 1));
        let a = attribute(
            &span(events),
            &said(
                1,
                "FileNotFoundError: [Errno 2] No such file or directory: '/data/in.csv'",
            ),
        );
        assert_eq!(a.primitive, Primitive::FsMissing);
        assert_eq!(a.decisive.unwrap().path.as_deref(), Some("/data/in.csv"));
    }

    #[test]
    fn seccomp_denial_outranks_later_weaker_failures() {
        let mut denied = ev(Kind::SeccompDenied, 10, 5);
        denied.syscall = Some("mkdir".into());
        denied.syscall_nr = Some(83);
        denied.ret = Some(-1);
        denied.errno = Some("EPERM".into());
        denied.path = Some("/tmp/out".into());
        denied.seccomp_filter = Some(true);
        let events = vec![
            denied,
            failed(10, 6, "openat", libc::ENOENT, "/tmp/out/x"),
            exit(10, 9, 1),
        ];
        let a = attribute(&span(events), &outcome(1));
        assert_eq!(a.primitive, Primitive::Seccomp);
        assert_eq!(
            a.explanation,
            "mkdir(\"/tmp/out\") was denied by the seccomp filter (EPERM; the syscall never ran) in w (pid 10)"
        );
    }

    #[test]
    fn a_child_failure_hidden_by_a_pipeline_is_reported_but_not_blamed() {
        // `find GONE | wc -l`: find exits 1 on EROFS, the span exits 0
        let events = vec![
            failed(11, 1, "mkdir", libc::EROFS, "/ro/x"),
            exit(11, 2, 1),
            exit(10, 3, 0),
        ];
        let a = attribute(&span(events), &outcome(0));
        assert!(!a.failed);
        assert_eq!(a.primitive, Primitive::None);
        let h = a.hidden_failure.expect("the child's failure is reported");
        assert_eq!(h.primitive, Primitive::FsReadonly);
        assert!(h.explanation.contains("w (pid 11)"), "{}", h.explanation);
        // the root's own coped-with failures are not hidden failures…
        let events = vec![failed(10, 1, "mkdir", libc::EROFS, "/ro/x"), exit(10, 3, 0)];
        assert_eq!(attribute(&span(events), &outcome(0)).hidden_failure, None);
        // …except state an earlier call wrote being gone
        let earlier = crate::event::WrittenEarlier {
            span: 1,
            pid: 9,
            comm: "w".into(),
            syscall: "openat".into(),
            at_ms: 0,
            mount_ns: None,
            path: Some("/tmp/work".into()),
        };
        let mut gone = failed(10, 1, "newfstatat", libc::ENOENT, "/tmp/work");
        gone.written_earlier = Some(earlier.clone());
        let a = attribute(&span(vec![gone.clone(), exit(10, 3, 0)]), &outcome(0));
        assert_eq!(
            a.hidden_failure.map(|h| h.primitive),
            Some(Primitive::FsPersistence)
        );
        // …unless the call made it again itself: a check before creating
        // (a linker's output the last failed link removed)
        let mut made = ev(Kind::FileWrite, 10, 2);
        made.path = Some("/tmp/work/cache.pyc".into());
        let a = attribute(&span(vec![gone.clone(), made, exit(10, 3, 0)]), &outcome(0));
        assert_eq!(a.hidden_failure, None, "{a:?}");
        // a file never written, in a directory an earlier call made and
        // this one wrote into again (python's .pyc beside its temp file):
        // the directory persisted
        let mut pyc = failed(10, 1, "openat", libc::ENOENT, "/tmp/work/t.pyc");
        pyc.written_earlier = Some(earlier.clone());
        let mut beside = ev(Kind::FileWrite, 10, 2);
        beside.path = Some("/tmp/work/t.pyc.140221".into());
        let a = attribute(
            &span(vec![pyc.clone(), beside, exit(10, 3, 0)]),
            &outcome(0),
        );
        assert_eq!(a.hidden_failure, None, "{a:?}");
        let a = attribute(&span(vec![pyc, exit(10, 3, 0)]), &outcome(0));
        assert_eq!(
            a.hidden_failure.map(|h| h.primitive),
            Some(Primitive::FsPersistence)
        );
        // …but a call that creates failing with ENOENT says a directory
        // above is gone: made again after, it was still lost (a per-call
        // tmpfs; `mkdir -p` of the session's directory)
        let mut lost = failed(10, 1, "mkdir", libc::ENOENT, "/tmp/work");
        lost.written_earlier = Some(earlier);
        let mut again = ev(Kind::FileWrite, 10, 2);
        again.path = Some("/tmp/work".into());
        let a = attribute(&span(vec![lost, again, exit(10, 3, 0)]), &outcome(0));
        assert_eq!(
            a.hidden_failure.map(|h| h.primitive),
            Some(Primitive::FsPersistence)
        );
    }

    #[test]
    fn failures_of_processes_that_exited_0_are_not_blamed() {
        // a child hit EROFS but coped; the root failed for its own reasons
        let events = vec![
            failed(11, 1, "openat", libc::EROFS, "/ro/cache"),
            exit(11, 2, 0),
            exit(10, 3, 2),
        ];
        let a = attribute(&span(events), &outcome(2));
        assert_eq!(a.primitive, Primitive::None);
    }

    #[test]
    fn path_search_then_exec_is_not_exec_missing() {
        let mut exec = ev(Kind::Exec, 10, 3);
        exec.path = Some("/usr/bin/tool".into());
        let events = vec![
            failed(10, 1, "execve", libc::ENOENT, "/usr/local/bin/tool"),
            exec,
            failed(10, 4, "openat", libc::EACCES, "/etc/shadow"),
            exit(10, 5, 1),
        ];
        let a = attribute(
            &span(events),
            &said(1, "tool: /etc/shadow: Permission denied"),
        );
        assert_eq!(a.primitive, Primitive::FsPermission);
    }

    #[test]
    fn execve_eacces_on_noexec_mount_from_span_mount_event() {
        let mut mount = ev(Kind::Mount, 10, 1);
        mount.path = Some("/scratch".into());
        mount.flags = Some(libc::MS_NOEXEC);
        let events = vec![
            mount,
            failed(10, 2, "execve", libc::EACCES, "/scratch/tool"),
            exit(10, 3, 126),
        ];
        let a = attribute(&span(events), &outcome(126));
        assert_eq!(a.primitive, Primitive::FsNoexec);
    }

    #[test]
    fn oom_victim_wins_and_names_rss() {
        let mut oom = ev(Kind::OomVictim, 10, 4);
        oom.comm = "python3".into();
        oom.anon_rss_kb = Some(512 * 1024);
        let events = vec![failed(10, 1, "openat", libc::ENOENT, "/data/x"), oom];
        let o = Outcome {
            exit: ExitStatus {
                code: None,
                signal: Some("SIGKILL".into()),
            },
            ..Default::default()
        };
        let a = attribute(&span(events), &o);
        assert_eq!(a.primitive, Primitive::MemOom);
        assert_eq!(
            a.explanation,
            "python3 (pid 10) was killed by the OOM killer at 512 MiB anon RSS"
        );
        assert_eq!(a.exit.shell_code(), 137);
    }

    #[test]
    fn a_tab_the_oom_killer_took_inside_a_call_that_exited_0_is_never_nothing_failed() {
        // the browser lives on and exits 0; its renderer did not
        let mut oom = ev(Kind::OomVictim, 12, 5 * MS);
        oom.comm = "chromium".into();
        oom.anon_rss_kb = Some(300 * 1024);
        oom.cgroup = Some("/agent-bridge/call-7".into());
        oom.memory_max_kb = Some(512 * 1024);
        let mut s = span(vec![oom, exit(10, 9 * MS, 0)]);
        s.reclaim_ns = 640 * MS;
        let o = Outcome {
            duration_ns: 2000 * MS,
            ..outcome(0)
        };
        let a = attribute(&s, &o);
        assert!(!a.failed);
        assert_eq!(a.primitive, Primitive::None);
        let hidden = a
            .hidden_failure
            .expect("the OOM kill is the hidden failure");
        assert_eq!(hidden.primitive, Primitive::MemOom);
        assert_eq!(
            hidden.explanation,
            "chromium (pid 12) was killed by the OOM killer at 300 MiB anon RSS in cgroup \
             /agent-bridge/call-7 (memory limit 512 MiB), after 640 ms of memory reclaim"
        );
        assert!(
            a.explanation.starts_with("exited 0, but chromium (pid 12)"),
            "{}",
            a.explanation
        );
        assert_eq!(a.decisive.map(|d| d.kind), Some(Kind::OomVictim));
        // heavy reclaim alone: mem.pressure; a little: nothing
        let mut s = span(vec![exit(10, 9 * MS, 0)]);
        s.reclaim_ns = 600 * MS;
        let hidden = attribute(&s, &o)
            .hidden_failure
            .expect("reclaim is the hidden failure");
        assert_eq!(hidden.primitive, Primitive::MemPressure);
        assert!(
            hidden.explanation.contains("600 ms (30% of its time)"),
            "{}",
            hidden.explanation
        );
        s.reclaim_ns = 30 * MS;
        assert_eq!(attribute(&s, &o).hidden_failure, None);
    }

    #[test]
    fn timeout_is_reported_as_timeout() {
        let o = Outcome {
            exit: ExitStatus {
                code: None,
                signal: Some("SIGKILL".into()),
            },
            timed_out: Some(std::time::Duration::from_secs(2)),
            ..Default::default()
        };
        let a = attribute(&span(vec![]), &o);
        assert_eq!(a.primitive, Primitive::Timeout);
        assert_eq!(a.layer, Some(Layer::Sandbox));
        // a renderer the OOM killer took, then a hang until the deadline: OOM
        let mut oom = ev(Kind::OomVictim, 12, 5 * MS);
        oom.comm = "chromium".into();
        oom.anon_rss_kb = Some(300 * 1024);
        let a = attribute(&span(vec![oom]), &o);
        assert_eq!(a.primitive, Primitive::MemOom, "{}", a.explanation);
        assert_eq!(
            a.explanation,
            "chromium (pid 12) was killed by the OOM killer at 300 MiB anon RSS; the workload then hung until the time limit of 2.0s killed it"
        );
    }

    /// A fatal `sig` generated for thread `tid` by process `sender`.
    fn signal(tid: u32, ts: u64, sig: &str, sender: u32) -> KernelEvent {
        signal_from(tid, ts, sig, (sender, "w"), 0)
    }

    /// Thread `tid` of process `pid` starts (a clone with CLONE_THREAD).
    fn thread(pid: u32, tid: u32, ts: u64) -> KernelEvent {
        let mut e = ev(Kind::Fork, pid, ts);
        e.child_pid = Some(tid);
        e.thread = Some(true);
        e
    }

    #[test]
    fn enomem_then_its_own_sigtrap_is_mem_limit_naming_both() {
        // Chromium under RLIMIT_AS: mmap fails ×4 in one thread (one event
        // and three repeats counted in the kernel), another thread traps
        let mut refused = failed(10, 20 * MS, "mmap", libc::ENOMEM, "");
        refused.tid = 12;
        refused.repeats = Some(3);
        let mut died = ev(Kind::Exit, 10, 31 * MS);
        died.comm = "chromium".into();
        let events = vec![
            thread(10, 12, MS),
            thread(10, 13, 2 * MS),
            refused,
            signal(13, 30 * MS, "SIGTRAP", 10),
            died,
        ];
        let a = attribute(&span(events), &killed_by("SIGTRAP"));
        assert_eq!(a.primitive, Primitive::MemLimit, "{}", a.explanation);
        assert_eq!(
            a.explanation,
            "mmap failed with ENOMEM ×4 (RLIMIT_AS or overcommit), then chromium (pid 10) aborted with SIGTRAP"
        );
        assert_eq!(a.confidence, 0.9);
        let d = a.decisive.expect("the last refusal is decisive");
        assert_eq!((d.kind, d.tid), (Kind::SyscallFailed, 12));
        assert_eq!(a.layer, Some(Layer::Sandbox));
    }

    #[test]
    fn eagain_on_clone_then_its_own_sigabrt_is_proc_limit() {
        let events = vec![
            failed(10, 5 * MS, "mmap", libc::ENOMEM, ""),
            failed(10, 10 * MS, "clone", libc::EAGAIN, ""),
            signal(10, 11 * MS, "SIGABRT", 10),
            ev(Kind::Exit, 10, 12 * MS),
        ];
        let a = attribute(&span(events), &killed_by("SIGABRT"));
        assert_eq!(a.primitive, Primitive::ProcLimit, "{}", a.explanation);
        assert_eq!(a.decisive.unwrap().syscall.as_deref(), Some("clone"));
        assert_eq!(
            a.explanation,
            "clone failed with EAGAIN (pids cgroup or RLIMIT_NPROC), after 1 other refused resource request, then w (pid 10) aborted with SIGABRT"
        );
    }

    #[test]
    fn a_seccomp_denial_then_its_own_sigtrap_is_seccomp() {
        let mut denied = failed(10, 5 * MS, "memfd_create", libc::EPERM, "");
        denied.kind = Kind::SeccompDenied;
        denied.seccomp_filter = Some(true);
        let events = vec![
            denied,
            signal(10, 6 * MS, "SIGTRAP", 10),
            ev(Kind::Exit, 10, 7 * MS),
        ];
        let a = attribute(&span(events), &killed_by("SIGTRAP"));
        assert_eq!(a.primitive, Primitive::Seccomp, "{}", a.explanation);
        assert!(
            a.explanation.starts_with("memfd_create")
                && a.explanation
                    .contains("denied by the seccomp filter (EPERM")
                && a.explanation.ends_with("aborted with SIGTRAP"),
            "{}",
            a.explanation
        );
    }

    #[test]
    fn a_refused_connection_a_live_helper_reported_is_why_a_servers_call_failed() {
        // a browser MCP server's navigation: the tool call is an error, the
        // server (10) and Chromium's network service (11) live on, and the
        // service's connect was refused (learnt by SO_ERROR)
        let mut fork = ev(Kind::Fork, 10, 0);
        fork.child_pid = Some(11);
        fork.thread = Some(false);
        let mut refused = failed(11, 3 * MS, "connect", libc::ECONNREFUSED, "");
        refused.addr = Some("127.66.0.1:18799".into());
        refused.via = Some("getsockopt(SO_ERROR)".into());
        let a = attribute(&span(vec![fork.clone(), refused]), &outcome(1));
        assert!(a.failed);
        assert_eq!(a.primitive, Primitive::NetEgress, "{}", a.explanation);
        assert!(
            a.explanation.contains("127.66.0.1:18799"),
            "{}",
            a.explanation
        );
        assert!(
            a.explanation
                .ends_with("which the failing call most likely reported"),
            "{}",
            a.explanation
        );
        // a unix socket refused is no such report: nothing the kernel saw
        let mut unix = failed(11, 4 * MS, "connect", libc::ECONNREFUSED, "");
        unix.addr = Some("unix:/run/dbus/system_bus_socket".into());
        let a = attribute(&span(vec![fork, unix]), &outcome(1));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
    }

    #[test]
    fn a_refused_connection_a_child_reported_is_the_hidden_failure_of_a_call_that_exited_0() {
        // Chromium: the network service's connect is refused, it reports the
        // error page to the browser, and every process exits 0
        let mut fork = ev(Kind::Fork, 10, 0);
        fork.child_pid = Some(11);
        fork.thread = Some(false);
        let mut refused = failed(11, 3 * MS, "connect", libc::ECONNREFUSED, "");
        refused.addr = Some("127.66.0.1:8080".into());
        let mut pending = failed(11, 2 * MS, "connect", libc::EINPROGRESS, "");
        pending.addr = Some("127.66.0.1:8081".into());
        let mut unix = failed(11, 4 * MS, "connect", libc::ECONNREFUSED, "");
        unix.addr = Some("unix:/run/dbus/system_bus_socket".into());
        let events = vec![
            fork,
            pending.clone(),
            refused,
            unix.clone(),
            exit(11, 5 * MS, 0),
        ];
        let a = attribute(&span(events), &outcome(0));
        assert_eq!(a.primitive, Primitive::None, "the call itself succeeded");
        let h = a
            .hidden_failure
            .expect("the refused connection is reported");
        assert_eq!(h.primitive, Primitive::NetEgress);
        assert!(
            h.explanation
                .contains("connect(127.66.0.1:8080) failed with ECONNREFUSED"),
            "{}",
            h.explanation
        );
        // a still-pending connect or a unix socket alone is not a hidden failure
        let mut fork = ev(Kind::Fork, 10, 0);
        fork.child_pid = Some(11);
        fork.thread = Some(false);
        let a = attribute(
            &span(vec![fork, pending, unix, exit(11, 5 * MS, 0)]),
            &outcome(0),
        );
        assert_eq!(a.hidden_failure, None);
    }

    #[test]
    fn missing_files_then_its_own_sigabrt_is_fs_missing_but_not_for_a_fault() {
        let events = |sig: &str, paths: &[&str]| {
            let mut v: Vec<KernelEvent> = paths
                .iter()
                .enumerate()
                .map(|(i, p)| failed(10, (i as u64 + 1) * MS, "access", libc::ENOENT, p))
                .collect();
            v.push(signal(10, 9 * MS, sig, 10));
            v.push(ev(Kind::Exit, 10, 10 * MS));
            v
        };
        let nowhere = [
            "/nonexistent-probe-test/a.conf",
            "/nonexistent-probe-test/b.conf",
        ];
        // files nothing names and nobody has: a deliberate abort of its own
        let a = attribute(&span(events("SIGABRT", &nowhere)), &killed_by("SIGABRT"));
        assert_eq!(a.primitive, Primitive::Signal, "{}", a.explanation);
        // …unless its words name them
        let named = Outcome {
            words: Words {
                command: None,
                output: Some(format!("cannot load {} or {}", nowhere[0], nowhere[1])),
            },
            ..killed_by("SIGABRT")
        };
        let a = attribute(&span(events("SIGABRT", &nowhere)), &named);
        assert_eq!(a.primitive, Primitive::FsMissing, "{}", a.explanation);
        assert_eq!(a.confidence, 0.75);
        assert_eq!(
            a.explanation,
            "access(\"/nonexistent-probe-test/b.conf\") failed with ENOENT ×2, then w (pid 10) aborted with SIGABRT"
        );
        // a file the workload could not see but that existed out here when
        // the span closed wins: the sandbox hid it (the host's answer, not
        // this machine's: attribution reads only what was captured)
        let hidden = "/nonexistent-probe-test/hidden.ttf";
        let host = testing::FixedHost {
            existing: &["/nonexistent-probe-test/hidden.ttf"],
            now_ms: 0,
        };
        let a = testing::attribute_on(
            &host,
            span(events("SIGABRT", &[hidden, nowhere[0], nowhere[1]])),
            &killed_by("SIGABRT"),
        );
        assert_eq!(
            a.explanation,
            "access(\"/nonexistent-probe-test/hidden.ttf\") failed with ENOENT (present outside the sandbox: hidden from it), then w (pid 10) aborted with SIGABRT"
        );
        // not captured: nothing says it was there
        let a = attribute(
            &span(events("SIGABRT", &[hidden, nowhere[0], nowhere[1]])),
            &killed_by("SIGABRT"),
        );
        assert_eq!(a.primitive, Primitive::Signal, "{}", a.explanation);
        let a = attribute(&span(events("SIGSEGV", &nowhere)), &named_segv(&named));
        assert_eq!(
            a.primitive,
            Primitive::Signal,
            "a fault is a bug of its own: {}",
            a.explanation
        );
    }

    /// `outcome`'s words, killed by SIGSEGV.
    fn named_segv(outcome: &Outcome) -> Outcome {
        Outcome {
            words: outcome.words.clone(),
            ..killed_by("SIGSEGV")
        }
    }

    #[test]
    fn a_crash_with_no_refusal_before_it_is_signal() {
        let events = vec![
            failed(10, MS, "openat", libc::ENOENT, "/data/optional.cfg"),
            signal(10, 2 * MS, "SIGSEGV", 10),
            ev(Kind::Exit, 10, 3 * MS),
        ];
        let a = attribute(&span(events), &killed_by("SIGSEGV"));
        assert_eq!(a.primitive, Primitive::Signal);
        assert_eq!(a.explanation, "w (pid 10) crashed with SIGSEGV");
    }

    #[test]
    fn refusals_of_another_process_do_not_explain_a_crash() {
        let mut events = vec![ev(Kind::Fork, 10, 0)];
        events[0].child_pid = Some(11);
        events[0].thread = Some(false);
        events.push(failed(11, MS, "mmap", libc::ENOMEM, ""));
        events.push(exit(11, 2 * MS, 1));
        events.push(signal(10, 3 * MS, "SIGSEGV", 10));
        let a = attribute(&span(events), &killed_by("SIGSEGV"));
        assert_eq!(a.primitive, Primitive::Signal, "{}", a.explanation);
    }

    #[test]
    fn a_refusal_does_not_explain_a_signal_sent_by_another_process_or_much_later() {
        // `kill -ABRT` from outside
        let events = vec![
            failed(10, MS, "clone", libc::EAGAIN, ""),
            signal(10, 2 * MS, "SIGABRT", 99),
        ];
        let a = attribute(&span(events), &killed_by("SIGABRT"));
        assert_eq!(a.primitive, Primitive::Signal, "{}", a.explanation);
        // a refusal the process got past long before it crashed
        let late = SYMPTOM_WINDOW_NS + 10 * MS;
        let events = vec![
            failed(10, MS, "clone", libc::EAGAIN, ""),
            signal(10, late, "SIGABRT", 10),
        ];
        let a = attribute(&span(events), &killed_by("SIGABRT"));
        assert_eq!(a.primitive, Primitive::Signal, "{}", a.explanation);
        // …and SIGFPE is no symptom of a refused resource
        let events = vec![
            failed(10, MS, "mmap", libc::ENOMEM, ""),
            signal(10, 2 * MS, "SIGFPE", 10),
        ];
        let a = attribute(&span(events), &killed_by("SIGFPE"));
        assert_eq!(a.primitive, Primitive::Signal, "{}", a.explanation);
    }

    #[test]
    fn the_loaders_stat_of_a_missing_library_directory_is_noise() {
        // LD_LIBRARY_PATH names a directory the sandbox hides: ld.so tries
        // a library in it, then stats it; the program then runs and fails
        let events = vec![
            failed(10, 1, "openat", libc::ENOENT, "/tmp/build/deps/libc.so.6"),
            failed(10, 2, "newfstatat", libc::ENOENT, "/tmp/build/deps"),
            failed(10, 3, "newfstatat", libc::ENOENT, "/data/input"),
            exit(10, 4, 1),
        ];
        let a = attribute(&span(events), &said(1, "cannot read /data/input"));
        assert_eq!(a.decisive.unwrap().path.as_deref(), Some("/data/input"));
        let events = vec![
            failed(10, 2, "newfstatat", libc::ENOENT, "/tmp/build/deps"),
            exit(10, 4, 1),
        ];
        let a = attribute(
            &span(events),
            &said(1, "no such directory: /tmp/build/deps"),
        );
        assert_eq!(
            a.primitive,
            Primitive::FsMissing,
            "alone, it is a missing directory"
        );
    }

    #[test]
    fn a_failed_lookup_nothing_names_is_noticed_never_the_cause() {
        // grep with no match on an Ubuntu image: its message catalog is
        // looked up while it prints, right before it exits 1
        let catalog = "/usr/share/locale-langpack/en/LC_MESSAGES/grep.mo";
        let events = vec![
            failed(10, MS, "openat", libc::ENOENT, catalog),
            exit(10, 2 * MS, 1),
        ];
        let a = attribute(&span(events.clone()), &said(1, "grep: no match\n"));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        assert_eq!(a.layer, Some(Layer::Test));
        assert_eq!(a.noticed.len(), 1, "{:?}", a.noticed);
        assert!(
            a.noticed[0].starts_with(&format!(
                "`{catalog}` was missing (openat ENOENT in w (pid 10))"
            )),
            "{:?}",
            a.noticed
        );
        // with no words at all, nothing corroborates it either
        let a = attribute(&span(events), &outcome(1));
        assert_eq!(a.primitive, Primitive::None, "{}", a.explanation);
        // `cat /nonexistent`: the catalog looked up after the real miss
        // does not outrank the file the workload named
        let events = vec![
            failed(10, MS, "openat", libc::ENOENT, "/nonexistent"),
            failed(10, 2 * MS, "openat", libc::ENOENT, catalog),
            exit(10, 3 * MS, 1),
        ];
        let a = attribute(
            &span(events),
            &said(1, "cat: /nonexistent: No such file or directory\n"),
        );
        assert_eq!(a.primitive, Primitive::FsMissing, "{}", a.explanation);
        assert_eq!(a.decisive.unwrap().path.as_deref(), Some("/nonexistent"));
        assert!(
            a.explanation
                .ends_with("(the workload's own output names it)"),
            "{}",
            a.explanation
        );
        assert_eq!(a.noticed.len(), 1, "the catalog is still shown");
    }

    #[test]
    fn a_strong_failure_stands_without_words() {
        for (syscall, errno, primitive) in [
            ("openat", libc::EROFS, Primitive::FsReadonly),
            ("write", libc::ENOSPC, Primitive::FsSpace),
            ("openat", libc::EMFILE, Primitive::ProcLimit),
            ("clone", libc::EAGAIN, Primitive::ProcLimit),
        ] {
            let events = vec![
                failed(10, MS, syscall, errno, "/out/x"),
                exit(10, 2 * MS, 1),
            ];
            let a = attribute(&span(events), &outcome(1));
            assert_eq!(a.primitive, primitive, "{syscall}: {}", a.explanation);
            assert!(a.noticed.is_empty());
        }
    }
}
