//! Failure events as evidence, read from their grades ([`super::grade`]):
//! a crash's refusal, a shell's missing command, the strongest among a
//! chosen set, and the sentence that names it.

use crate::event::{Errno, KernelEvent, Kind, Signal, errno_desc, is_signal};
use crate::primitive::{Primitive, SYMPTOM_SIGNALS, SYMPTOM_WINDOW_NS, classify};
use crate::spans::SpanEvidence;

use super::confidence::{Basis, Level};
use super::grade::{Grade, Grades, last_exec};
use super::{Case, Outcome, Verdict};

/// A crash the process brought on itself right after the kernel refused it
/// a resource (Chromium under RLIMIT_AS: mmap ENOMEM ×4 in one thread, then
/// its own SIGTRAP in another): the refusal is the cause, the signal its
/// symptom. `signal` is the fatal signal's event, when seen. None when the
/// signal is not one of [`SYMPTOM_SIGNALS`], another process sent it, or no
/// `mem.limit` / `proc.limit` failure or seccomp denial of the same process
/// (tgid: the `pid` of every event) came within [`SYMPTOM_WINDOW_NS`]
/// before it (Chromium checks every syscall it makes and traps on the
/// ones a filter refused).
pub(super) fn resource_failure_behind_crash(
    span: &SpanEvidence,
    grades: &Grades,
    pid: u32,
    sig: &str,
    signal: Option<&KernelEvent>,
    who: &dyn Fn(u32) -> String,
) -> Option<Verdict> {
    if !SYMPTOM_SIGNALS.contains(&sig) {
        return None;
    }
    // a fault, abort(), raise() and a trap instruction all generate the
    // signal from the dying process's own thread, so it is the sender
    let sender = signal.and_then(|e| e.sender_pid).or_else(|| {
        span.processes
            .get(&pid)
            .and_then(|p| p.signal_sender.as_ref())
            .map(|(s, _)| *s)
    });
    if sender.is_some_and(|s| s != pid) {
        return None;
    }
    let crashed_at = signal.map(|e| e.ts_ns).or_else(|| {
        span.events
            .iter()
            .rev()
            .find(|e| e.kind == Kind::Exit && e.pid == pid)
            .map(|e| e.ts_ns)
    })?;
    let events = &span.events;
    // a run of identical failures carries the time of its first one: a run
    // that began before the window is left out even if it lasted into it
    let in_window: Vec<(usize, Primitive)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            (e.kind.is_failure() || e.kind == Kind::SeccompDenied)
                && e.pid == pid
                && e.ts_ns <= crashed_at
                && crashed_at - e.ts_ns <= SYMPTOM_WINDOW_NS
        })
        .filter_map(|(i, _)| Some((i, grades.get(i)?)))
        .filter(|(i, g)| g.counts() || present_outside(span, &events[*i]))
        .map(|(i, g)| (i, g.primitive))
        .collect();
    let refused = |p: Primitive| {
        matches!(
            p,
            Primitive::MemLimit | Primitive::ProcLimit | Primitive::Seccomp
        )
    };
    let mut refusals: Vec<(usize, Primitive)> = in_window
        .iter()
        .copied()
        .filter(|&(_, p)| refused(p))
        .collect();
    // A deliberate abort (a failed CHECK: SIGABRT, SIGTRAP) after files it
    // looked for were missing: Chromium without fonts aborts in Skia once
    // fontconfig found none. Less sure than a refusal (programs look for
    // optional files all the time), and never for a fault (SIGSEGV…),
    // which is a bug of its own. Weak lookups count here when
    // corroborated, or when the file exists outside the workload's view
    // (the sandbox hid it: that corroborates it too).
    let mut basis = Basis::RefusalBehindCrash;
    let mut hidden_from_it = false;
    if refusals.is_empty() && aborted(sig) {
        refusals = in_window
            .into_iter()
            .filter(|&(_, p)| p == Primitive::FsMissing)
            .collect();
        // files the workload could not see but that exist out here were
        // hidden from it (a slimmed image, an emptied mount): those, when
        // there are any, rather than files nobody has
        let hidden: Vec<(usize, Primitive)> = refusals
            .iter()
            .copied()
            .filter(|&(i, _)| present_outside(span, &events[i]))
            .collect();
        if !hidden.is_empty() {
            refusals = hidden;
            hidden_from_it = true;
        }
        basis = Basis::MissingFilesBehindAbort;
    }
    let &(last, primitive) = refusals.last()?;
    let ev = &events[last];
    let times = |e: &KernelEvent| 1 + e.repeats.unwrap_or(0);
    let (same, other): (Vec<&KernelEvent>, Vec<&KernelEvent>) = refusals
        .iter()
        .map(|&(i, _)| &events[i])
        .partition(|e| e.syscall_nr == ev.syscall_nr && e.ret == ev.ret);
    let count: u64 = same.iter().map(|e| times(e)).sum();
    let others: u64 = other.iter().map(|e| times(e)).sum();
    let errno = ev.errno.as_deref().unwrap_or("an error");
    let count = if count > 1 {
        format!(" ×{count}")
    } else {
        String::new()
    };
    let limit = ev
        .errno_nr()
        .zip(ev.syscall.as_deref())
        .and_then(|(errno, syscall)| classify(syscall, errno, ev.flags.unwrap_or(0)))
        .and_then(|rule| rule.limit)
        .map(|l| format!(" ({l})"))
        .unwrap_or_default();
    let others = match others {
        0 => String::new(),
        1 if primitive == Primitive::FsMissing => ", after 1 other missing file".to_string(),
        n if primitive == Primitive::FsMissing => format!(", after {n} other missing files"),
        1 => ", after 1 other refused resource request".to_string(),
        n => format!(", after {n} other refused resource requests"),
    };
    let verb = if aborted(sig) { "aborted" } else { "crashed" };
    Some(Verdict::new(
        primitive,
        basis,
        if primitive == Primitive::Seccomp {
            format!(
                "{} was denied by the seccomp filter ({errno}; the syscall never ran){count}{others}, then {} {verb} with {sig}",
                ev.call(),
                who(pid)
            )
        } else {
            let hidden = if hidden_from_it {
                " (present outside the sandbox: hidden from it)"
            } else {
                ""
            };
            format!(
                "{} failed with {errno}{count}{limit}{hidden}{others}, then {} {verb} with {sig}",
                ev.call(),
                who(pid)
            )
        },
        Some(ev.clone()),
    ))
}

/// The failed event names an absolute path that existed where the probe
/// runs when the span closed: the workload's own view (its mount
/// namespace) did not have it.
fn present_outside(span: &SpanEvidence, ev: &KernelEvent) -> bool {
    ev.path_truncated.is_none()
        && ev
            .path
            .as_deref()
            .is_some_and(|p| span.closing.present_outside.contains(p))
}

/// A failure a process that exited 0 most likely reported to its parent
/// rather than failing itself (Chromium's network service renders an error
/// page and its writer threads log a full disk, while the browser exits 0):
/// where a call's exit status says nothing failed, it is still the failure
/// the call hid. Only failures no program makes on purpose: a connection
/// to an IP address refused, unreachable or timed out (a still-pending
/// EINPROGRESS connect is not: programs race those), a full disk, a
/// read-only filesystem.
pub(super) fn reported_failure(ev: &KernelEvent, primitive: Primitive) -> bool {
    match primitive {
        Primitive::NetEgress => {
            !ev.errno_is(Errno::EINPROGRESS)
                && ev
                    .addr
                    .as_deref()
                    .is_some_and(|a| a.parse::<std::net::SocketAddr>().is_ok())
        }
        Primitive::FsSpace | Primitive::FsReadonly => true,
        _ => false,
    }
}

/// A shell's "command not found": a process exited 127 after looking up
/// a name in the bin directories of its PATH (stat, access or execve) and
/// finding none; one directory is enough (`PATH=/bin`, minimal images,
/// `env -i`). Where the span's status is 127, the lookup may also be
/// another process's that then exited non-zero (a container runtime's `runc
/// init` looks the command up itself and the runtime reports 127); with any
/// other status, a lookup in two bin directories or more by a process that
/// then exited non-zero (firejail looks it up and exits 1). Not a lookup
/// its process got past or whose failure its parent outlived and succeeded
/// anyway (`survived`).
/// Only bin directories (`…/bin`, `…/sbin`) are a command's candidates: a
/// name looked up in several other places is a message catalog or a
/// configuration file, not a program.
///
/// `said_only`: only a command the workload's words say is not found
/// ("sh: 1: foo: not found", "bash: foo: command not found"), as every
/// weak failure needs its words: a failure the status hid, and any call
/// to a server that outlives it, whose own programs look commands up
/// around the call (version probes of tools it may not have).
pub(super) fn command_not_found(
    span: &SpanEvidence,
    outcome: &Outcome,
    survived: impl Fn(&KernelEvent) -> bool,
    said_only: bool,
) -> Option<Verdict> {
    let said = not_found_names(outcome.words.output.as_deref().unwrap_or(""));
    let named = |path: &str| {
        let name = path.rsplit('/').next().unwrap_or(path);
        !said_only || said.iter().any(|(n, _)| n == name)
    };
    let exited_127 = |pid: u32| {
        let code = span.processes.get(&pid).and_then(|p| p.exit_code);
        code == Some(127)
            || (outcome.exit.code == Some(127)
                && (Some(pid) == span.root_pid || code.is_some_and(|c| c != 0)))
    };
    // a runtime that looks the command up itself and exits 1 (firejail):
    // only candidates in bin directories then, as a PATH has
    let own_lookup = |pid: u32| {
        span.processes
            .get(&pid)
            .and_then(|p| p.exit_code)
            .is_some_and(|c| c != 0)
    };
    let in_bin_dir = |path: &str| {
        path.rsplit_once('/')
            .is_some_and(|(dir, _)| dir.ends_with("/bin") || dir.ends_with("/sbin"))
    };
    // a lookup that ended in a successful exec found its program (the
    // subshell of `sleep 30 &`, killed later, is no missing command)
    let execs = last_exec(&span.events);
    let misses: Vec<&KernelEvent> = span
        .events
        .iter()
        .enumerate()
        .filter(|(i, e)| execs.get(&e.pid).is_none_or(|x| x < i))
        .map(|(_, e)| e)
        // podman looks for the OCI runtimes it knows (krun…), then goes
        // on; `cargo new`'s child cannot run `hg`, and cargo succeeds
        .filter(|e| !survived(e))
        .filter(|e| {
            e.kind.is_failure()
                && e.errno_is(Errno::ENOENT)
                && e
                    .syscall
                    .as_deref()
                    .is_some_and(|s| crate::syscalls::PATH_LOOKUPS.contains(&s))
                && e.path
                    .as_deref()
                    .is_some_and(|p| p.starts_with('/') && in_bin_dir(p) && named(p))
                // a shell that said so went on without it (`no-such-tool; true`)
                && (exited_127(e.pid) || own_lookup(e.pid) || said_only)
        })
        .collect();
    let last = *misses.last()?;
    let name = last.path.as_deref()?.rsplit('/').next()?.to_string();
    let mut tried: Vec<&str> = misses
        .iter()
        .filter(|e| e.pid == last.pid)
        .filter_map(|e| e.path.as_deref())
        .filter(|p| p.rsplit('/').next() == Some(name.as_str()))
        .collect();
    let mut seen = std::collections::HashSet::new();
    tried.retain(|p| seen.insert(*p));
    let status_127 = exited_127(last.pid);
    // a program looking for itself on PATH (python finding its prefix)
    let itself = span.processes.get(&last.pid).is_some_and(|p| {
        p.comm == name || p.exe.as_deref().and_then(|e| e.rsplit('/').next()) == Some(name.as_str())
    });
    // a shell looks the name up, then its child runs what it found
    let found = span.events.iter().any(|e| {
        e.kind == Kind::Exec
            && e.ts_ns >= last.ts_ns
            && e.path.as_deref().and_then(|p| p.rsplit('/').next()) == Some(name.as_str())
    });
    // every candidate is in a bin directory (see `misses`)
    if found || (!status_127 && (tried.len() < 2 || itself)) {
        return None;
    }
    let words = said
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, line)| format!(", saying \"{line}\""))
        .unwrap_or_default();
    Some(Verdict::new(
        Primitive::ExecMissing,
        Basis::CommandNotFound { status_127 },
        format!(
            "`{name}` is not installed: {} (pid {}) looked in {} ({}) and {}{words}",
            last.comm,
            last.pid,
            match tried.len() {
                1 => "the one PATH directory".to_string(),
                n => format!("{n} PATH directories"),
            },
            tried.join(", "),
            match (
                span.processes.get(&last.pid).and_then(|p| p.exit_code),
                outcome.exit.code
            ) {
                (Some(127) | None, _) => "exited 127".to_string(),
                (Some(0), _) => "went on without it".to_string(),
                (Some(c), Some(127)) => format!("exited {c}; the workload's status is 127"),
                (Some(c), _) => format!("exited {c}"),
            }
        ),
        Some(last.clone()),
    ))
}

/// Under gVisor a shell's PATH search is stat(2), whose raw points carry no
/// path: a command is missing when the shell said so itself ("sh: 1: foo:
/// not found", "bash: foo: command not found"), exited 127, and its stat
/// lookups (two or more: one per PATH directory) failed with ENOENT, and
/// nothing of that name ran afterwards. The words
/// name the command; the kernel's side is the failed lookups and the 127.
pub(super) fn command_not_found_said(span: &SpanEvidence, outcome: &Outcome) -> Option<Verdict> {
    let no_paths = span.source.sight().lookups_without_paths?;
    let (name, line) = not_found_names(outcome.words.output.as_deref()?).pop()?;
    // every process that exited 127 (`sh -c 'bash -c foo'`: the inner
    // one searched), and the root when the workload's status is 127
    let mut shells: Vec<u32> = span
        .processes
        .iter()
        .filter(|(_, p)| p.exit_code == Some(127))
        .map(|(pid, _)| *pid)
        .collect();
    shells.extend(span.root_pid.filter(|_| outcome.exit.code == Some(127)));
    let lookups_of = |shell: u32| -> Vec<&KernelEvent> {
        span.events
            .iter()
            .filter(|e| {
                e.pid == shell
                    && e.kind == Kind::SyscallFailed
                    && e.errno_is(Errno::ENOENT)
                    && e.path.is_none()
                    // a PATH search stats each directory's candidate
                    && e.syscall.as_deref().is_some_and(|s| crate::syscalls::STATS.contains(&s))
            })
            .collect()
    };
    // one per PATH directory: a lone failed stat is no search
    let lookups = shells
        .into_iter()
        .map(lookups_of)
        .filter(|l| l.len() >= 2)
        .max_by_key(|l| l.last().map(|e| e.ts_ns))?;
    let last = *lookups.last()?;
    let ran = span.events.iter().any(|e| {
        e.kind == Kind::Exec
            && e.ts_ns >= last.ts_ns
            && (e.comm == name
                || e.path.as_deref().and_then(|p| p.rsplit('/').next()) == Some(name.as_str()))
    });
    if ran {
        return None;
    }
    Some(Verdict::new(
        Primitive::ExecMissing,
        Basis::CommandNotFoundSaid,
        format!(
            "`{name}` is not installed: {} (pid {}) looked it up ({} {} failed with ENOENT; \
             {no_paths}) and exited 127, saying \"{line}\"",
            last.comm,
            last.pid,
            lookups.len(),
            last.syscall.as_deref().unwrap_or("lookup"),
        ),
        Some(last.clone()),
    ))
}

/// The commands a shell's "not found" lines name, with their lines, in
/// the order said.
fn not_found_names(output: &str) -> Vec<(String, String)> {
    // a server's answer relayed as JSON has its lines as `\n` escapes
    output
        .lines()
        .flat_map(|l| l.split("\\n"))
        .filter_map(|line| {
            let line = line.trim();
            let name = line
                .strip_suffix(": command not found")
                .or_else(|| line.strip_suffix(": not found"))
                .and_then(|head| head.rsplit(": ").next())
                .or_else(|| line.split_once("command not found: ").map(|(_, n)| n))?;
            let name = name.trim();
            (!name.is_empty() && !name.contains(char::is_whitespace))
                .then(|| (name.to_string(), line.to_string()))
        })
        .collect()
}

/// The strongest failure that counts as evidence ([`Grades::evidence`])
/// among those `eligible` accepts (given the event and its grade),
/// explained; among equals the latest wins.
pub(super) fn strongest_failure(
    case: &Case,
    eligible: impl Fn(&KernelEvent, &Grade) -> bool,
) -> Option<Verdict> {
    pick_failure(case, eligible, None)
}

/// The latest eligible failure of level `from` or above: a process that
/// got past one denial or limit and then failed on another (curl under
/// srt: its AF_UNIX socket is refused, then its connect) failed on the
/// later one. Without such a failure, the strongest.
pub(super) fn latest_failure_from(
    case: &Case,
    from: Level,
    eligible: impl Fn(&KernelEvent, &Grade) -> bool,
) -> Option<Verdict> {
    pick_failure(case, eligible, Some(from))
}

fn pick_failure(
    case: &Case,
    eligible: impl Fn(&KernelEvent, &Grade) -> bool,
    latest_from: Option<Level>,
) -> Option<Verdict> {
    let events = &case.span.events;
    let mut best: Option<(usize, Grade)> = None;
    for (i, ev) in events.iter().enumerate().rev() {
        let Some(grade) = case.grades.evidence(i) else {
            continue;
        };
        if !eligible(ev, &grade) {
            continue;
        }
        if latest_from.is_some_and(|from| grade.level >= from) {
            best = Some((i, grade));
            break;
        }
        // strictly greater: among equals, the latest (seen first) wins
        if best.is_none_or(|(_, b)| grade.weight() > b.weight()) {
            best = Some((i, grade));
        }
    }
    let (i, grade) = best?;
    Some(explain_failure(case.span, case.outcome, &events[i], &grade))
}

/// The sentence for failure `ev`, graded `grade`.
fn explain_failure(
    span: &SpanEvidence,
    outcome: &Outcome,
    ev: &KernelEvent,
    grade: &Grade,
) -> Verdict {
    let events = &span.events;
    let errno = ev.errno.clone().unwrap_or_default().into_owned();
    let desc = errno_desc(&errno).to_lowercase();
    let proc_desc = format!("{} (pid {})", ev.comm, ev.pid);
    let primitive = grade.primitive;
    let unseen_connects = span.source.sight().connect_outcomes_unseen;
    // a verdict that settles more than the failure's grade did
    let mut settled: Option<Basis> = None;
    let explanation = match primitive {
        Primitive::Seccomp => {
            let unconfirmed = if ev.seccomp_filter == Some(true) {
                ""
            } else {
                " (the task's seccomp mode could not be confirmed)"
            };
            format!(
                "{} was denied by the seccomp filter ({errno}; the syscall never ran) in {proc_desc}{unconfirmed}",
                ev.call()
            )
        }
        Primitive::ExecMissing => {
            let name = ev
                .path
                .as_deref()
                .and_then(|p| p.rsplit('/').next())
                .unwrap_or("program");
            let mut tried: Vec<&str> = events
                .iter()
                .filter(|e| {
                    e.pid == ev.pid
                        && e.syscall_nr == ev.syscall_nr
                        && e.errno_is(Errno::ENOENT)
                        && e.path
                            .as_deref()
                            .is_some_and(|p| p.rsplit('/').next() == Some(name))
                })
                .filter_map(|e| e.path.as_deref())
                .collect();
            let mut seen = std::collections::HashSet::new();
            tried.retain(|p| seen.insert(*p));
            if outcome.exit.code == Some(127) {
                settled = Some(Basis::ExecMissingAt127);
            }
            format!(
                "`{name}` is not installed: execve failed with ENOENT for {} candidate path(s) ({})",
                tried.len(),
                tried.join(", ")
            )
        }
        Primitive::FsPersistence => {
            let w = ev.written_earlier.as_ref();
            let ago = w.map(|w| {
                let ms = (span.closing.closed_ms - w.at_ms).max(0);
                if ms < 1000 {
                    format!("{ms} ms earlier")
                } else {
                    format!("{:.1} s earlier", ms as f64 / 1000.0)
                }
            });
            let ns = match (
                w.and_then(|w| w.mount_ns.as_deref()),
                ev.mount_ns.as_deref(),
            ) {
                (Some(a), Some(b)) if a != b => {
                    format!(" — written in mount namespace {a}, missing in {b}")
                }
                (Some(a), Some(_)) => format!(
                    " — same mount namespace {a}: removed, or a tmpfs/overlay that was reset"
                ),
                _ => String::new(),
            };
            format!(
                "{} failed with {errno} in {proc_desc}, but span {} of this session wrote it ({}, pid {}, with {}, {}){ns}: the write did not persist",
                ev.call(),
                w.map(|w| w.span).unwrap_or(0),
                w.map(|w| w.comm.as_str()).unwrap_or("?"),
                w.map(|w| w.pid).unwrap_or(0),
                w.map(|w| w.syscall.as_str()).unwrap_or("open"),
                ago.unwrap_or_default()
            )
        }
        Primitive::FsNoexec => {
            settled = Some(Basis::Noexec);
            format!(
                "{} failed with EACCES in {proc_desc}: the file is on a mount with noexec",
                ev.call()
            )
        }
        // gVisor shows the EINPROGRESS, never how the connect ended (its
        // outcome is read through getsockopt, which has no point)
        Primitive::NetEgress if ev.errno_is(Errno::EINPROGRESS) && unseen_connects.is_some() => {
            format!(
                "{} was still in progress (EINPROGRESS) when {proc_desc} gave up on it: refused, \
                 unreachable or unanswered, {}: {}",
                ev.call(),
                unseen_connects.unwrap_or_default(),
                primitive.meaning()
            )
        }
        // a non-blocking connect that never completed: the failure is the
        // silence after it, not the EINPROGRESS its call returned
        Primitive::NetEgress if ev.errno_is(Errno::EINPROGRESS) => format!(
            "{} got no answer: it was still pending (EINPROGRESS) when {proc_desc} gave up on it \
             (its own timeout): {}",
            ev.call(),
            primitive.meaning()
        ),
        Primitive::NetEgress if ev.via.is_some() => format!(
            "{} failed with {errno} ({desc}) in {proc_desc}, {}: {}",
            ev.call(),
            match ev.duration_ns {
                Some(ns) => format!(
                    "reported by {} {:.0} ms after the non-blocking connect",
                    ev.via.as_deref().unwrap_or(""),
                    ns as f64 / 1e6
                ),
                None => format!("reported by {}", ev.via.as_deref().unwrap_or("")),
            },
            primitive.meaning()
        ),
        _ if ev.kind == Kind::UringFailed => format!(
            "{} failed with {errno} ({desc}) in {proc_desc}: {} (an io_uring request: no syscall \
             failed, the error came back in its completion)",
            ev.call(),
            primitive.meaning()
        ),
        _ => format!(
            "{} failed with {errno} ({desc}) in {proc_desc}: {}",
            ev.call(),
            primitive.meaning()
        ),
    };
    // weak evidence says what corroborated it
    let explanation = match grade.witness {
        Some(w) => format!("{explanation} ({})", w.clause()),
        None => explanation,
    };
    match settled {
        Some(basis) => Verdict::new(primitive, basis, explanation, Some(ev.clone())),
        None => Verdict::of_grade(grade, explanation, ev.clone()),
    }
}

/// Whether `sig` is how a program stops itself on purpose (abort(3), a
/// trap), not a crash it suffered.
fn aborted(sig: &str) -> bool {
    is_signal(Some(sig), Signal::SIGABRT) || is_signal(Some(sig), Signal::SIGTRAP)
}

#[cfg(test)]
mod tests {
    use super::not_found_names;

    fn not_found_name(output: &str) -> Option<(String, String)> {
        not_found_names(output).pop()
    }

    #[test]
    fn a_shells_not_found_line_names_the_command() {
        for (output, name) in [
            ("sh: 1: cargo: not found\n", "cargo"),
            ("bash: line 1: rg: command not found\n", "rg"),
            ("zsh: command not found: jq\n", "jq"),
            (
                "building…\n/bin/sh: 3: ./run.sh: not found\nmake: *** [x] Error 127\n",
                "./run.sh",
            ),
        ] {
            assert_eq!(
                not_found_name(output).map(|(n, _)| n).as_deref(),
                Some(name),
                "{output}"
            );
        }
        for output in ["ValueError: bad input", "Error: page not found", ""] {
            assert_eq!(not_found_name(output), None, "{output}");
        }
        // every line, in order: a server's answer may carry several
        let names: Vec<String> =
            not_found_names("sh: 1: a: not found\nok\nbash: b: command not found\n")
                .into_iter()
                .map(|(n, _)| n)
                .collect();
        assert_eq!(names, ["a", "b"]);
        // relayed in a JSON answer, its lines escaped
        let relayed = r#"{"text":"exit code: 127\nstderr:\nsh: 1: no-such-tool: not found\n"}"#;
        assert_eq!(
            not_found_name(relayed).map(|(n, _)| n).as_deref(),
            Some("no-such-tool")
        );
    }
}
