//! Starting a workload without copying the bridge: the child is cloned with
//! `CLONE_VM | CLONE_VFORK`, as posix_spawn(3) does, so no page table is
//! copied, no page is copied on write afterwards and none is torn down at
//! exec. `std::process::Command` forks instead whenever it must run code
//! between fork and exec, which the attach and the profile need.
//!
//! The child shares the bridge's memory until it execs, while the thread
//! that cloned it is suspended: it runs on its own stack, makes only
//! async-signal-safe calls on memory prepared before the clone, allocates
//! nothing, and calls no libc wrapper that acts on every thread of the
//! process (setuid and its kin: libc would take the bridge's threads for
//! the child's; the raw syscalls act on the child alone).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;

use crate::self_exec::CArgs;

/// What to start.
pub struct Launch {
    /// Paths to execve in turn, as execvp(3) tries each PATH entry; the
    /// first that is not ENOENT/ENOTDIR/EACCES ends the search.
    pub candidates: Vec<CString>,
    pub args: CArgs,
    pub cwd: CString,
    /// stdin is a pipe (else /dev/null).
    pub stdin_pipe: bool,
}

/// A started child: its pid and our ends of its pipes.
pub struct Launched {
    pub pid: u32,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// The paths `program` is tried at: itself if it names a path, `found` when
/// the caller looked it up already, else every entry of `path`.
pub fn candidates(
    program: &OsStr,
    found: Option<std::path::PathBuf>,
    path: Option<OsString>,
) -> io::Result<Vec<CString>> {
    let c = |p: &OsStr| crate::self_exec::cstring(p);
    if program.as_bytes().contains(&b'/') || program.is_empty() {
        return Ok(vec![c(program)?]);
    }
    if let Some(found) = found {
        return Ok(vec![c(found.as_os_str())?]);
    }
    // execvp's default when PATH is unset
    let path = path.unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path)
        .map(|dir| {
            // an empty entry is the working directory
            let dir = if dir.as_os_str().is_empty() {
                ".".into()
            } else {
                dir
            };
            c(dir.join(program).as_os_str())
        })
        .collect()
}

/// Everything the child needs, on the bridge's memory.
struct ChildContext<'a> {
    launch: &'a Launch,
    stdio: [RawFd; 3],
    setup: &'a mut dyn FnMut() -> io::Result<()>,
    /// Where the child writes its errno when it cannot exec.
    errno: RawFd,
}

const STACK: usize = 256 * 1024;

/// Starts `launch`, running `setup` in the child before exec (it must be
/// async-signal-safe and must not allocate). An error from `setup`, or an
/// exec that failed for every candidate, comes back as the spawn's error,
/// after the child is reaped.
pub fn launch(launch: &Launch, setup: &mut dyn FnMut() -> io::Result<()>) -> io::Result<Launched> {
    let (stdin_r, stdin_w) = if launch.stdin_pipe {
        let (r, w) = pipe()?;
        (r, Some(w))
    } else {
        (std::fs::File::open("/dev/null")?.into(), None)
    };
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let (errno_r, errno_w) = nonblocking_pipe()?;
    let mut context = ChildContext {
        launch,
        stdio: [
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
        ],
        setup,
        errno: errno_w.as_raw_fd(),
    };
    let mut stack = vec![0u8; STACK];
    // SAFETY: the child runs `child_main` on `stack` (which outlives it: the
    // clone returns once the child has exec'd or exited) with `context`
    // borrowed for as long. Signals are blocked across the clone, so no
    // handler of ours runs on the child's stack; the child resets them.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(STACK).map_addr(|a| a & !15);
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut context as *mut ChildContext).cast(),
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(err);
        }
        pid
    };
    drop((stdin_r, stdout_w, stderr_w, errno_w));
    // the child has exec'd or exited by now: what it wrote is all there
    // (another thread's fork may still hold the write end, so no waiting
    // for end of file)
    if let Ok(code) = <[u8; 4]>::try_from(drain(errno_r)) {
        let mut status = 0;
        // SAFETY: reaping our own child, which has exited.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(code)));
    }
    Ok(Launched {
        pid: pid as u32,
        stdin: stdin_w,
        stdout: stdout_r,
        stderr: stderr_r,
    })
}

extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildContext` `launch` passed, alive until we
    // exec or exit.
    let context = unsafe { &mut *arg.cast::<ChildContext>() };
    let err = context.run();
    let code = err.raw_os_error().unwrap_or(libc::EINVAL).to_ne_bytes();
    // SAFETY: write(2) of a 4-byte buffer, then _exit(2).
    unsafe {
        libc::write(context.errno, code.as_ptr().cast(), 4);
        libc::_exit(127)
    }
}

impl ChildContext<'_> {
    /// Returns only on failure.
    fn run(&mut self) -> io::Error {
        let last = io::Error::last_os_error;
        // SAFETY (whole block): plain syscalls on fds and memory prepared
        // before the clone.
        unsafe {
            // the child has its own copy of the handler table: handlers of
            // the bridge must not run here, and SIGPIPE (ignored by Rust's
            // runtime) is the workload's to take
            for sig in 1..=libc::SIGRTMAX() {
                let mut action: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut action) == 0
                    && (action.sa_sigaction != libc::SIG_DFL
                        && action.sa_sigaction != libc::SIG_IGN
                        || sig == libc::SIGPIPE)
                {
                    action.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &action, std::ptr::null_mut());
                }
            }
            for (fd, target) in self.stdio.into_iter().zip(0..) {
                // dup2 onto itself would keep close-on-exec
                let kept = if fd == target {
                    libc::fcntl(fd, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, target)
                };
                if kept < 0 {
                    return last();
                }
            }
            if libc::chdir(self.launch.cwd.as_ptr()) != 0 {
                return last();
            }
            if libc::setpgid(0, 0) != 0 {
                return last();
            }
            if let Err(e) = (self.setup)() {
                return e;
            }
            let none: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            let args = &self.launch.args;
            let mut denied = false;
            let mut err = io::Error::from_raw_os_error(libc::ENOENT);
            for path in &self.launch.candidates {
                libc::execve(path.as_ptr(), args.argv.as_ptr(), args.envp.as_ptr());
                err = last();
                match err.raw_os_error() {
                    Some(libc::EACCES) => denied = true,
                    Some(libc::ENOENT | libc::ENOTDIR) => {}
                    _ => return err,
                }
            }
            if denied {
                io::Error::from_raw_os_error(libc::EACCES)
            } else {
                err
            }
        }
    }
}

/// A close-on-exec pipe whose read end does not block: for what a child
/// writes before its exec, read once the launch has returned.
pub fn nonblocking_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe()?;
    // SAFETY: fcntl(2) on our own fd.
    if unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((r, w))
}

/// Everything a non-blocking pipe holds now.
pub fn drain(r: OwnedFd) -> Vec<u8> {
    use std::io::Read as _;
    let mut out = Vec::new();
    let _ = std::fs::File::from(r).read_to_end(&mut out); // stops at EAGAIN
    out
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) into a 2-int array; the fds are new and ours.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: Vec<CString>) -> Vec<String> {
        v.into_iter().map(|c| c.into_string().unwrap()).collect()
    }

    #[test]
    fn candidates_are_the_path_itself_the_lookup_or_every_path_entry() {
        let path = Some(OsString::from("/a::/b"));
        let c = |p: &str, found: Option<&str>| {
            strings(candidates(p.as_ref(), found.map(Into::into), path.clone()).unwrap())
        };
        assert_eq!(c("./run.sh", None), ["./run.sh"]);
        assert_eq!(c("/bin/true", Some("/x/true")), ["/bin/true"]);
        assert_eq!(c("true", Some("/b/true")), ["/b/true"]);
        // execvp: an empty entry is the working directory
        assert_eq!(c("true", None), ["/a/true", "./true", "/b/true"]);
        assert_eq!(
            strings(candidates("true".as_ref(), None, None).unwrap()),
            ["/bin/true", "/usr/bin/true"]
        );
        assert!(candidates("a\0b".as_ref(), None, path).is_err());
    }

    #[test]
    fn a_launched_child_gets_its_pipes_and_a_failed_exec_comes_back_as_errno() {
        use std::io::{Read as _, Write as _};
        let args = |argv: &[&str]| {
            let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
            CArgs::new(&argv, std::iter::empty()).unwrap()
        };
        let cat = Launch {
            candidates: vec![c"/nonexistent/cat".into(), c"/bin/cat".into()],
            args: args(&["cat"]),
            cwd: c"/".into(),
            stdin_pipe: true,
        };
        let started = launch(&cat, &mut || Ok(())).unwrap();
        std::fs::File::from(started.stdin.unwrap())
            .write_all(b"through")
            .unwrap();
        let mut out = String::new();
        std::fs::File::from(started.stdout)
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "through");
        let mut status = 0;
        // SAFETY: reaping the child just launched.
        assert_eq!(
            unsafe { libc::waitpid(started.pid as i32, &mut status, 0) },
            started.pid as i32
        );
        assert_eq!(status, 0);
        let missing = Launch {
            candidates: vec![c"/nonexistent/a".into(), c"/nonexistent/b".into()],
            ..cat
        };
        let err = launch(&missing, &mut || Ok(())).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        let refused = launch(&missing, &mut || {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        });
        assert_eq!(refused.err().unwrap().raw_os_error(), Some(libc::EPERM));
    }
}
