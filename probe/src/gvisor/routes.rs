//! The daemon's map from gVisor's points to its spans. eBPF spans are
//! keyed in the kernel (a traced thread carries its span); gVisor's points
//! carry a container id and the sandbox's own pids, so the daemon keeps
//! the same map in user space: a span's processes are the one it was
//! begun for and whatever that one forks, as clone points say.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::event::{KernelEvent, Kind};

/// One runsc connection to the monitor.
#[derive(Debug, Default)]
struct Connection {
    /// The host pid that connected (the runsc process that started the
    /// sandbox): a bridge inside reaches the daemon through that
    /// sandbox's gofer, a child of the same runsc.
    runsc_pid: Option<u32>,
    /// The containers its points named.
    containers: BTreeSet<String>,
}

/// Counts for `probe status`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RouteCounts {
    /// Points that made events.
    pub points: u64,
    /// Events of processes in no span (the sandbox's other work).
    pub unrouted: u64,
    /// Points runsc dropped (its `dropped_count`), all connections.
    pub dropped: u64,
}

/// The processes of one container, by the pid the sandbox sees.
#[derive(Debug, Default)]
struct Processes {
    spans: HashMap<u32, u64>,
    /// Live processes' parents, from clone and exit points: what a span
    /// begun over a running tree takes with it.
    parents: HashMap<u32, u32>,
}

#[derive(Debug, Default)]
pub struct Routes {
    connections: HashMap<u64, Connection>,
    /// Per container: looked up by `&str` for every event, allocating
    /// nothing.
    containers: HashMap<String, Processes>,
    pub counts: RouteCounts,
}

/// Why a gVisor span cannot be begun.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RouteError {
    #[error(
        "this client is inside a gVisor sandbox whose points never reached this daemon: start \
         runsc with the daemon's session (`probe gvisor-session > FILE`, then `runsc \
         --pod-init-config=FILE …`; runsc does not reconnect to a daemon started after it). A \
         sandbox started detached (`run --detach`, `create`/`start`, containerd) is not found \
         behind its client: name its container (`gvisor_container`)"
    )]
    NoSandbox,
    #[error(
        "the sandbox of runsc {0} runs several containers ({1}): name one (`gvisor_container`)"
    )]
    Ambiguous(u32, String),
}

impl Routes {
    pub fn connected(&mut self, conn: u64, runsc_pid: Option<u32>) {
        self.connections.insert(
            conn,
            Connection {
                runsc_pid,
                containers: BTreeSet::new(),
            },
        );
    }

    /// `conn`'s sandbox runs `container`.
    pub fn container(&mut self, conn: u64, container: &str) {
        if let Some(c) = self.connections.get_mut(&conn) {
            c.containers.insert(container.to_string());
        }
    }

    /// The sandbox hung up: its processes are gone (their spans keep what
    /// they collected).
    pub fn closed(&mut self, conn: u64) {
        if let Some(c) = self.connections.remove(&conn) {
            for container in &c.containers {
                if let Some(p) = self.containers.get_mut(container) {
                    p.parents.clear();
                }
            }
        }
    }

    /// Connected sandboxes: (runsc pid, containers).
    pub fn sandboxes(&self) -> Vec<(Option<u32>, Vec<String>)> {
        let mut v: Vec<_> = self
            .connections
            .values()
            .map(|c| (c.runsc_pid, c.containers.iter().cloned().collect()))
            .collect();
        v.sort();
        v
    }

    /// Whether a connected sandbox runs `container`.
    pub fn is_connected(&self, container: &str) -> bool {
        self.connections
            .values()
            .any(|c| c.containers.contains(container))
    }

    /// The container of the sandbox that runsc `runsc_pid` started.
    pub fn container_of(&self, runsc_pid: u32) -> Result<String, RouteError> {
        let containers: BTreeSet<&String> = self
            .connections
            .values()
            .filter(|c| c.runsc_pid == Some(runsc_pid))
            .flat_map(|c| c.containers.iter())
            .collect();
        match containers.len() {
            0 => Err(RouteError::NoSandbox),
            1 => Ok(containers.into_iter().next().cloned().unwrap_or_default()),
            _ => Err(RouteError::Ambiguous(
                runsc_pid,
                containers
                    .into_iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
        }
    }

    /// Puts `pid` of `container` in `span`; with `tree`, its known
    /// descendants too. Answers how many processes.
    pub fn attach(&mut self, span: u64, container: &str, pid: u32, tree: bool) -> usize {
        let procs = self.containers.entry(container.to_string()).or_default();
        let mut taken = vec![pid];
        if tree {
            let mut i = 0;
            while i < taken.len() {
                let parent = taken[i];
                taken.extend(
                    procs
                        .parents
                        .iter()
                        .filter(|(_, p)| **p == parent)
                        .map(|(child, _)| *child),
                );
                i += 1;
            }
        }
        let unique: HashSet<u32> = taken.into_iter().collect();
        for p in &unique {
            procs.spans.insert(*p, span);
        }
        unique.len()
    }

    /// Forgets the processes of an ended span.
    pub fn end(&mut self, span: u64) {
        for procs in self.containers.values_mut() {
            procs.spans.retain(|_, s| *s != span);
        }
    }

    /// The span `ev` (of a point of `container`) belongs to; follows
    /// forks on the way. An exit does not end the process's membership:
    /// gVisor reports a task's exit per task, and a leader that left by
    /// `pthread_exit` has threads still running; the span's end does.
    pub fn route(&mut self, container: &str, ev: &KernelEvent) -> Option<u64> {
        let span = match ev.kind {
            Kind::Fork if ev.thread != Some(true) => {
                let procs = match self.containers.get_mut(container) {
                    Some(p) => p,
                    None => self.containers.entry(container.to_string()).or_default(),
                };
                let span = procs.spans.get(&ev.pid).copied();
                if let Some(child) = ev.child_pid {
                    procs.parents.insert(child, ev.pid);
                    if let Some(s) = span {
                        procs.spans.insert(child, s);
                    }
                }
                span
            }
            _ => self.containers.get_mut(container).and_then(|procs| {
                if ev.kind == Kind::Exit {
                    procs.parents.remove(&ev.pid);
                }
                procs.spans.get(&ev.pid).copied()
            }),
        };
        if span.is_none() {
            self.counts.unrouted += 1;
        }
        span
    }

    /// The spans of `conn`'s containers, which its drops may belong to.
    pub fn spans_of(&self, conn: u64) -> Vec<u64> {
        let Some(c) = self.connections.get(&conn) else {
            return Vec::new();
        };
        let mut spans: Vec<u64> = c
            .containers
            .iter()
            .filter_map(|container| self.containers.get(container))
            .flat_map(|procs| procs.spans.values().copied())
            .collect();
        spans.sort_unstable();
        spans.dedup();
        spans
    }
}

/// The gVisor sandbox behind a daemon client: a bridge inside reaches the
/// host's socket (`--host-uds=open`) through the sandbox's gofer. Its
/// container is the last word of the sandbox process (`runsc-sandbox …
/// boot … ID`) that shares the gofer's `--bundle`; its runsc is the
/// gofer's parent while that runsc runs in the foreground (`do`, `run`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxClient {
    pub container: Option<String>,
    pub runsc: Option<u32>,
}

/// See [`SandboxClient`]; `None` when `peer_pid` is no gofer.
pub fn sandbox_behind(peer_pid: u32) -> Option<SandboxClient> {
    use crate::proctree::argv;
    let gofer = argv(peer_pid)?;
    // runsc re-executes itself: its comm is `exe`, its argv[0] says which
    if gofer.first()? != "runsc-gofer" {
        return None;
    }
    let container = bundle_of(&gofer).and_then(|bundle| {
        std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .find_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                let words = argv(pid)?;
                (words.first()? == "runsc-sandbox" && bundle_of(&words) == Some(bundle.clone()))
                    .then(|| words.last().cloned())
                    .flatten()
            })
    });
    Some(SandboxClient {
        container,
        runsc: crate::proctree::ppid(peer_pid),
    })
}

/// `--bundle DIR` or `--bundle=DIR`.
fn bundle_of(words: &[String]) -> Option<String> {
    words
        .iter()
        .enumerate()
        .find_map(|(i, w)| match w.strip_prefix("--bundle") {
            Some("") => words.get(i + 1).cloned(),
            Some(rest) => rest.strip_prefix('=').map(str::to_string),
            None => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: Kind, pid: u32) -> KernelEvent {
        KernelEvent::bare(kind, 0, pid, pid, "sh".into())
    }

    fn fork(parent: u32, child: u32) -> KernelEvent {
        let mut e = ev(Kind::Fork, parent);
        e.child_pid = Some(child);
        e.thread = Some(false);
        e
    }

    #[test]
    fn a_span_takes_what_its_process_forks_and_keeps_it_until_it_ends() {
        let mut r = Routes::default();
        r.connected(1, Some(100));
        r.container(1, "c");
        assert_eq!(r.route("c", &fork(1, 5)), None, "before any span");
        assert_eq!(r.container_of(100), Ok("c".into()));
        assert_eq!(r.attach(7, "c", 5, false), 1);
        assert_eq!(r.route("c", &fork(5, 6)), Some(7));
        assert_eq!(r.route("c", &ev(Kind::SyscallFailed, 6)), Some(7));
        // the same pid in another container is another process
        assert_eq!(r.route("d", &ev(Kind::SyscallFailed, 6)), None);
        assert_eq!(r.route("c", &ev(Kind::Exit, 6)), Some(7));
        // a thread of an exited leader is still the span's
        assert_eq!(r.route("c", &ev(Kind::SyscallFailed, 6)), Some(7));
        assert_eq!(r.spans_of(1), vec![7]);
        r.end(7);
        assert_eq!(r.route("c", &ev(Kind::SyscallFailed, 5)), None);
        assert_eq!(r.counts.unrouted, 3);
    }

    #[test]
    fn a_bundle_is_read_in_either_form() {
        let w = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            bundle_of(&w(
                "runsc-gofer --root=/r gofer --bundle /tmp/b --spec-fd=3"
            )),
            Some("/tmp/b".into())
        );
        assert_eq!(
            bundle_of(&w(
                "runsc-sandbox --root=/r boot --bundle=/tmp/b --cpu-num 2 runsc-1"
            )),
            Some("/tmp/b".into())
        );
        assert_eq!(bundle_of(&w("runsc-sandbox --bundles=/x")), None);
    }

    #[test]
    fn a_tree_takes_the_descendants_known_now() {
        let mut r = Routes::default();
        r.connected(1, None);
        for (p, c) in [(1, 2), (2, 3), (3, 4), (1, 9)] {
            r.route("c", &fork(p, c));
        }
        assert_eq!(r.attach(5, "c", 2, true), 3);
        assert_eq!(r.route("c", &ev(Kind::SyscallFailed, 4)), Some(5));
        assert_eq!(r.route("c", &ev(Kind::SyscallFailed, 9)), None);
    }

    #[test]
    fn a_runsc_with_no_sandbox_or_several_containers_is_refused() {
        let mut r = Routes::default();
        assert_eq!(r.container_of(100), Err(RouteError::NoSandbox));
        r.connected(1, Some(100));
        r.container(1, "a");
        r.container(1, "b");
        assert!(matches!(
            r.container_of(100),
            Err(RouteError::Ambiguous(100, _))
        ));
        r.closed(1);
        assert_eq!(r.container_of(100), Err(RouteError::NoSandbox));
    }
}
