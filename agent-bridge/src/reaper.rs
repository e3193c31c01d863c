//! Nothing a session started outlives its server. The bridge (or proxy)
//! starts a reaper next to it: a process of its own (its own process group,
//! so a terminal's Ctrl-C or hang-up reaches the server, not the reaper),
//! holding the read end of a pipe whose only write end the server keeps
//! (close-on-exec, so no workload inherits it). However the server ends,
//! a clean exit, a panic or SIGKILL, the kernel closes that end; the
//! reaper reads end-of-file, kills every call cgroup the server named
//! `mcp-PID-…` (`cgroup.kill`, or each pid in v1) and removes it.

use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};

/// The server's end of the pipe: dropped only with the process.
pub struct Reaper {
    _alive: OwnedFd,
}

/// Starts `agent-bridge reap PID` for this process, with its stdin on the
/// pipe. Failing to start one is said, not fatal: the next bridge's sweep
/// still removes what is left.
pub fn start() -> std::io::Result<Reaper> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let exe = std::env::current_exe()?;
    use std::os::unix::process::CommandExt as _;
    Command::new(exe)
        .args(["reap", &std::process::id().to_string()])
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()?;
    Ok(Reaper { _alive: write })
}

/// The reaper's main: waits for the end of stdin (the server is gone),
/// then removes the server's call cgroups with everything in them.
pub fn main(server: u32) -> std::process::ExitCode {
    let mut stdin = std::io::stdin();
    let mut buf = [0u8; 64];
    // nothing is ever written: a read returns only when the server is gone
    while matches!(stdin.read(&mut buf), Ok(1..)) {}
    crate::cgroup::remove_owned_by(server);
    std::process::ExitCode::SUCCESS
}
