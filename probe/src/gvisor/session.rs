//! The trace session the probe asks runsc for: which points, with which
//! context, sent where (`--pod-init-config`, or `runsc trace create`).

use std::ffi::{OsStr, OsString};
use std::path::Path;

use serde_json::{Value, json};

/// Context every point carries: the probe keys spans by container and
/// pid, names processes, and resolves relative paths against the cwd.
const CONTEXT: [&str; 6] = [
    "time",
    "thread_id",
    "group_id",
    "container_id",
    "process_name",
    "cwd",
];

/// Syscalls with a schematized point (path, address, flags): their exits.
/// Reads, writes and closes are most of a workload's syscalls, and gVisor
/// sends a point for every success too: `IoPoints` says which of them are
/// asked for (docs/BENCHMARKS.md has what they cost).
const SCHEMATIZED: [&str; 16] = [
    "open", "openat", "creat", "execve", "execveat", "connect", "socket", "bind", "accept",
    "accept4", "chdir", "fchdir", "chroot", "clone", "fork", "vfork",
];

/// Syscalls that fail for sandbox reasons and have no schema: raw points,
/// sysno and errno only (gVisor does not read their path arguments).
/// x86_64 numbers: mkdir, rmdir, unlink, unlinkat, mkdirat, rename,
/// renameat, renameat2, link, linkat, symlink, symlinkat, chmod, fchmodat,
/// chown, fchownat, truncate, access, faccessat, faccessat2, stat, lstat,
/// newfstatat, statx, mount, umount2, unshare, setns, ptrace, bpf,
/// setrlimit, prlimit64.
pub const RAW_SYSNOS: [u32; 32] = [
    83, 84, 87, 263, 258, 82, 264, 316, 86, 265, 88, 266, 90, 268, 92, 260, 76, 21, 269, 439, 4, 6,
    262, 332, 165, 166, 272, 308, 101, 321, 160, 302,
];

/// Syscalls a user-space kernel may not have (ENOSYS), newer than most
/// programs' fallbacks, with no point of their own: raw points too, so a
/// program that reports one missing is `sandbox.kernel` (x86_64: clone3,
/// io_uring_setup, pidfd_open, openat2, landlock_create_ruleset,
/// memfd_secret, close_range, epoll_pwait2, process_madvise).
pub const RAW_ENOSYS_SYSNOS: [u32; 9] = [435, 425, 434, 437, 444, 447, 436, 441, 440];

/// What `IoPoints::All` asks for: first the writes, where ENOSPC, EDQUOT,
/// EFBIG and EIO of a file's data show (`IoPoints::Writes`, the first
/// `WRITES`), then the reads and close.
const ALL_IO: [&str; 11] = [
    "write", "writev", "pwrite64", "pwritev", "pwritev2", "read", "readv", "pread64", "preadv",
    "preadv2", "close",
];
const WRITES: usize = 5;

/// Which read, write and close exits the session asks for, beside the
/// other points. Each adds a point per call, successes included, with the
/// path behind the fd looked up for each. The writes are asked for by
/// default: measured, they cost 6% on 20,000 small writes and nothing
/// measurable elsewhere, and a full disk on a write is among the commonest
/// sandbox failures; reads and closes cost 14% there and rarely fail for
/// a sandbox's reasons.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IoPoints {
    /// None: a failed write inside gVisor is not seen.
    None,
    /// write, writev, pwrite64, pwritev, pwritev2: a full disk or quota
    /// on a write is seen, with the file's path.
    #[default]
    Writes,
    /// The writes, and read, readv, pread64, preadv, preadv2 and close.
    All,
}

impl IoPoints {
    fn syscalls(self) -> &'static [&'static str] {
        match self {
            IoPoints::None => &[],
            IoPoints::Writes => &ALL_IO[..WRITES],
            IoPoints::All => &ALL_IO,
        }
    }
}

/// Whether runsc starts the sandbox when no monitor answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfNoMonitor {
    /// `probe trace --gvisor`: the probe is the monitor; a sandbox it
    /// cannot hear is an error.
    Fail,
    /// The daemon's session: a sandbox still starts while the daemon is
    /// down (its points are lost; its bridge's calls say why).
    Start,
}

/// The pod-init configuration that sends the probe's points to `endpoint`.
pub fn pod_init_config(endpoint: &Path, if_none: IfNoMonitor, io: IoPoints) -> Value {
    json!({ "trace_session": session(endpoint, if_none, io) })
}

/// The session itself (what `runsc trace create --config` reads).
pub fn session(endpoint: &Path, if_none: IfNoMonitor, io: IoPoints) -> Value {
    let context: Vec<&str> = CONTEXT.to_vec();
    let mut points = vec![
        json!({"name": "container/start", "context_fields": context}),
        json!({"name": "sentry/clone", "context_fields": context}),
        json!({"name": "sentry/execve", "context_fields": context}),
        json!({"name": "sentry/task_exit", "context_fields": context}),
    ];
    for name in SCHEMATIZED {
        points.push(json!({"name": format!("syscall/{name}/exit"), "context_fields": context}));
    }
    for name in io.syscalls() {
        points.push(json!({
            "name": format!("syscall/{name}/exit"),
            "optional_fields": ["fd_path"],
            "context_fields": context,
        }));
    }
    for nr in RAW_SYSNOS.into_iter().chain(RAW_ENOSYS_SYSNOS) {
        // a raw exit point carries its enter point's context fields (a
        // runsc bug): the enter point asks for them
        points
            .push(json!({"name": format!("syscall/sysno/{nr}/enter"), "context_fields": context}));
        points.push(json!({"name": format!("syscall/sysno/{nr}/exit")}));
    }
    json!({
        "name": "Default",
        // a runsc without one of these points still sends the others (an
        // unknown point otherwise drops the whole session, silently)
        "ignore_missing": true,
        "points": points,
        "sinks": [{
            "name": "remote",
            "config": {"endpoint": endpoint.to_string_lossy(), "retries": 3},
            "ignore_setup_error": if_none == IfNoMonitor::Start,
        }],
    })
}

/// Why a command line cannot carry the probe's session.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CommandError {
    #[error(
        "--gvisor runs a runsc command line (`probe trace --gvisor -- runsc [flags] do|run …`); \
         `{0}` is not runsc"
    )]
    NotRunsc(String),
    #[error(
        "the command already has --pod-init-config: the probe brings its own. Drop it, or add \
         the probe's session to a running sandbox with `runsc trace create --config` \
         (`probe gvisor-session` prints it)"
    )]
    HasPodInitConfig,
}

/// runsc's subcommands that start or join a sandbox (after them, words
/// are the subcommand's and the workload's).
const SUBCOMMANDS: [&str; 6] = ["do", "run", "create", "start", "exec", "restore"];

/// `command` with `--pod-init-config=CONFIG` as runsc's first flag. runsc
/// may follow a wrapper (`sudo`, `timeout 60`, `env X=1`): the first word
/// whose file name is `runsc` is it.
pub fn with_pod_init_config(
    command: &[OsString],
    config: &Path,
) -> Result<Vec<OsString>, CommandError> {
    let at = command
        .iter()
        .position(|w| Path::new(w).file_name() == Some(OsStr::new("runsc")))
        .ok_or_else(|| {
            CommandError::NotRunsc(
                command
                    .first()
                    .map(|w| w.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            )
        })?;
    // runsc's global flags come before its subcommand, their values
    // either `--flag=v` or the next word (`--root STATE`)
    if command[at + 1..]
        .iter()
        .map(|w| w.to_string_lossy())
        .take_while(|w| !SUBCOMMANDS.contains(&w.as_ref()))
        .any(|w| w.trim_start_matches('-').starts_with("pod-init-config"))
    {
        return Err(CommandError::HasPodInitConfig);
    }
    let mut out = command[..=at].to_vec();
    let mut flag = OsString::from("--pod-init-config=");
    flag.push(config);
    out.push(flag);
    out.extend_from_slice(&command[at + 1..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<OsString> {
        s.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn the_session_flag_goes_right_after_runsc_even_behind_a_wrapper() {
        let cfg = Path::new("/run/p/cfg.json");
        assert_eq!(
            with_pod_init_config(&words("runsc --network=none do ls"), cfg).unwrap(),
            words("runsc --pod-init-config=/run/p/cfg.json --network=none do ls")
        );
        assert_eq!(
            with_pod_init_config(&words("timeout 60 /usr/bin/runsc do true"), cfg).unwrap(),
            words("timeout 60 /usr/bin/runsc --pod-init-config=/run/p/cfg.json do true")
        );
    }

    #[test]
    fn a_command_that_is_not_runsc_or_has_its_own_session_is_refused() {
        let cfg = Path::new("/c.json");
        assert_eq!(
            with_pod_init_config(&words("docker run x"), cfg),
            Err(CommandError::NotRunsc("docker".into()))
        );
        assert_eq!(
            with_pod_init_config(&words("runsc --pod-init-config=/x.json do ls"), cfg),
            Err(CommandError::HasPodInitConfig)
        );
        // behind a flag whose value is the next word
        assert_eq!(
            with_pod_init_config(
                &words("runsc --root /run/rs --pod-init-config /x.json run --bundle b c"),
                cfg
            ),
            Err(CommandError::HasPodInitConfig)
        );
        // a word of the workload that looks like the flag is the workload's
        assert!(with_pod_init_config(&words("runsc do echo --pod-init-config"), cfg).is_ok());
    }

    #[test]
    fn every_raw_point_asks_for_its_context_on_the_enter_side() {
        let s = session(Path::new("/s"), IfNoMonitor::Fail, IoPoints::None);
        let points = s["points"].as_array().unwrap();
        for nr in RAW_SYSNOS {
            let enter = points
                .iter()
                .find(|p| p["name"] == format!("syscall/sysno/{nr}/enter"))
                .unwrap();
            assert_eq!(
                enter["context_fields"].as_array().unwrap().len(),
                CONTEXT.len()
            );
        }
        assert_eq!(s["sinks"][0]["config"]["endpoint"], "/s");
        assert_eq!(s["sinks"][0]["ignore_setup_error"], false);
        let daemon = session(Path::new("/s"), IfNoMonitor::Start, IoPoints::None);
        assert_eq!(daemon["sinks"][0]["ignore_setup_error"], true);
    }

    #[test]
    fn io_points_add_their_exits_with_the_path_behind_the_fd() {
        let names = |io| -> Vec<String> {
            let s = session(Path::new("/s"), IfNoMonitor::Start, io);
            let points = s["points"].as_array().unwrap().clone();
            points
                .into_iter()
                .filter(|p| p["optional_fields"] == json!(["fd_path"]))
                .map(|p| p["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert!(names(IoPoints::None).is_empty());
        assert_eq!(IoPoints::default(), IoPoints::Writes);
        let writes = names(IoPoints::Writes);
        assert!(writes.contains(&"syscall/write/exit".to_string()));
        assert!(writes.contains(&"syscall/pwritev2/exit".to_string()));
        assert!(
            !writes
                .iter()
                .any(|n| n.contains("read") || n.contains("close"))
        );
        let all = names(IoPoints::All);
        assert!(all.contains(&"syscall/close/exit".to_string()));
        assert!(all.contains(&"syscall/read/exit".to_string()));
        assert!(writes.iter().all(|w| all.contains(w)));
    }
}
