//! Today's verdicts, pinned: thousands of generated spans (every kind of
//! failure the rules grade, in every place a span can hold it, with every
//! ending, with and without the workload's words), each attributed, one
//! line per case in `golden/verdicts.txt`. A change to attribution that
//! moves any verdict, confidence, decisive event, hidden failure, noticed
//! line or sentence fails here and names the cases; one that means to
//! move them re-blesses the file with `PROBE_BLESS=1` and says why.

use std::fmt::Write as _;

use crate::event::{KernelEvent, Kind, WrittenEarlier};
use crate::spans::SpanEvidence;

use super::testing::*;
use super::{Outcome, Words, attribute};

/// Where a failure happens in the span's process tree.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// In the root process itself.
    Root,
    /// In a child whose exit status the root passes on.
    ExitPath,
    /// In a child that exits 1 while the root goes on.
    OffPath,
    /// In a child still running when the span ends.
    StillRunning,
    /// In a child the root stops with SIGTERM.
    StoppedByAncestor,
    /// In a child that copes and exits 0.
    ChildExited0,
}

const PLACES: [Place; 6] = [
    Place::Root,
    Place::ExitPath,
    Place::OffPath,
    Place::StillRunning,
    Place::StoppedByAncestor,
    Place::ChildExited0,
];

/// How the root ends.
#[derive(Clone, Copy, Debug)]
enum Ending {
    Exit1,
    /// After a shell's PATH search for a command that is not there.
    Exit127,
    Exit0,
    OwnAbort,
    OwnSegv,
    Timeout,
}

const ENDINGS: [Ending; 6] = [
    Ending::Exit1,
    Ending::Exit127,
    Ending::Exit0,
    Ending::OwnAbort,
    Ending::OwnSegv,
    Ending::Timeout,
];

const DIR: &str = "/nonexistent-golden";

/// A kind of failure: its name and its events for `pid` at `ts`.
struct Failure {
    name: &'static str,
    make: fn(u32, u64) -> Vec<KernelEvent>,
    /// What the workload would say about it.
    words: &'static str,
}

fn with(mut e: KernelEvent, f: impl FnOnce(&mut KernelEvent)) -> KernelEvent {
    f(&mut e);
    e
}

fn connect(pid: u32, ts: u64, errno: i32) -> KernelEvent {
    with(failed(pid, ts, "connect", errno, ""), |e| {
        e.addr = Some("127.0.0.1:9".into())
    })
}

const O_WRITE: u64 = (libc::O_WRONLY | libc::O_CREAT) as u64;

/// An open to write that failed with `errno`.
fn open_to_write(pid: u32, ts: u64, errno: i32, path: &str) -> Vec<KernelEvent> {
    vec![with(failed(pid, ts, "openat", errno, path), |e| {
        e.flags = Some(O_WRITE)
    })]
}

/// A seccomp denial of mount, confirmed by the filter's flag or not.
fn seccomp_denial(pid: u32, ts: u64, confirmed: bool) -> Vec<KernelEvent> {
    vec![with(ev(Kind::SeccompDenied, pid, ts), |e| {
        e.syscall = Some("mount".into());
        e.syscall_nr = crate::syscalls::number("mount");
        e.errno = Some("EPERM".into());
        e.ret = Some(-(libc::EPERM as i64));
        e.seccomp_filter = confirmed.then_some(true);
    })]
}

/// Every row of the rules, and the refinements grade.rs makes.
const FAILURES: &[Failure] = &[
    Failure {
        name: "exec-enoent",
        make: |p, t| {
            vec![failed(
                p,
                t,
                "execve",
                libc::ENOENT,
                "/nonexistent-golden/bin/tool",
            )]
        },
        words: "tool: not found",
    },
    Failure {
        name: "exec-eacces",
        make: |p, t| {
            vec![failed(
                p,
                t,
                "execve",
                libc::EACCES,
                "/nonexistent-golden/run.sh",
            )]
        },
        words: "/nonexistent-golden/run.sh: Permission denied",
    },
    Failure {
        name: "exec-noexec",
        // the span mounted it noexec (a span's own mount, not the host's:
        // the eBPF source reads the host's mount table on arrival)
        make: |p, t| {
            vec![
                with(ev(Kind::Mount, p, t), |e| {
                    e.path = Some(DIR.into());
                    e.flags = Some(libc::MS_NOEXEC);
                }),
                failed(
                    p,
                    t + 1,
                    "execve",
                    libc::EACCES,
                    "/nonexistent-golden/run.sh",
                ),
            ]
        },
        words: "/nonexistent-golden/run.sh: Permission denied",
    },
    Failure {
        name: "open-erofs",
        make: |p, t| open_to_write(p, t, libc::EROFS, "/nonexistent-golden/out.txt"),
        words: "Read-only file system",
    },
    Failure {
        name: "write-enospc",
        make: |p, t| {
            vec![with(failed(p, t, "write", libc::ENOSPC, ""), |e| {
                e.fd = Some(3)
            })]
        },
        words: "No space left on device",
    },
    Failure {
        name: "open-edquot",
        make: |p, t| open_to_write(p, t, libc::EDQUOT, "/nonexistent-golden/q"),
        words: "Disk quota exceeded",
    },
    Failure {
        name: "write-efbig",
        make: |p, t| vec![failed(p, t, "write", libc::EFBIG, "")],
        words: "File too large",
    },
    Failure {
        name: "clone-eagain",
        make: |p, t| vec![failed(p, t, "clone", libc::EAGAIN, "")],
        words: "fork: Resource temporarily unavailable",
    },
    Failure {
        name: "clone-enomem",
        make: |p, t| vec![failed(p, t, "clone", libc::ENOMEM, "")],
        words: "fork: Cannot allocate memory",
    },
    Failure {
        name: "open-emfile",
        make: |p, t| {
            vec![failed(
                p,
                t,
                "openat",
                libc::EMFILE,
                "/nonexistent-golden/f",
            )]
        },
        words: "Too many open files",
    },
    Failure {
        name: "open-enfile",
        make: |p, t| {
            vec![failed(
                p,
                t,
                "openat",
                libc::ENFILE,
                "/nonexistent-golden/f",
            )]
        },
        words: "Too many open files in system",
    },
    Failure {
        name: "mmap-enomem",
        make: |p, t| vec![failed(p, t, "mmap", libc::ENOMEM, "")],
        words: "MemoryError",
    },
    Failure {
        name: "connect-refused",
        make: |p, t| vec![connect(p, t, libc::ECONNREFUSED)],
        words: "Connection refused",
    },
    Failure {
        name: "connect-netunreach",
        make: |p, t| vec![connect(p, t, libc::ENETUNREACH)],
        words: "Network is unreachable",
    },
    Failure {
        name: "connect-inprogress",
        make: |p, t| vec![connect(p, t, libc::EINPROGRESS)],
        words: "timed out",
    },
    Failure {
        name: "mount-eperm",
        make: |p, t| {
            vec![failed(
                p,
                t,
                "mount",
                libc::EPERM,
                "/nonexistent-golden/mnt",
            )]
        },
        words: "mount: permission denied",
    },
    Failure {
        name: "open-write-eacces",
        make: |p, t| open_to_write(p, t, libc::EACCES, "/nonexistent-golden/w.txt"),
        words: "/nonexistent-golden/w.txt: Permission denied",
    },
    Failure {
        name: "open-read-eacces",
        make: |p, t| {
            vec![failed(
                p,
                t,
                "openat",
                libc::EACCES,
                "/nonexistent-golden/r.txt",
            )]
        },
        words: "/nonexistent-golden/r.txt: Permission denied",
    },
    Failure {
        name: "mkdir-enoent",
        make: |p, t| {
            vec![failed(
                p,
                t,
                "mkdirat",
                libc::ENOENT,
                "/nonexistent-golden/a/b",
            )]
        },
        words: "/nonexistent-golden/a/b: No such file or directory",
    },
    Failure {
        name: "open-enoent",
        make: |p, t| {
            vec![failed(
                p,
                t,
                "openat",
                libc::ENOENT,
                "/nonexistent-golden/data.csv",
            )]
        },
        words: "/nonexistent-golden/data.csv: No such file or directory",
    },
    Failure {
        name: "open-enoent-existing-outside",
        make: |p, t| vec![failed(p, t, "openat", libc::ENOENT, "/etc/passwd")],
        words: "/etc/passwd: No such file or directory",
    },
    Failure {
        name: "stat-enoent",
        make: |p, t| {
            vec![failed(
                p,
                t,
                "newfstatat",
                libc::ENOENT,
                "/nonexistent-golden/cfg",
            )]
        },
        words: "/nonexistent-golden/cfg: No such file or directory",
    },
    Failure {
        name: "seccomp-confirmed",
        make: |p, t| seccomp_denial(p, t, true),
        words: "Operation not permitted",
    },
    Failure {
        name: "seccomp-unconfirmed",
        make: |p, t| seccomp_denial(p, t, false),
        words: "Operation not permitted",
    },
    Failure {
        name: "persistence",
        make: |p, t| {
            vec![with(
                failed(
                    p,
                    t,
                    "openat",
                    libc::ENOENT,
                    "/nonexistent-golden/state.json",
                ),
                |e| {
                    e.written_earlier = Some(WrittenEarlier {
                        span: 7,
                        pid: 3,
                        comm: "w".into(),
                        syscall: "openat".into(),
                        // in the future: "0 ms earlier" on any clock
                        at_ms: i64::MAX / 2,
                        mount_ns: None,
                        path: None,
                    })
                },
            )]
        },
        words: "/nonexistent-golden/state.json: No such file or directory",
    },
    Failure {
        name: "uring-eacces",
        make: |p, t| {
            vec![with(
                failed(p, t, "openat", libc::EACCES, "/nonexistent-golden/u.txt"),
                |e| {
                    e.kind = Kind::UringFailed;
                    e.io_uring_op = Some("openat".into());
                },
            )]
        },
        words: "/nonexistent-golden/u.txt: Permission denied",
    },
];

/// The PATH search a shell makes before saying `not found` (exit 127).
fn path_search(pid: u32, ts: u64) -> Vec<KernelEvent> {
    [
        "/usr/local/bin/golden-cmd",
        "/usr/bin/golden-cmd",
        "/bin/golden-cmd",
    ]
    .iter()
    .enumerate()
    .map(|(i, p)| failed(pid, ts + i as u64, "execve", libc::ENOENT, p))
    .collect()
}

/// The span and outcome of one case: `failures` (each at its own time) in
/// `place`, the root ending by `ending`, with or without `words`.
fn case(
    failures: &[&Failure],
    place: Place,
    ending: Ending,
    words: bool,
) -> (SpanEvidence, Outcome) {
    let root = 10;
    let child = 11;
    let mut events = Vec::new();
    let failer = match place {
        Place::Root => root,
        _ => {
            events.push(fork(root, child, MS));
            events.push(exec(child, 2 * MS, "helper"));
            child
        }
    };
    for (i, f) in failures.iter().enumerate() {
        events.extend((f.make)(failer, (10 + i as u64) * MS));
    }
    let child_code = match (place, ending) {
        (Place::ExitPath, Ending::Exit127) => 127,
        (Place::ExitPath, Ending::Exit0) | (Place::ChildExited0, _) => 0,
        _ => 1,
    };
    match place {
        Place::Root | Place::StillRunning => {}
        Place::ExitPath | Place::OffPath | Place::ChildExited0 => {
            events.push(exit(child, 30 * MS, child_code))
        }
        Place::StoppedByAncestor => {
            events.push(signal_from(child, 30 * MS, "SIGTERM", (root, "w"), 0));
            events.push(exit_with(child, 31 * MS, None));
        }
    }
    if matches!(ending, Ending::Exit127) {
        events.extend(path_search(root, 40 * MS));
    }
    let end = 50 * MS;
    let mut outcome = match ending {
        Ending::Exit1 => outcome(1),
        Ending::Exit127 => outcome(127),
        Ending::Exit0 => outcome(0),
        Ending::OwnAbort => {
            events.push(signal_from(root, end, "SIGABRT", (root, "w"), -6));
            killed_by("SIGABRT")
        }
        Ending::OwnSegv => {
            events.push(signal_from(root, end, "SIGSEGV", (root, "w"), 1));
            killed_by("SIGSEGV")
        }
        Ending::Timeout => {
            events.push(signal_from(root, end, "SIGKILL", (1, "caller"), 0));
            Outcome {
                timed_out: Some(std::time::Duration::from_secs(5)),
                ..killed_by("SIGKILL")
            }
        }
    };
    let root_code = match ending {
        Ending::Exit1 => Some(1),
        Ending::Exit127 => Some(127),
        Ending::Exit0 => Some(0),
        _ => None,
    };
    events.push(exit_with(root, end + MS, root_code));
    outcome.duration_ns = end + MS;
    if words {
        let said: Vec<&str> = failures.iter().map(|f| f.words).collect();
        outcome.words = Words {
            command: Some(format!("helper {DIR}/data.csv {DIR}/cfg")),
            output: Some(said.join("\n")),
        };
    }
    (span(events), outcome)
}

fn fnv64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// An event's index in the span, or -1.
fn index_of(span: &SpanEvidence, e: &KernelEvent) -> i64 {
    span.events
        .iter()
        .position(|s| s.ts_ns == e.ts_ns && s.pid == e.pid && s.kind == e.kind)
        .map_or(-1, |i| i as i64)
}

/// The host the cases close on: /etc/passwd exists, nothing under
/// [`DIR`] does.
const HOST: FixedHost = FixedHost {
    existing: &["/etc/passwd"],
    now_ms: 0,
};

/// One line: the case's name and its verdict.
fn verdict_line(name: &str, mut span: SpanEvidence, outcome: &Outcome) -> String {
    crate::facts::capture(&mut span, outcome.exit.signal.as_deref(), &HOST);
    let span = &span;
    let a = attribute(span, outcome);
    let events: Vec<String> = a
        .events
        .iter()
        .map(|e| index_of(span, e).to_string())
        .collect();
    format!(
        "{name} {} {} {:.2} d={} h={} n={} e={} x={:016x}",
        a.primitive.id(),
        a.layer.map_or("-", |l| l.id()),
        a.confidence,
        a.decisive.as_ref().map_or(-1, |d| index_of(span, d)),
        a.hidden_failure
            .as_ref()
            .map_or("-".to_string(), |h| h.primitive.id().to_string()),
        a.noticed.len(),
        events.join(","),
        fnv64(&a.explanation),
    )
}

/// Calls `f` with every case's name, span and outcome, in a fixed order.
fn for_each_case(mut f: impl FnMut(String, SpanEvidence, Outcome)) {
    for failure in FAILURES {
        for place in PLACES {
            for ending in ENDINGS {
                for words in [false, true] {
                    let (span, outcome) = case(&[failure], place, ending, words);
                    let name = format!("{}/{place:?}/{ending:?}/{}", failure.name, words as u8);
                    f(name, span, outcome);
                }
            }
        }
    }
    for a in FAILURES {
        for b in FAILURES {
            for ending in [Ending::Exit1, Ending::Exit127, Ending::OwnAbort] {
                let (span, outcome) = case(&[a, b], Place::Root, ending, false);
                f(
                    format!("{}+{}/Root/{ending:?}/0", a.name, b.name),
                    span,
                    outcome,
                );
            }
        }
    }
}

/// Every case's line, in a fixed order.
fn all_lines() -> String {
    let mut out = String::new();
    for_each_case(|name, span, outcome| {
        let _ = writeln!(out, "{}", verdict_line(&name, span, &outcome));
    });
    out
}

#[test]
fn every_generated_case_keeps_its_verdict() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/attribution/golden/verdicts.txt");
    let now = all_lines();
    if std::env::var_os("PROBE_BLESS").is_some() {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, &now).unwrap();
        return;
    }
    let blessed = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e} (PROBE_BLESS=1 writes it)", file.display()));
    let differ: Vec<String> = blessed
        .lines()
        .zip(now.lines())
        .filter(|(b, n)| b != n)
        .take(20)
        .map(|(b, n)| format!("  was {b}\n  now {n}"))
        .collect();
    assert!(
        differ.is_empty() && blessed.lines().count() == now.lines().count(),
        "{} of {} verdicts moved ({} lines blessed); the first:\n{}",
        blessed
            .lines()
            .zip(now.lines())
            .filter(|(b, n)| b != n)
            .count(),
        now.lines().count(),
        blessed.lines().count(),
        differ.join("\n")
    );
}

#[test]
fn the_generated_cases_reach_every_primitive_the_rules_name_and_both_layers() {
    let lines = all_lines();
    for p in crate::primitive::RULES.iter().map(|r| r.primitive.id()) {
        assert!(
            lines.lines().any(|l| l.split(' ').nth(1) == Some(p)),
            "no case is judged {p}"
        );
    }
    for p in [
        "seccomp",
        "fs.persistence",
        "fs.noexec",
        "none",
        "exec.missing",
    ] {
        assert!(
            lines.lines().any(|l| l.split(' ').nth(1) == Some(p)),
            "no case is judged {p}"
        );
    }
    for layer in [" sandbox ", " test ", " - "] {
        assert!(lines.contains(layer), "no case has layer {layer:?}");
    }
}

/// Every case stored as the daemon stores it (its events, its verdict, its
/// replay input, through JSON) and attributed again from that alone gets
/// its verdict again.
#[test]
fn every_generated_case_replays_to_its_verdict() {
    use super::{Attribution, VerdictView, reattribute};
    use crate::spans::Replay;
    let mut checked = 0;
    for_each_case(|name, mut span, outcome| {
        crate::facts::capture(&mut span, outcome.exit.signal.as_deref(), &HOST);
        let mut live = attribute(&span, &outcome);
        // what the store keeps with `keep_events = "all"`
        live.events = span.events.iter().cloned().collect();
        let replay = span.replay(&outcome);
        let stored: Attribution =
            serde_json::from_str(&serde_json::to_string(&live).unwrap()).unwrap();
        let replay: Replay =
            serde_json::from_str(&serde_json::to_string(&replay).unwrap()).unwrap();
        let again = reattribute(&stored, &replay);
        assert_eq!(
            VerdictView::from(&again),
            VerdictView::from(&live),
            "{name}: replayed, the verdict moved"
        );
        checked += 1;
    });
    assert_eq!(checked, all_lines().lines().count());
}
