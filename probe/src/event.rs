//! Decoding: raw ring-buffer records → [`KernelEvent`], the JSON event of the
//! contract (`kind`, `syscall`, `errno`, `path`, `pid`, `ts_ns`, …).

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

pub use nix::errno::Errno;
pub use nix::sys::signal::Signal;
use probe_abi::{
    ArgRole, DATA_LEN, EVENT_HEADER_LEN, Event, EventKind, flags, is_fd_syscall, syscall_arg_role,
};
use serde::{Deserialize, Serialize};

/// Event kinds as they appear in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    SyscallFailed,
    SeccompDenied,
    Signal,
    OomVictim,
    Fork,
    Exec,
    Exit,
    FileWrite,
    ReclaimStall,
    Mount,
    /// dup2/dup3 (internal: followed to name files behind fds).
    FdDup,
    /// The thread's last failure repeated identically `repeats` more times
    /// (internal: added to that failure, not kept).
    Repeated,
    /// An io_uring request failed (`io_uring_op`; `syscall` is the syscall
    /// it does the work of, and it is judged like that syscall's failure).
    UringFailed,
    /// An io_uring request naming a path or an address succeeded under a
    /// seccomp filter, which does not see io_uring operations.
    UringUnderSeccomp,
}

impl Kind {
    pub fn id(self) -> &'static str {
        match self {
            Kind::SyscallFailed => "syscall_failed",
            Kind::SeccompDenied => "seccomp_denied",
            Kind::Signal => "signal",
            Kind::OomVictim => "oom_victim",
            Kind::Fork => "fork",
            Kind::Exec => "exec",
            Kind::Exit => "exit",
            Kind::FileWrite => "file_write",
            Kind::ReclaimStall => "reclaim_stall",
            Kind::Mount => "mount",
            Kind::FdDup => "fd_dup",
            Kind::Repeated => "repeated",
            Kind::UringFailed => "uring_failed",
            Kind::UringUnderSeccomp => "uring_under_seccomp",
        }
    }

    /// A failed operation: a syscall's, or an io_uring request's doing a
    /// syscall's work.
    pub fn is_failure(self) -> bool {
        matches!(self, Kind::SyscallFailed | Kind::UringFailed)
    }

    pub fn from_id(id: &str) -> Option<Kind> {
        use Kind::*;
        [
            SyscallFailed,
            SeccompDenied,
            Signal,
            OomVictim,
            Fork,
            Exec,
            Exit,
            FileWrite,
            ReclaimStall,
            Mount,
            FdDup,
            Repeated,
            UringFailed,
            UringUnderSeccomp,
        ]
        .into_iter()
        .find(|k| k.id() == id)
    }
}

/// One decoded kernel event. Optional fields are present only for the kinds
/// they belong to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelEvent {
    pub kind: Kind,
    /// Nanoseconds since the span began.
    pub ts_ns: u64,
    /// The process the event is about (for `signal`: the target).
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<Cow<'static, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall_nr: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<Cow<'static, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ret: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `path` is the first 255 bytes of a longer path (the kernel saw it
    /// whole; the event carries that much).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_truncated: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// How long the syscall ran: failed connect/sendto only (a timeout shows
    /// as seconds; path syscalls are not timed), and reclaim stalls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ns: Option<u64>,
    /// open(2) flags, or mount(2) flags for `mount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<u64>,
    /// The fd of a write-family syscall; the old fd of a dup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fd: Option<i64>,
    /// The task had a seccomp filter installed (seen by the probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp_filter: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub si_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_comm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_rss_kb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_vm_kb: Option<u64>,
    /// execve EACCES: the path's mount has `noexec` (checked on arrival).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_noexec: Option<bool>,
    /// ENOENT on a path an earlier span of the same session wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_earlier: Option<WrittenEarlier>,
    /// `mnt:[NNN]` of the process, when it matters (persistence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_ns: Option<String>,
    /// The same failure followed this many more times in a row, on the same
    /// thread (counted in the kernel, not sent one by one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeats: Option<u64>,
    /// How the failure was learnt when not from the syscall's own return:
    /// `getsockopt(SO_ERROR)` for a non-blocking connect's outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<Cow<'static, str>>,
    /// `reclaim_stall`: the memory cgroup reclaimed at its limit (true), not
    /// the machine short of memory (direct reclaim, absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memcg: Option<bool>,
    /// `uring_*`: the io_uring operation (`IORING_OP_OPENAT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_uring_op: Option<Cow<'static, str>>,
    /// `oom_victim`: the victim's cgroup v2 path, read while it was being killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// `oom_victim`: that cgroup's `memory.max` in KiB (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max_kb: Option<u64>,
}

/// `si_code` of a SIGSYS raised by seccomp.
pub const SYS_SECCOMP: i32 = 1;

impl KernelEvent {
    pub(crate) fn bare(kind: Kind, ts_ns: u64, pid: u32, tid: u32, comm: String) -> Self {
        KernelEvent {
            kind,
            ts_ns,
            pid,
            tid,
            comm,
            syscall: None,
            syscall_nr: None,
            errno: None,
            ret: None,
            path: None,
            path_truncated: None,
            addr: None,
            duration_ns: None,
            flags: None,
            fd: None,
            seccomp_filter: None,
            signal: None,
            si_code: None,
            sender_pid: None,
            sender_comm: None,
            child_pid: None,
            thread: None,
            exit_code: None,
            anon_rss_kb: None,
            total_vm_kb: None,
            mount_noexec: None,
            written_earlier: None,
            mount_ns: None,
            repeats: None,
            memcg: None,
            via: None,
            io_uring_op: None,
            cgroup: None,
            memory_max_kb: None,
        }
    }

    /// Whether it failed with `errno` (rules name errnos by their
    /// constant, never by a string: a misspelling does not compile).
    pub fn errno_is(&self, errno: Errno) -> bool {
        self.errno.as_deref() == Some(errno_name(errno as i32).as_ref())
    }

    /// Whether it is syscall `sysno` (by the kernel's name on this
    /// architecture, which the event carries).
    pub fn syscall_is(&self, sysno: syscalls::Sysno) -> bool {
        self.syscall.as_deref() == Some(crate::syscalls::name(sysno as i64).as_ref())
    }

    /// Whether it is (or was caused by) signal `signal`.
    pub fn signal_is(&self, signal: Signal) -> bool {
        is_signal(self.signal.as_deref(), signal)
    }

    /// The errno number of a failed syscall or seccomp denial, if any.
    pub fn errno_nr(&self) -> Option<i32> {
        match self.kind {
            Kind::SyscallFailed | Kind::SeccompDenied | Kind::Repeated | Kind::UringFailed => self
                .ret
                .filter(|r| *r < 0 && *r >= -4095)
                .map(|r| -r as i32),
            _ => None,
        }
    }

    /// `syscall("path")`, `syscall(addr)` or `syscall`, for sentences;
    /// `io_uring openat("path")` for an io_uring request.
    pub fn call(&self) -> String {
        let name = self.syscall.as_deref().unwrap_or("syscall");
        let via = if matches!(self.kind, Kind::UringFailed | Kind::UringUnderSeccomp) {
            "io_uring "
        } else {
            ""
        };
        match (&self.path, &self.addr) {
            (Some(p), _) if self.path_truncated == Some(true) => {
                format!("{via}{name}(\"{p}…\" cut at {} bytes)", p.len())
            }
            (Some(p), _) => format!("{via}{name}(\"{p}\")"),
            (None, Some(a)) => format!("{via}{name}({a})"),
            _ => format!("{via}{name}"),
        }
    }
}

/// Why a record could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    /// The record is shorter than an [`Event`]'s header: ABI mismatch
    /// between the embedded eBPF object and this binary.
    #[error("ring buffer record of {0} bytes, expected {1}")]
    Size(usize, usize),
    /// A kind this binary does not know.
    #[error("unknown event kind {0}")]
    Kind(u32),
}

/// Reads one ring-buffer record. Alignment is not guaranteed, hence the
/// copy. A record may end after the words of `data` it fills
/// ([`EVENT_HEADER_LEN`]): only those bytes are copied, the rest is zero.
pub fn read_raw(bytes: &[u8]) -> Result<Event, DecodeError> {
    if bytes.len() < EVENT_HEADER_LEN {
        return Err(DecodeError::Size(bytes.len(), EVENT_HEADER_LEN));
    }
    let n = bytes.len().min(size_of::<Event>());
    let mut raw = std::mem::MaybeUninit::<Event>::zeroed();
    // SAFETY: n bytes fit both buffers; Event is plain old data (probe_abi),
    // so any bit pattern, zero included, is valid.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), raw.as_mut_ptr().cast::<u8>(), n);
        Ok(raw.assume_init())
    }
}

/// Decodes a raw event; `span_start_ns` makes `ts_ns` relative.
pub fn decode(raw: &Event, span_start_ns: u64) -> Result<KernelEvent, DecodeError> {
    let kind = EventKind::from_u32(raw.kind).ok_or(DecodeError::Kind(raw.kind))?;
    let ts = raw.ts_ns.saturating_sub(span_start_ns);
    let comm = cstr(&raw.comm);
    let data_len = (raw.data_len as usize).min(DATA_LEN);
    let data = &raw.data[..data_len];
    let ev = match kind {
        EventKind::SyscallFailed
        | EventKind::SeccompDenied
        | EventKind::FileWrite
        | EventKind::Mount => {
            let k = match kind {
                EventKind::SyscallFailed => Kind::SyscallFailed,
                EventKind::SeccompDenied => Kind::SeccompDenied,
                EventKind::FileWrite => Kind::FileWrite,
                _ => Kind::Mount,
            };
            let mut ev = KernelEvent::bare(k, ts, raw.pid, raw.tid, comm);
            // A seccomp kill rolls the registers back: the exit's "ret" is
            // the syscall number and the id may be -1.
            let nr = if kind == EventKind::SeccompDenied && raw.syscall < 0 {
                raw.ret
            } else {
                raw.syscall
            };
            ev.syscall = Some(crate::syscalls::name(nr));
            ev.syscall_nr = Some(nr);
            ev.ret = Some(raw.ret);
            if let Some(e) = ev.errno_nr() {
                ev.errno = Some(errno_name(e));
            }
            if kind != EventKind::SeccompDenied {
                // looked up once: this runs for every failing syscall
                let role = syscall_arg_role(raw.syscall);
                if role.is_timed() {
                    ev.duration_ns = Some(raw.duration_ns);
                }
                if is_fd_syscall(raw.syscall)
                    || matches!(role, ArgRole::SockAddr { .. })
                    || raw.flags & flags::SOCKET_ERROR != 0
                {
                    ev.fd = Some(raw.aux[0] as i64);
                } else if matches!(role, ArgRole::Path { flags: Some(_), .. })
                    || matches!(kind, EventKind::FileWrite | EventKind::Mount)
                {
                    ev.flags = Some(raw.aux[0]);
                }
            }
            path_addr_seccomp(&mut ev, raw.flags, data);
            if raw.flags & flags::SOCKET_ERROR != 0 {
                ev.via = Some(Cow::Borrowed("getsockopt(SO_ERROR)"));
            }
            ev
        }
        EventKind::Signal => {
            let target = raw.aux[2] as u32;
            let mut ev = KernelEvent::bare(Kind::Signal, ts, target, target, String::new());
            ev.signal = Some(signal_name(raw.aux[0] as i32));
            ev.si_code = Some(raw.aux[1] as u32 as i32);
            ev.sender_pid = Some(raw.pid);
            ev.sender_comm = Some(comm);
            ev
        }
        EventKind::OomVictim => {
            let mut ev = KernelEvent::bare(Kind::OomVictim, ts, raw.pid, raw.tid, comm);
            ev.total_vm_kb = Some(raw.aux[0]);
            ev.anon_rss_kb = Some(raw.aux[1]);
            ev
        }
        EventKind::Fork => {
            let mut ev = KernelEvent::bare(Kind::Fork, ts, raw.pid, raw.tid, comm);
            ev.child_pid = Some(raw.aux[0] as u32);
            ev.thread = Some(raw.flags & flags::THREAD != 0);
            ev
        }
        EventKind::Exec => {
            let mut ev = KernelEvent::bare(Kind::Exec, ts, raw.pid, raw.tid, comm);
            if raw.flags & flags::DATA_PATH != 0 {
                set_path(&mut ev, raw.flags, data);
            }
            ev
        }
        EventKind::Exit => {
            let mut ev = KernelEvent::bare(Kind::Exit, ts, raw.pid, raw.tid, comm);
            if raw.flags & flags::HAS_EXIT_CODE != 0 {
                ev.exit_code = Some((raw.aux[0] as u32 as i32) & 0xff);
            }
            ev
        }
        EventKind::ReclaimStall => {
            let mut ev = KernelEvent::bare(Kind::ReclaimStall, ts, raw.pid, raw.tid, comm);
            ev.duration_ns = Some(raw.duration_ns);
            if raw.flags & flags::MEMCG_RECLAIM != 0 {
                ev.memcg = Some(true);
            }
            ev
        }
        EventKind::FdDup => {
            let mut ev = KernelEvent::bare(Kind::FdDup, ts, raw.pid, raw.tid, comm);
            ev.syscall = Some(crate::syscalls::name(raw.syscall));
            ev.syscall_nr = Some(raw.syscall);
            ev.fd = Some(raw.aux[0] as i64);
            ev.ret = Some(raw.ret);
            ev
        }
        EventKind::Repeated => {
            let mut ev = KernelEvent::bare(Kind::Repeated, ts, raw.pid, raw.tid, comm);
            ev.syscall = Some(crate::syscalls::name(raw.syscall));
            ev.syscall_nr = Some(raw.syscall);
            ev.ret = Some(raw.ret);
            if let Some(e) = ev.errno_nr() {
                ev.errno = Some(errno_name(e));
            }
            ev.repeats = Some(raw.aux[0]);
            ev
        }
        EventKind::UringFailed | EventKind::UringUnderSeccomp => {
            let k = if kind == EventKind::UringFailed {
                Kind::UringFailed
            } else {
                Kind::UringUnderSeccomp
            };
            let mut ev = KernelEvent::bare(k, ts, raw.pid, raw.tid, comm);
            let opcode = raw.aux[0] as u32;
            let nr = probe_abi::uring_op_syscall(opcode);
            ev.syscall = Some(if nr >= 0 {
                crate::syscalls::name(nr)
            } else {
                Cow::Owned(uring_op_name(opcode).to_ascii_lowercase())
            });
            ev.syscall_nr = (nr >= 0).then_some(nr);
            ev.io_uring_op = Some(Cow::Owned(format!("IORING_OP_{}", uring_op_name(opcode))));
            if matches!(opcode, probe_abi::uring::OPENAT | probe_abi::uring::OPENAT2) {
                ev.flags = Some(raw.aux[1]);
            }
            ev.ret = Some(raw.ret);
            if let Some(e) = ev.errno_nr() {
                ev.errno = Some(errno_name(e));
            }
            path_addr_seccomp(&mut ev, raw.flags, data);
            ev
        }
        EventKind::TaskUntracked => return Err(DecodeError::Kind(raw.kind)),
    };
    Ok(ev)
}

/// The path or address an event carries, and whether its task was under a
/// seccomp filter, from its flags.
fn path_addr_seccomp(ev: &mut KernelEvent, raw_flags: u32, data: &[u8]) {
    if raw_flags & flags::DATA_PATH != 0 {
        set_path(ev, raw_flags, data);
    } else if raw_flags & flags::DATA_SOCKADDR != 0 {
        ev.addr = sockaddr(data);
    }
    if raw_flags & flags::SECCOMP_ON != 0 {
        ev.seccomp_filter = Some(true);
    }
}

/// The path in `data`, and whether the kernel's was longer.
fn set_path(ev: &mut KernelEvent, raw_flags: u32, data: &[u8]) {
    ev.path = Some(cstr(data));
    if raw_flags & flags::DATA_TRUNCATED != 0 {
        ev.path_truncated = Some(true);
    }
}

/// `OPENAT` for `IORING_OP_OPENAT` (`enum io_uring_op`, a stable uAPI).
pub fn uring_op_name(opcode: u32) -> &'static str {
    const NAMES: [&str; 63] = [
        "NOP",
        "READV",
        "WRITEV",
        "FSYNC",
        "READ_FIXED",
        "WRITE_FIXED",
        "POLL_ADD",
        "POLL_REMOVE",
        "SYNC_FILE_RANGE",
        "SENDMSG",
        "RECVMSG",
        "TIMEOUT",
        "TIMEOUT_REMOVE",
        "ACCEPT",
        "ASYNC_CANCEL",
        "LINK_TIMEOUT",
        "CONNECT",
        "FALLOCATE",
        "OPENAT",
        "CLOSE",
        "FILES_UPDATE",
        "STATX",
        "READ",
        "WRITE",
        "FADVISE",
        "MADVISE",
        "SEND",
        "RECV",
        "OPENAT2",
        "EPOLL_CTL",
        "SPLICE",
        "PROVIDE_BUFFERS",
        "REMOVE_BUFFERS",
        "TEE",
        "SHUTDOWN",
        "RENAMEAT",
        "UNLINKAT",
        "MKDIRAT",
        "SYMLINKAT",
        "LINKAT",
        "MSG_RING",
        "FSETXATTR",
        "SETXATTR",
        "FGETXATTR",
        "GETXATTR",
        "SOCKET",
        "URING_CMD",
        "SEND_ZC",
        "SENDMSG_ZC",
        "READ_MULTISHOT",
        "WAITID",
        "FUTEX_WAIT",
        "FUTEX_WAKE",
        "FUTEX_WAITV",
        "FIXED_FD_INSTALL",
        "FTRUNCATE",
        "BIND",
        "LISTEN",
        "RECV_ZC",
        "EPOLL_WAIT",
        "READV_FIXED",
        "WRITEV_FIXED",
        "PIPE",
    ];
    NAMES.get(opcode as usize).copied().unwrap_or("UNKNOWN")
}

/// A NUL-terminated byte string, lossily as UTF-8.
fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// `ENOENT` for 2, `E1234` when unknown. Borrowed for every known errno:
/// this runs once per failing syscall.
pub fn errno_name(errno: i32) -> Cow<'static, str> {
    // kernel-internal restart codes leak to tracepoints on interrupted syscalls
    match errno {
        512 => return "ERESTARTSYS".into(),
        513 => return "ERESTARTNOINTR".into(),
        514 => return "ERESTARTNOHAND".into(),
        516 => return "ERESTART_RESTARTBLOCK".into(),
        _ => {}
    }
    match syscalls::Errno::new(errno).name() {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(format!("E{errno}")),
    }
}

/// "No such file or directory" for ENOENT.
pub fn errno_desc(name: &str) -> &'static str {
    (1..134)
        .map(syscalls::Errno::new)
        .find(|e| e.name() == Some(name))
        .and_then(|e| e.description())
        .unwrap_or("unknown error")
}

/// Whether a signal carried by name (`SIGKILL`, as events, processes and
/// exits store it) is `signal`.
pub fn is_signal(name: Option<&str>, signal: Signal) -> bool {
    name == Some(signal.as_str())
}

/// `SIGKILL` for 9.
pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("SIG{sig}"))
}

/// Renders a `struct sockaddr`: `10.0.0.1:80`, `[::1]:443`, `unix:/run/x.sock`.
pub fn sockaddr(b: &[u8]) -> Option<String> {
    if b.len() < 2 {
        return None;
    }
    let family = u16::from_ne_bytes([b[0], b[1]]) as i32;
    match family {
        libc::AF_INET if b.len() >= 8 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            Some(format!("{}:{port}", Ipv4Addr::new(b[4], b[5], b[6], b[7])))
        }
        libc::AF_INET6 if b.len() >= 24 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[8..24]);
            Some(format!("[{}]:{port}", Ipv6Addr::from(a)))
        }
        libc::AF_UNIX => {
            let p = &b[2..];
            if p.first() == Some(&0) {
                Some(format!("unix:@{}", cstr(&p[1..])))
            } else {
                Some(format!("unix:{}", cstr(p)))
            }
        }
        f => Some(format!("family {f}")),
    }
}

/// Where and when a path was written: attached to the ENOENT that finds it
/// missing later.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenEarlier {
    pub span: u64,
    pub pid: u32,
    pub comm: String,
    pub syscall: String,
    /// Wall-clock ms when it was written.
    pub at_ms: i64,
    /// `mnt:[NNN]` of the writer, when it could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_ns: Option<String>,
    /// The path it wrote: the failed one, or a directory above or below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: EventKind) -> Event {
        Event {
            ts_ns: 1_000,
            span: 7,
            kind: kind as u32,
            flags: 0,
            pid: 42,
            tid: 43,
            syscall: 0,
            ret: 0,
            duration_ns: 0,
            aux: [0; 4],
            data_len: 0,
            _pad: 0,
            comm: *b"python3\0\0\0\0\0\0\0\0\0",
            data: [0; DATA_LEN],
        }
    }

    #[test]
    fn failed_open_with_path() {
        let mut r = raw(EventKind::SyscallFailed);
        r.syscall = 257;
        r.ret = -2;
        r.flags = flags::DATA_PATH;
        let p = b"/data/in.csv\0";
        r.data[..p.len()].copy_from_slice(p);
        r.data_len = p.len() as u32;
        let ev = decode(&r, 400).unwrap();
        assert_eq!(ev.kind, Kind::SyscallFailed);
        assert_eq!(ev.syscall.as_deref(), Some("openat"));
        assert_eq!(ev.errno.as_deref(), Some("ENOENT"));
        assert_eq!(ev.path.as_deref(), Some("/data/in.csv"));
        assert_eq!(ev.ts_ns, 600);
        assert_eq!(ev.comm, "python3");
        assert_eq!(ev.call(), "openat(\"/data/in.csv\")");
    }

    #[test]
    fn a_cut_path_says_so_in_the_event_and_the_call() {
        let mut r = raw(EventKind::SyscallFailed);
        r.syscall = 257;
        r.ret = -2;
        r.flags = flags::DATA_PATH | flags::DATA_TRUNCATED;
        r.data[..DATA_LEN - 1].fill(b'p');
        r.data_len = DATA_LEN as u32 - 1;
        let ev = decode(&r, 0).unwrap();
        assert_eq!(ev.path_truncated, Some(true));
        assert_eq!(
            ev.call(),
            format!("openat(\"{}…\" cut at 255 bytes)", "p".repeat(255))
        );
        r.flags = flags::DATA_PATH;
        assert_eq!(decode(&r, 0).unwrap().path_truncated, None);
    }

    #[test]
    fn seccomp_kill_names_the_syscall_from_ret() {
        let mut r = raw(EventKind::SeccompDenied);
        r.syscall = -1;
        r.ret = 41;
        let ev = decode(&r, 0).unwrap();
        assert_eq!(ev.syscall.as_deref(), Some("socket"));
        assert_eq!(ev.errno, None);
    }

    #[test]
    fn connect_address_v4_v6_unix() {
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&80u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(sockaddr(&v4).as_deref(), Some("10.0.0.1:80"));
        let mut v6 = vec![0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&443u16.to_be_bytes());
        v6[23] = 1;
        assert_eq!(sockaddr(&v6).as_deref(), Some("[::1]:443"));
        let mut un = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
        un.extend_from_slice(b"/run/x.sock\0");
        assert_eq!(sockaddr(&un).as_deref(), Some("unix:/run/x.sock"));
    }

    #[test]
    fn reclaim_stall_says_whether_a_memory_cgroup_reclaimed() {
        let mut r = raw(EventKind::ReclaimStall);
        r.duration_ns = 5_000_000;
        let direct = decode(&r, 0).unwrap();
        assert_eq!((direct.duration_ns, direct.memcg), (Some(5_000_000), None));
        r.flags = flags::MEMCG_RECLAIM;
        let memcg = decode(&r, 0).unwrap();
        assert_eq!(
            (memcg.duration_ns, memcg.memcg),
            (Some(5_000_000), Some(true))
        );
        let json = serde_json::to_value(&memcg).unwrap();
        assert_eq!(json["kind"], "reclaim_stall");
        assert_eq!(json["memcg"], true);
    }

    #[test]
    fn record_cut_after_its_path_decodes_whole() {
        let mut r = raw(EventKind::SyscallFailed);
        r.syscall = 257; // openat
        r.ret = -2;
        r.flags = flags::DATA_PATH;
        let path = b"/nonexistent/missing-1.csv";
        r.data[..path.len()].copy_from_slice(path);
        r.data[path.len()..].fill(0xaa); // what the kernel does not send
        r.data_len = path.len() as u32;
        // SAFETY: Event is plain old data.
        let whole =
            unsafe { std::slice::from_raw_parts((&raw const r).cast::<u8>(), size_of::<Event>()) };
        // the header and the words the path fills, as the programs send it
        let sent = &whole[..EVENT_HEADER_LEN + path.len().div_ceil(8) * 8];
        let read = read_raw(sent).unwrap();
        assert!(
            read.data[sent.len() - EVENT_HEADER_LEN..]
                .iter()
                .all(|&b| b == 0)
        );
        let ev = decode(&read, 0).unwrap();
        assert_eq!(ev.path.as_deref(), Some("/nonexistent/missing-1.csv"));
        assert_eq!(ev.errno.as_deref(), Some("ENOENT"));
        // a full-size record (the kinds sent by reservation) reads the same
        assert_eq!(decode(&read_raw(whole).unwrap(), 0).unwrap().path, ev.path);
    }

    #[test]
    fn short_record_and_unknown_kind_are_errors() {
        assert_eq!(
            read_raw(&[0u8; 8]).err(),
            Some(DecodeError::Size(8, EVENT_HEADER_LEN))
        );
        let mut r = raw(EventKind::Exit);
        r.kind = 999;
        assert_eq!(decode(&r, 0).err(), Some(DecodeError::Kind(999)));
    }

    #[test]
    fn failed_uring_openat_is_named_as_openat_through_io_uring() {
        let mut r = raw(EventKind::UringFailed);
        r.aux[0] = probe_abi::uring::OPENAT as u64;
        r.ret = -30;
        r.flags = flags::DATA_PATH | flags::SECCOMP_ON;
        let p = b"/ro/out\0";
        r.data[..p.len()].copy_from_slice(p);
        r.data_len = p.len() as u32;
        let ev = decode(&r, 0).unwrap();
        assert_eq!(ev.kind, Kind::UringFailed);
        assert!(ev.kind.is_failure());
        assert_eq!(ev.syscall.as_deref(), Some("openat"));
        assert_eq!(ev.syscall_nr, Some(257));
        assert_eq!(ev.errno.as_deref(), Some("EROFS"));
        assert_eq!(ev.io_uring_op.as_deref(), Some("IORING_OP_OPENAT"));
        assert_eq!(ev.seccomp_filter, Some(true));
        assert_eq!(ev.call(), "io_uring openat(\"/ro/out\")");
        // an opcode with no syscall of its own keeps its io_uring name
        r.aux[0] = 11; // TIMEOUT
        r.flags = 0;
        let ev = decode(&r, 0).unwrap();
        assert_eq!(
            (ev.syscall.as_deref(), ev.syscall_nr),
            (Some("timeout"), None)
        );
    }

    #[test]
    fn names() {
        assert_eq!(errno_name(13), "EACCES");
        assert_eq!(errno_desc("EROFS"), "Read-only file system");
        assert_eq!(signal_name(9), "SIGKILL");
    }
}
