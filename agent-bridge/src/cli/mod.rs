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
    #[command(flatten)]
    pub connections: ConnectionArgs,
}

/// How many HTTP connections, and how long each may sit without progress.
#[derive(clap::Args)]
pub struct ConnectionArgs {
    /// Most HTTP connections open at once; one more is answered 503 with a
    /// JSON-RPC error and Retry-After. Each is a file descriptor: keep it
    /// under the soft RLIMIT_NOFILE (ulimit -n) less what sessions need.
    #[arg(long, default_value_t = 1024, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Close an HTTP connection whose next request's head has not arrived
    /// in full within SECS: a new connection that sends nothing, a
    /// kept-alive one left idle, a head sent a byte at a time. A request
    /// in flight is never cut (a long call keeps its connection). 0: never.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub idle_timeout: u64,
    /// Answer 408 (a JSON-RPC -32700 error) and close the connection when a
    /// request body stops arriving: nothing for SECS. 0: never.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub body_timeout: u64,
    /// End an MCP session that has been idle for SECS (no request, nothing
    /// sent to it; a client that never sends DELETE): its workloads are
    /// killed and, for the proxy, its server shut down. 0: never.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub session_idle_timeout: u64,
}

impl ConnectionArgs {
    pub fn limits(&self) -> agent_bridge::listen::ConnectionLimits {
        let secs = |s: u64| (s > 0).then(|| std::time::Duration::from_secs(s));
        agent_bridge::listen::ConnectionLimits {
            max_connections: self.max_connections as usize,
            idle_timeout: secs(self.idle_timeout),
            body_timeout: secs(self.body_timeout),
        }
    }

    pub fn session_idle(&self) -> Option<std::time::Duration> {
        (self.session_idle_timeout > 0)
            .then(|| std::time::Duration::from_secs(self.session_idle_timeout))
    }
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
