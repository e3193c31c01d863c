//! Seccomp filters for injecting faults: shared by `probe-fault` and
//! agent-bridge's sandbox profiles.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// Why a seccomp rule could not be built.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("unknown seccomp action `{0}` (errno, errno=ENAME, kill, trap, log)")]
    Action(String),
    #[error("unknown errno `{0}` (e.g. EPERM, EACCES)")]
    Errno(String),
    #[error("unknown syscall `{0}`")]
    Syscall(String),
    #[error("no syscalls given")]
    Empty,
    #[error("seccomp: {0}")]
    Compile(#[from] seccompiler::BackendError),
    #[error("seccomp: {0}")]
    Build(#[from] seccompiler::Error),
}

/// Parses an action: `errno` (EPERM), `errno=ENAME`, `kill` (the process),
/// `trap` (SIGSYS) or `log`.
pub fn seccomp_action(action: &str) -> Result<SeccompAction, FaultError> {
    Ok(match action {
        "errno" => SeccompAction::Errno(libc::EPERM as u32),
        "kill" => SeccompAction::KillProcess,
        "trap" => SeccompAction::Trap,
        "log" => SeccompAction::Log,
        a if a.starts_with("errno=") => SeccompAction::Errno(errno_number(&a[6..])? as u32),
        a => return Err(FaultError::Action(a.into())),
    })
}

/// `EPERM` → 1.
pub fn errno_number(name: &str) -> Result<i32, FaultError> {
    (1..134)
        .find(|&n| format!("{:?}", nix::errno::Errno::from_raw(n)) == name)
        .ok_or_else(|| FaultError::Errno(name.into()))
}

/// A filter that answers `action` to every syscall named, and allows the rest.
pub fn seccomp_filter<S: AsRef<str>>(
    action: &str,
    syscalls: &[S],
) -> Result<BpfProgram, FaultError> {
    let action = seccomp_action(action)?;
    if syscalls.is_empty() {
        return Err(FaultError::Empty);
    }
    let mut rules = BTreeMap::new();
    for name in syscalls {
        let name = name.as_ref();
        let nr = crate::syscalls::number(name).ok_or_else(|| FaultError::Syscall(name.into()))?;
        rules.insert(nr, vec![]);
    }
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, TargetArch::x86_64)?;
    Ok(filter.try_into()?)
}
