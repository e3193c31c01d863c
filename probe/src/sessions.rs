//! Sessions: what each session wrote successfully, so that a later span of
//! the same session that finds the path gone is attributed `fs.persistence`
//! (the seed's "files written to a directory were not there when asked for").
//!
//! Paths are made absolute (against the writer's cwd) and tagged with the
//! writer's mount namespace when they arrive, while the process is likely
//! still alive.

use std::collections::{HashMap, VecDeque};

use crate::event::{Errno, KernelEvent, Kind, WrittenEarlier};

/// Paths remembered per session; the oldest are forgotten first.
pub const MAX_PATHS_PER_SESSION: usize = 10_000;
/// Sessions remembered; the least recently used are forgotten first.
pub const MAX_SESSIONS: usize = 4_096;
/// Entries (written paths and the directories above them) remembered
/// across all sessions. The per-session caps alone allowed 4,096 sessions
/// of 50,000 entries each, so a daemon serving long-lived sessions for
/// weeks grew toward gigabytes; at a few hundred bytes an entry this keeps
/// the memory near 20 MiB. The least recently used sessions go first; one
/// session alone stays within its own caps, below this.
pub const MAX_REMEMBERED: usize = 65_536;

#[derive(Default)]
struct Session {
    writes: HashMap<String, WrittenEarlier>,
    /// Directories above written paths, so an ENOENT on the directory of a
    /// written file (`mkdir -p` after the tmpfs was replaced) counts too.
    dirs: HashMap<String, WrittenEarlier>,
    order: VecDeque<String>,
    last_used: u64,
}

impl Session {
    fn entries(&self) -> usize {
        self.writes.len() + self.dirs.len()
    }
}

/// The per-session write memory.
#[derive(Default)]
pub struct Sessions {
    sessions: HashMap<String, Session>,
    tick: u64,
    /// The sum of every session's `entries()`.
    remembered: usize,
}

/// `mnt:[4026531841]` of `pid`.
pub fn mount_ns(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|p| p.display().to_string())
}

/// `path` made absolute against `pid`'s cwd.
fn absolute(path: &str, pid: u32) -> Option<String> {
    crate::mounts::absolute_in(path, &format!("/proc/{pid}"))
}

impl Sessions {
    /// Looks at one event of `span` in `session`: remembers successful
    /// writes, and tags an ENOENT/ENOTDIR on a path an earlier span wrote.
    pub fn observe(&mut self, session: &str, span: u64, ev: &mut KernelEvent) {
        match ev.kind {
            Kind::FileWrite => {
                let Some(path) = ev.path.as_deref().and_then(|p| absolute(p, ev.pid)) else {
                    return;
                };
                self.tick += 1;
                let tick = self.tick;
                if self.sessions.len() >= MAX_SESSIONS && !self.sessions.contains_key(session) {
                    self.forget_least_recent(session);
                }
                let s = self.sessions.entry(session.to_string()).or_default();
                let before = s.entries();
                s.last_used = tick;
                let record = WrittenEarlier {
                    span,
                    pid: ev.pid,
                    comm: ev.comm.clone(),
                    syscall: ev.syscall.as_deref().unwrap_or("open").to_string(),
                    at_ms: crate::clock::now_ms(),
                    mount_ns: mount_ns(ev.pid),
                    path: None,
                };
                if s.dirs.len() > MAX_PATHS_PER_SESSION * 4 {
                    s.dirs.clear();
                }
                let mut dir = path.as_str();
                while let Some(i) = dir.rfind('/').filter(|&i| i > 0) {
                    dir = &dir[..i];
                    s.dirs.insert(dir.to_string(), record.clone());
                }
                if s.writes.insert(path.clone(), record).is_none() {
                    s.order.push_back(path);
                    if s.order.len() > MAX_PATHS_PER_SESSION
                        && let Some(old) = s.order.pop_front()
                    {
                        s.writes.remove(&old);
                    }
                }
                let after = s.entries();
                self.remembered = self.remembered - before + after;
                while self.remembered > MAX_REMEMBERED && self.forget_least_recent(session) {}
            }
            k if k.is_failure() && (ev.errno_is(Errno::ENOENT) || ev.errno_is(Errno::ENOTDIR)) => {
                let Some(s) = self.sessions.get(session) else {
                    return;
                };
                let Some(path) = ev.path.as_deref().and_then(|p| absolute(p, ev.pid)) else {
                    return;
                };
                // a directory holding files an earlier span wrote
                // a process that misses a file it wrote itself removed or
                // renamed it (a lock released, a temp file moved into place):
                // only another process's write is evidence of lost state
                let other = |w: &&WrittenEarlier| w.span != span && w.pid != ev.pid;
                if let Some(w) = s.dirs.get(&path).filter(other) {
                    ev.written_earlier = Some(WrittenEarlier {
                        path: Some(path.clone()),
                        ..w.clone()
                    });
                    ev.mount_ns = mount_ns(ev.pid);
                    return;
                }
                // the path itself, or a directory above it, written by an earlier span
                let mut probe_path = path.as_str();
                loop {
                    if let Some(w) = s.writes.get(probe_path).filter(other) {
                        ev.written_earlier = Some(WrittenEarlier {
                            path: Some(probe_path.to_string()),
                            ..w.clone()
                        });
                        ev.mount_ns = mount_ns(ev.pid);
                        return;
                    }
                    match probe_path.rfind('/') {
                        Some(i) if i > 0 => probe_path = &probe_path[..i],
                        _ => return,
                    }
                }
            }
            _ => {}
        }
    }

    /// Forgets the least recently used session other than `keep`; false
    /// when there is none.
    fn forget_least_recent(&mut self, keep: &str) -> bool {
        let Some(oldest) = self
            .sessions
            .iter()
            .filter(|(k, _)| k.as_str() != keep)
            .min_by_key(|(_, s)| s.last_used)
            .map(|(k, _)| k.clone())
        else {
            return false;
        };
        if let Some(gone) = self.sessions.remove(&oldest) {
            self.remembered -= gone.entries();
        }
        true
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Written paths and directories remembered, across sessions.
    pub fn remembered(&self) -> usize {
        self.remembered
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: Kind, path: &str, errno: Option<&'static str>) -> KernelEvent {
        let mut e: KernelEvent = serde_json::from_value(
            serde_json::json!({"kind": kind, "ts_ns": 0, "pid": 1, "tid": 1, "comm": "w"}),
        )
        .unwrap();
        e.path = Some(path.into());
        e.errno = errno.map(Into::into);
        e.syscall = Some("openat".into());
        e
    }

    #[test]
    fn later_enoent_of_an_earlier_write_is_tagged() {
        let mut s = Sessions::default();
        s.observe(
            "t-1",
            1,
            &mut ev(Kind::FileWrite, "/mnt/data/out.csv", None),
        );
        // same span: not a persistence problem
        let mut same = ev(Kind::SyscallFailed, "/mnt/data/out.csv", Some("ENOENT"));
        s.observe("t-1", 1, &mut same);
        assert!(same.written_earlier.is_none());
        // other session: not ours
        let mut other = ev(Kind::SyscallFailed, "/mnt/data/out.csv", Some("ENOENT"));
        s.observe("t-2", 2, &mut other);
        assert!(other.written_earlier.is_none());
        // later span, same session, the process that wrote it: it removed
        // or renamed its own file (a long-lived server's lock or temp file)
        let mut own = ev(Kind::SyscallFailed, "/mnt/data/out.csv", Some("ENOENT"));
        s.observe("t-1", 2, &mut own);
        assert!(own.written_earlier.is_none());
        // later span, same session, another process: tagged, citing the write
        let mut later = ev(Kind::SyscallFailed, "/mnt/data/out.csv", Some("ENOENT"));
        later.pid = 2;
        s.observe("t-1", 2, &mut later);
        assert_eq!(later.written_earlier.as_ref().map(|w| w.span), Some(1));
        // a file under a directory the session created
        s.observe("t-1", 3, &mut ev(Kind::FileWrite, "/mnt/work", None));
        let mut under = ev(Kind::SyscallFailed, "/mnt/work/result.json", Some("ENOENT"));
        under.pid = 2;
        s.observe("t-1", 4, &mut under);
        assert_eq!(under.written_earlier.map(|w| w.span), Some(3));
        // the directory of a file the session wrote (`mkdir -p` again after it vanished)
        let mut parent = ev(Kind::SyscallFailed, "/mnt/data", Some("ENOENT"));
        parent.pid = 2;
        s.observe("t-1", 5, &mut parent);
        assert_eq!(parent.written_earlier.map(|w| w.span), Some(1));
        // a sibling that was never written is not
        let mut sibling = ev(Kind::SyscallFailed, "/mnt/other", Some("ENOENT"));
        sibling.pid = 2;
        s.observe("t-1", 5, &mut sibling);
        assert!(sibling.written_earlier.is_none());
    }

    #[test]
    fn the_memory_of_all_sessions_is_bounded_and_the_least_recent_go_first() {
        let mut s = Sessions::default();
        // a session's 1,000 writes and their 2 directories; twice the
        // budget offered in all
        let per_session = 1_000;
        let sessions = 2 * MAX_REMEMBERED / per_session;
        for n in 0..sessions {
            for i in 0..per_session {
                let path = format!("/w/s{n}/f{i}");
                s.observe(
                    &format!("s-{n}"),
                    n as u64,
                    &mut ev(Kind::FileWrite, &path, None),
                );
            }
            assert!(s.remembered() <= MAX_REMEMBERED, "{}", s.remembered());
        }
        let counted: usize = s.sessions.values().map(Session::entries).sum();
        assert_eq!(s.remembered(), counted);
        assert!(s.remembered() > MAX_REMEMBERED - 2 * per_session);
        // the first sessions were forgotten, the last is whole
        assert!(!s.sessions.contains_key("s-0"));
        let last = &s.sessions[&format!("s-{}", sessions - 1)];
        assert_eq!(last.writes.len(), per_session);
        // a forgotten session's write no longer tags a later failure
        let mut gone = ev(Kind::SyscallFailed, "/w/s0/f1", Some("ENOENT"));
        gone.pid = 2;
        s.observe("s-0", 99_999, &mut gone);
        assert!(gone.written_earlier.is_none());
        // one session alone keeps its own caps
        let mut one = Sessions::default();
        for i in 0..MAX_PATHS_PER_SESSION + 10 {
            one.observe("big", 1, &mut ev(Kind::FileWrite, &format!("/b/{i}"), None));
        }
        assert_eq!(one.sessions["big"].writes.len(), MAX_PATHS_PER_SESSION);
        assert!(one.remembered() <= MAX_REMEMBERED);
    }
}
