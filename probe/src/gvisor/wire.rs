//! gVisor's runtime-monitoring wire format (`pkg/sentry/seccheck`): the
//! handshake, the 8-byte header of every datagram and the protobuf
//! messages of the points the probe enables, declared with prost's derive
//! (field numbers from `pkg/sentry/seccheck/points/*.proto`; fields the
//! probe does not read are skipped by the decoder).

use prost::Message as _;

/// The protocol version both sides announce (`common.Handshake`).
pub const HANDSHAKE_VERSION: u32 = 1;

/// Bytes before the payload: `u16 header_size, u16 message_type, u32
/// dropped_count` (little-endian). A newer runsc may send a longer header:
/// the payload starts at `header_size`.
pub const HEADER_LEN: usize = 8;

/// Largest datagram read (Falco's monitor read up to 300 KiB; an execve
/// point carries the whole environment).
pub const MAX_DATAGRAM: usize = 300 * 1024;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Handshake {
    #[prost(uint32, tag = "1")]
    pub version: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContextData {
    /// The sandbox's CLOCK_REALTIME.
    #[prost(int64, tag = "1")]
    pub time_ns: i64,
    /// Pids in the sandbox's root PID namespace.
    #[prost(int32, tag = "2")]
    pub thread_id: i32,
    #[prost(int32, tag = "4")]
    pub thread_group_id: i32,
    #[prost(string, tag = "6")]
    pub container_id: String,
    #[prost(string, tag = "8")]
    pub cwd: String,
    #[prost(string, tag = "9")]
    pub process_name: String,
}

/// A syscall's exit: `result` is 0 on failure, `errorno` the positive errno.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Exit {
    #[prost(int64, tag = "1")]
    pub result: i64,
    #[prost(int64, tag = "2")]
    pub errorno: i64,
}

/// `syscall.Syscall`: a raw point, sysno and arguments (never dereferenced).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawSyscall {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(message, optional, tag = "2")]
    pub exit: Option<Exit>,
    #[prost(uint64, tag = "4")]
    pub sysno: u64,
    #[prost(uint64, tag = "5")]
    pub arg1: u64,
    #[prost(uint64, tag = "6")]
    pub arg2: u64,
    #[prost(uint64, tag = "7")]
    pub arg3: u64,
    #[prost(uint64, tag = "8")]
    pub arg4: u64,
    #[prost(uint64, tag = "9")]
    pub arg5: u64,
}

impl RawSyscall {
    /// The flags argument of the raw syscalls that have one the probe
    /// judges (x86_64 argument positions): statx, newfstatat, faccessat2,
    /// unlinkat, renameat2.
    pub fn flags(&self) -> Option<u64> {
        match self.sysno {
            332 | 263 => Some(self.arg3),
            262 | 439 => Some(self.arg4),
            316 => Some(self.arg5),
            _ => None,
        }
    }
}

/// Fields 1–3, which every schematized syscall message shares: enough
/// for the messages whose other fields the probe does not read (prost
/// skips fields a message does not declare, whatever their wire type).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Bare {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(message, optional, tag = "2")]
    pub exit: Option<Exit>,
    #[prost(uint64, tag = "3")]
    pub sysno: u64,
}

/// `Close`, `Read`, `Write`, `Fcntl`, … : an fd and the path behind it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FdCall {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(message, optional, tag = "2")]
    pub exit: Option<Exit>,
    #[prost(uint64, tag = "3")]
    pub sysno: u64,
    #[prost(int64, tag = "4")]
    pub fd: i64,
    #[prost(string, tag = "5")]
    pub fd_path: String,
}

/// `Open`: a path relative to `fd_path` when not absolute, and its flags.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OpenCall {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(message, optional, tag = "2")]
    pub exit: Option<Exit>,
    #[prost(uint64, tag = "3")]
    pub sysno: u64,
    #[prost(int64, tag = "4")]
    pub fd: i64,
    #[prost(string, tag = "5")]
    pub fd_path: String,
    #[prost(string, tag = "6")]
    pub pathname: String,
    #[prost(uint32, tag = "7")]
    pub flags: u32,
}

/// `Execve`, `Chdir`: a path relative to `fd_path` when not absolute
/// (their field 7 is not open flags: execve's argv).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PathCall {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(message, optional, tag = "2")]
    pub exit: Option<Exit>,
    #[prost(uint64, tag = "3")]
    pub sysno: u64,
    #[prost(int64, tag = "4")]
    pub fd: i64,
    #[prost(string, tag = "5")]
    pub fd_path: String,
    #[prost(string, tag = "6")]
    pub pathname: String,
}

/// `Connect`, `Bind`, `Accept`: a raw `struct sockaddr`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddrCall {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(message, optional, tag = "2")]
    pub exit: Option<Exit>,
    #[prost(uint64, tag = "3")]
    pub sysno: u64,
    #[prost(int64, tag = "4")]
    pub fd: i64,
    #[prost(string, tag = "5")]
    pub fd_path: String,
    #[prost(bytes = "vec", tag = "6")]
    pub address: Vec<u8>,
}

/// A schematized syscall point, whichever message carried it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyscallPoint {
    pub context_data: Option<ContextData>,
    pub exit: Option<Exit>,
    pub sysno: u64,
    pub fd: Option<i64>,
    /// The path of `fd` (the directory of a relative `pathname`).
    pub fd_path: String,
    pub pathname: Option<String>,
    pub address: Option<Vec<u8>>,
    pub flags: Option<u64>,
}

impl From<Bare> for SyscallPoint {
    fn from(m: Bare) -> Self {
        SyscallPoint {
            context_data: m.context_data,
            exit: m.exit,
            sysno: m.sysno,
            ..Default::default()
        }
    }
}

impl From<FdCall> for SyscallPoint {
    fn from(m: FdCall) -> Self {
        SyscallPoint {
            context_data: m.context_data,
            exit: m.exit,
            sysno: m.sysno,
            fd: Some(m.fd),
            fd_path: m.fd_path,
            ..Default::default()
        }
    }
}

impl From<Chroot> for SyscallPoint {
    fn from(m: Chroot) -> Self {
        SyscallPoint {
            context_data: m.context_data,
            exit: m.exit,
            sysno: m.sysno,
            pathname: Some(m.pathname),
            ..Default::default()
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Chroot {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(message, optional, tag = "2")]
    pub exit: Option<Exit>,
    #[prost(uint64, tag = "3")]
    pub sysno: u64,
    #[prost(string, tag = "4")]
    pub pathname: String,
}

/// `sentry.CloneInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CloneInfo {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(int32, tag = "3")]
    pub created_thread_id: i32,
    #[prost(int32, tag = "4")]
    pub created_thread_group_id: i32,
    #[prost(uint64, tag = "6")]
    pub flags: u64,
}

/// `sentry.ExecveInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecveInfo {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(string, tag = "2")]
    pub binary_path: String,
    #[prost(string, repeated, tag = "3")]
    pub argv: Vec<String>,
}

/// `sentry.TaskExit` and `sentry.ExitNotifyParentInfo`: a wait status.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExit {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(int32, tag = "2")]
    pub exit_status: i32,
}

/// `container.Start`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStart {
    #[prost(message, optional, tag = "1")]
    pub context_data: Option<ContextData>,
    #[prost(string, tag = "2")]
    pub id: String,
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
}

/// `common.MessageType` values the probe reads.
pub mod kind {
    pub const CONTAINER_START: u16 = 1;
    pub const SENTRY_CLONE: u16 = 2;
    pub const SENTRY_EXEC: u16 = 3;
    pub const SENTRY_EXIT_NOTIFY_PARENT: u16 = 4;
    pub const SENTRY_TASK_EXIT: u16 = 5;
    pub const SYSCALL_RAW: u16 = 6;
    pub const SYSCALL_OPEN: u16 = 7;
    pub const SYSCALL_CLOSE: u16 = 8;
    pub const SYSCALL_READ: u16 = 9;
    pub const SYSCALL_CONNECT: u16 = 10;
    pub const SYSCALL_EXECVE: u16 = 11;
    pub const SYSCALL_CHDIR: u16 = 13;
    pub const SYSCALL_FCNTL: u16 = 18;
    pub const SYSCALL_SIGNALFD: u16 = 20;
    pub const SYSCALL_CHROOT: u16 = 21;
    pub const SYSCALL_BIND: u16 = 24;
    pub const SYSCALL_ACCEPT: u16 = 25;
    pub const SYSCALL_TIMERFD_SETTIME: u16 = 27;
    pub const SYSCALL_TIMERFD_GETTIME: u16 = 28;
    pub const SYSCALL_INOTIFY_ADD_WATCH: u16 = 31;
    pub const SYSCALL_INOTIFY_RM_WATCH: u16 = 32;
    pub const SYSCALL_WRITE: u16 = 34;
    /// The schematized syscall messages (open … write).
    pub const SYSCALL_FIRST: u16 = 7;
    pub const SYSCALL_LAST: u16 = 34;
}

/// One decoded point.
#[derive(Clone, Debug, PartialEq)]
pub enum Point {
    ContainerStart(ContainerStart),
    Clone(CloneInfo),
    Execve(ExecveInfo),
    TaskExit(TaskExit),
    Raw(RawSyscall),
    Syscall(SyscallPoint),
    /// A message type this probe does not read (a newer runsc's): skipped.
    Other(u16),
}

impl Point {
    /// The container the point came from, when it carries its context
    /// (container/start names its own id).
    pub fn container(&self) -> Option<&str> {
        let ctx = match self {
            Point::ContainerStart(m) => return Some(m.id.as_str()).filter(|id| !id.is_empty()),
            Point::Clone(m) => m.context_data.as_ref(),
            Point::Execve(m) => m.context_data.as_ref(),
            Point::TaskExit(m) => m.context_data.as_ref(),
            Point::Raw(m) => m.context_data.as_ref(),
            Point::Syscall(m) => m.context_data.as_ref(),
            Point::Other(_) => None,
        };
        ctx.map(|c| c.container_id.as_str())
            .filter(|id| !id.is_empty())
    }
}

/// One datagram: its point and runsc's cumulative count of points it
/// dropped for this connection.
#[derive(Clone, Debug, PartialEq)]
pub struct Datagram {
    pub dropped_count: u32,
    pub point: Point,
}

/// Why a datagram could not be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WireError {
    #[error("datagram of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    #[error("header size {0} is outside the {1}-byte datagram")]
    HeaderSize(usize, usize),
    #[error("message type {0}: {1}")]
    Payload(u16, prost::DecodeError),
}

/// Decodes one datagram (header and payload).
pub fn decode(datagram: &[u8]) -> Result<Datagram, WireError> {
    if datagram.len() < HEADER_LEN {
        return Err(WireError::Short(datagram.len()));
    }
    let header_size = u16::from_le_bytes([datagram[0], datagram[1]]) as usize;
    let message_type = u16::from_le_bytes([datagram[2], datagram[3]]);
    let dropped_count = u32::from_le_bytes([datagram[4], datagram[5], datagram[6], datagram[7]]);
    if !(HEADER_LEN..=datagram.len()).contains(&header_size) {
        return Err(WireError::HeaderSize(header_size, datagram.len()));
    }
    let payload = &datagram[header_size..];
    let bad = |e| WireError::Payload(message_type, e);
    use kind as t;
    let point = match message_type {
        t::CONTAINER_START => Point::ContainerStart(ContainerStart::decode(payload).map_err(bad)?),
        t::SENTRY_CLONE => Point::Clone(CloneInfo::decode(payload).map_err(bad)?),
        t::SENTRY_EXEC => Point::Execve(ExecveInfo::decode(payload).map_err(bad)?),
        // the parent's view of the same exit (never sent for init): the
        // task_exit point says it first
        t::SENTRY_EXIT_NOTIFY_PARENT => Point::Other(message_type),
        t::SENTRY_TASK_EXIT => Point::TaskExit(TaskExit::decode(payload).map_err(bad)?),
        t::SYSCALL_RAW => Point::Raw(RawSyscall::decode(payload).map_err(bad)?),
        t::SYSCALL_OPEN => {
            let m = OpenCall::decode(payload).map_err(bad)?;
            syscall(SyscallPoint {
                fd: Some(m.fd),
                pathname: Some(m.pathname),
                flags: Some(u64::from(m.flags)),
                context_data: m.context_data,
                exit: m.exit,
                sysno: m.sysno,
                fd_path: m.fd_path,
                address: None,
            })
        }
        t::SYSCALL_EXECVE | t::SYSCALL_CHDIR => {
            let m = PathCall::decode(payload).map_err(bad)?;
            syscall(SyscallPoint {
                fd: Some(m.fd),
                pathname: Some(m.pathname),
                context_data: m.context_data,
                exit: m.exit,
                sysno: m.sysno,
                fd_path: m.fd_path,
                ..Default::default()
            })
        }
        t::SYSCALL_CONNECT | t::SYSCALL_BIND | t::SYSCALL_ACCEPT => {
            let m = AddrCall::decode(payload).map_err(bad)?;
            syscall(SyscallPoint {
                fd: Some(m.fd),
                address: Some(m.address),
                context_data: m.context_data,
                exit: m.exit,
                sysno: m.sysno,
                fd_path: m.fd_path,
                ..Default::default()
            })
        }
        t::SYSCALL_CHROOT => syscall(Chroot::decode(payload).map_err(bad)?.into()),
        t::SYSCALL_CLOSE
        | t::SYSCALL_READ
        | t::SYSCALL_FCNTL
        | t::SYSCALL_SIGNALFD
        | t::SYSCALL_TIMERFD_SETTIME
        | t::SYSCALL_TIMERFD_GETTIME
        | t::SYSCALL_INOTIFY_ADD_WATCH
        | t::SYSCALL_INOTIFY_RM_WATCH
        | t::SYSCALL_WRITE => syscall(FdCall::decode(payload).map_err(bad)?.into()),
        other if (t::SYSCALL_FIRST..=t::SYSCALL_LAST).contains(&other) => {
            syscall(Bare::decode(payload).map_err(bad)?.into())
        }
        other => Point::Other(other),
    };
    Ok(Datagram {
        dropped_count,
        point,
    })
}

fn syscall(point: SyscallPoint) -> Point {
    Point::Syscall(point)
}

/// The handshake bytes the monitor answers with.
pub fn handshake() -> Vec<u8> {
    Handshake {
        version: HANDSHAKE_VERSION,
    }
    .encode_to_vec()
}

/// The peer's handshake: its version, or why it is not one.
pub fn read_handshake(bytes: &[u8]) -> Result<u32, prost::DecodeError> {
    Handshake::decode(bytes).map(|h| h.version)
}
