//! What the host says about a span when it closes, read once, before it is
//! attributed: the memory PSI total, the wall clock, and which of the paths
//! a crashing process found missing exist where the probe runs (hidden from
//! the workload). Attribution reads only these ([`crate::spans::Closing`]),
//! never the host, so the same evidence gets the same verdict replayed
//! later, elsewhere.

use std::collections::BTreeSet;

use crate::event::Kind;
use crate::primitive::{SYMPTOM_SIGNALS, SYMPTOM_WINDOW_NS};
use crate::spans::{Closing, SpanEvidence};

/// The host's answers.
pub trait Host {
    /// `some total=` of /proc/pressure/memory (µs), when PSI is available.
    fn psi_memory_some_us(&self) -> Option<u64>;
    /// Wall-clock ms.
    fn now_ms(&self) -> i64;
    /// Whether an absolute path exists in the probe's own view.
    fn path_exists(&self, path: &str) -> bool;
}

/// The machine the probe runs on.
pub struct LiveHost;

impl Host for LiveHost {
    fn psi_memory_some_us(&self) -> Option<u64> {
        crate::spans::psi_memory_some_us()
    }
    fn now_ms(&self) -> i64 {
        crate::clock::now_ms()
    }
    fn path_exists(&self, path: &str) -> bool {
        std::path::Path::new(path).exists()
    }
}

/// Reads the facts of a closing span from `host` into `span.closing`;
/// `root_signal`: the signal that killed the span's first process, as its
/// caller saw it.
pub fn capture(span: &mut SpanEvidence, root_signal: Option<&str>, host: &dyn Host) {
    let present_outside = crash_lookups(span, root_signal)
        .into_iter()
        .filter(|p| host.path_exists(p))
        .collect();
    span.closing = Closing {
        psi_some_us: host.psi_memory_some_us(),
        closed_ms: host.now_ms(),
        present_outside,
    };
}

/// The absolute paths a process failed on within [`SYMPTOM_WINDOW_NS`]
/// before it died of one of [`SYMPTOM_SIGNALS`]: the only failures whose
/// presence outside the sandbox attribution asks about (a crash after
/// files were hidden from it).
fn crash_lookups(span: &SpanEvidence, root_signal: Option<&str>) -> BTreeSet<String> {
    let symptom = |s: Option<&str>| s.is_some_and(|s| SYMPTOM_SIGNALS.contains(&s));
    let mut crashed: Vec<u32> = span
        .processes
        .iter()
        .filter(|(_, p)| symptom(p.signal.as_deref()))
        .map(|(pid, _)| *pid)
        .collect();
    if symptom(root_signal) {
        crashed.extend(span.root_pid);
    }
    let mut paths = BTreeSet::new();
    for pid in crashed {
        // when it died: its fatal signal, or its exit
        let deaths: Vec<u64> = span
            .events
            .iter()
            .filter(|e| {
                e.pid == pid
                    && (e.kind == Kind::Exit
                        || (e.kind == Kind::Signal && symptom(e.signal.as_deref())))
            })
            .map(|e| e.ts_ns)
            .collect();
        for e in span.events.iter().filter(|e| {
            e.pid == pid
                && (e.kind.is_failure() || e.kind == Kind::SeccompDenied)
                && e.path_truncated.is_none()
                && deaths
                    .iter()
                    .any(|&d| e.ts_ns <= d && d - e.ts_ns <= SYMPTOM_WINDOW_NS)
        }) {
            if let Some(p) = e.path.as_deref().filter(|p| p.starts_with('/')) {
                paths.insert(p.to_string());
            }
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::attribute;
    use crate::attribution::testing::{MS, failed, killed_by, signal_from, span};

    /// A file that existed when the span closed and is gone when it is
    /// attributed: the verdict is the one its capture gave, not today's.
    #[test]
    fn the_verdict_is_what_the_host_said_at_close_not_later() {
        let dir = std::env::temp_dir().join(format!("probe-facts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hidden = dir.join("font.ttf");
        std::fs::write(&hidden, b"").unwrap();
        let path = hidden.to_str().unwrap();
        let events = vec![
            failed(10, MS, "openat", libc::ENOENT, path),
            signal_from(10, 2 * MS, "SIGABRT", (10, "w"), -6),
        ];
        let outcome = killed_by("SIGABRT");
        let mut s = span(events.clone());
        capture(&mut s, outcome.exit.signal.as_deref(), &LiveHost);
        assert!(s.closing.present_outside.contains(path));
        assert!(s.closing.closed_ms > 0);
        std::fs::remove_dir_all(&dir).unwrap();
        let a = attribute(&s, &outcome);
        assert_eq!(a.primitive.id(), "fs.missing", "{}", a.explanation);
        assert!(
            a.explanation.contains("hidden from it"),
            "{}",
            a.explanation
        );
        // the same evidence closing now, without the file: another verdict,
        // because the host said otherwise
        let mut later = span(events);
        capture(&mut later, outcome.exit.signal.as_deref(), &LiveHost);
        assert!(later.closing.present_outside.is_empty());
        assert_eq!(attribute(&later, &outcome).primitive.id(), "signal");
    }

    #[test]
    fn only_a_crashing_process_s_failures_in_the_window_are_looked_up() {
        let outcome = killed_by("SIGABRT");
        let s = span(vec![
            failed(10, MS, "openat", libc::ENOENT, "/a/early"),
            failed(11, 6_000 * MS, "openat", libc::ENOENT, "/b/other-process"),
            failed(10, 6_000 * MS, "openat", libc::ENOENT, "relative/name"),
            failed(10, 6_500 * MS, "openat", libc::ENOENT, "/c/in-window"),
            signal_from(10, 7_000 * MS, "SIGABRT", (10, "w"), -6),
        ]);
        let asked: Vec<String> = crash_lookups(&s, outcome.exit.signal.as_deref())
            .into_iter()
            .collect();
        assert_eq!(asked, ["/c/in-window"]);
    }
}
