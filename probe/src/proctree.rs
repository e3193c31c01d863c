//! A running process tree as /proc shows it: every thread of a process and
//! of all its descendants (for `begin_span` with `tree`), a process's
//! parent and command line.

use std::collections::HashSet;

/// The thread ids of `pid` (all its threads) and, recursively, of every
/// child of any of them. Processes that exit during the walk are skipped.
pub fn threads(pid: u32) -> Vec<u32> {
    walk(pid).1
}

/// `pid` and, recursively, every process it started that still runs.
pub fn descendants(pid: u32) -> Vec<u32> {
    walk(pid).0
}

/// (the processes, their threads) of the tree under `pid`.
fn walk(pid: u32) -> (Vec<u32>, Vec<u32>) {
    let (mut processes, mut threads) = (Vec::new(), Vec::new());
    let mut seen = HashSet::new();
    let mut todo = vec![pid];
    // without CONFIG_PROC_CHILDREN: parent → children from every /proc/N/stat
    let mut by_parent: Option<std::collections::HashMap<u32, Vec<u32>>> = None;
    while let Some(p) = todo.pop() {
        if !seen.insert(p) {
            continue;
        }
        processes.push(p);
        for tid in tasks(p) {
            threads.push(tid);
            match std::fs::read_to_string(format!("/proc/{p}/task/{tid}/children")) {
                Ok(children) => {
                    todo.extend(
                        children
                            .split_whitespace()
                            .filter_map(|c| c.parse::<u32>().ok()),
                    );
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && tid == p => {
                    let map = by_parent.get_or_insert_with(parents);
                    todo.extend(map.get(&p).into_iter().flatten().copied());
                }
                Err(_) => {}
            }
        }
    }
    (processes, threads)
}

/// /proc/PID/stat after its command name (state, ppid, …); `None` when
/// the process is gone.
fn stat_after_comm(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parentheses: fields start after the last ')'
    Some(stat.rsplit_once(')')?.1.to_owned())
}

/// The parent of `pid`, from /proc/PID/stat.
pub fn ppid(pid: u32) -> Option<u32> {
    stat_after_comm(pid)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` has exited: gone from /proc, or a zombie waiting to be
/// reaped.
pub fn exited(pid: u32) -> bool {
    stat_after_comm(pid).is_none_or(|f| matches!(f.split_whitespace().next(), Some("Z" | "X")))
}

/// The command line of `pid`, word by word (empty words dropped).
pub fn argv(pid: u32) -> Option<Vec<String>> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        cmdline
            .split(|&b| b == 0)
            .filter(|w| !w.is_empty())
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect(),
    )
}

/// The threads of one process (none when it is gone).
fn tasks(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every process's children, from the ppid field of /proc/N/stat.
fn parents() -> std::collections::HashMap<u32, Vec<u32>> {
    let mut map: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return map;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(ppid) = ppid(pid) {
            map.entry(ppid).or_default().push(pid);
        }
    }
    map
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_threads_and_descendants() {
        // sh → sleep: the child shows up, and so does this test's own threads
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let sh = child.id();
        let found = loop {
            let t = super::threads(sh);
            if t.len() >= 2 || std::time::Instant::now() > deadline {
                break t;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(found.contains(&sh), "{found:?}");
        assert_eq!(found.len(), 2, "sh and its sleep: {found:?}");
        let me = super::threads(std::process::id());
        assert!(me.len() >= 2, "this test binary runs threads: {me:?}");
        for &p in found.iter().filter(|&&p| p != sh) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
