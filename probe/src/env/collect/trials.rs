//! Trials: a system call tried for real, in a forked child that then
//! exits, so whatever it changes (a new namespace, a tracer) dies with it.
//!
//! The child may be forked from a threaded process, so it does nothing
//! but raw system calls and `_exit` (async-signal-safe): no allocation, no
//! locks. It reports through its exit status: 0 for success, else the
//! errno.

use std::time::{Duration, Instant};

use super::util::errno_name;

/// How long a trial may take before it is killed.
const TRIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// The trials the `syscalls` facet reports, by key.
pub const TRIALS: &[&str] = &[
    "try.userns",
    "try.mountns",
    "try.io_uring",
    "try.bpf",
    "try.ptrace",
    "try.perf_event",
    "try.userfaultfd",
];

/// Runs every trial: (key, "ok" | errno name | what happened).
pub fn run_all() -> Vec<(&'static str, String)> {
    let root = nix::unistd::geteuid().is_root();
    TRIALS
        .iter()
        .map(|&key| {
            let outcome = match key {
                "try.userns" => in_child(userns),
                "try.mountns" if root => in_child(mountns_root),
                "try.mountns" => in_child(mountns_user),
                "try.io_uring" => in_child(io_uring),
                "try.bpf" => in_child(bpf_map),
                "try.ptrace" => in_child(ptrace_traceme),
                "try.perf_event" => in_child(perf_event),
                _ => in_child(userfaultfd),
            };
            (key, outcome)
        })
        .collect()
}

/// Runs `body` in a forked child and names its outcome.
pub fn in_child(body: fn() -> i32) -> String {
    // SAFETY: the child runs only `body` (raw system calls, no allocation)
    // and `_exit`, which are async-signal-safe after fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return format!("not tried: fork {}", errno_name(last_errno()));
    }
    if pid == 0 {
        let code = body();
        // SAFETY: leaves the child at once, running nothing of the parent's.
        unsafe { libc::_exit(code.clamp(0, 255)) };
    }
    wait(pid, TRIAL_TIMEOUT)
}

/// Waits for the trial child, killing it at the deadline.
fn wait(pid: libc::pid_t, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    let mut status = 0;
    loop {
        // SAFETY: status is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if r < 0 && last_errno() != libc::EINTR {
            return format!("not known: waitpid {}", errno_name(last_errno()));
        }
        if Instant::now() >= deadline {
            // SAFETY: pid is our own unreaped child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return format!("no answer within {} s (killed)", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    if libc::WIFEXITED(status) {
        match libc::WEXITSTATUS(status) {
            0 => "ok".into(),
            e => errno_name(e),
        }
    } else if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let name = nix::sys::signal::Signal::try_from(sig)
            .map(|s| s.as_str().to_string())
            .unwrap_or_else(|_| format!("signal {sig}"));
        format!("killed by {name}")
    } else {
        "not known: odd wait status".into()
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// 0 when a raw system call returned a file descriptor (closed here) or
/// 0, else its errno.
fn outcome(r: libc::c_long, close: bool) -> i32 {
    if r < 0 {
        return last_errno().max(1);
    }
    if close {
        // SAFETY: r is a descriptor the call just returned.
        unsafe { libc::close(r as i32) };
    }
    0
}

fn unshare(flags: libc::c_int) -> i32 {
    // SAFETY: unshare takes an integer.
    outcome(unsafe { libc::syscall(libc::SYS_unshare, flags) }, false)
}

fn userns() -> i32 {
    unshare(libc::CLONE_NEWUSER)
}

fn mountns_user() -> i32 {
    unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS)
}

fn mountns_root() -> i32 {
    unshare(libc::CLONE_NEWNS)
}

fn io_uring() -> i32 {
    // struct io_uring_params, zeroed: the kernel fills it in
    let mut params = [0u64; 15];
    // SAFETY: params is 120 writable bytes, the size of io_uring_params.
    let r = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    outcome(r, true)
}

fn bpf_map() -> i32 {
    // union bpf_attr for BPF_MAP_CREATE: a one-element array map; the
    // rest zero (the kernel checks that what it does not know is zero)
    let mut attr = [0u32; 32];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4; // key_size
    attr[2] = 4; // value_size
    attr[3] = 1; // max_entries
    // SAFETY: attr is 128 readable bytes, as the size says.
    let r = unsafe { libc::syscall(libc::SYS_bpf, 0, attr.as_mut_ptr(), 128u32) };
    outcome(r, true)
}

fn ptrace_traceme() -> i32 {
    // SAFETY: PTRACE_TRACEME takes no pointers.
    let r = unsafe { libc::syscall(libc::SYS_ptrace, 0, 0, 0, 0) };
    outcome(r, false)
}

/// struct perf_event_attr as of PERF_ATTR_SIZE_VER0 (64 bytes).
#[repr(C)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// The bit of a perf_event_attr flag: C bitfields start at the low bit on
/// little-endian targets, at the high bit on big-endian ones.
const fn perf_flag(bit: u32) -> u64 {
    if cfg!(target_endian = "little") {
        1 << bit
    } else {
        1 << (63 - bit)
    }
}

fn perf_event() -> i32 {
    let attr = PerfEventAttr {
        kind: 1, // PERF_TYPE_SOFTWARE
        size: 64,
        config: 0, // PERF_COUNT_SW_CPU_CLOCK
        sample_period: 0,
        sample_type: 0,
        read_format: 0,
        // disabled, exclude_kernel, exclude_hv: what an unprivileged
        // self-monitoring process may ask for
        flags: perf_flag(0) | perf_flag(5) | perf_flag(6),
        wakeup_events: 0,
        bp_type: 0,
        config1: 0,
    };
    // this process, any CPU, no group, PERF_FLAG_FD_CLOEXEC
    // SAFETY: attr is a valid perf_event_attr of the size it states.
    let r = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            0,
            -1,
            -1,
            8u64,
        )
    };
    outcome(r, true)
}

fn userfaultfd() -> i32 {
    // SAFETY: takes flags only.
    let r = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
    outcome(r, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_named() {
        assert_eq!(in_child(|| 0), "ok");
        assert_eq!(in_child(|| libc::EPERM), "EPERM");
        assert_eq!(
            in_child(|| {
                // SAFETY: raising a signal in the trial child only.
                unsafe { libc::raise(libc::SIGKILL) };
                0
            }),
            "killed by SIGKILL"
        );
    }

    #[test]
    fn every_trial_answers() {
        let all = run_all();
        assert_eq!(all.len(), TRIALS.len());
        for (key, v) in all {
            assert!(!v.is_empty(), "{key}");
            // ptrace(PTRACE_TRACEME) is allowed almost everywhere
            if key == "try.ptrace" {
                assert!(v == "ok" || v.starts_with('E'), "{v}");
            }
        }
    }

    #[test]
    fn a_hung_trial_is_killed() {
        // SAFETY: pause() just waits, in the child
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe {
                libc::pause();
                libc::_exit(0)
            };
        }
        let got = wait(pid, Duration::from_millis(100));
        assert!(got.starts_with("no answer"), "{got}");
        // killed and reaped, not left behind
        assert_eq!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
    }
}
