//! Human-readable rendering of an attribution.

use std::fmt::Write as _;

use crate::attribution::Attribution;
use crate::event::{KernelEvent, Kind, Signal};

/// One event as a timeline line: `+1.204ms  mkdir[812]  syscall_failed mkdir("/x") EROFS`.
pub fn event_line(e: &KernelEvent) -> String {
    let mut s = format!(
        "+{:>9.3}ms  {}[{}]  {}",
        e.ts_ns as f64 / 1e6,
        e.comm,
        e.pid,
        e.kind.id()
    );
    match e.kind {
        Kind::SyscallFailed
        | Kind::SeccompDenied
        | Kind::FileWrite
        | Kind::Mount
        | Kind::UringFailed
        | Kind::UringUnderSeccomp => {
            let _ = write!(s, " {}", e.call());
            if let Some(errno) = &e.errno {
                let _ = write!(s, " {errno}");
            }
            if e.mount_noexec == Some(true) {
                s.push_str(" (noexec mount)");
            }
            if let Some(n) = e.repeats {
                // the whole run: this one and its identical followers
                let _ = write!(s, " ×{}", n + 1);
            }
        }
        Kind::Signal => {
            let _ = write!(s, " {}", e.signal.as_deref().unwrap_or("?"));
            if let (Some(p), Some(c)) = (e.sender_pid, &e.sender_comm) {
                let _ = write!(s, " from {c}[{p}]");
            }
            if e.si_code == Some(crate::event::SYS_SECCOMP) && e.signal_is(Signal::SIGSYS) {
                s.push_str(" (seccomp)");
            }
        }
        Kind::OomVictim => {
            let _ = write!(s, " anon_rss={} KiB", e.anon_rss_kb.unwrap_or(0));
        }
        Kind::Fork => {
            let _ = write!(s, " child={}", e.child_pid.unwrap_or(0));
        }
        Kind::Exec => {
            let _ = write!(s, " {}", e.path.as_deref().unwrap_or("?"));
        }
        Kind::Exit => match e.exit_code {
            Some(c) => {
                let _ = write!(s, " code={c}");
            }
            None => s.push_str(" (no exit call: killed)"),
        },
        Kind::FdDup => {
            let _ = write!(s, " {} -> {}", e.fd.unwrap_or(-1), e.ret.unwrap_or(-1));
        }
        Kind::ReclaimStall => {
            let _ = write!(s, " {:.3}ms", e.duration_ns.unwrap_or(0) as f64 / 1e6);
        }
        Kind::Repeated => {
            let _ = write!(
                s,
                " {} {} × {}",
                e.syscall.as_deref().unwrap_or("?"),
                e.errno.as_deref().unwrap_or("?"),
                e.repeats.unwrap_or(0)
            );
        }
    }
    s
}

/// The report `probe trace` prints without `--json`.
pub fn render(a: &Attribution) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "probe: {}", a.label);
    let _ = writeln!(
        out,
        "  exit        {} after {:.1} ms",
        a.exit.describe(),
        a.duration_ms
    );
    let layer = a
        .layer
        .map(|l| format!("{} layer, ", l.id()))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "  primitive   {}  ({layer}confidence {:.2})",
        a.primitive, a.confidence
    );
    let _ = writeln!(out, "  why         {}", a.explanation);
    if let Some(h) = &a.hint {
        let _ = writeln!(out, "  what to do  {h}");
    }
    if let Some(d) = &a.decisive {
        let _ = writeln!(out, "  decisive    {}", event_line(d));
    }
    // seen, not the cause: failed lookups nothing corroborated
    for (i, n) in a.noticed.iter().enumerate() {
        let head = if i == 0 { "noticed" } else { "" };
        let _ = writeln!(out, "  {head:<11} {n}");
    }
    if !a.events.is_empty() {
        let _ = writeln!(out, "  events ({}):", a.events.len());
        for e in &a.events {
            let _ = writeln!(out, "    {}", event_line(e));
        }
    }
    if a.memory.reclaim_ms > 0.0 || a.memory.psi_some_ms.is_some_and(|p| p > 0.0) {
        let _ = writeln!(
            out,
            "  memory      {:.1} ms in memory reclaim{}",
            a.memory.reclaim_ms,
            a.memory
                .psi_some_ms
                .map(|p| format!(", machine PSI some {p:.1} ms"))
                .unwrap_or_default()
        );
    }
    if let Some(view) = &a.sandbox {
        let pids = match (view.pids, view.root_pid) {
            (crate::attribution::PidsIn::Sandbox, _) => "pids are the sandbox's".to_string(),
            (crate::attribution::PidsIn::Daemon, Some(root)) => format!(
                "pids are the host's; its first process, {}, is {} in the sandbox",
                root.daemon, root.sandbox
            ),
            (crate::attribution::PidsIn::Daemon, None) => "pids are the host's".to_string(),
        };
        let _ = writeln!(out, "  sandbox     {} ({pids})", view.id);
    }
    let counts: Vec<String> = a.counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    let source = match a.source {
        crate::spans::Source::Ebpf => "",
        crate::spans::Source::Gvisor => {
            " (from gVisor's runtime monitoring; pids are the sandbox's)"
        }
    };
    let _ = writeln!(
        out,
        "  seen        {}{source} · drops: kernel {}, retention {}{}",
        if counts.is_empty() {
            "no events".to_string()
        } else {
            counts.join(", ")
        },
        a.drops.kernel,
        a.drops.retention,
        if a.drops.not_kept > 0 {
            let which = if a.explains() {
                "failed lookups it got past"
            } else {
                "the span explained nothing"
            };
            format!(
                " · {} events not kept ({which}: keep_events = \"failed\")",
                a.drops.not_kept
            )
        } else {
            String::new()
        }
    );
    out
}
