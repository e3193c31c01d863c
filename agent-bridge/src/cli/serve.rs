//! `agent-bridge serve`: the sandbox over MCP, on stdio or Streamable HTTP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_bridge::profile::Profile;
use agent_bridge::server::{self, HttpOptions};
use agent_bridge::session::Config;
use anyhow::Context as _;
use contract::fault::InterfaceFault;
use contract::units::parse_size;

use super::{GuardArgs, run_dir, shutdown_on_signals};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Speak MCP on stdin/stdout (logs go to stderr).
    #[arg(long, conflicts_with = "http", required_unless_present = "http")]
    pub stdio: bool,
    /// Serve Streamable HTTP at http://ADDR/mcp (e.g. 127.0.0.1:8765; port 0 picks one).
    ///
    /// Each MCP session gets a sandbox session of its own (probe session,
    /// background processes, disks); clients of protocol 2026-07-28, which
    /// has no sessions, share one.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Sandbox profile applied to every workload: a built-in name or a TOML file.
    #[arg(long, default_value = "clean", value_name = "NAME|FILE")]
    pub profile: String,
    /// Corrupt bytes in the encoding layer on purpose (testing harnesses only).
    #[arg(long, value_enum, value_name = "FAULT")]
    pub interface_fault: Option<InterfaceFault>,
    /// The probe daemon's control socket.
    #[arg(long, default_value = "/run/probe/probe.sock", value_name = "PATH")]
    pub probe_socket: PathBuf,
    /// Run without asking the probe (kernel: {available: false}).
    #[arg(long)]
    pub no_probe: bool,
    /// Working directory of workloads that name none.
    #[arg(long, default_value = "/tmp", value_name = "DIR")]
    pub workdir: PathBuf,
    /// SQLite file that `record_result` writes (created if missing).
    #[arg(long, value_name = "FILE")]
    pub results_db: Option<PathBuf>,
    /// Default timeout of a call, in milliseconds.
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    pub timeout_ms: u64,
    #[command(flatten)]
    pub guard: GuardArgs,
    /// Largest request: HTTP body, or one stdio message (e.g. 96M).
    #[arg(long, default_value = "96M", value_name = "SIZE", value_parser = parse_size)]
    pub max_body: u64,
    /// Threads for the protocol side (parsing, routing, waiting on workloads).
    /// One is fastest per call on a small machine: no wake-ups across threads.
    /// Raise it when several sessions move large files at once, so one
    /// answer's serialization does not hold up the others. Hashing, base64
    /// encoding and waits on workloads run on their own threads either way.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub async_threads: u16,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let profile = Profile::load(&args.profile)?;
    let max_body = usize::try_from(args.max_body).context("--max-body")?;
    agent_bridge::big_alloc::spawn_release_thread().context("cannot start a thread")?;
    let swept = agent_bridge::cgroup::sweep_stale();
    if swept > 0 {
        tracing::info!("removed {swept} call cgroup(s) left by bridges that died");
    }
    let profiles = agent_bridge::session::remove_orphan_profiles(&std::env::temp_dir());
    if profiles > 0 {
        tracing::info!("removed {profiles} browser profile(s) left by bridges that died");
    }
    // kept to the end: when this process goes, so does every workload it started
    let _reaper = agent_bridge::reaper::start()
        .map_err(|e| tracing::warn!("no reaper: workloads may outlive this bridge: {e}"));
    std::fs::create_dir_all(&args.workdir)
        .with_context(|| format!("--workdir {}", args.workdir.display()))?;
    let run_dir = run_dir();
    let config = Arc::new(Config {
        profile,
        probe_socket: (!args.no_probe).then_some(args.probe_socket),
        fault: args.interface_fault,
        workdir: args.workdir,
        results_db: args.results_db,
        // through /proc: the binary stays reachable when a profile mounts
        // over the directory it lives in (e.g. an ephemeral /tmp)
        self_exe: PathBuf::from("/proc/self/exe"),
        default_timeout: Duration::from_millis(args.timeout_ms),
        run_dir: run_dir.clone(),
    });
    if let Some(f) = config.fault {
        eprintln!(
            "agent-bridge: WARNING: interface fault `{}` is on: results are corrupted on purpose",
            f.name()
        );
    }
    let shutdown = shutdown_on_signals();
    let result = match args.http {
        Some(addr) => {
            let opts = HttpOptions {
                addr,
                limits: args.guard.connections.limits(),
                session_idle: args.guard.connections.session_idle(),
                token: args.guard.token,
                allowed_origins: args.guard.allow_origin,
                max_body,
            };
            server::serve_http(config, opts, shutdown).await
        }
        None => tokio::select! {
            r = server::serve_stdio(config, max_body) => r,
            () = shutdown.cancelled() => Ok(()),
        },
    };
    // an exit this process controls: what its sessions started goes now, not
    // when the reaper sees it gone
    agent_bridge::cgroup::remove_owned_by(std::process::id());
    let _ = std::fs::remove_dir(&run_dir);
    result
}
