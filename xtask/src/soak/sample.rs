//! Every interval: each process's RSS, open fds and threads from /proc, the
//! daemon's figures from `probe status --json`, the call cgroups under the
//! bridge's parent, and the DB's files and filesystem.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fleet::{Fleet, Role};

#[derive(Clone, Copy, Default, Debug)]
pub struct ProcSample {
    pub rss_kib: u64,
    pub fds: u64,
    pub threads: u64,
}

#[derive(Clone, Default, Debug)]
pub struct Sample {
    /// Seconds since the soak started.
    pub t: f64,
    pub procs: BTreeMap<Role, ProcSample>,
    /// The daemon's, when it answered.
    pub open_spans: Option<u64>,
    /// Spans its connections end if they close first (a server's spans
    /// between calls): bounded by the servers' connections, or a leak.
    pub ending_with_connection: Option<u64>,
    /// Span ids its connections keep to end should their client die:
    /// those open, and those ended on another connection since the last
    /// pruning (bounded by twice the open spans), or a leak.
    pub ending_with_client: Option<u64>,
    pub tracked_tasks: Option<u64>,
    /// The sessions' remembered writes (paths and directories).
    pub paths_remembered: Option<u64>,
    pub events_total: Option<u64>,
    pub kernel_drops: Option<u64>,
    pub late_events: Option<u64>,
    pub store_errors: Option<u64>,
    pub budget_bytes: Option<u64>,
    /// Call cgroups (`mcp-PID-…`) of live bridges (in use, or spare ones
    /// kept for their next calls).
    pub cgroups: u64,
    /// Call cgroups whose bridge is gone: left over until the next bridge
    /// starts and sweeps them.
    pub cgroups_orphaned: u64,
    pub db_bytes: u64,
    pub wal_bytes: u64,
    pub fs_free_bytes: u64,
}

pub struct Sampler {
    handle: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    pub fn spawn(
        fleet: Arc<Fleet>,
        every: Duration,
        started: Instant,
        stop: Arc<AtomicBool>,
    ) -> Sampler {
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut next = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                if Instant::now() >= next {
                    samples.push(take(&fleet, started));
                    next += every;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            samples.push(take(&fleet, started));
            samples
        });
        Sampler { handle }
    }

    pub fn join(self) -> Vec<Sample> {
        self.handle.join().unwrap_or_default()
    }
}

pub fn take(fleet: &Fleet, started: Instant) -> Sample {
    let mut s = Sample {
        t: started.elapsed().as_secs_f64(),
        ..Sample::default()
    };
    for role in Role::ALL {
        if let Some(pid) = fleet.pid(role)
            && let Some(p) = proc_sample(pid)
        {
            s.procs.insert(role, p);
        }
    }
    if let Some(st) = status(fleet) {
        let n = |v: &Value| v.as_u64();
        s.open_spans = n(&st["open_spans"]);
        s.ending_with_connection = n(&st["clients"]["spans_ending_with_connection"]);
        s.ending_with_client = n(&st["clients"]["spans_ending_with_client"]);
        s.tracked_tasks = n(&st["tracked_tasks"]);
        s.paths_remembered = n(&st["paths_remembered"]);
        s.events_total = n(&st["events_total"]);
        s.kernel_drops = n(&st["drops"]["kernel_total"]);
        s.late_events = n(&st["late_events"]);
        s.store_errors = n(&st["db"]["store_errors"]);
        s.budget_bytes = n(&st["db"]["budget_bytes"]);
    }
    (s.cgroups, s.cgroups_orphaned) = call_cgroups();
    let len = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    s.db_bytes = len(&fleet.db);
    s.wal_bytes = len(&fleet.db.with_extension("db-wal"));
    s.fs_free_bytes = free_bytes(&fleet.fs);
    s
}

/// `probe status --json`, when the daemon answers.
pub fn status(fleet: &Fleet) -> Option<Value> {
    let out = Command::new(fleet.probe())
        .args(["status", "--json", "--socket"])
        .arg(&fleet.socket)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(ProcSample {
        rss_kib: field("VmRSS:"),
        fds,
        threads: field("Threads:"),
    })
}

/// The call cgroups (`agent-bridge/mcp-PID-…`) in every hierarchy the
/// bridge uses, counted once per name: (those of live bridges, those whose
/// bridge is gone).
pub fn call_cgroups() -> (u64, u64) {
    let mut names = std::collections::BTreeSet::new();
    let roots = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .chain(
            std::fs::read_dir("/sys/fs/cgroup")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path()),
        );
    for root in roots {
        for e in std::fs::read_dir(root.join("agent-bridge"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_prefix("mcp-") {
                let pid = rest.split('-').next().unwrap_or("").to_string();
                names.insert((name.clone(), pid));
            }
        }
    }
    let orphaned = names
        .iter()
        .filter(|(_, pid)| !std::path::Path::new("/proc").join(pid).exists())
        .count() as u64;
    (names.len() as u64 - orphaned, orphaned)
}

/// Bytes an unprivileged writer may still use on `path`'s filesystem (0
/// when it cannot be read).
pub fn free_bytes(path: &std::path::Path) -> u64 {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs writes into the zeroed struct; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return 0;
        }
        st.f_bavail as u64 * st.f_frsize as u64
    }
}
