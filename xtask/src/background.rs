//! Work `cargo xtask test` runs beside its tests: at the lowest CPU and I/O
//! priority, so it takes only what the tests leave idle, and raised to the
//! normal priority once the tests wait on it.

use std::collections::{BTreeMap, BTreeSet};

/// The nice of background work.
const NICE: i32 = 19;

/// Puts the calling thread, and all it starts from now on, at the lowest
/// CPU and I/O priority.
pub fn lowest_priority_here() {
    // SAFETY: plain syscalls on this thread (0: the caller, which on Linux
    // is this thread); what it spawns inherits both.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, NICE);
        // best-effort class, its lowest level: the tests' I/O first
        libc::syscall(libc::SYS_ioprio_set, 1, 0, (2 << 13) | 7);
    }
}

/// Raises every process this one started that still runs at the background
/// nice (and their children) to the normal priority; returns how many. A
/// child forked after this inherits its parent's new priority, so a second
/// pass catches the few forked while the first ran.
pub fn raise_to_normal() -> usize {
    let mut raised = 0;
    for _ in 0..2 {
        for pid in background_descendants(std::process::id()) {
            // SAFETY: plain syscalls on a pid; one gone meanwhile fails
            // harmlessly.
            let ok = unsafe {
                let cpu = libc::setpriority(libc::PRIO_PROCESS, pid, 0) == 0;
                // class none: I/O priority follows the CPU nice again
                libc::syscall(libc::SYS_ioprio_set, 1, pid, 0);
                cpu
            };
            raised += usize::from(ok);
        }
    }
    raised
}

/// The descendants of `root` whose nice is [`NICE`].
fn background_descendants(root: u32) -> Vec<u32> {
    // pid -> (parent, nice), from /proc/PID/stat: fields after the `)`
    // that ends the command name are state, ppid, …; nice is the 19th field
    let mut procs = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if let (Some(Ok(ppid)), Some(Ok(nice))) = (
            fields.get(1).map(|f| f.parse::<u32>()),
            fields.get(16).map(|f| f.parse::<i32>()),
        ) {
            procs.insert(pid, (ppid, nice));
        }
    }
    let mut below = BTreeSet::from([root]);
    // parents have lower pids mostly, but not always: repeat until stable
    loop {
        let before = below.len();
        for (&pid, &(ppid, _)) in &procs {
            if below.contains(&ppid) {
                below.insert(pid);
            }
        }
        if below.len() == before {
            break;
        }
    }
    below
        .into_iter()
        .filter(|pid| *pid != root && procs.get(pid).is_some_and(|&(_, nice)| nice == NICE))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn background_children_are_raised_and_others_left_alone() {
        if unsafe { libc::geteuid() } != 0 {
            // lowering a nice needs CAP_SYS_NICE
            assert!(
                std::env::var("CI").is_err(),
                "this test needs root under CI=true"
            );
            eprintln!("not root: skipped");
            return;
        }
        let background = std::thread::spawn(|| {
            lowest_priority_here();
            Command::new("sleep").arg("30").spawn().unwrap()
        })
        .join()
        .unwrap();
        // another nice, as work the caller niced for its own reasons
        let other = std::thread::spawn(|| {
            // SAFETY: a plain syscall on this thread
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 5) };
            Command::new("sleep").arg("30").spawn().unwrap()
        })
        .join()
        .unwrap();
        let nice = |pid: u32| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let rest = stat.rsplit_once(')').unwrap().1.to_string();
            rest.split_whitespace()
                .nth(16)
                .unwrap()
                .parse::<i32>()
                .unwrap()
        };
        assert_eq!(nice(background.id()), NICE);
        assert!(background_descendants(std::process::id()).contains(&background.id()));
        assert!(raise_to_normal() >= 1);
        assert_eq!(nice(background.id()), 0);
        assert_eq!(nice(other.id()), 5);
        for mut child in [background, other] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
