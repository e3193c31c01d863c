//! Syscall names and the classes the rule table speaks of. Numbers stay
//! below this module (and in `probe_abi`'s tables): rules name syscalls.

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

/// execve, execveat: a program started (on every architecture).
pub const EXEC: [&str; 2] = ["execve", "execveat"];

/// The calls a PATH search makes for each candidate: it stats it, or it
/// execs it straight away.
pub const PATH_LOOKUPS: [&str; 9] = [
    "stat",
    "lstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "execve",
    "execveat",
];

/// The stat family alone: what a shell's own PATH search makes.
pub const STATS: [&str; 4] = ["stat", "lstat", "newfstatat", "statx"];

/// Every syscall the rule table names, by class. Rules speak of names, so
/// one written for `openat` holds on x86_64 and arm64 alike; the legacy
/// forms arm64 lacks stay listed for x86_64 (see [`X86_ONLY`]).
const CLASSES: [(SyscallClass, &[&str]); 8] = {
    use SyscallClass::*;
    [
        (Exec, &EXEC),
        (Fork, &["clone", "clone3", "fork", "vfork"]),
        (
            Memory,
            &[
                "mmap", "mprotect", "brk", "mremap", "shmget", "mlock", "mlockall", "mlock2",
            ],
        ),
        (
            Connect,
            &["connect", "sendto", "sendmsg", "recvfrom", "recvmsg"],
        ),
        (
            Privileged,
            &[
                "mknod",
                "mknodat",
                "mount",
                "umount2",
                "unshare",
                "setns",
                "ptrace",
                "bpf",
                "chroot",
                "pivot_root",
                "setuid",
                "setgid",
                "setreuid",
                "setregid",
                "setresuid",
                "setresgid",
                "setgroups",
                "setfsuid",
                "setfsgid",
                "init_module",
                "finit_module",
                "delete_module",
                "reboot",
                "sethostname",
                "setdomainname",
                "settimeofday",
                "clock_settime",
                "perf_event_open",
                "swapon",
                "swapoff",
                "iopl",
                "ioperm",
                "acct",
                "quotactl",
                "kexec_load",
                "open_by_handle_at",
                "capset",
                "open_tree",
                "move_mount",
                "fsopen",
                "fsconfig",
                "fsmount",
                "setrlimit",
                "prlimit64",
            ],
        ),
        (
            PathWrite,
            &[
                "mknod",
                "mknodat",
                "creat",
                "mkdir",
                "mkdirat",
                "unlink",
                "unlinkat",
                "rmdir",
                "rename",
                "renameat",
                "renameat2",
                "link",
                "linkat",
                "symlink",
                "symlinkat",
                "truncate",
                "chmod",
                "fchmodat",
                "fchmodat2",
                "chown",
                "lchown",
                "fchownat",
                "utimensat",
            ],
        ),
        (PathRead, &["open", "openat", "openat2", "chdir"]),
        (
            PathProbe,
            &[
                "stat",
                "lstat",
                "newfstatat",
                "statx",
                "access",
                "faccessat",
                "faccessat2",
                "readlink",
                "readlinkat",
                "statfs",
            ],
        ),
    ]
};

/// The x86_64 syscalls the rules name that arm64 does not have, with the
/// one arm64 programs call instead (none: x86 port I/O has no counterpart).
pub const X86_ONLY: [(&str, Option<&str>); 20] = [
    ("fork", Some("clone")),
    ("vfork", Some("clone")),
    ("mknod", Some("mknodat")),
    ("iopl", None),
    ("ioperm", None),
    ("open", Some("openat")),
    ("creat", Some("openat")),
    ("mkdir", Some("mkdirat")),
    ("unlink", Some("unlinkat")),
    ("rmdir", Some("unlinkat")),
    ("rename", Some("renameat")),
    ("link", Some("linkat")),
    ("symlink", Some("symlinkat")),
    ("chmod", Some("fchmodat")),
    ("chown", Some("fchownat")),
    ("lchown", Some("fchownat")),
    ("stat", Some("newfstatat")),
    ("lstat", Some("newfstatat")),
    ("access", Some("faccessat")),
    ("readlink", Some("readlinkat")),
];

/// Whether syscall `name` is of `class`, given its open flags (for opens).
/// Called for each failure the attribution grades: no allocation.
pub fn is_in(name: &str, open_flags: u64, class: SyscallClass) -> bool {
    if matches!(name, "open" | "openat") && open_flags_write(open_flags) {
        return class == SyscallClass::PathWrite;
    }
    CLASSES
        .iter()
        .any(|(c, names)| *c == class && names.contains(&name))
}

/// The classes syscall `name` belongs to, given its open flags (for opens).
pub fn classes(name: &str, open_flags: u64) -> Vec<SyscallClass> {
    CLASSES
        .iter()
        .map(|(class, _)| *class)
        .filter(|&class| is_in(name, open_flags, class))
        .collect()
}

/// The kernel's name where the syscalls crate has another: arm64's 79 is
/// `newfstatat` to the kernel and to strace, `fstatat` to the crate.
const ALIASES: [(&str, &str); 1] = [("fstatat", "newfstatat")];

/// The syscall's name on this architecture, e.g. `openat`, or
/// `syscall_NNN` when unknown.
pub fn name(nr: i64) -> Cow<'static, str> {
    match usize::try_from(nr).ok().and_then(syscalls::Sysno::new) {
        Some(s) => {
            let name = s.name();
            let kernel = ALIASES.iter().find(|(c, _)| *c == name).map(|(_, k)| *k);
            Cow::Borrowed(kernel.unwrap_or(name))
        }
        None => Cow::Owned(format!("syscall_{nr}")),
    }
}

/// The syscall number for `name` on this architecture.
pub fn number(name: &str) -> Option<i64> {
    let crate_name = ALIASES.iter().find(|(_, k)| *k == name).map(|(c, _)| *c);
    [Some(name), crate_name]
        .into_iter()
        .flatten()
        .find_map(|n| n.parse::<syscalls::Sysno>().ok())
        .map(|s| s.id() as i64)
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
            classes("openat", libc::O_RDONLY as u64),
            [SyscallClass::PathRead]
        );
        assert_eq!(
            classes("openat", (libc::O_WRONLY | libc::O_CREAT) as u64),
            [SyscallClass::PathWrite]
        );
        assert_eq!(
            classes("mknodat", 0),
            [SyscallClass::Privileged, SyscallClass::PathWrite]
        );
    }

    fn on_x86_64(name: &str) -> bool {
        name.parse::<syscalls::x86_64::Sysno>().is_ok()
    }

    fn on_aarch64(name: &str) -> bool {
        let crate_name = ALIASES.iter().find(|(_, k)| *k == name).map(|(c, _)| *c);
        [Some(name), crate_name]
            .into_iter()
            .flatten()
            .any(|n| n.parse::<syscalls::aarch64::Sysno>().is_ok())
    }

    /// Every syscall a rule names exists on both architectures, or is an
    /// x86_64 legacy form whose arm64 replacement is in the same classes.
    #[test]
    fn every_syscall_the_rules_name_exists_on_both_architectures() {
        let named = CLASSES
            .iter()
            .flat_map(|(_, names)| names.iter())
            .chain(&PATH_LOOKUPS)
            .chain(&STATS);
        for &name in named {
            assert!(on_x86_64(name), "{name} is no x86_64 syscall");
            if on_aarch64(name) {
                assert!(
                    X86_ONLY.iter().all(|(x, _)| *x != name),
                    "{name} exists on arm64"
                );
                continue;
            }
            let (_, instead) = X86_ONLY
                .iter()
                .find(|(x, _)| *x == name)
                .unwrap_or_else(|| panic!("{name} is missing on arm64 and not marked x86-only"));
            if let Some(instead) = instead {
                assert!(on_aarch64(instead), "{instead} (for {name})");
                for class in classes(name, 0) {
                    let theirs = classes(instead, 0);
                    let covered = theirs.contains(&class)
                        // creat always writes; openat writes with its flags
                        || (name == "creat" && classes(instead, libc::O_CREAT as u64).contains(&class));
                    assert!(covered, "{instead} is not {class:?} like {name}");
                }
            }
        }
    }

    #[test]
    fn arm64s_fstatat_goes_by_the_kernels_name() {
        assert!(on_aarch64("newfstatat") && !on_aarch64("stat"));
        assert_eq!(name(number("newfstatat").unwrap()), "newfstatat");
    }
}
