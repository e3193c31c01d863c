//! `agent-bridge`: serve the sandbox over MCP (stdio or Streamable HTTP).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use agent_bridge::fault::InterfaceFault;
use agent_bridge::profile::{BUILT_IN, Profile};
use agent_bridge::server::{self, HttpOptions};
use agent_bridge::session::Config;
use anyhow::Context as _;
use clap::{Parser, Subcommand};

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
    Serve(ServeArgs),
    /// List the built-in sandbox profiles, or print one as TOML.
    Profiles {
        /// A built-in name or a TOML file to check and print.
        name: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Campaign test suites: generate the default one, validate files, print the schema.
    #[command(subcommand)]
    Campaign(CampaignCommand),
    /// (internal) file operations for the file tools, run under the profile.
    #[command(hide = true)]
    Worker {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

#[derive(Subcommand)]
enum CampaignCommand {
    /// Write a deterministic suite of tests across the ten domains, one JSON file each.
    Generate {
        /// How many tests (spread evenly over the domains).
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// The same seed gives the same files, byte for byte.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Directory to write `ID.json` files into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Check test files (e.g. ones a coding agent wrote): every problem with file, field and reason.
    Validate {
        dir: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of a test file.
    Schema,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Speak MCP on stdin/stdout (logs go to stderr).
    #[arg(long, conflicts_with = "http", required_unless_present = "http")]
    stdio: bool,
    /// Serve Streamable HTTP at http://ADDR/mcp (e.g. 127.0.0.1:8765; port 0 picks one).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Sandbox profile applied to every workload: a built-in name or a TOML file.
    #[arg(long, default_value = "clean", value_name = "NAME|FILE")]
    profile: String,
    /// Corrupt bytes in the encoding layer on purpose (testing harnesses only).
    #[arg(long, value_enum, value_name = "FAULT")]
    interface_fault: Option<InterfaceFault>,
    /// The probe daemon's control socket.
    #[arg(long, default_value = "/run/probe/probe.sock", value_name = "PATH")]
    probe_socket: PathBuf,
    /// Run without asking the probe (kernel: {available: false}).
    #[arg(long)]
    no_probe: bool,
    /// Working directory of workloads that name none.
    #[arg(long, default_value = "/tmp", value_name = "DIR")]
    workdir: PathBuf,
    /// SQLite file that `record_result` writes (created if missing).
    #[arg(long, value_name = "FILE")]
    results_db: Option<PathBuf>,
    /// Default timeout of a call, in milliseconds.
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    timeout_ms: u64,
    /// Bearer token required on every HTTP request (required off loopback).
    #[arg(long, env = "AGENT_BRIDGE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// An Origin allowed besides loopback ones (repeatable).
    #[arg(long, value_name = "ORIGIN")]
    allow_origin: Vec<String>,
    /// Largest request: HTTP body, or one stdio message (e.g. 96M).
    #[arg(long, default_value = "96M", value_name = "SIZE")]
    max_body: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Worker { args } => agent_bridge::worker::main(&args),
        Command::Profiles { name, json } => report(profiles(name, json)),
        Command::Campaign(c) => campaign(c),
        Command::Serve(args) => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "warn,rmcp=error".into()),
                )
                .init();
            let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
            let code = report(rt.block_on(serve(args)));
            // blocking waits of killed workloads must not hold the exit
            rt.shutdown_timeout(Duration::from_secs(1));
            code
        }
    }
}

fn report(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-bridge: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn campaign(cmd: CampaignCommand) -> ExitCode {
    use agent_bridge::campaign::{generate, spec, validate};
    match cmd {
        CampaignCommand::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&spec::schema()).expect("JSON")
            );
            ExitCode::SUCCESS
        }
        CampaignCommand::Generate { count, seed, out } => {
            let tests = generate::suite(count, seed);
            report(
                generate::write_suite(&out, &tests)
                    .with_context(|| format!("writing {}", out.display()))
                    .map(|()| eprintln!("wrote {count} tests (seed {seed}) to {}", out.display())),
            )
        }
        CampaignCommand::Validate { dir, json } => {
            let suite = match validate::load_dir(&dir) {
                Ok(s) => s,
                Err(e) => {
                    return report(Err(anyhow::anyhow!("cannot read {}: {e}", dir.display())));
                }
            };
            if json {
                let problems: Vec<_> = suite
                    .problems
                    .iter()
                    .map(|p| serde_json::json!({"file": p.file, "field": p.field, "reason": p.reason}))
                    .collect();
                let v = serde_json::json!({"files": suite.files, "valid": suite.tests.len(), "problems": problems});
                println!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
            } else {
                for p in &suite.problems {
                    println!("{p}");
                }
                println!(
                    "{} files: {} valid, {} with problems ({} problems)",
                    suite.files,
                    suite.tests.len(),
                    suite.files - suite.tests.len(),
                    suite.problems.len()
                );
            }
            if suite.problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn profiles(name: Option<String>, json: bool) -> anyhow::Result<()> {
    let Some(name) = name else {
        let all: Vec<Profile> = BUILT_IN
            .iter()
            .map(|(n, t)| Profile::parse(n, t).expect("built-in profiles parse"))
            .collect();
        if json {
            println!("{}", serde_json::to_string_pretty(&all)?);
        } else {
            println!("{:<14} {:<15} DESCRIPTION", "PROFILE", "REPRODUCES");
            for p in all {
                let r = p.reproduces.as_deref().unwrap_or("-");
                println!("{:<14} {:<15} {}", p.name, r, p.description);
            }
        }
        return Ok(());
    };
    let p = Profile::load(&name).map_err(anyhow::Error::msg)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else if let Some((_, text)) = BUILT_IN.iter().find(|(n, _)| *n == name) {
        print!("{text}");
    } else {
        print!("{}", toml::to_string_pretty(&p)?);
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let profile = Profile::load(&args.profile).map_err(anyhow::Error::msg)?;
    let max_body = agent_bridge::profile::parse_size(&args.max_body)
        .map_err(anyhow::Error::msg)
        .context("--max-body")? as usize;
    let swept = agent_bridge::cgroup::sweep_stale();
    if swept > 0 {
        tracing::info!("removed {swept} call cgroup(s) left by bridges that died");
    }
    std::fs::create_dir_all(&args.workdir)
        .with_context(|| format!("--workdir {}", args.workdir.display()))?;
    // session disks live where no profile mounts over them (not under /tmp)
    let run_base = if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run")
    } else {
        std::env::temp_dir()
    };
    let run_dir = run_base.join(format!("agent-bridge-{}", std::process::id()));
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
    let result = match args.http {
        Some(addr) => {
            let opts = HttpOptions {
                addr,
                token: args.token,
                allowed_origins: args.allow_origin,
                max_body,
            };
            server::serve_http(config, opts, shutdown).await
        }
        None => tokio::select! {
            r = server::serve_stdio(config, max_body) => r,
            () = shutdown.cancelled() => Ok(()),
        },
    };
    let _ = std::fs::remove_dir(&run_dir);
    result
}
