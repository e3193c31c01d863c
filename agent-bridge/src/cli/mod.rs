//! The server side of the command line: `serve`, `proxy` and `profiles`,
//! and what they share (the HTTP guard's flags, the runtime, signals).
//! `campaign` is the campaign crate's own CLI (`campaign::cli`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

pub mod profiles;
pub mod proxy;
pub mod serve;

/// Who may use an HTTP server (`serve` and `proxy`).
#[derive(clap::Args)]
pub struct GuardArgs {
    /// Bearer token required on every HTTP request (required off loopback).
    #[arg(long, env = "AGENT_BRIDGE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// An Origin allowed besides loopback ones (repeatable).
    #[arg(long, value_name = "ORIGIN")]
    pub allow_origin: Vec<String>,
}

/// Logs to stderr, then runs `server` on a runtime of `threads` threads.
pub fn run_server(threads: usize, server: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,rmcp=error".into()),
        )
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = report(rt.block_on(server));
    // blocking waits of killed workloads must not hold the exit
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

pub fn report(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-bridge: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Ctrl-C or SIGTERM.
pub fn shutdown_on_signals() -> tokio_util::sync::CancellationToken {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        stop.cancel();
    });
    shutdown
}

/// Where session disks live: where no profile mounts over them (not /tmp).
pub fn run_dir() -> PathBuf {
    let run_base = if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run")
    } else {
        std::env::temp_dir()
    };
    run_base.join(format!("agent-bridge-{}", std::process::id()))
}
