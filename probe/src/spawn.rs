//! Spawning a workload that is attached to a span before it executes.
//!
//! The child reports its pid over a pipe and waits in `pre_exec` until the
//! caller has attached it (a `TASKS` entry, or an `attach` request to the
//! daemon); only then does it exec. Everything the program does, from its
//! first syscall, is traced, and its children inherit the span in the kernel.

use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};

/// Spawns `cmd`, calling `attach(pid)` while the child is blocked before
/// exec. If `attach` fails the child never runs the program.
///
/// Returns the spawn result (exec failures such as ENOENT come back as
/// `Err` after the kernel has seen the failing execve) and the child's pid.
pub fn spawn_attached<E: Send>(
    cmd: &mut Command,
    attach: impl FnOnce(u32) -> Result<(), E> + Send,
) -> Result<(io::Result<Child>, u32), SpawnError<E>> {
    spawn_attached_with(cmd, attach, |_| Ok(()))
}

/// Like [`spawn_attached`], then runs `setup` in the child once it is
/// attached, just before exec, so the probe sees the setup too (a sandbox
/// applying mounts, limits and seccomp filters).
///
/// `setup` runs between fork and exec: it must only make async-signal-safe
/// calls and must not allocate. It gets a file descriptor for a short
/// message saying what failed; when it returns an error, the spawn result
/// is that error with the message appended.
pub fn spawn_attached_with<E: Send>(
    cmd: &mut Command,
    attach: impl FnOnce(u32) -> Result<(), E> + Send,
    mut setup: impl FnMut(RawFd) -> io::Result<()> + Send + Sync + 'static,
) -> Result<(io::Result<Child>, u32), SpawnError<E>> {
    let (pid_r, pid_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    let (pid_w_raw, go_r_raw) = (pid_w.as_raw_fd(), go_r.as_raw_fd());
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (getpid, write, read) on fds it owns.
    unsafe {
        cmd.pre_exec(move || {
            let pid = libc::getpid().to_ne_bytes();
            if libc::write(pid_w_raw, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                return Err(io::Error::last_os_error());
            }
            let mut go = 0u8;
            if libc::read(go_r_raw, (&mut go as *mut u8).cast(), 1) != 1 || go != 1 {
                return Err(io::Error::other(
                    "the probe could not attach this process; not running it",
                ));
            }
            setup(pid_w_raw)
        });
    }
    std::thread::scope(|s| {
        // The child is forked by this thread, not a helper: a program that
        // sets PR_SET_PDEATHSIG (bwrap --die-with-parent, supervisors) gets
        // that signal when the *thread* that forked it exits, so a helper
        // thread ending would kill it. spawn() only returns once the child
        // has exec'd or failed to, so the attach runs beside it instead.
        let attacher = s.spawn(move || {
            let mut pid_r = std::fs::File::from(pid_r);
            let mut go_w = std::fs::File::from(go_w);
            let mut buf = [0u8; 4];
            // EOF: the child died before reporting (fork failed, or it was
            // killed); spawn() says why
            pid_r.read_exact(&mut buf).ok()?;
            let pid = u32::from_ne_bytes(buf);
            let attached = attach(pid);
            let _ = go_w.write_all(&[u8::from(attached.is_ok())]);
            Some((pid, attached, pid_r))
        });
        let mut spawned = cmd.spawn();
        // the child's ends close with the Command's copies only when it is
        // dropped: close ours so a child that died unreported reads as EOF
        drop((pid_w, go_r));
        let Some((pid, attached, mut pid_r)) = attacher.join().expect("attacher thread panicked")
        else {
            return Err(SpawnError::Spawn(
                spawned
                    .err()
                    .unwrap_or_else(|| io::Error::other("child vanished")),
            ));
        };
        if let Err(e) = &spawned {
            // what the setup hook wrote before failing, if anything
            let mut why = String::new();
            let _ = pid_r.read_to_string(&mut why);
            if !why.is_empty() {
                spawned = Err(io::Error::new(e.kind(), format!("{why}: {e}")));
            }
        }
        match attached {
            Ok(()) => Ok((spawned, pid)),
            Err(e) => Err(SpawnError::Attach(e)),
        }
    })
}

/// Why a workload could not be started under the probe.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError<E> {
    /// fork or pipe failed before the program was even tried.
    #[error("cannot start the workload: {0}")]
    Spawn(#[from] io::Error),
    /// The child could not be attached to its span; it was not run.
    #[error("cannot attach the workload to its span: {0}")]
    Attach(E),
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use super::*;

    #[test]
    fn a_workload_that_dies_with_its_parent_outlives_the_spawn() {
        // PR_SET_PDEATHSIG fires when the *thread* that forked the child
        // exits (bwrap --die-with-parent, supervisors). Asked for before
        // exec, while spawn() is surely still running: a helper thread
        // that forked it and then ended would kill it here.
        let mut cmd = Command::new("sleep");
        cmd.arg("0.2");
        let (child, _pid) = spawn_attached_with(
            &mut cmd,
            |_| Ok::<(), ()>(()),
            // SAFETY: prctl is async-signal-safe.
            |_| match unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            },
        )
        .expect("spawned");
        let status = child.expect("sleep runs").wait().unwrap();
        assert_eq!(status.signal(), None, "killed: {status}");
        assert!(status.success(), "{status}");
    }
}
