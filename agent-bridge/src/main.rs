//! `agent-bridge`: serve the sandbox over MCP (stdio or Streamable HTTP), put
//! another MCP server behind the bridge (`proxy`), and run campaigns. This
//! file only parses the command line and dispatches: the server side's
//! commands are in `cli/`, the campaign's in `campaign::cli`.

use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::Context as _;
use campaign::cli::CampaignCommand;
use clap::{Parser, Subcommand};

mod cli;

use cli::{proxy, report, run_server, serve};

#[global_allocator]
static ALLOCATOR: agent_bridge::big_alloc::BigReuse = agent_bridge::big_alloc::BigReuse;

#[derive(Parser)]
#[command(
    name = "agent-bridge",
    version,
    about = "The MCP server for an agent sandbox: exact bytes, kernel evidence on every call, fault profiles.",
    after_help = "Examples:\n  \
        agent-bridge serve --stdio                          # for an MCP client that spawns it\n  \
        agent-bridge serve --http 127.0.0.1:8765            # Streamable HTTP at /mcp\n  \
        agent-bridge serve --stdio --profile readonly       # preview a hardening change\n  \
        agent-bridge profiles                               # the built-in profiles\n  \
        agent-bridge profiles noexec                        # one profile's TOML\n\n\
        Kernel evidence needs the probe daemon (`probe run`); without it every result says\n\
        kernel: {available: false, reason} and the bridge works as usual."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve MCP on stdio or Streamable HTTP.
    Serve(serve::ServeArgs),
    /// Put any stdio MCP server behind the bridge: kernel evidence on its every tools/call.
    #[command(after_help = proxy::PROXY_HELP)]
    Proxy(proxy::ProxyArgs),
    /// List the built-in sandbox profiles, or print one as TOML.
    Profiles {
        /// A built-in name or a TOML file to check and print.
        name: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Campaigns: generate a suite, run it against a bridge into SQLite, report and compare runs.
    #[command(
        subcommand,
        after_help = "A typical campaign:\n  \
            agent-bridge campaign generate --count 1000 --out suite\n  \
            agent-bridge campaign run --suite suite --target http://127.0.0.1:8765/mcp --db results.db --run clean\n  \
            agent-bridge campaign report --db results.db --run clean --html clean.html\n  \
            agent-bridge campaign compare --db results.db clean hardened\n\n\
            See docs/CAMPAIGN.md for the test format, the triage rules and the tables."
    )]
    Campaign(CampaignCommand),
    /// (internal) waits for the end of stdin, then kills and removes the
    /// call cgroups of bridge PID (started by serve and proxy).
    #[command(hide = true)]
    Reap { pid: u32 },
    /// (internal) file operations for the file tools, run under the profile.
    #[command(hide = true)]
    Worker {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    // One malloc arena, not one per thread up to 8 a core: a server's
    // tokio workers and short-lived blocking threads each left freed
    // chunks in arenas of their own, and its RSS crept up (the proxy's
    // 20 KB per campaign run of 60 calls with a live heap of 1.6 MB;
    // about 7 KB with one arena, and slowing). Each thread's tcache still
    // serves small allocations without the arena's lock.
    // SAFETY: mallopt before any other thread exists.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1)
    };
    let cli = Cli::parse();
    match cli.command {
        Command::Worker { args } => agent_bridge::worker::main(&args),
        Command::Reap { pid } => agent_bridge::reaper::main(pid),
        Command::Profiles { name, json } => report(cli::profiles::run(name, json)),
        Command::Campaign(c) => {
            if matches!(c, CampaignCommand::Run(_)) {
                // the runner moves big payloads: give freed buffers back when idle
                let started = agent_bridge::big_alloc::spawn_release_thread();
                if let Err(e) = started.context("cannot start a thread") {
                    return report(Err(e));
                }
            }
            campaign::cli::main(c)
        }
        Command::Serve(args) => {
            let threads = usize::from(args.async_threads);
            run_server(threads, serve::run(args))
        }
        Command::Proxy(args) => run_server(2, proxy::run(args)),
    }
}
