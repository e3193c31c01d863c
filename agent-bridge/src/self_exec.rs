//! Exec of the bridge's own binary (the file tools' worker) by file
//! descriptor. Exec'd by the path `/proc/self/exe`, the kernel names the
//! process after the link, `exe`, and so does the probe's evidence ("openat
//! failed with ENOENT in exe"). Exec'd with `execveat(fd, "", AT_EMPTY_PATH)`,
//! Linux 6.13 and later name it after the file: `agent-bridge`. The path
//! stays the fallback: on older kernels (which would name it after the fd
//! number), under a profile whose seccomp rules name `execveat`, and where
//! the exec by fd fails.

use std::ffi::{CString, OsStr, OsString, c_char};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::sync::{Arc, OnceLock};

/// Whether this kernel names a process exec'd by fd after the file
/// (Linux 6.13 and later).
pub fn names_fd_execs() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    numbers.next().zip(numbers.next()) >= Some((6, 13))
}

/// The bridge's binary, opened once (close-on-exec); `None` where an exec
/// by fd would not name the process after it.
fn own_binary() -> Option<RawFd> {
    static EXE: OnceLock<Option<File>> = OnceLock::new();
    EXE.get_or_init(|| {
        names_fd_execs()
            .then(|| File::open("/proc/self/exe").ok())
            .flatten()
    })
    .as_ref()
    .map(File::as_raw_fd)
}

/// `base` with `overrides` set over it, in order (a later pair wins).
fn merged<'a>(
    mut base: Vec<(OsString, OsString)>,
    overrides: impl Iterator<Item = (&'a OsString, &'a OsString)>,
) -> Vec<(OsString, OsString)> {
    for (k, v) in overrides {
        match base.iter_mut().find(|(name, _)| name == k) {
            Some(var) => var.1 = v.clone(),
            None => base.push((k.clone(), v.clone())),
        }
    }
    base
}

/// argv and envp as execve(2) takes them, built before fork: between fork
/// and exec the child may not allocate.
pub struct CArgs {
    pub argv: Vec<*const c_char>,
    pub envp: Vec<*const c_char>,
    /// Own what `argv` and `envp` point to.
    _args: Vec<CString>,
    _env: Arc<Vec<CString>>,
}

// SAFETY: the pointers point into `_args` and `_env`, which the struct
// owns (or shares, read-only) and never changes; nothing else reaches them.
unsafe impl Send for CArgs {}
unsafe impl Sync for CArgs {}

/// This process's environment, read once: the bridge never changes its
/// own, and copying it (under the environment's lock) and encoding it
/// again took ~8 µs of every call.
fn own_vars() -> &'static [(OsString, OsString)] {
    static VARS: OnceLock<Vec<(OsString, OsString)>> = OnceLock::new();
    VARS.get_or_init(|| std::env::vars_os().collect())
}

/// [`own_vars`] as `NAME=value` C strings, shared by every call that sets
/// no variable of its own.
fn own_env() -> &'static Arc<Vec<CString>> {
    static ENV: OnceLock<Arc<Vec<CString>>> = OnceLock::new();
    // a variable with a NUL byte cannot come from the process's environment
    ENV.get_or_init(|| {
        Arc::new(
            own_vars()
                .iter()
                .filter_map(|(k, v)| env_pair(k, v).ok())
                .collect(),
        )
    })
}

fn env_pair(k: &OsStr, v: &OsStr) -> io::Result<CString> {
    let mut pair = k.to_os_string();
    pair.push("=");
    pair.push(v);
    cstring(&pair)
}

impl CArgs {
    /// `argv` with this process's environment, then `env` over it (later
    /// pairs win), as `Command::envs` would have set it.
    pub fn new<'a>(
        argv: &[OsString],
        env: impl Iterator<Item = (&'a OsString, &'a OsString)>,
    ) -> io::Result<CArgs> {
        let args = argv
            .iter()
            .map(|a| cstring(a))
            .collect::<io::Result<Vec<_>>>()?;
        let mut env = env.peekable();
        let envs = if env.peek().is_none() {
            own_env().clone()
        } else {
            let vars = merged(own_vars().to_vec(), env);
            Arc::new(
                vars.iter()
                    .map(|(k, v)| env_pair(k, v))
                    .collect::<io::Result<Vec<_>>>()?,
            )
        };
        let pointers = |strings: &[CString]| {
            let mut p: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
            p.push(std::ptr::null());
            p
        };
        Ok(CArgs {
            argv: pointers(&args),
            envp: pointers(&envs),
            _args: args,
            _env: envs,
        })
    }
}

pub fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::other("a NUL byte in argv or env"))
}

/// The bridge's own binary by fd, with the worker's argv and envp.
pub struct ExecByFd {
    fd: RawFd,
    args: CArgs,
}

impl ExecByFd {
    /// See [`CArgs::new`]; `None` where the kernel cannot name the process
    /// after the binary.
    pub fn new<'a>(
        argv: &[OsString],
        env: impl Iterator<Item = (&'a OsString, &'a OsString)>,
    ) -> io::Result<Option<ExecByFd>> {
        let Some(fd) = own_binary() else {
            return Ok(None);
        };
        Ok(Some(ExecByFd {
            fd,
            args: CArgs::new(argv, env)?,
        }))
    }

    /// Replaces the process; returns only the error. Async-signal-safe: for
    /// the child between fork and exec.
    pub fn exec(&self) -> io::Error {
        // SAFETY: NUL-terminated arrays of pointers to live C strings.
        unsafe {
            libc::syscall(
                libc::SYS_execveat,
                self.fd,
                c"".as_ptr(),
                self.args.argv.as_ptr(),
                self.args.envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        };
        io::Error::last_os_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_in_place_and_new_names_are_added() {
        let os = |s: &str| OsString::from(s);
        let base = vec![(os("PATH"), os("/bin")), (os("HOME"), os("/root"))];
        let overrides = [
            (os("PATH"), os("/x")),
            (os("NEW"), os("1")),
            (os("PATH"), os("/y")),
        ];
        let env = merged(base, overrides.iter().map(|(k, v)| (k, v)));
        assert_eq!(
            env,
            vec![
                (os("PATH"), os("/y")),
                (os("HOME"), os("/root")),
                (os("NEW"), os("1"))
            ]
        );
    }
}
