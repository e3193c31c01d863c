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
    #[error("no syscall `{0}` on {arch}{hint}", arch = std::env::consts::ARCH, hint = x86_only_hint(.0))]
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

/// What to call instead of an x86_64 legacy syscall this architecture lacks.
fn x86_only_hint(name: &str) -> String {
    crate::syscalls::X86_ONLY
        .iter()
        .find(|(x, _)| *x == name)
        .map(|(_, instead)| match instead {
            Some(i) => format!(" (an x86_64 legacy call: programs here call {i})"),
            None => " (x86_64 only)".to_string(),
        })
        .unwrap_or_default()
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
    // the filter checks the audit arch: a filter for another one kills on every call
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch)?;
    Ok(filter.try_into()?)
}
