//! A cgroup per call: the whole process tree of a workload can be found and
//! killed (nothing leaks past the call), and memory/pids limits apply.
//!
//! Works with cgroup v2 (unified, or hybrid at /sys/fs/cgroup/unified) and
//! v1 hierarchies; this machine has v1 memory and pids plus a cgroup2 mount
//! without controllers, which is still enough to track and kill a tree.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARENT: &str = "agent-bridge";

/// Where a controller (or plain tracking, for `None`) lives.
#[derive(Debug, Clone)]
enum Hierarchy {
    V1(PathBuf),
    V2(PathBuf),
}

/// Where the cgroup v2 hierarchy is mounted (unified, or the hybrid
/// layout's /sys/fs/cgroup/unified), if it is.
pub fn v2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.controllers").exists())
}

fn hierarchy(controller: Option<&str>) -> Option<Hierarchy> {
    let Some(controller) = controller else {
        return v2_root().map(Hierarchy::V2);
    };
    if let Some(root) = v2_root() {
        let have = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        if have.split_whitespace().any(|c| c == controller) {
            return Some(Hierarchy::V2(root));
        }
    }
    let v1 = Path::new("/sys/fs/cgroup").join(controller);
    (v1.join("cgroup.procs").exists() && !v1.join("cgroup.controllers").exists())
        .then_some(Hierarchy::V1(v1))
}

/// Removes call cgroups left by bridges that died without cleaning up
/// (SIGKILL): directories `mcp-PID-…` whose PID is gone. Returns how many.
///
/// Not inside a PID namespace: there a bridge of the host (or of another
/// sandbox) sharing the hierarchy has a pid this one cannot see, so a
/// missing pid proves nothing, and sweeping would kill its calls.
pub fn sweep_stale() -> usize {
    if !matches!(probe::loader::PidNamespace::current(), Ok(None)) {
        return 0;
    }
    remove_where(|owner| !Path::new("/proc").join(owner).exists())
}

/// Kills and removes the call cgroups of bridge `pid` (`mcp-PID-…`), which
/// has ended (its reaper's job: it may still be a zombie, so its /proc
/// entry proves nothing). Returns how many went.
pub fn remove_owned_by(pid: u32) -> usize {
    let pid = pid.to_string();
    remove_where(|owner| owner == pid)
}

/// Kills and removes every `mcp-OWNER-…` call cgroup whose OWNER `stale`
/// says is gone, and those of the bridges that ran in them.
fn remove_where(stale: impl Fn(&str) -> bool) -> usize {
    let mut roots: Vec<PathBuf> = v2_root().into_iter().collect();
    roots.extend(
        ["memory", "pids"]
            .iter()
            .map(|c| Path::new("/sys/fs/cgroup").join(c)),
    );
    let mut removed = 0;
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root.join(PARENT)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let owner = name.strip_prefix("mcp-").and_then(|r| r.split('-').next());
            let Some(owner) = owner else { continue };
            if !stale(owner) {
                continue;
            }
            let mut stale = CallCgroups {
                dirs: vec![e.path()],
                tracking: Some(e.path()),
                v2: None,
                v2_fd: None,
                events: None,
                reusable: false,
                killed: Default::default(),
            };
            let inside = stale.pids();
            stale.remove();
            if e.path().exists() {
                continue;
            }
            removed += 1;
            // a bridge that ran in this tree (a proxied `serve`) keeps its
            // calls in cgroups beside it and its reaper in it, killed just
            // now: its calls go from here (each step removed a directory,
            // so this ends)
            for pid in inside {
                removed += remove_owned_by(pid as u32);
            }
        }
    }
    removed
}

/// The cgroups of one call, removed (after killing what is left) when the
/// last reference goes: on a blocking thread when that is inside a runtime.
#[derive(Debug, Default)]
pub struct CallCgroups {
    dirs: Vec<PathBuf>,
    /// The directory whose `cgroup.procs` lists the whole tree.
    tracking: Option<PathBuf>,
    /// The call's directory in the cgroup v2 hierarchy, if it has one
    /// (tracking and every v2 controller share it).
    v2: Option<PathBuf>,
    /// `v2` opened, for clone3 to start children in; kept with the cgroup
    /// so a reused one is not opened again per call.
    v2_fd: Option<Arc<OwnedFd>>,
    /// `cgroup.events` of a v2 tracking cgroup, read in place by
    /// `populated` at the end of every call.
    events: Option<std::fs::File>,
    /// Tracking alone, in cgroup v2: no limit, no controller, so an empty
    /// one serves the next call as well as a new one (see [`Spare`]).
    reusable: bool,
    /// `cgroup.kill` was written: never reused, since on this 6.18 kernel
    /// a child cloned into such a cgroup is killed at once (seen in
    /// a_cancelled_call_kills_its_workload, whose next call died).
    killed: std::sync::atomic::AtomicBool,
}

/// What a call's cgroups should enforce.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u32>,
}

impl Limits {
    fn is_none(&self) -> bool {
        self.memory_bytes.is_none() && self.pids.is_none()
    }
}

/// A session's empty call cgroups, kept for its next calls: taking one
/// saves the mkdir before a call (about 45 µs) and the kill-and-rmdir
/// after it. Only tracking cgroups are kept (see `reusable`): a memory
/// cgroup would carry the page cache its call charged into the next.
/// Dropped with the session, which removes them.
#[derive(Debug, Default)]
pub struct Spare(std::sync::Mutex<Vec<CallCgroups>>);

/// Spare cgroups a session keeps at most (concurrent calls each took one).
const SPARE_MAX: usize = 8;

impl Spare {
    /// Cgroups for a call: a spare one where it can serve, else new ones
    /// named `name` (see [`CallCgroups::create`]).
    pub fn take(&self, name: &str, limits: Limits) -> io::Result<CallCgroups> {
        if limits.is_none() {
            let spare = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop();
            if let Some(cg) = spare {
                return Ok(cg);
            }
        }
        CallCgroups::create(name, limits)
    }

    /// Takes back a call's cgroups once the call is over: kept when
    /// reusable, never killed (a leftover was killed, or the call timed out
    /// or was cancelled) and room is left; else removed.
    pub fn give_back(&self, cg: CallCgroups) {
        let killed = cg.killed.load(std::sync::atomic::Ordering::Relaxed);
        let mut spare = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if cg.reusable && !killed && spare.len() < SPARE_MAX {
            spare.push(cg);
        }
    }
}

impl CallCgroups {
    /// Creates the call's cgroups. Tracking is best effort (none without
    /// root); a limit that cannot be applied is an error.
    pub fn create(name: &str, limits: Limits) -> io::Result<CallCgroups> {
        let mut cg = CallCgroups::default();
        if let Some(h) = hierarchy(None)
            && let Ok(dir) = make_dir(&h, name, None)
        {
            cg.tracking = Some(dir.clone());
            cg.v2 = Some(dir.clone());
            cg.dirs.push(dir);
        }
        if let Some(bytes) = limits.memory_bytes {
            let h = hierarchy(Some("memory")).ok_or_else(|| {
                io::Error::other("no cgroup hierarchy with the memory controller")
            })?;
            let file = match h {
                Hierarchy::V1(_) => "memory.limit_in_bytes",
                Hierarchy::V2(_) => "memory.max",
            };
            let dir = make_dir(&h, name, Some("memory"))?;
            cg.push(&h, &dir);
            write(&dir.join(file), &bytes.to_string())?;
            if let Hierarchy::V2(_) = h {
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            }
        }
        if let Some(n) = limits.pids {
            let h = hierarchy(Some("pids"))
                .ok_or_else(|| io::Error::other("no cgroup hierarchy with the pids controller"))?;
            let dir = make_dir(&h, name, Some("pids"))?;
            cg.push(&h, &dir);
            write(&dir.join("pids.max"), &n.to_string())?;
            cg.tracking.get_or_insert(dir);
        }
        cg.reusable = cg.v2.is_some() && cg.dirs.len() == 1 && limits.is_none();
        // unopenable: children join it through cgroup.procs instead, and
        // `populated` lists the processes
        cg.v2_fd = cg
            .v2
            .as_ref()
            .and_then(|d| std::fs::File::open(d).ok())
            .map(|f| Arc::new(f.into()));
        if cg.tracking.is_some() && cg.tracking == cg.v2 {
            cg.events = cg
                .v2
                .as_ref()
                .and_then(|d| std::fs::File::open(d.join("cgroup.events")).ok());
        }
        Ok(cg)
    }

    /// Records a controller's directory (v2 ones are the call's one v2
    /// directory; a directory is listed once).
    fn push(&mut self, h: &Hierarchy, dir: &Path) {
        if let Hierarchy::V2(_) = h {
            self.v2.get_or_insert_with(|| dir.to_path_buf());
        }
        if !self.dirs.iter().any(|d| d == dir) {
            self.dirs.push(dir.to_path_buf());
        }
    }

    /// Moves `pid` (before it execs) into every cgroup of the call.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        for dir in &self.dirs {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// The call's cgroup v2 directory, which a child can be started in
    /// (see `launch`), if the call has one.
    pub fn v2_dir(&self) -> Option<&Path> {
        self.v2.as_deref()
    }

    /// [`CallCgroups::v2_dir`] opened, when it could be.
    pub fn v2_fd(&self) -> Option<Arc<OwnedFd>> {
        self.v2_fd.clone()
    }

    /// The `cgroup.procs` file of every cgroup of the call but the v2 one,
    /// for a child that joins them itself before exec (see `attach`).
    pub fn v1_procs_files(&self) -> io::Result<Vec<std::ffi::CString>> {
        self.dirs
            .iter()
            .filter(|d| Some(d.as_path()) != self.v2_dir())
            .map(|d| procs_file(d))
            .collect()
    }

    /// Every process still in the call's tree (empty without tracking).
    pub fn pids(&self) -> Vec<i32> {
        let Some(dir) = &self.tracking else {
            return vec![];
        };
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// Whether a cgroup holds the call's whole tree (not without root).
    pub fn tracks(&self) -> bool {
        self.tracking.is_some()
    }

    /// Whether anything still runs in the call's tree, child cgroups
    /// included (v2 `cgroup.events`; v1: the listed processes).
    pub fn populated(&self) -> bool {
        if self.tracking.is_none() {
            return false;
        }
        // "populated 0|1\nfrozen 0|1\n": a kernfs file reads afresh from
        // offset 0 each time
        let mut buf = [0u8; 128];
        match self.events.as_ref().map(|f| f.read_at(&mut buf, 0)) {
            Some(Ok(n)) => buf[..n].split(|&b| b == b'\n').any(|l| l == b"populated 1"),
            _ => !self.pids().is_empty(),
        }
    }

    /// cgroup.kill (v2, Linux 5.14+) kills atomically, forks included.
    fn write_kill(&self, dir: &Path) {
        self.killed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    }

    /// SIGKILLs the whole tree once, without waiting for it to go.
    pub fn signal_all(&self) {
        let Some(dir) = &self.tracking else {
            return;
        };
        self.write_kill(dir);
        for pid in self.pids() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// SIGKILLs the whole tree and waits (up to 2 s) until it is gone.
    pub fn kill_all(&self) {
        let Some(dir) = &self.tracking else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        self.write_kill(dir);
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl CallCgroups {
    /// Kills what is left and removes the directories: blocking.
    fn remove(&mut self) {
        self.kill_all();
        self.tracking = None;
        for dir in self.dirs.drain(..) {
            // a v1 memory cgroup may take a moment to release its charges
            for _ in 0..100 {
                if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Drop for CallCgroups {
    fn drop(&mut self) {
        if self.dirs.is_empty() {
            return;
        }
        // not dropped again if a runtime that is shutting down drops the
        // task unrun (that drop would spawn again, recursing): then the
        // directories stay for the next `sweep_stale`
        let left = std::mem::ManuallyDrop::new(CallCgroups {
            dirs: std::mem::take(&mut self.dirs),
            tracking: self.tracking.take(),
            v2: self.v2.take(),
            // the open files close with `self`
            v2_fd: None,
            events: None,
            reusable: false,
            killed: Default::default(),
        });
        // the kill and the removal can wait on the kernel for seconds: on an
        // async runtime's thread that would stall every session it serves
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || remove_and_free(left))),
            Err(_) => remove_and_free(left),
        }
    }
}

/// Removes a dropped call's cgroups, then frees what held them: emptied,
/// its drop spawns nothing. (Left in its `ManuallyDrop`, every call's
/// directory list and paths stayed on the heap: about 150 bytes a call,
/// megabytes an hour under a campaign.)
fn remove_and_free(mut left: std::mem::ManuallyDrop<CallCgroups>) {
    left.remove();
    drop(std::mem::ManuallyDrop::into_inner(left));
}

fn make_dir(h: &Hierarchy, name: &str, controller: Option<&str>) -> io::Result<PathBuf> {
    let (root, v2) = match h {
        Hierarchy::V1(r) => (r, false),
        Hierarchy::V2(r) => (r, true),
    };
    let parent = root.join(PARENT);
    if !parent.exists() {
        match std::fs::create_dir(&parent) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    if let (true, Some(c)) = (v2, controller) {
        // controllers must be enabled down the path to the call's cgroup
        write(&root.join("cgroup.subtree_control"), &format!("+{c}"))?;
        write(&parent.join("cgroup.subtree_control"), &format!("+{c}"))?;
    }
    let dir = parent.join(name);
    match std::fs::create_dir(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(dir),
    }
}

/// `dir`'s `cgroup.procs`, as the C string a child writes itself into.
pub fn procs_file(dir: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt as _;
    std::ffi::CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
        .map_err(|_| io::Error::other("a NUL byte in a cgroup path"))
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::{CallCgroups, Limits};

    /// A call's cgroups, dropped (outside a runtime: removed on the spot),
    /// leave nothing on the heap: a month of calls must not add up.
    #[test]
    fn dropped_call_cgroups_leave_nothing_on_the_heap() {
        let name = |k: usize| format!("mcp-{}-heap-{k}", std::process::id());
        let first = CallCgroups::create(&name(0), Limits::default()).unwrap();
        if !first.tracks() {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(
                !ci,
                "no call cgroup could be made (root and cgroup v2 are needed); CI=true forbids skipping"
            );
            eprintln!("skipped: no call cgroup could be made (root and cgroup v2 are needed)");
            return;
        }
        drop(first);
        let before = crate::thread_heap::live();
        for k in 1..=50 {
            let cg = CallCgroups::create(&name(k), Limits::default()).unwrap();
            let dir = cg.v2_dir().unwrap().to_path_buf();
            drop(cg);
            assert!(!dir.exists(), "{} was not removed", dir.display());
        }
        let left = crate::thread_heap::live() - before;
        assert_eq!(left, 0, "50 calls' cgroups left {left} bytes on the heap");
    }
}
