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
    /// A cgroup v2 directory to start the child in: cloned straight into it
    /// where the kernel can (`CLONE_INTO_CGROUP`, Linux 5.7). Moving a
    /// process into a cgroup takes a lock whose writer waits out an RCU
    /// grace period when no move happened lately: 6 to 16 ms on this VM
    /// after 20 ms without one, so every call of an agent that thinks
    /// between calls paid it. Where the clone cannot, `setup` is told the
    /// child is not there yet and moves it.
    pub cgroup: Option<std::sync::Arc<OwnedFd>>,
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
    setup: &'a mut dyn FnMut(bool) -> io::Result<()>,
    /// Where the child writes its errno when it cannot exec.
    errno: RawFd,
    /// The child started in `launch.cgroup`.
    placed: bool,
    /// The kernel reset the child's signal handlers (clone3's
    /// CLONE_CLEAR_SIGHAND): only SIGPIPE is left to reset.
    handlers_cleared: bool,
}

const STACK: usize = 256 * 1024;

/// Starts `launch`, running `setup` in the child before exec (it must be
/// async-signal-safe and must not allocate; its argument says whether the
/// child started in `launch.cgroup`). An error from `setup`, or an exec
/// that failed for every candidate, comes back as the spawn's error, after
/// the child is reaped.
pub fn launch(
    launch: &Launch,
    setup: &mut dyn FnMut(bool) -> io::Result<()>,
) -> io::Result<Launched> {
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
        placed: false,
        handlers_cleared: false,
    };
    let mut stack = vec![0u8; STACK];
    // SAFETY: the child runs `child_main` on `stack` (which outlives it: the
    // clone returns once the child has exec'd or exited) with `context`
    // borrowed for as long. Signals are blocked across the clone, so no
    // handler of ours runs on the child's stack; the child resets them.
    let pid = unsafe {
        let base = stack.as_mut_ptr().map_addr(|a| (a + 15) & !15);
        let top = stack.as_mut_ptr().add(STACK).map_addr(|a| a & !15);
        let arg: *mut libc::c_void = (&raw mut context).cast();
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut pid = -1;
        // the flags are read by the child (sharing our memory) before it
        // runs setup, so they are set before each attempt
        let flags = |placed: bool, cleared: bool| {
            (*arg.cast::<ChildContext>()).placed = placed;
            (*arg.cast::<ChildContext>()).handlers_cleared = cleared;
        };
        if let Some(cgroup) = &launch.cgroup {
            // any refusal (an old kernel, a seccomp policy that denies
            // clone3, a cgroup it cannot start in) leaves the move to setup
            flags(true, true);
            pid = clone3_vfork(Some(cgroup.as_raw_fd()), base, top, arg).unwrap_or(-1);
        }
        if pid < 0 {
            flags(false, true);
            pid = clone3_vfork(None, base, top, arg).unwrap_or(-1);
        }
        if pid < 0 {
            flags(false, false);
            pid = libc::clone(
                child_main,
                top.cast(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                arg,
            );
        }
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

/// `struct clone_args` of clone3(2), up to `cgroup` (Linux 5.7). Only the
/// x86_64 path enters clone3 itself (a few instructions of assembly);
/// elsewhere (aarch64) the child is placed by `setup`.
#[cfg(target_arch = "x86_64")]
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

#[cfg(target_arch = "x86_64")]
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;
#[cfg(target_arch = "x86_64")]
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// clone3(2) with `CLONE_VM | CLONE_VFORK | CLONE_CLEAR_SIGHAND`, and
/// `CLONE_INTO_CGROUP` when given a `cgroup`: the child runs
/// `child_main(arg)` on the stack from `base` to `top` (16-aligned), with
/// the kernel's default for every signal we handle (one flag where the
/// child would otherwise query and reset 64 dispositions itself), starting
/// life in `cgroup`. The child's pid, or the errno.
///
/// libc has no clone3 wrapper, and a child that shares our memory must
/// leave the syscall on its own stack straight into a function: a few
/// instructions of assembly, as every libc's clone(2) wrapper has.
///
/// # Safety
/// As for clone(2): `base..top` is a stack nothing else uses until the
/// clone returns, and `arg` is what `child_main` expects.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_vfork(
    cgroup: Option<RawFd>,
    base: *mut u8,
    top: *mut u8,
    arg: *mut libc::c_void,
) -> Result<i32, i32> {
    let into = if cgroup.is_some() {
        CLONE_INTO_CGROUP
    } else {
        0
    };
    let args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | CLONE_CLEAR_SIGHAND | into,
        exit_signal: libc::SIGCHLD as u64,
        stack: base as u64,
        stack_size: top as u64 - base as u64,
        cgroup: cgroup.unwrap_or(0) as u64,
        ..CloneArgs::default()
    };
    let entry: extern "C" fn(*mut libc::c_void) -> libc::c_int = child_main;
    let ret: i64;
    // SAFETY: the caller's promise. The child starts with our registers
    // but its stack pointer at `top` (16-aligned, as a call wants), calls
    // `entry(arg)` and exits with what it returns (child_main execs or
    // _exits first); we resume with rax = the child's pid or -errno once
    // it has exec'd or exited (CLONE_VFORK). Only rax, rcx and r11 change.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "mov edi, eax",
            "mov eax, 60", // exit(2)
            "syscall",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &raw const args,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    if ret < 0 {
        Err(-ret as i32)
    } else {
        Ok(ret as i32)
    }
}

/// Elsewhere the child is moved into its cgroup by `setup`, and resets
/// its own signal handlers.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3_vfork(
    _cgroup: Option<RawFd>,
    _base: *mut u8,
    _top: *mut u8,
    _arg: *mut libc::c_void,
) -> Result<i32, i32> {
    Err(libc::ENOSYS)
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
            // the bridge must not run here (clone3 may have reset them
            // already), and SIGPIPE (ignored by Rust's runtime) is the
            // workload's to take
            let signals = if self.handlers_cleared {
                libc::SIGPIPE..=libc::SIGPIPE
            } else {
                1..=libc::SIGRTMAX()
            };
            for sig in signals {
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
            if let Err(e) = (self.setup)(self.placed) {
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

/// Everything a non-blocking pipe holds now (read(2) until EAGAIN; no
/// size probing by stat and lseek, which a pipe does not answer anyway).
pub fn drain(r: OwnedFd) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: read(2) into a local buffer.
        let n = unsafe { libc::read(r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            out.extend_from_slice(&buf[..n as usize]);
        } else if n == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return out;
        }
    }
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
    use std::sync::Arc;

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

    fn args(argv: &[&str]) -> CArgs {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        CArgs::new(&argv, std::iter::empty()).unwrap()
    }

    /// Runs `cat /proc/self/cgroup` with `cgroup` to start in: what it
    /// printed, and whether setup was told it started there.
    fn own_cgroup(cgroup: Option<Arc<OwnedFd>>) -> (String, bool) {
        use std::io::Read as _;
        use std::sync::atomic::{AtomicBool, Ordering};
        let placed = AtomicBool::new(false);
        let cat = Launch {
            candidates: vec![c"/bin/cat".into()],
            args: args(&["cat", "/proc/self/cgroup"]),
            cwd: c"/".into(),
            stdin_pipe: false,
            cgroup,
        };
        // the child shares our memory until it execs: the flag it sets is ours
        let started = launch(&cat, &mut |p| {
            placed.store(p, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        let mut out = String::new();
        std::fs::File::from(started.stdout)
            .read_to_string(&mut out)
            .unwrap();
        let mut status = 0;
        // SAFETY: reaping the child just launched.
        unsafe { libc::waitpid(started.pid as i32, &mut status, 0) };
        assert_eq!(status, 0, "{out}");
        (out, placed.load(Ordering::SeqCst))
    }

    #[test]
    fn a_child_starts_in_its_cgroup_or_is_told_to_move_itself() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
                "cgroups need root; CI=true forbids skipping"
            );
            eprintln!("SKIPPED: cgroups need root");
            return;
        }
        let root = crate::cgroup::v2_root().expect("a cgroup2 mount");
        let name = format!("launch-test-{}", std::process::id());
        let dir = root.join(&name);
        std::fs::create_dir(&dir).unwrap();
        let (out, placed) = own_cgroup(Some(Arc::new(std::fs::File::open(&dir).unwrap().into())));
        std::fs::remove_dir(&dir).unwrap();
        assert!(placed, "CLONE_INTO_CGROUP refused on Linux 5.7+");
        assert!(out.contains(&format!("0::/{name}\n")), "{out}");
        // a directory that is no cgroup: clone3 refuses, the child starts
        // beside us, and setup is told it must move it
        let not_cgroup = tempfile::tempdir().unwrap();
        let (out, placed) = own_cgroup(Some(Arc::new(
            std::fs::File::open(not_cgroup.path()).unwrap().into(),
        )));
        assert!(!placed);
        assert!(!out.contains(&name), "{out}");
        let (_, placed) = own_cgroup(None);
        assert!(!placed);
    }

    extern "C" fn ignore_signal(_: libc::c_int) {}

    #[test]
    fn a_child_runs_none_of_our_signal_handlers_and_takes_sigpipe_by_default() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // a handler of ours (as tokio installs), and SIGPIPE ignored (as
        // Rust's runtime leaves it): what does the child see before exec?
        // SAFETY: installs a handler that does nothing, for a signal no
        // test sends.
        unsafe {
            libc::signal(
                libc::SIGURG,
                ignore_signal as *const () as libc::sighandler_t,
            )
        };
        let disposition = |sig| {
            // SAFETY: a query of one disposition into a local.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &mut action);
                action.sa_sigaction
            }
        };
        assert_eq!(disposition(libc::SIGPIPE), libc::SIG_IGN);
        let (urg_default, pipe_default) = (AtomicBool::new(false), AtomicBool::new(false));
        let t = Launch {
            candidates: vec![c"/bin/true".into()],
            args: args(&["true"]),
            cwd: c"/".into(),
            stdin_pipe: false,
            cgroup: None,
        };
        // setup runs in the child, just before exec, sharing our memory
        let started = launch(&t, &mut |_| {
            urg_default.store(disposition(libc::SIGURG) == libc::SIG_DFL, Ordering::SeqCst);
            pipe_default.store(
                disposition(libc::SIGPIPE) == libc::SIG_DFL,
                Ordering::SeqCst,
            );
            Ok(())
        })
        .unwrap();
        let mut status = 0;
        // SAFETY: reaping the child just launched.
        unsafe { libc::waitpid(started.pid as i32, &mut status, 0) };
        assert_eq!(status, 0);
        assert!(
            urg_default.load(Ordering::SeqCst),
            "our handler reached the child"
        );
        assert!(
            pipe_default.load(Ordering::SeqCst),
            "SIGPIPE still ignored in the child"
        );
        assert_eq!(
            disposition(libc::SIGURG),
            ignore_signal as *const () as libc::sighandler_t
        );
    }

    #[test]
    fn a_launched_child_gets_its_pipes_and_a_failed_exec_comes_back_as_errno() {
        use std::io::{Read as _, Write as _};
        let cat = Launch {
            candidates: vec![c"/nonexistent/cat".into(), c"/bin/cat".into()],
            args: args(&["cat"]),
            cwd: c"/".into(),
            stdin_pipe: true,
            cgroup: None,
        };
        let started = launch(&cat, &mut |_| Ok(())).unwrap();
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
        let err = launch(&missing, &mut |_| Ok(())).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        let refused = launch(&missing, &mut |_| {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        });
        assert_eq!(refused.err().unwrap().raw_os_error(), Some(libc::EPERM));
    }
}
