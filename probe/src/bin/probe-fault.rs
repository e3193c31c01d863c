//! `probe-fault`: run a command under a sandbox restriction, to reproduce a
//! failure (and to test the probe against real faults). Installs seccomp
//! filters and resource limits on itself, then execs the command.
//!
//! ```text
//! probe-fault --seccomp errno:mkdir -- mkdir /tmp/x
//! probe-fault --seccomp kill:socket --rlimit nproc=20 -- python3 job.py
//! ```

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode};

use anyhow::{Context as _, bail};
use clap::Parser;
use seccompiler::BpfProgram;

#[derive(Parser)]
#[command(
    name = "probe-fault",
    version,
    about = "Run a command under an injected sandbox fault (seccomp filter, rlimit).",
    after_help = "Examples:\n  probe-fault --seccomp errno:mkdir -- mkdir /tmp/x\n  \
                  probe-fault --seccomp errno=EACCES:openat,open -- cat /etc/hostname\n  \
                  probe-fault --seccomp kill:socket -- python3 -c 'import socket; socket.socket()'\n  \
                  probe-fault --rlimit nproc=1 -- sh -c 'sleep 1 & wait'"
)]
struct Args {
    /// Seccomp rule ACTION:SYSCALL[,SYSCALL...]. ACTION is errno (EPERM),
    /// errno=ENAME, kill (kill the process), trap (SIGSYS) or log.
    /// Repeatable; each rule is its own stacked filter.
    #[arg(long, value_name = "ACTION:SYSCALLS")]
    seccomp: Vec<String>,
    /// Resource limit NAME=VALUE: nproc, nofile, as, fsize, core (soft and hard).
    #[arg(long, value_name = "NAME=VALUE")]
    rlimit: Vec<String>,
    /// The command to run.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("probe-fault: {e:#}");
            ExitCode::from(125)
        }
    }
}

enum Never {}

fn run(args: Args) -> anyhow::Result<Never> {
    // build everything first: nothing may fail after the filters go in
    let filters: Vec<BpfProgram> = args
        .seccomp
        .iter()
        .map(|s| filter(s))
        .collect::<Result<_, _>>()?;
    let limits: Vec<(i32, u64)> = args
        .rlimit
        .iter()
        .map(|s| rlimit(s))
        .collect::<Result<_, _>>()?;
    let (program, rest) = args.command.split_first().context("no command")?;
    for (resource, value) in limits {
        let lim = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: plain syscall with a valid pointer to an initialised struct.
        if unsafe { libc::setrlimit(resource as _, &lim) } != 0 {
            bail!("setrlimit: {}", std::io::Error::last_os_error());
        }
    }
    for f in &filters {
        seccompiler::apply_filter(f).context("installing the seccomp filter")?;
    }
    let err = Command::new(program).args(rest).exec();
    bail!("cannot run {}: {err}", program.to_string_lossy())
}

fn filter(spec: &str) -> anyhow::Result<BpfProgram> {
    let (action, syscalls) = spec
        .split_once(':')
        .with_context(|| format!("`{spec}`: expected ACTION:SYSCALLS"))?;
    let syscalls: Vec<&str> = syscalls.split(',').collect();
    Ok(probe::fault::seccomp_filter(action, &syscalls)?)
}

fn rlimit(spec: &str) -> anyhow::Result<(i32, u64)> {
    let (name, value) = spec
        .split_once('=')
        .with_context(|| format!("`{spec}`: expected NAME=VALUE"))?;
    let value: u64 = value
        .parse()
        .with_context(|| format!("`{value}` is not a number"))?;
    let resource = match name {
        "nproc" => libc::RLIMIT_NPROC,
        "nofile" => libc::RLIMIT_NOFILE,
        "as" => libc::RLIMIT_AS,
        "fsize" => libc::RLIMIT_FSIZE,
        "core" => libc::RLIMIT_CORE,
        n => bail!("unknown rlimit `{n}` (nproc, nofile, as, fsize, core)"),
    };
    Ok((resource as i32, value))
}
