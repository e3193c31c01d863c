//! `probe`: the command line. A thin layer over the `probe` library.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use probe::loader::Probe;
use probe::primitive::reference_markdown;
use probe::trace::{TraceOptions, trace};

/// Exit status for the probe's own failures (CMD's statuses pass through).
const PROBE_FAILED: u8 = 125;

#[derive(Parser)]
#[command(
    name = "probe",
    version,
    about = "Tells which kernel primitive made a sandboxed workload fail.",
    long_about = "Tells which kernel primitive made a sandboxed workload fail: seccomp filters, \
read-only or noexec mounts, permissions, full disks, pids and memory limits, blocked egress…\n\n\
eBPF programs on tracepoints (no kprobes needed) watch failing syscalls, seccomp denials, \
forks/execs/exits, signals, OOM kills and memory reclaim of the traced workload only, and the \
probe names the one event that made it fail.\n\n\
Needs root (or CAP_BPF+CAP_PERFMON+CAP_SYS_RESOURCE)."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command under the probe and say why it failed.
    ///
    /// Exits with the command's status (128+N when killed by signal N; 125
    /// when the probe itself cannot run). The command's output passes
    /// through; with --json its stdout goes to stderr so stdout carries
    /// exactly one JSON object.
    ///
    /// Examples:
    ///   probe trace -- python3 train.py
    ///   probe trace --json -- sh -c 'echo hi > /readonly/out'
    ///   probe trace --events --timeout 30 -- make test
    #[command(verbatim_doc_comment)]
    Trace {
        /// Print one JSON attribution object on stdout.
        #[arg(long)]
        json: bool,
        /// Include every event seen, not only the evidence.
        #[arg(long)]
        events: bool,
        /// Kill the command after this many seconds (attributed `timeout`).
        #[arg(long, value_name = "SECS")]
        timeout: Option<f64>,
        /// Events kept per span; older ones are evicted and counted.
        #[arg(long, value_name = "N", default_value_t = probe::spans::DEFAULT_EVENT_CAP)]
        event_cap: usize,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// Print the primitives reference (the taxonomy and its rules) as Markdown.
    Primitives,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("probe: {e:#}");
            ExitCode::from(PROBE_FAILED)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Cmd::Primitives => {
            print!("{}", reference_markdown());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Trace { json, events, timeout, event_cap, command } => {
            let timeout = match timeout {
                Some(t) if !(t.is_finite() && t > 0.0) => anyhow::bail!("--timeout must be a positive number of seconds"),
                t => t.map(Duration::from_secs_f64),
            };
            let mut probe = Probe::load()?;
            let opts = TraceOptions {
                command,
                timeout,
                all_events: events,
                stdout_to_stderr: json,
                event_cap: Some(event_cap.max(1)),
            };
            let traced = trace(&mut probe, &opts)?;
            drop(probe);
            let a = &traced.attribution;
            if json {
                println!("{}", serde_json::to_string_pretty(a)?);
            } else {
                print!("{}", probe::report::render(a));
            }
            if traced.interrupted {
                eprintln!("probe: interrupted; the workload was stopped");
            }
            Ok(ExitCode::from(a.exit.shell_code().clamp(0, 255) as u8))
        }
    }
}
