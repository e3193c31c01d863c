//! Grading: every failure event of a span is weighed once, before any
//! ranking, into a [`Level`] (see [`super::confidence`]), and the ranking
//! reads only these grades.
//!
//! - **Standing**, **hard** or **decisive** evidence stands alone: a denial
//!   or a hard limit (seccomp,
//!   EROFS, ENOSPC/EDQUOT, EAGAIN on fork, EMFILE/ENFILE, a refused or
//!   unreachable connect, a missing privilege, a write refused by
//!   permissions, an exec that failed, state an earlier call wrote and
//!   this one lost).
//! - A failed lookup is **weak**: ENOENT or ENOTDIR on any path,
//!   EACCES or EPERM on a read, stat, access or readlink. Every program
//!   makes such lookups by the hundred (search paths of compilers,
//!   interpreters and loaders, message catalogs, optional configuration
//!   files) and most tolerate them, so a weak failure is a cause only
//!   when something **corroborates** it (and is then graded so): the workload's own words (its
//!   output, or the result the caller got) name the path, or the command
//!   it was asked to run names it. A traceback, a failed test or an error
//!   that names no failed path corroborates nothing.
//!
//! A path is named when a word of the text is the path as the failing
//! call gave it, or when one side is relative and is the other's tail
//! (`foo.h` names `/usr/include/foo.h`; a tail is a file name with an
//! extension or several components). Two absolute paths must be equal:
//! `/app/index.js` in a traceback does not name
//! `/app/node_modules/x/index.js`. A stat or access is a check, not a
//! need: the command naming it (`gcc … -o out` stats `out` before writing
//! it) does not corroborate it, nor does any word for a bare name (no
//! directory, no extension: `test_sum`), which any text may say.
//!
//! A failure is **superseded**, and no evidence at all, when its process
//! got past it: a successful exec in the same process replaced its
//! program image (a PATH search or a wrapper coped with it), or the same
//! process later opened the same path for writing (it made the directory,
//! or waited for the mount, and tried again).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::event::{KernelEvent, Kind};
use crate::primitive::{Primitive, classify};
use crate::spans::SpanEvidence;
use crate::syscalls::SyscallClass;

use super::Words;
use super::confidence::{Basis, Level, confidence, level};

/// What the failed call was for, as the rules tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Starting a program (execve, execveat).
    Exec,
    /// Creating or changing a path (an open to write, mkdir, rename…).
    Write,
    /// Opening a path to read it, or entering it.
    Read,
    /// Looking a path up without needing it (stat, access, readlink): a
    /// check, not a need.
    Probe,
    Connect,
    Fork,
    Memory,
    /// A call that needs a capability (mount, unshare, bpf…).
    Privileged,
    /// Any other call a rule names (a write that found the disk full, an
    /// open over the fd limit).
    Resource,
    /// A call the seccomp filter denied.
    Seccomp,
    /// A lookup of a path an earlier call wrote.
    Persistence,
}

impl Role {
    fn of(class: SyscallClass) -> Role {
        match class {
            SyscallClass::Exec => Role::Exec,
            SyscallClass::PathWrite => Role::Write,
            SyscallClass::PathRead => Role::Read,
            SyscallClass::PathProbe => Role::Probe,
            SyscallClass::Connect => Role::Connect,
            SyscallClass::Fork => Role::Fork,
            SyscallClass::Memory => Role::Memory,
            SyscallClass::Privileged => Role::Privileged,
            SyscallClass::Any => Role::Resource,
        }
    }
}

/// What corroborated a weak failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Witness {
    /// The workload's output (or the result its caller got) names the path.
    Said,
    /// The command the workload was asked to run names the path.
    Asked,
}

impl Witness {
    /// The clause an explanation ends with.
    pub fn clause(self) -> &'static str {
        match self {
            Witness::Said => "the workload's own output names it",
            Witness::Asked => "the command names it",
        }
    }
}

/// One failure's grade.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grade {
    pub primitive: Primitive,
    pub level: Level,
    /// What graded it: the rule row, or a refinement (a seccomp denial,
    /// lost state); its confidence orders failures within a level.
    pub basis: Basis,
    pub role: Role,
    /// For a lookup: what named it, if anything did.
    pub witness: Option<Witness>,
    /// Its program image was replaced by a later exec: no evidence.
    pub superseded: bool,
}

impl Grade {
    /// Whether the failure may be named as a cause: it stands alone, or
    /// it is corroborated.
    pub fn counts(&self) -> bool {
        self.level >= Level::Corroborated
    }

    /// The confidence of its basis: orders failures within a level.
    pub fn weight(&self) -> f64 {
        confidence(self.basis)
    }
}

/// The grades of one span's events, by index.
pub struct Grades {
    grades: Vec<Option<Grade>>,
}

impl Grades {
    /// Grades every failure of `span`; `words` are the witnesses.
    pub fn of(span: &SpanEvidence, words: &Words) -> Grades {
        let said = Names::of(words.output.as_deref().unwrap_or(""));
        let asked = Names::of(words.command.as_deref().unwrap_or(""));
        let later = Later::of(&span.events);
        let grades = (0..span.events.len())
            .map(|i| {
                let mut grade = weigh(span, &span.events, i, &later)?;
                if grade.level != Level::Weak {
                    return Some(grade);
                }
                let ev = &span.events[i];
                let path = ev.path.as_deref().unwrap_or("");
                let cut = ev.path_truncated == Some(true);
                let probe = grade.role == Role::Probe;
                // a bare name (no directory, no extension) is a word any
                // text may say: it is named only where the call needed it
                let bare = !path.starts_with('/') && !specific(path);
                grade.witness = if bare && probe {
                    None
                } else if said.names(path, cut) {
                    Some(Witness::Said)
                } else if !probe && asked.names(path, cut) {
                    // a stat or access of a path the command names is a
                    // check (does the output exist yet?), not a need
                    Some(Witness::Asked)
                } else {
                    None
                };
                if grade.witness.is_some() {
                    grade.level = Level::Corroborated;
                }
                Some(grade)
            })
            .collect();
        Grades { grades }
    }

    /// Any graded failure at index `i`, corroborated or not; never a
    /// superseded one.
    pub fn get(&self, i: usize) -> Option<Grade> {
        self.grades
            .get(i)
            .copied()
            .flatten()
            .filter(|g| !g.superseded)
    }

    /// The failure at `i` as evidence, when it may be named as a cause.
    pub fn evidence(&self, i: usize) -> Option<Grade> {
        self.get(i).filter(Grade::counts)
    }

    /// The failure at `i` is weak and nothing corroborated it: shown as
    /// noticed, never as the cause.
    pub fn uncorroborated(&self, i: usize) -> bool {
        self.get(i).is_some_and(|g| !g.counts())
    }
}

/// Index of the last successful exec per pid: a failure before it belongs
/// to a program image that was replaced.
pub(super) fn last_exec(events: &VecDeque<KernelEvent>) -> HashMap<u32, usize> {
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == Kind::Exec)
        .map(|(i, e)| (e.pid, i))
        .collect()
}

/// What each process did last, by event index, read once per span so
/// grading stays linear in its events (a span of a shell's PATH search
/// has thousands of failures).
struct Later<'a> {
    /// pid → index of its last successful exec.
    execs: HashMap<u32, usize>,
    /// (pid, path) → index of its last write to that path.
    writes: HashMap<(u32, &'a str), usize>,
}

impl<'a> Later<'a> {
    fn of(events: &'a VecDeque<KernelEvent>) -> Later<'a> {
        let writes = events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == Kind::FileWrite)
            .filter_map(|(i, e)| Some(((e.pid, e.path.as_deref()?), i)))
            .collect();
        Later {
            execs: last_exec(events),
            writes,
        }
    }

    /// Whether failure `i`'s program image was replaced after it.
    fn exec_after(&self, ev: &KernelEvent, i: usize) -> bool {
        self.execs.get(&ev.pid).is_some_and(|&x| x > i)
    }

    /// Whether the process of failure `i` later opened the same path for
    /// writing: it got past the failure on that object. Not for what the
    /// session wrote before and is gone: its loss is read by the
    /// persistence rule, which a later write does not undo.
    fn written_after(&self, ev: &KernelEvent, i: usize) -> bool {
        let Some(path) = ev.path.as_deref().filter(|_| ev.written_earlier.is_none()) else {
            return false;
        };
        self.writes.get(&(ev.pid, path)).is_some_and(|&w| w > i)
    }
}

/// A failure event's grade before its witnesses are read (a lookup is
/// weak until then); None when it is not a failure any rule names.
fn weigh(
    span: &SpanEvidence,
    events: &VecDeque<KernelEvent>,
    i: usize,
    later: &Later<'_>,
) -> Option<Grade> {
    let ev = &events[i];
    if !(ev.kind.is_failure() || ev.kind == Kind::SeccompDenied) {
        return None;
    }
    let errno = ev.errno_nr()?;
    let syscall = ev.syscall.as_deref()?;
    let graded = |primitive, basis, role| Grade {
        primitive,
        level: level(basis),
        basis,
        role,
        witness: None,
        superseded: false,
    };
    if ev.kind == Kind::SeccompDenied {
        let confirmed = ev.seccomp_filter == Some(true);
        let basis = Basis::SeccompDenial { confirmed };
        return Some(graded(Primitive::Seccomp, basis, Role::Seccomp));
    }
    // its program image was replaced: it coped, as a PATH search or a
    // wrapper does; or it tried again and wrote the same path
    let superseded = later.exec_after(ev, i) || later.written_after(ev, i);
    if superseded {
        let rule = classify(syscall, errno, ev.flags.unwrap_or(0))?;
        return Some(Grade {
            superseded: true,
            ..graded(rule.primitive, Basis::Rule(rule), Role::of(rule.class))
        });
    }
    if ev.written_earlier.is_some()
        && matches!(errno, libc::ENOENT | libc::ENOTDIR)
        && !made_again_later(events, i)
    {
        return Some(graded(
            Primitive::FsPersistence,
            Basis::Persistence,
            Role::Persistence,
        ));
    }
    let flags = ev.flags.unwrap_or(0);
    let rule = classify(syscall, errno, flags)?;
    let lookup = rule.primitive == Primitive::FsMissing
        || (rule.primitive == Primitive::FsPermission && rule.class == SyscallClass::PathRead);
    let mut grade = graded(rule.primitive, Basis::Rule(rule), Role::of(rule.class));
    if lookup {
        grade.level = Level::Weak;
    }
    if grade.primitive == Primitive::FsPermission && crate::syscalls::EXEC.contains(&syscall) {
        let path = ev.path.as_deref().unwrap_or("");
        let noexec_mount_in_span = span.events.iter().any(|m| {
            m.kind == Kind::Mount
                && m.flags.unwrap_or(0) & libc::MS_NOEXEC != 0
                && m.path.as_deref().is_some_and(|t| path.starts_with(t))
        });
        if ev.mount_noexec == Some(true) || noexec_mount_in_span {
            // graded by its row (0.85) until explained: the verdict is
            // decisive (`Basis::Noexec`), the failure among others is not
            grade.primitive = Primitive::FsNoexec;
        }
    }
    Some(grade)
}

/// Whether a failed look-up (stat, access, an open to read: not a call
/// that creates, whose ENOENT says a directory above is gone) found a path
/// missing that the span then made itself, at or below the path an earlier
/// span's write was remembered under: a check before creating (a linker's
/// `stat` of the output the last failed link removed) or a directory that
/// persisted and gets a new file (python's `.pyc` beside its temp file).
/// Nothing the session wrote is shown lost by that; its own programs
/// remove files too, and the probe does not see a removal.
fn made_again_later(events: &VecDeque<KernelEvent>, i: usize) -> bool {
    let ev = &events[i];
    let (Some(syscall), flags) = (ev.syscall.as_deref(), ev.flags.unwrap_or(0)) else {
        return false;
    };
    if crate::syscalls::is_in(syscall, flags, SyscallClass::PathWrite) {
        return false;
    }
    let written = ev.written_earlier.as_ref().and_then(|w| w.path.as_deref());
    let Some(path) = written.or(ev.path.as_deref()) else {
        return false;
    };
    events.iter().skip(i + 1).any(|w| {
        w.kind == Kind::FileWrite
            && w.path.as_deref().is_some_and(|p| {
                p == path || (p.starts_with(path) && p[path.len()..].starts_with('/'))
            })
    })
}

/// The path-like words of a text, for [`Names::names`].
struct Names {
    /// Every word as written.
    words: HashSet<String>,
    /// Tails of absolute words (`in.csv`, `data/in.csv` of
    /// `/tmp/t/data/in.csv`): what a relative path may name.
    tails: HashSet<String>,
}

impl Names {
    fn of(text: &str) -> Names {
        let mut words = HashSet::new();
        let mut tails = HashSet::new();
        // a path is letters, digits and `._-+~@%/`; quotes, colons,
        // commas, brackets and spaces end it
        let is_path_char = |c: char| c.is_alphanumeric() || "._-+~@%/".contains(c);
        for word in text.split(|c: char| !is_path_char(c)) {
            // a sentence's full stop is no part of the path
            let word = word.trim_end_matches('.');
            let word = word.strip_prefix("./").unwrap_or(word);
            // `file:///tmp/x` leaves `///tmp/x`
            let word = match word.trim_start_matches('/') {
                rest if rest.len() + 1 < word.len() => &word[word.len() - rest.len() - 1..],
                _ => word,
            };
            if word.is_empty() {
                continue;
            }
            if word.starts_with('/') {
                for tail in tails_of(word) {
                    tails.insert(tail.to_string());
                }
            }
            words.insert(word.to_string());
        }
        Names { words, tails }
    }

    /// Whether the text names `path` (see the module doc); `cut`: the
    /// kernel cut the path short, so a word that begins with it names it.
    fn names(&self, path: &str, cut: bool) -> bool {
        let path = path.strip_prefix("./").unwrap_or(path);
        if path.is_empty() {
            return false;
        }
        if self.words.contains(path) {
            return true;
        }
        if cut && self.words.iter().any(|w| w.starts_with(path)) {
            return true;
        }
        if path.starts_with('/') {
            // a relative word naming the absolute path's tail
            tails_of(path).any(|t| self.words.contains(t))
        } else {
            specific(path) && self.tails.contains(path)
        }
    }
}

/// The tails of absolute `path` after each `/` that say which file they
/// are: a name with an extension, or more than one component.
fn tails_of(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(move |(i, _)| &path[i + 1..])
        .filter(|t| specific(t))
}

/// A relative name specific enough to stand for a file: `foo.h`,
/// `data/in.csv`; not `lib` or `bin`, which any text may say.
fn specific(name: &str) -> bool {
    let name = name.trim_end_matches('/');
    !name.is_empty()
        && (name.contains('/') || name.trim_start_matches('.').contains('.'))
        && !name.starts_with('/')
}

#[cfg(test)]
mod tests {
    use super::super::testing::{MS, exit, failed, span};
    use super::*;

    fn words(command: &str, output: &str) -> Words {
        Words {
            command: Some(command.into()),
            output: Some(output.into()),
        }
    }

    fn grade_of(ev: KernelEvent, w: &Words) -> Grade {
        let s = span(vec![ev, exit(10, 9 * MS, 1)]);
        Grades::of(&s, w).get(0).expect("graded")
    }

    #[test]
    fn a_failure_its_own_process_got_past_on_the_same_path_is_superseded() {
        let words = Words::default();
        let write = |pid, path: &str| {
            let mut w = super::super::testing::ev(Kind::FileWrite, pid, 2 * MS);
            w.path = Some(path.into());
            w
        };
        let refused = || failed(10, MS, "openat", libc::EACCES, "/out/result.csv");
        // it tried again and wrote the file: no evidence at all
        let s = span(vec![
            refused(),
            write(10, "/out/result.csv"),
            exit(10, 9 * MS, 1),
        ]);
        let grades = Grades::of(&s, &words);
        assert_eq!(grades.get(0), None);
        assert_eq!(grades.evidence(0), None);
        // another process's write, or another path, is not its own
        for other in [write(11, "/out/result.csv"), write(10, "/out/other.csv")] {
            let s = span(vec![refused(), other, exit(10, 9 * MS, 1)]);
            let g = Grades::of(&s, &words).get(0).expect("still graded");
            assert!(!g.superseded, "{g:?}");
        }
    }

    #[test]
    fn a_failed_lookup_is_weak_and_a_denial_or_hard_limit_hard() {
        let none = Words::default();
        for (syscall, errno) in [
            ("openat", libc::ENOENT),
            ("newfstatat", libc::ENOENT),
            ("access", libc::ENOTDIR),
            ("readlink", libc::ENOENT),
            ("openat", libc::EACCES),
        ] {
            let g = grade_of(failed(10, MS, syscall, errno, "/x/y.conf"), &none);
            assert_eq!(g.level, Level::Weak, "{syscall} {errno}");
            assert!(!g.counts(), "{syscall} {errno}: uncorroborated");
        }
        for (syscall, errno, path) in [
            ("openat", libc::EROFS, "/x"),
            ("write", libc::ENOSPC, ""),
            ("clone", libc::EAGAIN, ""),
            ("openat", libc::EMFILE, "/x"),
            ("mkdir", libc::EACCES, "/x"),
            ("connect", libc::ECONNREFUSED, ""),
        ] {
            let g = grade_of(failed(10, MS, syscall, errno, path), &none);
            assert_eq!(g.level, Level::Hard, "{syscall} {errno}");
            assert!(g.counts());
        }
    }

    #[test]
    fn the_workloads_output_naming_the_path_corroborates_it() {
        let ev = || failed(10, MS, "openat", libc::ENOENT, "/data/in.csv");
        let w = words("", "cat: /data/in.csv: No such file or directory\n");
        assert_eq!(grade_of(ev(), &w).witness, Some(Witness::Said));
        // python's repr, a relative path as written
        let rel = failed(10, MS, "openat", libc::ENOENT, "data/in.csv");
        let w = words(
            "",
            "FileNotFoundError: [Errno 2] No such file or directory: 'data/in.csv'",
        );
        assert_eq!(grade_of(rel, &w).witness, Some(Witness::Said));
        // a compiler names the header it could not find by its name
        let header = failed(10, MS, "openat", libc::ENOENT, "/usr/include/foo.h");
        let w = words(
            "",
            "main.c:1:10: fatal error: foo.h: No such file or directory",
        );
        assert_eq!(grade_of(header, &w).witness, Some(Witness::Said));
        // a message ending a sentence with the path
        let w = words("", "could not open /data/in.csv.");
        assert_eq!(grade_of(ev(), &w).witness, Some(Witness::Said));
    }

    #[test]
    fn the_command_naming_the_path_corroborates_it() {
        let ev = failed(10, MS, "openat", libc::ENOENT, "/tmp/t/input.csv");
        let w = words("python3 -c open(\"/tmp/t/input.csv\").read()", "");
        assert_eq!(grade_of(ev, &w).witness, Some(Witness::Asked));
    }

    #[test]
    fn a_check_of_a_path_the_command_names_is_no_need_of_it() {
        // ld stats its output before writing it: `gcc x.c -o /tmp/link`
        let w = words("gcc /tmp/link.c -o /tmp/link", "undefined reference to `f'");
        let stat = failed(10, MS, "newfstatat", libc::ENOENT, "/tmp/link");
        assert_eq!(grade_of(stat.clone(), &w).witness, None);
        // an open of it is a need; and the output naming a stat corroborates
        let open = failed(10, MS, "openat", libc::ENOENT, "/tmp/link");
        assert_eq!(grade_of(open, &w).witness, Some(Witness::Asked));
        let said = words(
            "",
            "ls: cannot access '/tmp/link': No such file or directory",
        );
        assert_eq!(grade_of(stat, &said).witness, Some(Witness::Said));
    }

    #[test]
    fn a_check_of_a_bare_name_the_output_says_is_no_need_of_it() {
        // `python3 -m unittest test_sum` checks whether `test_sum` is a
        // path; the report then says `test_sum` as a module's name
        let w = words(
            "python3 -m unittest test_sum",
            "FAIL: test_sum (test_sum.T.test_sum)",
        );
        let stat = failed(10, MS, "newfstatat", libc::ENOENT, "test_sum");
        assert_eq!(grade_of(stat, &w).witness, None);
        // `cat notes`: an open of a bare name the output says is a need
        let w = words("cat notes", "cat: notes: No such file or directory");
        let open = failed(10, MS, "openat", libc::ENOENT, "notes");
        assert_eq!(grade_of(open, &w).witness, Some(Witness::Said));
    }

    #[test]
    fn an_error_that_names_no_failed_path_corroborates_nothing() {
        let traceback = "Traceback (most recent call last):\n  File \"/app/main.py\", line 3, in <module>\n    raise ValueError('bad input')\nValueError: bad input\n";
        for path in [
            // a message catalog looked up while printing the error
            "/usr/share/locale-langpack/en/LC_MESSAGES/grep.mo",
            // a driver's optional configuration file
            "/usr/share/nvidia/nvidia-application-profiles-rc",
            // a compiler's include-path search
            "/usr/include/x86_64-linux-gnu/stdc-predef.h",
            // a relative library directory
            "nvtx/lib",
            // a module search: another file of the same name elsewhere
            "/app/node_modules/main.py",
        ] {
            let g = grade_of(
                failed(10, MS, "openat", libc::ENOENT, path),
                &words("python3 /app/main.py", traceback),
            );
            assert_eq!(g.witness, None, "{path}");
            assert!(!g.counts(), "{path}");
        }
    }

    #[test]
    fn a_path_the_kernel_cut_short_is_named_by_a_word_it_begins() {
        let whole = format!("/nonexistent/{}", "m".repeat(300));
        let mut ev = failed(10, MS, "openat", libc::ENOENT, &whole[..255]);
        ev.path_truncated = Some(true);
        let w = words(
            "",
            &format!("[Errno 2] No such file or directory: '{whole}7'"),
        );
        assert_eq!(grade_of(ev.clone(), &w).witness, Some(Witness::Said));
        // uncut, it must be the word itself
        ev.path_truncated = None;
        assert_eq!(grade_of(ev, &w).witness, None);
    }

    #[test]
    fn a_file_url_names_its_path() {
        let ev = failed(10, MS, "openat", libc::ENOENT, "/tmp/page.html");
        let w = words(
            r#"{"params":{"arguments":{"url":"file:///tmp/page.html"}}}"#,
            "",
        );
        assert_eq!(grade_of(ev, &w).witness, Some(Witness::Asked));
    }

    #[test]
    fn a_bare_word_does_not_name_a_path() {
        // `lib` and `bin` are words any text may say
        let w = words("", "error in lib: see bin for details");
        let g = grade_of(failed(10, MS, "openat", libc::ENOENT, "/opt/x/lib"), &w);
        assert_eq!(g.witness, None);
        let g = grade_of(failed(10, MS, "openat", libc::ENOENT, "lib"), &w);
        assert_eq!(g.witness, Some(Witness::Said), "the path as given is named");
    }

    #[test]
    fn a_failure_whose_program_was_replaced_by_an_exec_is_no_evidence() {
        let s = span(vec![
            failed(10, MS, "openat", libc::EROFS, "/x"),
            super::super::testing::exec(10, 2 * MS, "sh"),
            exit(10, 9 * MS, 1),
        ]);
        assert!(Grades::of(&s, &Words::default()).get(0).is_none());
    }
}
