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
pub fn spawn_attached<E>(
    cmd: &mut Command,
    attach: impl FnOnce(u32) -> Result<(), E>,
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
pub fn spawn_attached_with<E>(
    cmd: &mut Command,
    attach: impl FnOnce(u32) -> Result<(), E>,
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
        // spawn() only returns once the child has exec'd or failed to, so it
        // runs beside us while we attach the waiting child.
        // The child's ends live until spawn() returns, then close, so a
        // child that dies before reporting reads as EOF, not a hang.
        let spawner = s.spawn(move || {
            let spawned = cmd.spawn();
            drop((pid_w, go_r));
            spawned
        });
        let mut pid_r = std::fs::File::from(pid_r);
        let mut go_w = std::fs::File::from(go_w);
        let mut buf = [0u8; 4];
        let pid = match pid_r.read_exact(&mut buf) {
            Ok(()) => u32::from_ne_bytes(buf),
            Err(_) => {
                let spawned = spawner.join().expect("spawner thread panicked");
                return Err(SpawnError::Spawn(
                    spawned
                        .err()
                        .unwrap_or_else(|| io::Error::other("child vanished")),
                ));
            }
        };
        let attached = attach(pid);
        let go = [u8::from(attached.is_ok())];
        let _ = go_w.write_all(&go);
        drop(go_w);
        let mut spawned = spawner.join().expect("spawner thread panicked");
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
