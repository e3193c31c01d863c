//! Spans that follow a cgroup (v2): everything that runs in it during the
//! span is the span's, whoever started it (a Docker container's processes
//! are containerd-shim's children, not `docker run`'s). The kernel side
//! keys on the cgroup's id, the inode number of its directory.

use std::path::{Path, PathBuf};

/// `statfs` magic of the cgroup v2 filesystem.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// A cgroup v2 directory and its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    pub path: PathBuf,
    pub id: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{path}: {error}")]
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{0} is not a cgroup v2 directory: a span follows cgroups of the unified hierarchy \
         (/sys/fs/cgroup on a cgroup v2 host, /sys/fs/cgroup/unified on a hybrid one); \
         a container's is the `0::` line of /proc/PID/cgroup under that mount"
    )]
    NotV2(PathBuf),
}

impl Cgroup {
    /// Opens `path`, which must be a directory of the cgroup v2 filesystem.
    pub fn open(path: &Path) -> Result<Cgroup, CgroupError> {
        let unreadable = |error| CgroupError::Unreadable {
            path: path.to_path_buf(),
            error,
        };
        let fs = nix::sys::statfs::statfs(path).map_err(|e| unreadable(e.into()))?;
        if fs.filesystem_type().0 as i64 != CGROUP2_SUPER_MAGIC {
            return Err(CgroupError::NotV2(path.to_path_buf()));
        }
        let meta = std::fs::metadata(path).map_err(unreadable)?;
        if !meta.is_dir() {
            return Err(CgroupError::NotV2(path.to_path_buf()));
        }
        Ok(Cgroup {
            path: path.to_path_buf(),
            id: std::os::unix::fs::MetadataExt::ino(&meta),
        })
    }

    /// The threads in it now (`cgroup.threads`), to attach at the span's
    /// start; the kernel adds those that fork or exec in it afterwards.
    pub fn threads(&self) -> Result<Vec<u32>, CgroupError> {
        let file = self.path.join("cgroup.threads");
        let text = std::fs::read_to_string(&file)
            .map_err(|error| CgroupError::Unreadable { path: file, error })?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }
}

/// The cgroup v2 mount point: `/sys/fs/cgroup` (v2 host) or
/// `/sys/fs/cgroup/unified` (hybrid), from /proc/self/mountinfo.
pub fn v2_root() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// A process's memory cgroup: its path (as /proc/PID/cgroup says it),
/// its directory, and whether that is a v1 `memory` hierarchy.
#[derive(Debug, Clone)]
pub struct MemoryCgroup {
    pub path: String,
    pub dir: PathBuf,
    pub v1: bool,
}

impl MemoryCgroup {
    /// `None` in the root cgroup, or when the process is gone.
    pub fn of(pid: u32) -> Option<MemoryCgroup> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let line = |want: &dyn Fn(&str) -> bool| {
            text.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
                want(controllers).then(|| path.to_string())
            })
        };
        let (path, dir, v1) = match line(&|c| c.split(',').any(|c| c == "memory")) {
            Some(path) => {
                let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
                (path, dir, true)
            }
            None => {
                let path = line(&|c| c.is_empty())?;
                let dir = v2_root()?.join(path.trim_start_matches('/'));
                (path, dir, false)
            }
        };
        (path != "/").then_some(MemoryCgroup { path, dir, v1 })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// How many times the OOM killer killed in it (`oom_kill` of v2's
    /// memory.events, v1's memory.oom_control); `None` once it is gone.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = self.file(if self.v1 {
            "memory.oom_control"
        } else {
            "memory.events"
        });
        let text = std::fs::read_to_string(file).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
    }
}

/// The memory cgroup a process is in: its path (the `memory` line of
/// /proc/PID/cgroup on a v1 or hybrid host, else the v2 `0::` line) and
/// that cgroup's limit in KiB (`None` when unlimited or unreadable);
/// `None` in the root cgroup, which has no limit to name. Read while an
/// OOM victim is still being killed, to say where the limit was.
pub fn memory_of(pid: u32) -> Option<(String, Option<u64>)> {
    let m = MemoryCgroup::of(pid)?;
    let limit = m.file(if m.v1 {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    });
    let path = m.path;
    // "max" (v2) or a page-rounded 2^63 (v1) when there is no limit
    let limit = std::fs::read_to_string(limit)
        .ok()
        .and_then(|m| m.trim().parse::<u64>().ok())
        .filter(|&bytes| bytes < 1 << 62)
        .map(|bytes| bytes / 1024);
    Some((path, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_is_not_a_cgroup_is_refused_with_where_to_look() {
        let e = Cgroup::open(Path::new("/tmp")).unwrap_err();
        assert!(matches!(e, CgroupError::NotV2(_)), "{e}");
        assert!(e.to_string().contains("0::"), "{e}");
        let e = Cgroup::open(Path::new("/nonexistent-cgroup")).unwrap_err();
        assert!(matches!(e, CgroupError::Unreadable { .. }), "{e}");
    }

    #[test]
    fn the_v2_root_is_a_cgroup_whose_threads_can_be_read() {
        let Some(root) = v2_root() else {
            eprintln!("SKIPPED: no cgroup2 mount on this machine");
            return;
        };
        let cg = Cgroup::open(&root).expect("the v2 root opens");
        assert!(cg.id > 0);
        // this test's own thread is somewhere in the hierarchy; the root
        // lists its direct members (possibly none), and reads
        cg.threads().expect("cgroup.threads reads");
    }

    #[test]
    fn a_live_process_has_a_memory_cgroup_path() {
        // a process in a memory cgroup of its own, with a limit
        let Some(mem) = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
            .iter()
            .map(Path::new)
            .find(|p| p.join("cgroup.procs").exists() && p.join("memory.stat").exists())
        else {
            eprintln!("SKIPPED: no memory controller mounted");
            return;
        };
        if !nix::unistd::Uid::effective().is_root() {
            assert!(
                !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
                "CI runs as root: making a memory cgroup needs it"
            );
            eprintln!("SKIPPED: making a memory cgroup needs root");
            return;
        }
        let dir = mem.join(format!("probe-memory-of-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let limit = if dir.join("memory.max").exists() {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(dir.join(limit), "268435456").unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        let got = memory_of(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_dir(&dir).unwrap();
        let (path, max) = got.expect("the child's memory cgroup reads");
        assert!(
            path.ends_with(&format!("probe-memory-of-{}", std::process::id())),
            "{path}"
        );
        assert_eq!(max, Some(256 * 1024));
        assert!(memory_of(u32::MAX).is_none());
    }
}
