//! Syscall numbers by architecture, for the syscalls this ABI names.
//!
//! The eBPF programs and the event decoder see numbers; everything above
//! them speaks of names. Each architecture has its own table, and
//! [`NATIVE`] is the one this build runs on: the eBPF object is built per
//! architecture (aya-build passes `bpf_target_arch`), userspace per target.
//! arm64 uses the generic table: no `open`, `stat`, `mkdir`, `fork`…, only
//! the `*at` and newer forms, which are [`ABSENT`] here.

/// The number of a syscall the architecture does not have: never a
/// syscall's number, so no comparison with it holds.
pub const ABSENT: i64 = -1;

macro_rules! syscall_numbers {
    ($($name:ident),* $(,)?) => {
        /// One architecture's number for each syscall the ABI names.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct SyscallNumbers {
            $(pub $name: i64,)*
        }

        impl SyscallNumbers {
            /// How many syscalls the tables name.
            pub const LEN: usize = [$(stringify!($name)),*].len();

            /// Every syscall the tables name, with its number here
            /// ([`ABSENT`] when the architecture has none).
            pub const fn entries(&self) -> [(&'static str, i64); Self::LEN] {
                [$((stringify!($name), self.$name)),*]
            }
        }
    };
}

syscall_numbers!(
    open,
    openat,
    openat2,
    creat,
    stat,
    lstat,
    access,
    truncate,
    chdir,
    rename,
    mkdir,
    rmdir,
    link,
    unlink,
    readlink,
    chmod,
    chown,
    lchown,
    mknod,
    statfs,
    chroot,
    umount2,
    execve,
    execveat,
    symlink,
    symlinkat,
    mount,
    mkdirat,
    mknodat,
    fchownat,
    newfstatat,
    unlinkat,
    renameat,
    renameat2,
    linkat,
    readlinkat,
    fchmodat,
    fchmodat2,
    faccessat,
    faccessat2,
    utimensat,
    statx,
    connect,
    bind,
    sendto,
    sendmsg,
    recvfrom,
    recvmsg,
    accept4,
    socket,
    listen,
    shutdown,
    getsockopt,
    clone,
    clone3,
    fork,
    vfork,
    exit,
    exit_group,
    prctl,
    seccomp,
    read,
    readv,
    write,
    pwrite64,
    writev,
    pwritev,
    ftruncate,
    fallocate,
    fsync,
    sync_file_range,
    close,
    dup2,
    dup3,
    poll,
    ppoll,
    epoll_ctl,
    epoll_wait,
    epoll_pwait,
    fadvise64,
    madvise,
    splice,
    tee,
    setxattr,
    fsetxattr,
    getxattr,
    fgetxattr,
    waitid,
    futex,
);

/// x86_64 (`arch/x86/entry/syscalls/syscall_64.tbl`).
pub const X86_64: SyscallNumbers = SyscallNumbers {
    open: 2,
    openat: 257,
    openat2: 437,
    creat: 85,
    stat: 4,
    lstat: 6,
    access: 21,
    truncate: 76,
    chdir: 80,
    rename: 82,
    mkdir: 83,
    rmdir: 84,
    link: 86,
    unlink: 87,
    readlink: 89,
    chmod: 90,
    chown: 92,
    lchown: 94,
    mknod: 133,
    statfs: 137,
    chroot: 161,
    umount2: 166,
    execve: 59,
    execveat: 322,
    symlink: 88,
    symlinkat: 266,
    mount: 165,
    mkdirat: 258,
    mknodat: 259,
    fchownat: 260,
    newfstatat: 262,
    unlinkat: 263,
    renameat: 264,
    renameat2: 316,
    linkat: 265,
    readlinkat: 267,
    fchmodat: 268,
    fchmodat2: 452,
    faccessat: 269,
    faccessat2: 439,
    utimensat: 280,
    statx: 332,
    connect: 42,
    bind: 49,
    sendto: 44,
    sendmsg: 46,
    recvfrom: 45,
    recvmsg: 47,
    accept4: 288,
    socket: 41,
    listen: 50,
    shutdown: 48,
    getsockopt: 55,
    clone: 56,
    clone3: 435,
    fork: 57,
    vfork: 58,
    exit: 60,
    exit_group: 231,
    prctl: 157,
    seccomp: 317,
    read: 0,
    readv: 19,
    write: 1,
    pwrite64: 18,
    writev: 20,
    pwritev: 296,
    ftruncate: 77,
    fallocate: 285,
    fsync: 74,
    sync_file_range: 277,
    close: 3,
    dup2: 33,
    dup3: 292,
    poll: 7,
    ppoll: 271,
    epoll_ctl: 233,
    epoll_wait: 232,
    epoll_pwait: 281,
    fadvise64: 221,
    madvise: 28,
    splice: 275,
    tee: 276,
    setxattr: 188,
    fsetxattr: 190,
    getxattr: 191,
    fgetxattr: 193,
    waitid: 247,
    futex: 202,
};

/// aarch64 (`include/uapi/asm-generic/unistd.h`).
pub const AARCH64: SyscallNumbers = SyscallNumbers {
    open: ABSENT,
    openat: 56,
    openat2: 437,
    creat: ABSENT,
    stat: ABSENT,
    lstat: ABSENT,
    access: ABSENT,
    truncate: 45,
    chdir: 49,
    rename: ABSENT,
    mkdir: ABSENT,
    rmdir: ABSENT,
    link: ABSENT,
    unlink: ABSENT,
    readlink: ABSENT,
    chmod: ABSENT,
    chown: ABSENT,
    lchown: ABSENT,
    mknod: ABSENT,
    statfs: 43,
    chroot: 51,
    umount2: 39,
    execve: 221,
    execveat: 281,
    symlink: ABSENT,
    symlinkat: 36,
    mount: 40,
    mkdirat: 34,
    mknodat: 33,
    fchownat: 54,
    newfstatat: 79,
    unlinkat: 35,
    renameat: 38,
    renameat2: 276,
    linkat: 37,
    readlinkat: 78,
    fchmodat: 53,
    fchmodat2: 452,
    faccessat: 48,
    faccessat2: 439,
    utimensat: 88,
    statx: 291,
    connect: 203,
    bind: 200,
    sendto: 206,
    sendmsg: 211,
    recvfrom: 207,
    recvmsg: 212,
    accept4: 242,
    socket: 198,
    listen: 201,
    shutdown: 210,
    getsockopt: 209,
    clone: 220,
    clone3: 435,
    fork: ABSENT,
    vfork: ABSENT,
    exit: 93,
    exit_group: 94,
    prctl: 167,
    seccomp: 277,
    read: 63,
    readv: 65,
    write: 64,
    pwrite64: 68,
    writev: 66,
    pwritev: 70,
    ftruncate: 46,
    fallocate: 47,
    fsync: 82,
    sync_file_range: 84,
    close: 57,
    dup2: ABSENT,
    dup3: 24,
    poll: ABSENT,
    ppoll: 73,
    epoll_ctl: 21,
    epoll_wait: ABSENT,
    epoll_pwait: 22,
    fadvise64: 223,
    madvise: 233,
    splice: 76,
    tee: 77,
    setxattr: 5,
    fsetxattr: 7,
    getxattr: 8,
    fgetxattr: 10,
    waitid: 95,
    futex: 98,
};

/// The architecture this build runs on: its name and its table.
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "bpf", bpf_target_arch = "x86_64")
))]
pub const NATIVE: (&str, SyscallNumbers) = ("x86_64", X86_64);

/// The architecture this build runs on: its name and its table.
#[cfg(any(
    target_arch = "aarch64",
    all(target_arch = "bpf", bpf_target_arch = "aarch64")
))]
pub const NATIVE: (&str, SyscallNumbers) = ("aarch64", AARCH64);

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(
        target_arch = "bpf",
        any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")
    )
)))]
compile_error!(
    "the probe knows the syscalls of x86_64 and aarch64 only (an eBPF build needs --cfg bpf_target_arch, which aya-build passes)"
);

/// Whether `nr` is one of `set` (which may hold [`ABSENT`]s).
pub(crate) const fn one_of(nr: i64, set: &[i64]) -> bool {
    if nr < 0 {
        return false;
    }
    let mut i = 0;
    while i < set.len() {
        if set[i] == nr {
            return true;
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// The kernel calls arm64's 79 `newfstatat` (as strace does); the
    /// syscalls crate calls it `fstatat`.
    fn crate_name(name: &str) -> &str {
        if name == "newfstatat" {
            "fstatat"
        } else {
            name
        }
    }

    #[test]
    fn every_number_is_the_kernels_for_its_architecture() {
        for (name, nr) in X86_64.entries() {
            let want = name
                .parse::<syscalls::x86_64::Sysno>()
                .map(|s| s.id() as i64);
            assert_eq!(want.unwrap_or(ABSENT), nr, "x86_64 {name}");
        }
        for (name, nr) in AARCH64.entries() {
            let want = crate_name(name)
                .parse::<syscalls::aarch64::Sysno>()
                .map(|s| s.id() as i64);
            assert_eq!(want.unwrap_or(ABSENT), nr, "aarch64 {name}");
        }
    }

    #[test]
    fn x86_only_syscalls_are_the_legacy_forms_arm64_replaced() {
        let absent: Vec<&str> = AARCH64
            .entries()
            .into_iter()
            .filter(|(_, nr)| *nr == ABSENT)
            .map(|(name, _)| name)
            .collect();
        assert_eq!(
            absent,
            [
                "open",
                "creat",
                "stat",
                "lstat",
                "access",
                "rename",
                "mkdir",
                "rmdir",
                "link",
                "unlink",
                "readlink",
                "chmod",
                "chown",
                "lchown",
                "mknod",
                "symlink",
                "fork",
                "vfork",
                "dup2",
                "poll",
                "epoll_wait"
            ]
        );
        assert!(X86_64.entries().iter().all(|(_, nr)| *nr != ABSENT));
    }
}
