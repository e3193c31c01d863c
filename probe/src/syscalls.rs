//! x86_64 syscall names and the classes the rule table speaks of.

use std::borrow::Cow;

use probe_abi::open_flags_write;

/// Groups of syscalls that fail for the same kind of reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyscallClass {
    /// Matches every syscall.
    Any,
    /// execve, execveat.
    Exec,
    /// clone, clone3, fork, vfork.
    Fork,
    /// mmap, brk, mremap, mlock…
    Memory,
    /// connect, sendto, sendmsg.
    Connect,
    /// Operations that need a capability: mount, unshare, setns, ptrace, bpf…
    Privileged,
    /// Creates or changes a path: open for write, mkdir, unlink, rename…
    PathWrite,
    /// Opens a path to read it, or enters it.
    PathRead,
    /// Looks a path up without needing it: stat, access, readlink.
    PathProbe,
}

impl SyscallClass {
    pub fn describe(self) -> &'static str {
        match self {
            SyscallClass::Any => "any syscall",
            SyscallClass::Exec => "execve/execveat",
            SyscallClass::Fork => "clone/clone3/fork/vfork",
            SyscallClass::Memory => "mmap/brk/mremap/mlock",
            SyscallClass::Connect => {
                "connect/sendto/sendmsg (and recvfrom/recvmsg on a connected UDP socket, which learns of an ICMP unreachable there)"
            }
            SyscallClass::Privileged => {
                "mount/umount2/unshare/setns/ptrace/bpf/chroot/pivot_root/set*id/setgroups/module/reboot/sethostname/perf_event_open/mknod/capset/prlimit"
            }
            SyscallClass::PathWrite => {
                "open-for-write/creat/mkdir/unlink/rmdir/rename/link/symlink/truncate/chmod/chown/mknod/utimensat"
            }
            SyscallClass::PathRead => "open-for-read/openat2/chdir",
            SyscallClass::PathProbe => {
                "stat/lstat/newfstatat/statx/access/faccessat/readlink/statfs"
            }
        }
    }
}

/// The classes syscall `nr` belongs to, given its open flags (for opens).
pub fn classes(nr: i64, open_flags: u64) -> &'static [SyscallClass] {
    use SyscallClass::*;
    match nr {
        59 | 322 => &[Exec],
        56 | 57 | 58 | 435 => &[Fork],
        9 | 10 | 12 | 25 | 29 | 149 | 151 | 325 => &[Memory],
        42 | 44 | 46 | 45 | 47 => &[Connect],
        133 | 259 => &[Privileged, PathWrite],
        165 | 166 | 272 | 308 | 101 | 321 | 161 | 155 | 105 | 106 | 113 | 114 | 117 | 119 | 116
        | 122 | 123 | 175 | 313 | 176 | 169 | 170 | 171 | 164 | 227 | 298 | 167 | 168 | 172
        | 173 | 163 | 179 | 246 | 304 | 126 | 428 | 429 | 430 | 431 | 432 | 160 | 302 => {
            &[Privileged]
        }
        2 | 257 if open_flags_write(open_flags) => &[PathWrite],
        2 | 257 | 437 | 80 => &[PathRead],
        85 | 83 | 258 | 87 | 263 | 84 | 82 | 264 | 316 | 86 | 265 | 88 | 266 | 76 | 90 | 268
        | 452 | 92 | 94 | 260 | 280 => &[PathWrite],
        4 | 6 | 262 | 332 | 21 | 269 | 439 | 89 | 267 | 137 => &[PathProbe],
        _ => &[],
    }
}

/// The syscall's name, e.g. `openat`, or `syscall_NNN` when unknown.
pub fn name(nr: i64) -> Cow<'static, str> {
    match usize::try_from(nr).ok().and_then(syscalls::Sysno::new) {
        Some(s) => Cow::Borrowed(s.name()),
        None => Cow::Owned(format!("syscall_{nr}")),
    }
}

/// The syscall number for `name` on x86_64.
pub fn number(name: &str) -> Option<i64> {
    name.parse::<syscalls::Sysno>().ok().map(|s| s.id() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (nr, n) in [
            (257, "openat"),
            (59, "execve"),
            (83, "mkdir"),
            (41, "socket"),
        ] {
            assert_eq!(name(nr), n);
            assert_eq!(number(n), Some(nr));
        }
        assert_eq!(name(100_000), "syscall_100000");
    }

    #[test]
    fn open_class_depends_on_flags() {
        assert_eq!(
            classes(257, libc::O_RDONLY as u64),
            &[SyscallClass::PathRead]
        );
        assert_eq!(
            classes(257, (libc::O_WRONLY | libc::O_CREAT) as u64),
            &[SyscallClass::PathWrite]
        );
    }
}
