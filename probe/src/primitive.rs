//! The primitive taxonomy, in one place: the [`Primitive`] enum, the
//! errno/syscall rule table ([`RULES`]) and the reference page generated from
//! them (`docs/PRIMITIVES.md`, checked by a test).

use serde::{Deserialize, Serialize};

use crate::syscalls::SyscallClass;

/// A kernel primitive that can make a workload fail. The string ids are a
/// stable contract (JSON, SQLite, docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Primitive {
    #[serde(rename = "seccomp")]
    Seccomp,
    #[serde(rename = "fs.permission")]
    FsPermission,
    #[serde(rename = "fs.readonly")]
    FsReadonly,
    #[serde(rename = "fs.noexec")]
    FsNoexec,
    #[serde(rename = "fs.space")]
    FsSpace,
    #[serde(rename = "fs.persistence")]
    FsPersistence,
    #[serde(rename = "fs.missing")]
    FsMissing,
    #[serde(rename = "exec.missing")]
    ExecMissing,
    #[serde(rename = "proc.limit")]
    ProcLimit,
    #[serde(rename = "mem.oom")]
    MemOom,
    #[serde(rename = "mem.limit")]
    MemLimit,
    #[serde(rename = "mem.pressure")]
    MemPressure,
    #[serde(rename = "net.egress")]
    NetEgress,
    #[serde(rename = "caps")]
    Caps,
    #[serde(rename = "sandbox.kernel")]
    SandboxKernel,
    #[serde(rename = "signal")]
    Signal,
    #[serde(rename = "timeout")]
    Timeout,
    #[serde(rename = "none")]
    None,
}

impl Primitive {
    pub const ALL: [Primitive; 18] = [
        Primitive::Seccomp,
        Primitive::FsPermission,
        Primitive::FsReadonly,
        Primitive::FsNoexec,
        Primitive::FsSpace,
        Primitive::FsPersistence,
        Primitive::FsMissing,
        Primitive::ExecMissing,
        Primitive::ProcLimit,
        Primitive::MemOom,
        Primitive::MemLimit,
        Primitive::MemPressure,
        Primitive::NetEgress,
        Primitive::Caps,
        Primitive::SandboxKernel,
        Primitive::Signal,
        Primitive::Timeout,
        Primitive::None,
    ];

    /// The stable identifier, e.g. `fs.readonly`.
    pub fn id(self) -> &'static str {
        match self {
            Primitive::Seccomp => "seccomp",
            Primitive::FsPermission => "fs.permission",
            Primitive::FsReadonly => "fs.readonly",
            Primitive::FsNoexec => "fs.noexec",
            Primitive::FsSpace => "fs.space",
            Primitive::FsPersistence => "fs.persistence",
            Primitive::FsMissing => "fs.missing",
            Primitive::ExecMissing => "exec.missing",
            Primitive::ProcLimit => "proc.limit",
            Primitive::MemOom => "mem.oom",
            Primitive::MemLimit => "mem.limit",
            Primitive::MemPressure => "mem.pressure",
            Primitive::NetEgress => "net.egress",
            Primitive::Caps => "caps",
            Primitive::SandboxKernel => "sandbox.kernel",
            Primitive::Signal => "signal",
            Primitive::Timeout => "timeout",
            Primitive::None => "none",
        }
    }

    pub fn from_id(id: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.id() == id)
    }

    /// What the primitive means, for the reference page.
    pub fn meaning(self) -> &'static str {
        match self {
            Primitive::Seccomp => {
                "a seccomp filter refused a syscall (errno returned, SIGSYS, or killed)"
            }
            Primitive::FsPermission => "file mode, owner or ACL refused access",
            Primitive::FsReadonly => "the filesystem is mounted read-only",
            Primitive::FsNoexec => "the file sits on a mount with `noexec`",
            Primitive::FsSpace => "the filesystem, quota or file-size limit is full",
            Primitive::FsPersistence => "a path written earlier in the same session is gone",
            Primitive::FsMissing => "a file or directory the workload needed does not exist",
            Primitive::ExecMissing => {
                "the program is not installed (every PATH candidate is missing)"
            }
            Primitive::ProcLimit => {
                "a process or file-descriptor limit (pids cgroup, RLIMIT_NPROC, RLIMIT_NOFILE)"
            }
            Primitive::MemOom => "the OOM killer killed the workload",
            Primitive::MemLimit => "an allocation was refused (RLIMIT_AS, overcommit)",
            Primitive::MemPressure => "long memory-reclaim stalls slowed the workload",
            Primitive::NetEgress => "an outbound connection was refused, unroutable or filtered",
            Primitive::Caps => "a privileged operation without the capability",
            Primitive::SandboxKernel => {
                "the sandbox's kernel is not Linux (gVisor's Sentry): it lacks a syscall or a flag Linux has"
            }
            Primitive::Signal => "a signal from another process, or a crash",
            Primitive::Timeout => "the caller's time limit killed the workload",
            Primitive::None => "no kernel cause: the failure belongs to the interface or the test",
        }
    }

    /// The kernel evidence that leads to the primitive, for the reference page.
    pub fn evidence(self) -> &'static str {
        match self {
            Primitive::Seccomp => {
                "sys_exit without sys_enter (errno or SIGSYS); SIGSYS with si_code SYS_SECCOMP; exit by SIGSYS"
            }
            Primitive::FsNoexec => {
                "execve EACCES on a path whose mount has `noexec` (span mount events, then mountinfo)"
            }
            Primitive::FsPersistence => "ENOENT on a path this session wrote successfully before",
            Primitive::ExecMissing => "execve ENOENT and no later successful exec of that program",
            Primitive::MemOom => "oom:mark_victim for a traced pid",
            Primitive::MemPressure => {
                "direct or memory-cgroup reclaim stalls (vmscan tracepoints) dominating the span"
            }
            Primitive::Signal => "signal:signal_generate of a fatal signal, then exit by it",
            Primitive::SandboxKernel => {
                "under gVisor: ENOSYS, or EINVAL from a call whose flags are all valid on Linux, that the failing process's output reports"
            }
            Primitive::Timeout => "the caller says it killed the workload on a deadline",
            Primitive::None => "none of the above before the failing exit",
            _ => "see the rule table",
        }
    }

    /// Which layer a failure with this primitive belongs to.
    pub fn layer(self) -> Layer {
        match self {
            Primitive::None => Layer::Test,
            _ => Layer::Sandbox,
        }
    }
}

impl std::fmt::Display for Primitive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

/// Where a failed test's cause lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    /// MCP server/client, transport, encoding, checksum mismatch.
    Interface,
    /// A kernel primitive of the sandbox.
    Sandbox,
    /// The test's own expectation, with no other evidence.
    Test,
}

impl Layer {
    pub fn id(self) -> &'static str {
        match self {
            Layer::Interface => "interface",
            Layer::Sandbox => "sandbox",
            Layer::Test => "test",
        }
    }
}

/// One row of the rule table: a failed syscall of `class` with one of
/// `errnos` points at `primitive`.
#[derive(Debug, PartialEq)]
pub struct Rule {
    pub class: SyscallClass,
    pub errnos: &'static [i32],
    pub primitive: Primitive,
    /// How strongly this failure explains a failing exit on its own (0..1).
    pub weight: f32,
    /// The limit that refuses, when the row can name it (for sentences:
    /// "mmap failed with ENOMEM ×4 (RLIMIT_AS or overcommit)").
    pub limit: Option<&'static str>,
}

use libc::{
    EACCES, EAGAIN, ECONNREFUSED, EDQUOT, EFBIG, EHOSTUNREACH, EINPROGRESS, EMFILE, ENETUNREACH,
    ENFILE, ENOENT, ENOMEM, ENOSPC, ENOTDIR, EPERM, EROFS, ETIMEDOUT,
};

/// The errno/syscall → primitive table. First match wins; anything that
/// matches no row (ENOTTY, EAGAIN on read, EINTR…) is never blamed.
pub const RULES: &[Rule] = &[
    Rule {
        class: SyscallClass::Exec,
        errnos: &[ENOENT],
        primitive: Primitive::ExecMissing,
        weight: 0.9,
        limit: None,
    },
    // refined to fs.noexec when the path's mount has noexec
    Rule {
        class: SyscallClass::Exec,
        errnos: &[EACCES],
        primitive: Primitive::FsPermission,
        weight: 0.85,
        limit: None,
    },
    Rule {
        class: SyscallClass::Any,
        errnos: &[EROFS],
        primitive: Primitive::FsReadonly,
        weight: 0.95,
        limit: None,
    },
    Rule {
        class: SyscallClass::Any,
        errnos: &[ENOSPC, EDQUOT, EFBIG],
        primitive: Primitive::FsSpace,
        weight: 0.95,
        limit: None,
    },
    Rule {
        class: SyscallClass::Fork,
        errnos: &[EAGAIN],
        primitive: Primitive::ProcLimit,
        weight: 0.95,
        limit: Some("pids cgroup or RLIMIT_NPROC"),
    },
    Rule {
        class: SyscallClass::Fork,
        errnos: &[ENOMEM],
        primitive: Primitive::MemLimit,
        weight: 0.9,
        limit: None,
    },
    Rule {
        class: SyscallClass::Any,
        errnos: &[EMFILE],
        primitive: Primitive::ProcLimit,
        weight: 0.9,
        limit: Some("RLIMIT_NOFILE"),
    },
    Rule {
        class: SyscallClass::Any,
        errnos: &[ENFILE],
        primitive: Primitive::ProcLimit,
        weight: 0.9,
        limit: Some("the system-wide file limit, fs.file-max"),
    },
    Rule {
        class: SyscallClass::Memory,
        errnos: &[ENOMEM],
        primitive: Primitive::MemLimit,
        weight: 0.9,
        // mmap's ENOMEM does not say which: a memory cgroup never refuses
        // a mapping (it reclaims or OOM-kills on touch)
        limit: Some("RLIMIT_AS or overcommit"),
    },
    Rule {
        class: SyscallClass::Connect,
        errnos: &[
            ENETUNREACH,
            EHOSTUNREACH,
            ECONNREFUSED,
            ETIMEDOUT,
            EPERM,
            EACCES,
        ],
        primitive: Primitive::NetEgress,
        weight: 0.9,
        limit: None,
    },
    // a non-blocking connect still pending: the caller's own timeout gave
    // up on it (python's create_connection(timeout=…), curl --connect-timeout)
    Rule {
        class: SyscallClass::Connect,
        errnos: &[EINPROGRESS],
        primitive: Primitive::NetEgress,
        weight: 0.5,
        limit: None,
    },
    Rule {
        class: SyscallClass::Privileged,
        errnos: &[EPERM],
        primitive: Primitive::Caps,
        weight: 0.9,
        limit: None,
    },
    Rule {
        class: SyscallClass::PathWrite,
        errnos: &[EACCES, EPERM],
        primitive: Primitive::FsPermission,
        weight: 0.9,
        limit: None,
    },
    Rule {
        class: SyscallClass::PathRead,
        errnos: &[EACCES, EPERM],
        primitive: Primitive::FsPermission,
        weight: 0.8,
        limit: None,
    },
    Rule {
        class: SyscallClass::PathWrite,
        errnos: &[ENOENT, ENOTDIR],
        primitive: Primitive::FsMissing,
        weight: 0.8,
        limit: None,
    },
    Rule {
        class: SyscallClass::PathRead,
        errnos: &[ENOENT, ENOTDIR],
        primitive: Primitive::FsMissing,
        weight: 0.6,
        limit: None,
    },
    // stat/access probes: a search, not a need; only blamed when nothing better exists
    Rule {
        class: SyscallClass::PathProbe,
        errnos: &[ENOENT, ENOTDIR],
        primitive: Primitive::FsMissing,
        weight: 0.35,
        limit: None,
    },
];

/// Fatal signals a process brings on itself when the kernel refused it a
/// resource: abort() or a CHECK's trap instruction on a failed allocation
/// or thread start (Chromium traps with SIGTRAP), or a fault on the NULL
/// it got back. Raised by the process itself, they are the symptom of a
/// `mem.limit` / `proc.limit` failure shortly before ([`SYMPTOM_WINDOW_NS`]).
/// SIGFPE is not here: no resource failure ends in a division by zero.
pub const SYMPTOM_SIGNALS: [&str; 5] = ["SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGTRAP"];

/// How long before such a signal a resource failure of the same process
/// still explains it. A program reacts to a refused mmap or clone within
/// the failing call's own error path (microseconds), or after a few
/// retries with back-off (allocators and thread pools retry for up to about
/// a second); 5 s covers both, while a failure a program got past minutes
/// earlier says nothing about a later crash.
pub const SYMPTOM_WINDOW_NS: u64 = 5_000_000_000;

/// The rule a failed syscall matches, if any.
pub fn classify(syscall: &str, errno: i32, open_flags: u64) -> Option<&'static Rule> {
    RULES.iter().find(|r| {
        r.errnos.contains(&errno)
            && (r.class == SyscallClass::Any
                || crate::syscalls::is_in(syscall, open_flags, r.class))
    })
}

/// The reference page `docs/PRIMITIVES.md`, generated from the enum and the
/// rule table (`cargo xtask docs` writes it; a test checks it is current).
pub fn reference_markdown() -> String {
    let mut out = String::from(
        "# Primitives reference\n\n\
         Generated from `probe/src/primitive.rs` by `cargo xtask docs`; a test fails when it is stale.\n\n\
         | primitive | layer | meaning | kernel evidence |\n|---|---|---|---|\n",
    );
    for p in Primitive::ALL {
        let rules: Vec<String> = RULES
            .iter()
            .filter(|r| r.primitive == p)
            .map(|r| {
                let errnos: Vec<String> = r
                    .errnos
                    .iter()
                    .map(|&e| crate::event::errno_name(e).into_owned())
                    .collect();
                let limit = r.limit.map(|l| format!(" ({l})")).unwrap_or_default();
                format!("{} on {}{limit}", errnos.join("/"), r.class.describe())
            })
            .collect();
        let evidence = if rules.is_empty() {
            p.evidence().to_string()
        } else if p.evidence() == "see the rule table" {
            rules.join("; ")
        } else {
            format!("{}; {}", p.evidence(), rules.join("; "))
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            p.id(),
            p.layer().id(),
            p.meaning(),
            evidence
        ));
    }
    out.push_str(
        "\nA failure that matches no rule (ENOTTY ioctls, EAGAIN on reads, ENOENT while a program \
         searches its module path and then exits 0…) is never blamed. The decisive event is the \
         strongest rule match in a process that exited non-zero, latest first; fatal signals, OOM \
         kills and seccomp denials outrank syscall failures",
    );
    out.push_str(&format!(
        ", except a crash a process brought on itself ({}, sent by no other process) within {} s \
         of `mem.limit` or `proc.limit` failures of its own: the refused resource is the cause, \
         the crash its symptom.\n",
        SYMPTOM_SIGNALS.join(", "),
        SYMPTOM_WINDOW_NS / 1_000_000_000
    ));
    out.push_str(
        "\n## A call to a long-lived server\n\n\
         A span over one call to a process that outlives it (the proxy's server, a browser, a \
         shell kept between calls: `begin_span` with `tree` or `server`) is judged by the \
         call's own work and its own words. Its work: the processes the server started, \
         traced from the call's first moment. Its words: the call's arguments (`words.command`) \
         and the answer the caller got (`words.output`: its text, escaped or not). A failed \
         lookup counts only where those words name its path; `exec.missing` only where the \
         answer carries the shell's own \"not found\" line for that name (a server's version \
         probes look up tools it may not have, and those are never the call's). A failed child \
         is coped with only by a parent that ended within the span, a script moving past a \
         check: what a server starts after a call's command (housekeeping, probes on a timer) \
         never makes that command's failure look handled, so the same call gets the same \
         verdict whenever the server's own programs run. A server that answers without \
         `isError` gets its call's failure as a hidden failure; with `isError`, as the verdict. \
         The same holds for any span whose words say a command was not found: `sh -c \
         'no-such-tool --version; true'` exits 0 with `exec.missing` as its hidden failure.\n",
    );
    out
}
