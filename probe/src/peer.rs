//! Who is at the other end of a control connection, and what it may touch.
//!
//! The daemon usually runs on the host, one per machine, and the bridges of
//! many containers reach it through a bind-mounted socket. A client is
//! known by its peer credentials (`SO_PEERCRED`: its pid as the daemon's
//! namespace sees it) and sorted once, when it connects:
//! - a client in the daemon's own PID namespace (the host's CLI, a bridge
//!   on the host) is [`Scope::Host`]: it names the daemon's pids and
//!   reaches every span;
//! - a client in another PID namespace (a bridge in a podman or Docker
//!   container, in bubblewrap's namespace) is a [`Sandbox`]: every pid it
//!   names is one of *its* namespace, translated at the door through
//!   `NSpid` ([`Sandbox::to_daemon_pid`]), so it can only ever name a
//!   process of its own namespace (or of one nested in it); a cgroup it
//!   names is looked up through its own root and must hold its processes
//!   only; it reads, tails and ends only the spans its sandbox opened;
//! - a client inside a gVisor sandbox (through the gofer, `--host-uds`) is
//!   a [`Sandbox`] keyed by its container: its pids are the sandbox's own;
//! - with `confine_clients = "all"`, a client in the daemon's namespace that
//!   is not root is a [`Sandbox`] too: its own uid's processes in its own
//!   cgroup v2 subtree ([`Owner`]).
//!
//! Refusals are `forbidden` errors in one sentence; the daemon counts them.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::gvisor::routes::SandboxClient;
use crate::protocol::{ErrorBody, ErrorCode};

/// What a connection's client may reach.
#[derive(Debug, Clone)]
pub enum Scope {
    /// Everything: a client in the daemon's own PID namespace.
    Host,
    /// Its own sandbox only.
    Sandbox(Sandbox),
}

/// A confined client's sandbox.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The key its spans are stored under: `pidns:INODE` or
    /// `gvisor:CONTAINER` (`gvisor-runsc:PID` while the container is not
    /// known).
    pub id: String,
    pub kind: SandboxKind,
}

#[derive(Debug, Clone)]
pub enum SandboxKind {
    /// A PID namespace other than the daemon's.
    PidNamespace(PidNamespace),
    /// A gVisor sandbox, reached through its gofer.
    Gvisor(SandboxClient),
    /// A client of the daemon's own namespace confined by configuration.
    Owner(Owner),
}

/// Which clients are confined to their sandbox (`probe run
/// --confine-clients`, the config's `confine_clients`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Confine {
    /// Clients in other PID namespaces and inside gVisor (the default).
    #[default]
    Sandboxed,
    /// Those, and every client of the daemon's own namespace but root.
    All,
}

/// A non-root client of the daemon's own namespace, confined: processes of
/// its uid in its cgroup v2 subtree (at connect time).
#[derive(Debug, Clone)]
pub struct Owner {
    pub uid: u32,
    /// Its cgroup v2 path (`0::` of /proc/PID/cgroup); None on a host
    /// without cgroup v2, where the uid alone confines.
    pub cgroup: Option<String>,
    pub peer: u32,
}

/// A client's PID namespace, as the daemon finds processes in it.
#[derive(Debug, Clone)]
pub struct PidNamespace {
    /// The namespace's inode (`/proc/PID/ns/pid`).
    pub inode: u64,
    /// Its depth below the daemon's namespace: the index of a process's id
    /// in it within `NSpid` (1 for a container on the host).
    pub level: usize,
    /// The client process, as the daemon sees it: its descendants are
    /// searched first.
    pub peer: u32,
}

impl Scope {
    /// Sorts the client whose peer credentials name `peer_pid` (the
    /// daemon's view). `gvisor`: the gVisor sandbox behind it, if any.
    /// A peer whose namespace cannot be read is confined to nothing: it
    /// gets a sandbox no process belongs to, never the host's reach.
    /// `uid`: its user; `confine`: which clients the daemon confines.
    pub fn of_peer(
        peer_pid: Option<u32>,
        uid: u32,
        gvisor: Option<SandboxClient>,
        confine: Confine,
    ) -> Scope {
        if let Some(client) = gvisor {
            let id = match (&client.container, client.runsc) {
                (Some(c), _) => format!("gvisor:{c}"),
                (None, Some(r)) => format!("gvisor-runsc:{r}"),
                (None, None) => "gvisor:unknown".into(),
            };
            return Scope::Sandbox(Sandbox {
                id,
                kind: SandboxKind::Gvisor(client),
            });
        }
        let Some(pid) = peer_pid else {
            return unreadable_peer();
        };
        let (Some(mine), Some(theirs), Some(ids)) = (
            pidns_inode(std::process::id()),
            pidns_inode(pid),
            nspid(pid),
        ) else {
            return unreadable_peer();
        };
        if mine == theirs {
            if confine == Confine::Sandboxed || uid == 0 {
                return Scope::Host;
            }
            let cgroup = cgroup_v2_of(pid);
            return Scope::Sandbox(Sandbox {
                id: match &cgroup {
                    Some(cg) => format!("uid:{uid}@cgroup:{cg}"),
                    None => format!("uid:{uid}"),
                },
                kind: SandboxKind::Owner(Owner {
                    uid,
                    cgroup,
                    peer: pid,
                }),
            });
        }
        Scope::Sandbox(Sandbox {
            id: format!("pidns:{theirs}"),
            kind: SandboxKind::PidNamespace(PidNamespace {
                inode: theirs,
                level: ids.len().saturating_sub(1),
                peer: pid,
            }),
        })
    }

    /// The sandbox's key, `None` for the host.
    pub fn sandbox_id(&self) -> Option<&str> {
        match self {
            Scope::Host => None,
            Scope::Sandbox(s) => Some(&s.id),
        }
    }

    /// Whether this client may read, tail or end a span `owner` opened
    /// (`None`: a host client's).
    pub fn may_reach(&self, owner: Option<&str>) -> bool {
        match self {
            Scope::Host => true,
            Scope::Sandbox(s) => owner == Some(s.id.as_str()),
        }
    }
}

/// A peer whose namespace could not be read (it exited as it connected):
/// confined to a sandbox nothing belongs to.
fn unreadable_peer() -> Scope {
    Scope::Sandbox(Sandbox {
        id: "unreadable-peer".into(),
        kind: SandboxKind::PidNamespace(PidNamespace {
            inode: 0,
            level: usize::MAX,
            peer: 0,
        }),
    })
}

/// A refusal: what the client asked is outside its sandbox.
pub fn forbidden(what: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(ErrorCode::Forbidden, what.to_string())
}

impl Sandbox {
    /// `pid` as the client's namespace numbers it, as the daemon's: a
    /// process whose id at the client's level is `pid` and whose namespace
    /// there is the client's. Searched among the client's descendants
    /// first (its workloads), then every process.
    pub fn to_daemon_pid(&self, pid: u32) -> Result<u32, ErrorBody> {
        let ns = match &self.kind {
            SandboxKind::PidNamespace(ns) => ns,
            SandboxKind::Gvisor(_) => return Ok(pid), // the sandbox's own numbering
            SandboxKind::Owner(_) if self.holds(pid) => return Ok(pid),
            SandboxKind::Owner(_) => {
                return Err(forbidden(format!(
                    "pid {pid} is no process of this client's ({}): a confined client may only \
                     trace its own user's processes in its own cgroup",
                    self.id
                )));
            }
        };
        let not_ours = || {
            forbidden(format!(
                "pid {pid} is no process of this client's PID namespace ({}): a sandbox's \
                 client may only trace its own processes",
                self.id
            ))
        };
        if pid == 0 || ns.inode == 0 {
            return Err(not_ours());
        }
        let matches = |host: u32| ns.holds(host, pid);
        if let Some(host) = crate::proctree::descendants(ns.peer)
            .into_iter()
            .find(|&h| matches(h))
        {
            return Ok(host);
        }
        let all = std::fs::read_dir("/proc")
            .map_err(|e| ErrorBody::new(ErrorCode::Internal, format!("cannot read /proc: {e}")))?;
        all.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|&h| matches(h))
            .ok_or_else(not_ours)
    }

    /// Checks that the daemon's `host` pid is a process of this sandbox.
    pub fn holds(&self, host: u32) -> bool {
        match &self.kind {
            SandboxKind::PidNamespace(ns) => ns.id_of(host).is_some(),
            SandboxKind::Gvisor(_) => false,
            SandboxKind::Owner(o) => o.holds(host),
        }
    }

    /// The cgroup v2 directory `path` names in the client's own view (its
    /// root, its cgroup namespace), as the daemon reaches it, if every
    /// thread in it now is one of this sandbox's and there is at least one:
    /// a cgroup holding another's processes, or none yet, is refused.
    pub fn cgroup(&self, path: &Path) -> Result<PathBuf, ErrorBody> {
        let peer = match &self.kind {
            SandboxKind::PidNamespace(ns) => ns.peer,
            SandboxKind::Owner(o) => o.peer,
            SandboxKind::Gvisor(_) => {
                return Err(forbidden(
                    "a client inside gVisor cannot follow a cgroup: the sandbox's kernel is \
                     gVisor's, not this one",
                ));
            }
        };
        if !path.is_absolute() {
            return Err(ErrorBody::new(
                ErrorCode::BadRequest,
                format!("cgroup {} is not an absolute path", path.display()),
            ));
        }
        let seen = PathBuf::from(format!("/proc/{peer}/root"))
            .join(path.strip_prefix("/").unwrap_or(path));
        let procs = std::fs::read_to_string(seen.join("cgroup.procs")).map_err(|e| {
            ErrorBody::new(
                ErrorCode::BadRequest,
                format!(
                    "{} is no cgroup this client can see ({e}): name the cgroup v2 \
                     directory as the container sees it",
                    path.display()
                ),
            )
        })?;
        let pids: Vec<u32> = procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() {
            return Err(forbidden(format!(
                "cgroup {} holds no process of this sandbox ({}) yet: a sandbox's client may \
                 follow a cgroup only while its own processes are in it",
                path.display(),
                self.id
            )));
        }
        if let Some(stranger) = pids.iter().find(|&&p| !self.holds(p)) {
            return Err(forbidden(format!(
                "cgroup {} holds a process outside this sandbox ({}; pid {stranger} as the \
                 daemon sees it): a sandbox's client may follow only its own cgroups",
                path.display(),
                self.id
            )));
        }
        Ok(seen)
    }
}

impl Owner {
    /// Whether the daemon's process `host` runs as this uid in this
    /// cgroup or below it.
    fn holds(&self, host: u32) -> bool {
        let uid = std::fs::read_to_string(format!("/proc/{host}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|ids| ids.split_whitespace().next()?.parse::<u32>().ok())
            });
        if uid != Some(self.uid) {
            return false;
        }
        match &self.cgroup {
            None => true,
            Some(mine) => cgroup_v2_of(host).is_some_and(|theirs| {
                mine == "/"
                    || theirs == *mine
                    || theirs
                        .strip_prefix(mine.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            }),
        }
    }
}

/// The cgroup v2 path of process `pid` (the `0::` line).
fn cgroup_v2_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
}

impl PidNamespace {
    /// Whether the daemon's process `host` has id `id` at this namespace's
    /// level, and its namespace there is this one.
    fn holds(&self, host: u32, id: u32) -> bool {
        self.id_of(host) == Some(id)
    }

    /// The daemon's process `host`'s id in this namespace, when it is in
    /// it (or in one nested in it): one `NSpid` read.
    fn id_of(&self, host: u32) -> Option<u32> {
        let ids = nspid(host)?;
        let id = *ids.get(self.level)?;
        // its own namespace, or the one `depth` levels up from it
        let depth = ids.len() - 1 - self.level;
        (ancestor_inode(host, depth) == Some(self.inode)).then_some(id)
    }
}

/// The `NSpid` line of `/proc/PID/status`: the process's id in each PID
/// namespace from the reader's down to its own.
pub fn nspid(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids: Vec<u32> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (!ids.is_empty()).then_some(ids)
}

/// The inode of process `pid`'s PID namespace.
pub fn pidns_inode(pid: u32) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// The inode of the PID namespace `depth` levels above `pid`'s own
/// (`NS_GET_PARENT`, ioctl_ns(2)).
fn ancestor_inode(pid: u32, depth: usize) -> Option<u64> {
    let mut ns: OwnedFd = std::fs::File::open(format!("/proc/{pid}/ns/pid"))
        .ok()?
        .into();
    for _ in 0..depth {
        // NS_GET_PARENT = _IO(0xb7, 0x2)
        const NS_GET_PARENT: libc::c_ulong = 0xb702;
        // SAFETY: ioctl on a namespace fd we own; it returns a new fd or -1.
        let parent = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_PARENT as _) };
        if parent < 0 {
            return None;
        }
        // SAFETY: a fresh fd the kernel just returned, owned by nobody else.
        ns = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(parent) };
    }
    let file = std::fs::File::from(ns);
    file.metadata().ok().map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_the_hosts_scope_and_its_own_nspid_names_it() {
        let me = std::process::id();
        assert!(matches!(
            Scope::of_peer(Some(me), 0, None, Confine::All),
            Scope::Host
        ));
        assert_eq!(nspid(me).and_then(|ids| ids.first().copied()), Some(me));
        assert_eq!(ancestor_inode(me, 0), pidns_inode(me));
    }

    #[test]
    fn a_non_root_client_confined_by_configuration_reaches_its_uids_processes_only() {
        let me = std::process::id();
        let scope = Scope::of_peer(Some(me), 65534, None, Confine::All);
        let Scope::Sandbox(s) = &scope else {
            panic!("confined")
        };
        assert!(s.id.starts_with("uid:65534"), "{}", s.id);
        // this process runs as root, not as 65534
        assert!(s.to_daemon_pid(me).is_err());
        assert!(!s.holds(1));
        assert!(matches!(
            Scope::of_peer(Some(me), 65534, None, Confine::Sandboxed),
            Scope::Host
        ));
    }

    #[test]
    fn a_peer_that_cannot_be_read_reaches_nothing() {
        let scope = Scope::of_peer(None, 0, None, Confine::Sandboxed);
        assert!(!scope.may_reach(None));
        assert!(!scope.may_reach(Some("pidns:1")));
        let Scope::Sandbox(s) = scope else {
            panic!("confined")
        };
        assert!(s.to_daemon_pid(std::process::id()).is_err());
        assert!(!s.holds(std::process::id()));
    }

    #[test]
    fn a_gvisor_client_reaches_only_its_containers_spans() {
        let client = SandboxClient {
            container: Some("agent-1".into()),
            runsc: Some(7),
        };
        let scope = Scope::of_peer(
            Some(std::process::id()),
            0,
            Some(client),
            Confine::Sandboxed,
        );
        assert_eq!(scope.sandbox_id(), Some("gvisor:agent-1"));
        assert!(scope.may_reach(Some("gvisor:agent-1")));
        assert!(!scope.may_reach(Some("gvisor:agent-2")));
        assert!(!scope.may_reach(None));
        assert!(Scope::Host.may_reach(Some("gvisor:agent-2")));
    }
}
