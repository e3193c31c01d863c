//! A gVisor sandbox's memory, watched from the host: gVisor has no point
//! for an OOM kill (the host's OOM killer kills the whole sandbox
//! process). Two witnesses: the `oom_kill` count of the sandbox's own
//! memory cgroup, read as the span goes (runsc removes the cgroup once the
//! sandbox is gone), and the kernel log's record of the kill, read at the
//! end (it outlives the cgroup: a kill between two reads is not missed).
//! Used by both `probe trace --gvisor` and the daemon, through
//! [`super::source::GvisorSource`].

use std::time::{Duration, Instant};

use crate::event::{KernelEvent, Kind};
use crate::spans::SpanEvidence;

/// How a watcher finds its sandbox process.
#[derive(Debug, Clone)]
pub enum Finder {
    /// Under this runsc (or a wrapper of it), which runs in the foreground.
    Runsc(u32),
    /// The sandbox that runs this container (detached: its runsc is gone).
    Container(String),
}

/// How often a watcher that has not found its sandbox looks again (a walk
/// of /proc).
const LOOK_AGAIN: Duration = Duration::from_millis(200);

pub struct SandboxMemory {
    finder: Option<Finder>,
    looked: Option<Instant>,
    sandbox: Option<u32>,
    cgroup: Option<crate::cgroup::MemoryCgroup>,
    limit_kb: Option<u64>,
    /// The cgroup's kills when it was found: a cgroup runsc made for this
    /// run counts from 0; a long-lived sandbox's counts from the span's
    /// start.
    baseline: Option<u64>,
    counts_from_zero: bool,
    kills: u64,
    log: Option<KernelLog>,
}

impl SandboxMemory {
    /// A watcher from now on. `counts_from_zero`: the sandbox is this
    /// run's own (`probe trace`), so every kill its cgroup counted is the
    /// run's, even one before it was found.
    pub fn new(finder: Option<Finder>, counts_from_zero: bool) -> SandboxMemory {
        SandboxMemory {
            finder,
            looked: None,
            sandbox: None,
            cgroup: None,
            limit_kb: None,
            baseline: None,
            counts_from_zero,
            kills: 0,
            log: KernelLog::open_at_end(),
        }
    }

    pub fn find_by(&mut self, finder: Finder) {
        self.finder = Some(finder);
    }

    /// Finds the sandbox and its cgroup, then reads its count.
    pub fn watch(&mut self) {
        if let Some(cg) = &self.cgroup {
            if let Some(n) = cg.oom_kills() {
                self.kills = n.saturating_sub(self.baseline.unwrap_or(0));
            }
            return;
        }
        let found = match (self.sandbox, &self.finder) {
            (Some(pid), _) => Some(pid),
            (None, None) => return,
            // its runsc runs in the foreground: a walk of its descendants,
            // every pass (a sandbox killed soon after it starts is found)
            (None, Some(Finder::Runsc(runsc))) => sandbox_process(*runsc),
            // a walk of all of /proc: not on every pass
            (None, Some(Finder::Container(id))) => {
                if self.looked.is_some_and(|at| at.elapsed() < LOOK_AGAIN) {
                    return;
                }
                self.looked = Some(Instant::now());
                sandbox_running(id)
            }
        };
        let Some(sandbox) = found else {
            return;
        };
        self.sandbox = Some(sandbox);
        // its own cgroup, once runsc has moved it there (until then it is
        // in its parent's, which is not the sandbox's limit)
        let own = crate::cgroup::MemoryCgroup::of(sandbox);
        let parents = crate::proctree::ppid(sandbox).and_then(crate::cgroup::MemoryCgroup::of);
        if let Some(cg) = own.filter(|c| parents.as_ref().is_none_or(|p| p.path != c.path)) {
            let now = cg.oom_kills().unwrap_or(0);
            self.baseline = Some(if self.counts_from_zero { 0 } else { now });
            self.kills = now.saturating_sub(self.baseline.unwrap_or(0));
            self.limit_kb = crate::cgroup::memory_of(sandbox).and_then(|(_, limit)| limit);
            self.cgroup = Some(cg);
        }
    }

    /// The OOM kill a witness saw, as the event the eBPF side sends for
    /// its victim: here the span's root, which died with the sandbox.
    pub fn kill(&mut self, span: &SpanEvidence) -> Option<KernelEvent> {
        let logged = match (self.sandbox, self.log.as_mut()) {
            (Some(pid), Some(log)) => log.oom_killed(pid),
            _ => false,
        };
        if self.kills == 0 && !logged {
            return None;
        }
        let pid = span.root_pid.unwrap_or(1);
        let comm = span
            .processes
            .get(&pid)
            .map(|p| p.comm.clone())
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "the sandbox".into());
        let at = crate::clock::monotonic_ns().saturating_sub(span.start_ns);
        let mut ev = KernelEvent::bare(Kind::OomVictim, at, pid, pid, comm);
        ev.cgroup = self.cgroup.as_ref().map(|c| c.path.clone());
        ev.memory_max_kb = self.limit_kb;
        Some(ev)
    }
}

/// The kernel log (`/dev/kmsg`), read from where it stood when opened.
struct KernelLog(std::fs::File);

impl KernelLog {
    /// `None` where the log cannot be read (no root, a container without it).
    fn open_at_end() -> Option<KernelLog> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()?;
        // SAFETY: lseek on an fd we own; SEEK_END on /dev/kmsg moves to
        // the next record to be written
        unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(&file), 0, libc::SEEK_END) };
        Some(KernelLog(file))
    }

    /// Whether a record since opening says the OOM killer killed `pid`
    /// ("Killed process PID (comm) …"). Its anon RSS is not taken: the
    /// Sentry keeps the workload's memory in a memory file, not anon.
    fn oom_killed(&mut self, pid: u32) -> bool {
        let needle = format!("Killed process {pid} (");
        let mut buf = vec![0u8; 8192];
        let mut found = false;
        loop {
            // one record per read; EAGAIN at the end, EPIPE when records
            // were overwritten (the next read goes on)
            match std::io::Read::read(&mut self.0, &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let record = String::from_utf8_lossy(&buf[..n]);
                    let text = record.split_once(';').map_or(record.as_ref(), |(_, t)| t);
                    found |= text.contains(&needle);
                }
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        found
    }
}

/// The runsc-sandbox process under `top` (runsc, or a wrapper of it:
/// `timeout 60 runsc …`; runsc re-executes itself: argv[0] names the
/// part, its comm is `exe`).
pub fn sandbox_process(top: u32) -> Option<u32> {
    crate::proctree::descendants(top)
        .into_iter()
        .find(|&pid| is_sandbox(pid, None))
}

/// The runsc-sandbox process that runs `container` (`runsc-sandbox …
/// boot … ID`: its last word names the sandbox's first container).
fn sandbox_running(container: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| is_sandbox(pid, Some(container)))
}

fn is_sandbox(pid: u32, container: Option<&str>) -> bool {
    crate::proctree::argv(pid).is_some_and(|w| {
        w.first().map(String::as_str) == Some("runsc-sandbox")
            && container.is_none_or(|c| w.last().map(String::as_str) == Some(c))
    })
}
