//! `agent-bridge proxy`: any stdio MCP server behind the bridge, with kernel
//! evidence on its every tools/call.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_bridge::profile::Profile;
use agent_bridge::server;
use anyhow::Context as _;
use contract::units::{parse_seconds, parse_size};

use super::{GuardArgs, run_dir, shutdown_on_signals};

pub const PROXY_HELP: &str = "Examples:\n  \
    agent-bridge proxy --stdio -- npx -y @modelcontextprotocol/server-filesystem /srv\n  \
    agent-bridge proxy --http 127.0.0.1:8766 -- python3 my_server.py\n  \
    agent-bridge proxy --stdio --profile readonly -- node build/index.js   # preview a hardening change\n\n\
    Every message is relayed as it is (unknown fields, _meta, progress and cancellation too);\n\
    each tools/call result gains _meta[\"probe/kernel\"]: the probe's attribution over the server's\n\
    whole process tree for the call (every thread and descendant), with overlapping_calls (other\n\
    calls in flight meanwhile: a thread is traced by one call at a time). Without a probe daemon\n\
    the evidence is {available: false, reason}.\n\n\
    When the server crashes, hangs (--call-timeout, --init-timeout), prints a line that is not\n\
    JSON-RPC, or sends a message over --max-message, the requests in flight get a JSON-RPC error\n\
    (code -32000) saying what happened, with the exit status or signal and the tail of its\n\
    stderr; the server is killed if still running, and started again for the next request, with\n\
    the client's initialize and notifications/initialized replayed to it (that answer swallowed).\n\n\
    Over HTTP each MCP session gets its own server; a tools/call with a progressToken is\n\
    answered as SSE (progress first), other requests as JSON. Server requests (sampling, roots,\n\
    ping) reach the client on that stream or on its GET stream; with neither open the server gets\n\
    error -32601. See docs/PROXY.md.";

#[derive(clap::Args)]
pub struct ProxyArgs {
    /// Speak MCP on stdin/stdout (logs and the server's stderr go to stderr).
    #[arg(long, conflicts_with = "http", required_unless_present = "http")]
    pub stdio: bool,
    /// Serve Streamable HTTP at http://ADDR/mcp, one server per MCP session.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Sandbox profile the server (and all it starts) runs under: a built-in name or a TOML file.
    #[arg(long, default_value = "clean", value_name = "NAME|FILE")]
    pub profile: String,
    /// The probe daemon's control socket.
    #[arg(long, default_value = "/run/probe/probe.sock", value_name = "PATH")]
    pub probe_socket: PathBuf,
    #[command(flatten)]
    pub guard: GuardArgs,
    /// Largest message either way: a client's line or HTTP body, or a server's line (e.g. 96M).
    #[arg(long, default_value = "96M", value_name = "SIZE", value_parser = parse_size)]
    pub max_message: u64,
    /// Seconds the server may take to answer initialize.
    #[arg(long, default_value = "30", value_name = "S", value_parser = parse_seconds)]
    pub init_timeout: Duration,
    /// Seconds the server may take to answer any other request.
    #[arg(long, default_value = "600", value_name = "S", value_parser = parse_seconds)]
    pub call_timeout: Duration,
    /// The foreign server's command line.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

pub async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    use agent_bridge::proxy;
    let profile = Profile::load(&args.profile)?;
    let max_message = usize::try_from(args.max_message).context("--max-message")?;
    agent_bridge::cgroup::sweep_stale();
    // kept to the end: when this process goes, so does the server's tree
    let _reaper = agent_bridge::reaper::start()
        .map_err(|e| tracing::warn!("no reaper: the server may outlive this proxy: {e}"));
    let run_dir = run_dir();
    let opts = Arc::new(proxy::Options {
        argv: args.command,
        profile,
        probe_socket: Some(args.probe_socket),
        max_message,
        init_timeout: args.init_timeout,
        call_timeout: args.call_timeout,
        run_dir: run_dir.clone(),
    });
    let shutdown = shutdown_on_signals();
    let result = match args.http {
        Some(addr) => {
            let limits = args.guard.connections.limits();
            let session_idle = args.guard.connections.session_idle();
            let guard =
                server::Guard::for_addr(addr, args.guard.token, args.guard.allow_origin, true)?;
            proxy::http::serve_http(opts, addr, guard, limits, session_idle, shutdown).await
        }
        None => tokio::select! {
            r = proxy::serve_stdio(opts) => r,
            () = shutdown.cancelled() => Ok(()),
        },
    };
    // an exit this process controls: what its servers started goes now, not
    // when the reaper sees it gone
    agent_bridge::cgroup::remove_owned_by(std::process::id());
    let _ = std::fs::remove_dir(&run_dir);
    result
}
