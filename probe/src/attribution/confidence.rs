//! The one table of confidences, and the levels ranking compares.
//!
//! Every verdict rests on a [`Basis`]: what the kernel showed (an OOM kill,
//! a rule's failure, a seccomp denial…) or what ranking concluded (nothing
//! the kernel saw explains it). Its confidence comes from [`confidence`],
//! its level from [`level`]; no other file of attribution writes a number.
//! Ranking compares levels, and confidences only to order verdicts within
//! a level.

use crate::primitive::Rule;

/// How much a failure or a verdict weighs, in the order ranking compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// A failed lookup that nothing corroborates: seen, never the cause.
    Weak,
    /// A failed lookup the workload's words or its command name.
    Corroborated,
    /// A refusal that stands alone but not over a hard limit: an exec
    /// refused by permissions, a connect still pending, a seccomp denial
    /// the filter's flag did not confirm.
    Standing,
    /// A denial or a hard limit: a program does not do without it.
    Hard,
    /// Settles a status on its own, over a shell's "not found" too: a
    /// confirmed seccomp denial, lost state, a noexec mount, a command
    /// missing at the shell's 127.
    Decisive,
}

/// What a verdict or a failure's grade rests on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Basis {
    /// The rule table's row for the failure (its weight is the row's).
    Rule(&'static Rule),
    SeccompDenial {
        confirmed: bool,
    },
    /// A path an earlier call wrote is gone.
    Persistence,
    /// An exec refused on a mount the span made noexec.
    Noexec,
    /// The exec's ENOENT, and the span's status is the shell's 127.
    ExecMissingAt127,
    /// A shell's PATH search found nothing.
    CommandNotFound {
        status_127: bool,
    },
    /// Under gVisor: the shell said so, its stat lookups failed.
    CommandNotFoundSaid,
    OomKill,
    CallerTimeout,
    SeccompKill,
    FileSizeSignal,
    Signal,
    /// A refused resource request right before the process's own crash.
    RefusalBehindCrash,
    /// Missing files right before the process's own abort.
    MissingFilesBehindAbort,
    MemoryPressure,
    /// A call Linux accepts that the sandbox's own kernel refused.
    SandboxKernel,
    NoKernelCause,
    /// Exited 0, but the OOM killer took one of its processes.
    SuccessAfterDeath,
    Success,
    /// A hidden failure: an OOM kill in a span that exited 0.
    HiddenOom,
    /// A hidden failure: a fifth of the span's time in memory reclaim.
    HiddenPressure,
}

/// A verdict taken from a helper its ancestor stopped: the stop is the
/// status, the helper's failure a likely reason for it.
pub const STOPPED_HELPER: f64 = 0.9;

/// A failure a process that exited 0 most likely reported to its parent.
pub const REPORTED_ELSEWHERE: f64 = 0.8;

/// The confidence of a basis: the one table.
pub fn confidence(basis: Basis) -> f64 {
    match basis {
        // the one widening: the rule table's weights are f32 (0.95 is
        // 0.9499999…, under Decisive; verdicts show it rounded)
        Basis::Rule(rule) => rule.weight as f64,
        Basis::SeccompDenial { confirmed: true } => 0.97,
        Basis::SeccompDenial { confirmed: false } => 0.6,
        Basis::Persistence => 0.95,
        Basis::Noexec => 0.95,
        Basis::ExecMissingAt127 => 0.97,
        Basis::CommandNotFound { status_127: true } => 0.95,
        // without the shell's 127, a denial or hard limit outranks it
        Basis::CommandNotFound { status_127: false } => 0.85,
        Basis::CommandNotFoundSaid => 0.9,
        Basis::OomKill => 0.97,
        Basis::CallerTimeout => 0.95,
        Basis::SeccompKill => 0.97,
        Basis::FileSizeSignal => 0.9,
        Basis::Signal => 0.9,
        Basis::RefusalBehindCrash => 0.9,
        // programs look for optional files all the time
        Basis::MissingFilesBehindAbort => 0.75,
        Basis::MemoryPressure => 0.6,
        Basis::SandboxKernel => 0.8,
        Basis::NoKernelCause => 0.7,
        Basis::SuccessAfterDeath => 0.9,
        Basis::Success => 0.95,
        Basis::HiddenOom => 0.9,
        Basis::HiddenPressure => 0.6,
    }
}

/// The level of a basis that stands on its own (a lookup's level is its
/// grade's: weak or corroborated).
pub fn level(basis: Basis) -> Level {
    match basis {
        Basis::SeccompDenial { confirmed: true }
        | Basis::Persistence
        | Basis::Noexec
        | Basis::ExecMissingAt127
        | Basis::CommandNotFound { status_127: true }
        | Basis::OomKill
        | Basis::CallerTimeout
        | Basis::SeccompKill
        | Basis::Success => Level::Decisive,
        // rows of 0.9 and 0.95 are denials and hard limits; 0.85 (an exec
        // refused by permissions) and 0.5 (a pending connect) are not
        Basis::Rule(rule) if rule.weight >= 0.9 => Level::Hard,
        Basis::CommandNotFoundSaid
        | Basis::FileSizeSignal
        | Basis::Signal
        | Basis::RefusalBehindCrash
        | Basis::SuccessAfterDeath
        | Basis::HiddenOom => Level::Hard,
        Basis::Rule(_)
        | Basis::SeccompDenial { confirmed: false }
        | Basis::CommandNotFound { status_127: false }
        | Basis::MissingFilesBehindAbort
        | Basis::MemoryPressure
        | Basis::SandboxKernel
        | Basis::NoKernelCause
        | Basis::HiddenPressure => Level::Standing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every basis, each rule row once.
    fn every_basis() -> Vec<Basis> {
        let mut all: Vec<Basis> = crate::primitive::RULES.iter().map(Basis::Rule).collect();
        all.extend([
            Basis::SeccompDenial { confirmed: true },
            Basis::SeccompDenial { confirmed: false },
            Basis::Persistence,
            Basis::Noexec,
            Basis::ExecMissingAt127,
            Basis::CommandNotFound { status_127: true },
            Basis::CommandNotFound { status_127: false },
            Basis::CommandNotFoundSaid,
            Basis::OomKill,
            Basis::CallerTimeout,
            Basis::SeccompKill,
            Basis::FileSizeSignal,
            Basis::Signal,
            Basis::RefusalBehindCrash,
            Basis::MissingFilesBehindAbort,
            Basis::MemoryPressure,
            Basis::SandboxKernel,
            Basis::NoKernelCause,
            Basis::SuccessAfterDeath,
            Basis::Success,
            Basis::HiddenOom,
            Basis::HiddenPressure,
        ]);
        all
    }

    /// The thresholds ranking compared confidences with before there were
    /// levels: 0.895 for a denial or hard limit (0.9 rows as f32 widen to
    /// 0.8999…), 0.95 for what settles a status on its own. The levels
    /// must give the same answers, quirks included (0.95 rows are f32).
    #[test]
    fn levels_reproduce_the_old_thresholds() {
        for b in every_basis() {
            let c = confidence(b);
            assert_eq!(
                level(b) >= Level::Hard,
                c >= 0.895,
                "{b:?}: confidence {c}, level {:?}",
                level(b)
            );
            assert_eq!(
                level(b) == Level::Decisive,
                c >= 0.95,
                "{b:?}: confidence {c}, level {:?}",
                level(b)
            );
        }
    }

    /// Attribution is a function of the span's evidence: nothing in it
    /// reads the host (files, procfs, PSI, the clock). What it needs of
    /// the host was captured when the span closed (`crate::facts`).
    #[test]
    fn attribution_reads_no_host() {
        let found = code_lines_where(|line| {
            [
                "std::fs",
                "Path::new",
                "\"/proc",
                "\"/sys",
                "clock::",
                "psi_memory",
                "SystemTime",
                "Instant::now",
                "procfs::",
                "crate::mounts",
                "crate::cgroup",
            ]
            .iter()
            .any(|read| line.contains(read))
        });
        assert!(
            found.is_empty(),
            "attribution reads the host:\n{}",
            found.join("\n")
        );
    }

    /// Attribution names no source of evidence: what a source cannot see
    /// reaches it as data (`Sight`), so the next source is a module of its
    /// own, not a branch here.
    #[test]
    fn attribution_names_no_source() {
        let found = code_lines_where(|line| {
            ["gvisor::", "Source::Gvisor", "Source::Ebpf", "loader::"]
                .iter()
                .any(|source| line.contains(source))
        });
        assert!(
            found.is_empty(),
            "attribution names a source:\n{}",
            found.join("\n")
        );
    }

    /// No number in attribution's code outside this table: a confidence
    /// written anywhere else is a second vocabulary.
    #[test]
    fn no_confidence_literal_outside_the_table() {
        let found = code_lines_where(|line| {
            let bytes = line.as_bytes();
            (1..bytes.len().saturating_sub(1)).any(|i| {
                bytes[i] == b'.'
                    && bytes[i - 1] == b'0'
                    && (b'1'..=b'9').contains(&bytes[i + 1])
                    && (i < 2 || !bytes[i - 2].is_ascii_alphanumeric() && bytes[i - 2] != b'.')
            })
        })
        .into_iter()
        .filter(|l| !l.starts_with("confidence.rs:"))
        .collect::<Vec<_>>();
        assert!(
            found.is_empty(),
            "confidences written outside confidence.rs:\n{}",
            found.join("\n")
        );
    }

    /// Errnos and signals are compared as constants (`errno_is(Errno::
    /// ENOENT)`, `is_signal(…, Signal::SIGKILL)`), never as strings: a
    /// misspelled name would match nothing, silently.
    #[test]
    fn no_errno_or_signal_compared_as_a_string() {
        let found = code_lines_where(|line| {
            ["\"E", "\"SIG"].iter().any(|quote| {
                line.match_indices(quote).any(|(i, _)| {
                    let name: String = line[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
                        .collect();
                    // a whole quoted name, not a sentence that starts so
                    name.len() >= 4 && line[i + 1 + name.len()..].starts_with('"')
                })
            })
        });
        assert!(
            found.is_empty(),
            "errnos or signals compared as strings:\n{}",
            found.join("\n")
        );
    }

    /// `file:line: code` of every line of attribution's code (its files
    /// up to their tests, comments cut off) that `hit` accepts. The
    /// test-only modules (golden.rs, testing.rs) build spans and bless
    /// files: they are not attribution.
    fn code_lines_where(hit: impl Fn(&str) -> bool) -> Vec<String> {
        let files = [
            ("mod.rs", include_str!("mod.rs")),
            ("rank.rs", include_str!("rank.rs")),
            ("failures.rs", include_str!("failures.rs")),
            ("grade.rs", include_str!("grade.rs")),
            ("lineage.rs", include_str!("lineage.rs")),
            ("steps.rs", include_str!("steps.rs")),
            ("confidence.rs", include_str!("confidence.rs")),
        ];
        let mut found = Vec::new();
        for (name, text) in files {
            let code = text.split("\nmod tests").next().unwrap();
            for (n, line) in code.lines().enumerate() {
                let line = line.split("//").next().unwrap();
                if hit(line) {
                    found.push(format!("{name}:{}: {}", n + 1, line.trim()));
                }
            }
        }
        found
    }
}
