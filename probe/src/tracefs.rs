//! tracefs: make sure it is mounted, and read tracepoint field offsets from
//! `events/<category>/<name>/format`, whose layouts vary across kernels.

use std::path::{Path, PathBuf};

use probe_abi::Offsets;

/// Where tracefs usually lives.
const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Errors reading tracefs.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// tracefs is neither mounted nor mountable.
    #[error(
        "tracefs is not mounted and mounting it at /sys/kernel/tracing failed: {0} \
         (run `mount -t tracefs nodev /sys/kernel/tracing` as root)"
    )]
    NotMounted(String),
    /// A tracepoint the probe needs does not exist on this kernel.
    #[error(
        "tracepoint {0} is missing on this kernel ({1}); the probe needs a kernel with \
         CONFIG_FTRACE_SYSCALLS and the sched/signal/oom tracepoints"
    )]
    Missing(String, String),
    /// A field the probe reads is not in the tracepoint's format.
    #[error(
        "tracepoint {0} has no field `{1}` in its format; this kernel's layout is not supported"
    )]
    Field(String, String),
}

/// The tracefs root, mounting it at /sys/kernel/tracing if needed.
pub fn root() -> Result<PathBuf, TracefsError> {
    for c in CANDIDATES {
        if Path::new(c).join("events").is_dir() {
            return Ok(PathBuf::from(c));
        }
    }
    let target = CANDIDATES[0];
    nix::mount::mount(
        Some("nodev"),
        target,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| TracefsError::NotMounted(e.desc().to_string()))?;
    Ok(PathBuf::from(target))
}

/// Parses a format file into (field name, offset) pairs.
pub fn parse_format(text: &str) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut parts = rest.split(';');
        let decl = parts.next().unwrap_or("").trim();
        let offset = parts.find_map(|p| {
            p.trim()
                .strip_prefix("offset:")
                .and_then(|o| o.parse::<u32>().ok())
        });
        // the name is the last word of the declaration, minus any [N]
        let name = decl.rsplit(' ').next().unwrap_or("");
        let name = name.split('[').next().unwrap_or(name);
        if let (false, Some(off)) = (name.is_empty(), offset) {
            out.push((name.to_string(), off));
        }
    }
    out
}

/// The format of one tracepoint.
pub fn format(root: &Path, tracepoint: &str) -> Result<Vec<(String, u32)>, TracefsError> {
    let path = root.join("events").join(tracepoint).join("format");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| TracefsError::Missing(tracepoint.to_string(), e.to_string()))?;
    Ok(parse_format(&text))
}

fn field(fields: &[(String, u32)], tp: &str, name: &str) -> Result<u32, TracefsError> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, o)| *o)
        .ok_or_else(|| TracefsError::Field(tp.to_string(), name.to_string()))
}

/// All the offsets the eBPF programs need.
pub fn offsets(root: &Path) -> Result<Offsets, TracefsError> {
    let fork = format(root, "sched/sched_process_fork")?;
    let exec = format(root, "sched/sched_process_exec")?;
    let exit = format(root, "sched/sched_process_exit")?;
    let sig = format(root, "signal/signal_generate")?;
    let oom = format(root, "oom/mark_victim")?;
    let enter = format(root, "raw_syscalls/sys_enter")?;
    let exit_sys = format(root, "raw_syscalls/sys_exit")?;
    let f = |fields: &[(String, u32)], tp: &str, name: &str| field(fields, tp, name);
    // io_uring is optional (CONFIG_IO_URING=n, or a kernel without these
    // tracepoints): u32::MAX everywhere, and its programs are not attached
    let uring = |tp: &str, name: &str| {
        format(root, &format!("io_uring/{tp}"))
            .ok()
            .and_then(|fields| f(&fields, tp, name).ok())
            .unwrap_or(u32::MAX)
    };
    Ok(Offsets {
        // not read by the programs today; u32::MAX marks a missing field
        fork_parent_pid: f(&fork, "sched_process_fork", "parent_pid").unwrap_or(u32::MAX),
        fork_child_pid: f(&fork, "sched_process_fork", "child_pid")?,
        exec_filename: f(&exec, "sched_process_exec", "filename")?,
        exec_old_pid: f(&exec, "sched_process_exec", "old_pid")?,
        exit_pid: f(&exit, "sched_process_exit", "pid").unwrap_or(u32::MAX),
        // older kernels have no group_dead: u32::MAX tells the eBPF side to
        // fall back to "the thread-group leader exited"
        exit_group_dead: f(&exit, "sched_process_exit", "group_dead").unwrap_or(u32::MAX),
        signal_sig: f(&sig, "signal_generate", "sig")?,
        signal_code: f(&sig, "signal_generate", "code")?,
        signal_pid: f(&sig, "signal_generate", "pid")?,
        signal_result: f(&sig, "signal_generate", "result")?,
        oom_pid: f(&oom, "mark_victim", "pid")?,
        // older kernels report only the pid: u32::MAX makes the program skip these
        oom_comm: f(&oom, "mark_victim", "comm").unwrap_or(u32::MAX),
        oom_total_vm: f(&oom, "mark_victim", "total_vm").unwrap_or(u32::MAX),
        oom_anon_rss: f(&oom, "mark_victim", "anon_rss").unwrap_or(u32::MAX),
        uring_submit_req: uring("io_uring_submit_req", "req"),
        uring_submit_opcode: uring("io_uring_submit_req", "opcode"),
        uring_complete_req: uring("io_uring_complete", "req"),
        uring_complete_res: uring("io_uring_complete", "res"),
        uring_complete_cflags: uring("io_uring_complete", "cflags"),
        uring_failed_opcode: uring("io_uring_req_failed", "opcode"),
        uring_failed_addr: uring("io_uring_req_failed", "addr"),
        // `off` is the sqe's addr2 (symlinkat's new link, connect's length)
        uring_failed_addr2: uring("io_uring_req_failed", "off"),
        uring_failed_op_flags: uring("io_uring_req_failed", "op_flags"),
        uring_failed_error: uring("io_uring_req_failed", "error"),
        sys_enter_id: f(&enter, "sys_enter", "id")?,
        sys_enter_args: f(&enter, "sys_enter", "args")?,
        sys_exit_id: f(&exit_sys, "sys_exit", "id")?,
        sys_exit_ret: f(&exit_sys, "sys_exit", "ret")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORK_6_18: &str = "name: sched_process_fork
ID: 318
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;
";

    const EXIT_OLD: &str = "\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
";

    #[test]
    fn parses_data_loc_and_arrays() {
        let f = parse_format(FORK_6_18);
        assert_eq!(field(&f, "fork", "child_pid").unwrap(), 20);
        assert_eq!(field(&f, "fork", "parent_comm").unwrap(), 8);
        let e = parse_format(EXIT_OLD);
        assert_eq!(field(&e, "exit", "comm").unwrap(), 8);
        assert_eq!(field(&e, "exit", "pid").unwrap(), 24);
        assert!(matches!(
            field(&e, "exit", "group_dead"),
            Err(TracefsError::Field(..))
        ));
    }
}
