//! `probe`: the command line. A thin layer over the `probe` library.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

use probe::attribution::{Attribution, ExitStatus, Words};
use probe::client::Client;
use probe::daemon::DaemonConfig;
use probe::loader::Probe;
use probe::primitive::reference_markdown;
use probe::protocol::{DEFAULT_DB, DEFAULT_SOCKET};
use probe::store::{SpanFilter, SpanRow, Store};
use probe::tee::{StderrTee, command_line};
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
One-off:   probe trace -- CMD            (no daemon)\n\
Daemon:    probe run                     (spans opened by agent-bridge or `probe span`)\n\
Inspect:   probe status | spans --failed | show SPAN | tail | export\n\
Compare:   probe env [--json] | probe env diff A B   (no root, no daemon)\n\n\
Loading programs needs root (or CAP_BPF+CAP_PERFMON+CAP_SYS_RESOURCE)."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command under the probe and say why it failed (no daemon).
    ///
    /// Exits with the command's status (128+N when killed by signal N; 125
    /// when the probe itself cannot run). The command's output passes
    /// through; with --json its stdout goes to stderr so stdout carries
    /// exactly one JSON object. Its stderr passes through a pipe whose
    /// tail the probe keeps: a failed lookup (ENOENT, ENOTDIR, EACCES on a
    /// read) is named as the cause only when the command line or that
    /// output names the path; the others are listed as `noticed`.
    ///
    /// Examples:
    ///   probe trace -- python3 train.py
    ///   probe trace --json -- sh -c 'echo hi > /readonly/out'
    ///   probe trace --events --timeout 30 -- make test
    ///   probe trace --gvisor -- runsc --network=none do python3 job.py
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
        /// Also follow a cgroup (v2 directory): its processes are the
        /// span's, even those CMD did not start (a Docker container's are
        /// containerd-shim's children). E.g. --cgroup
        /// /sys/fs/cgroup/system.slice/docker-ID.scope -- docker exec ID make
        #[arg(long, value_name = "PATH")]
        cgroup: Option<PathBuf>,
        /// CMD is a runsc (gVisor) command line: the probe is the
        /// sandbox's runtime monitor instead of loading eBPF (gVisor's
        /// kernel runs in user space, where eBPF cannot see). It adds its
        /// own --pod-init-config to runsc and attributes what the sandbox
        /// reports. Run it on the host, as root. E.g. --gvisor -- runsc
        /// --network=none do python3 job.py
        #[arg(long, conflicts_with = "cgroup")]
        gvisor: bool,
        /// With --gvisor: which read, write and close exits the session
        /// asks for. `writes` (the default): a full disk or quota on a
        /// write is seen; `all`: reads and closes too; `none`: neither.
        /// Each is a point per call, successes included: see
        /// docs/BENCHMARKS.md for the cost. (eBPF sees them always.)
        #[arg(
            long,
            value_enum,
            requires = "gvisor",
            default_value_t,
            value_name = "WHICH"
        )]
        io_points: probe::gvisor::session::IoPoints,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// Run the daemon: programs attached once, spans opened and closed by
    /// clients over the control socket, evidence kept in SQLite.
    ///
    /// Stops on SIGTERM/SIGINT: open spans are ended and stored, programs
    /// detached, the database checkpointed.
    ///
    /// Examples:
    ///   probe run
    ///   probe run --socket /tmp/p.sock --db /tmp/p.db
    ///   probe run --config /etc/probe/probe.toml --group probe
    #[command(verbatim_doc_comment)]
    Run {
        /// Control socket [default: /run/probe/probe.sock].
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Evidence database [default: /var/lib/probe/evidence.db].
        #[arg(long)]
        db: Option<PathBuf>,
        /// TOML config file (socket, db, group, events_per_span,
        /// max_open_spans, gvisor_socket, confine_clients, [retention]
        /// max_age_secs, max_db_bytes,
        /// max_disk_share, keep_events, [otlp]
        /// endpoint, headers, timeout_ms, service_name, queue_capacity).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Group allowed to use the socket besides root (mode becomes 0660).
        #[arg(long)]
        group: Option<String>,
        /// Events kept per span [default: 20000].
        #[arg(long)]
        event_cap: Option<usize>,
        /// Spans that may be open at once [default: 4096].
        #[arg(long)]
        max_open_spans: Option<usize>,
        /// Export every finished span as an OpenTelemetry span over
        /// OTLP/HTTP protobuf to this URL (e.g.
        /// http://127.0.0.1:4318/v1/traces). Else the config's [otlp]
        /// endpoint, else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT /
        /// OTEL_EXPORTER_OTLP_ENDPOINT; none: no export.
        #[arg(long, value_name = "URL")]
        otlp: Option<String>,
        /// Where gVisor sandboxes send their runtime-monitoring points
        /// (`probe gvisor-session` writes the runsc configuration that
        /// sends them here); `off`: do not listen [default: beside the
        /// control socket, probe.gvisor.sock].
        #[arg(long, value_name = "PATH")]
        gvisor_socket: Option<PathBuf>,
        /// Which clients may reach only their own sandbox's processes and
        /// spans: `sandboxed` (clients in another PID namespace or inside
        /// gVisor, whose pids are translated from their namespace) or
        /// `all` (also every client of this namespace but root: its own
        /// uid's processes in its own cgroup). Refusals are `forbidden`
        /// [default: sandboxed].
        #[arg(long, value_enum, value_name = "WHO")]
        confine_clients: Option<probe::peer::Confine>,
    },
    /// Print the runsc (gVisor) trace session that sends a sandbox's
    /// runtime-monitoring points to the daemon: the file for `runsc
    /// --pod-init-config=FILE`, or with --session-only the one for `runsc
    /// trace create --config FILE` on a running sandbox.
    ///
    /// Examples:
    ///   probe gvisor-session > /etc/probe/gvisor.json
    ///   runsc --pod-init-config=/etc/probe/gvisor.json --host-uds=open run …
    #[command(verbatim_doc_comment)]
    GvisorSession {
        /// The daemon's gVisor socket [default: /run/probe/probe.gvisor.sock].
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// The session object alone (for `runsc trace create`).
        #[arg(long)]
        session_only: bool,
        /// Which read, write and close exits the session asks for.
        /// `writes` (the default): a full disk or quota on a write is seen,
        /// with its file; `all`: reads and closes too; `none`: neither.
        /// Each is a point per call, successes included: see
        /// docs/BENCHMARKS.md for the cost.
        #[arg(long, value_enum, default_value_t, value_name = "WHICH")]
        io_points: probe::gvisor::session::IoPoints,
    },
    /// Run a command inside a span of the running daemon; print its attribution.
    ///
    /// Like `probe trace`, but the daemon does the watching, stores the
    /// evidence, and remembers the session's writes across spans.
    ///
    /// Example:
    ///   probe span --session t-42 -- sh -c 'echo x > /mnt/data/out'
    ///   probe span --session t-42 -- cat /mnt/data/out
    #[command(verbatim_doc_comment)]
    Span {
        /// The daemon's control socket.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Session the span belongs to (one MCP session / one test).
        #[arg(long)]
        session: Option<String>,
        /// Label [default: the command line].
        #[arg(long)]
        label: Option<String>,
        /// Print one JSON attribution object on stdout.
        #[arg(long)]
        json: bool,
        /// Kill the command after this many seconds (attributed `timeout`).
        #[arg(long, value_name = "SECS")]
        timeout: Option<f64>,
        /// Also follow a cgroup (v2 directory) for the span's life: its
        /// processes are the span's, even those CMD did not start.
        #[arg(long, value_name = "PATH")]
        cgroup: Option<PathBuf>,
        /// Store every event of this span even if it succeeds (by default
        /// a span that explains nothing keeps only its evidence: see
        /// `[retention] keep_events`).
        #[arg(long)]
        keep_all_events: bool,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// Daemon health: kernel, programs, events/s, drops, open spans, DB size.
    Status {
        /// The daemon's control socket.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// The status object as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stored spans, newest first.
    ///
    /// Examples:
    ///   probe spans --failed
    ///   probe spans --session t-0042 --since 2h --json
    #[command(verbatim_doc_comment)]
    Spans {
        /// The evidence database (read-only; the daemon may keep running).
        #[arg(long, default_value = DEFAULT_DB)]
        db: PathBuf,
        /// Only this session's spans.
        #[arg(long)]
        session: Option<String>,
        /// Only spans whose workload failed.
        #[arg(long)]
        failed: bool,
        /// Only spans started within this long (30s, 10m, 2h, 7d) or since this Unix time in ms.
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// At most this many spans.
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// Rows as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// One stored span: attribution and event timeline.
    #[command(after_help = "Examples:\n  \
        probe show 42\n  \
        probe show 42 --reattribute            # exit 0 same, 1 changed, 2 not replayable\n  \
        probe show --all --reattribute --json  # after an upgrade: exit 1 if any changed\n\n\
        A span can be attributed again when every event it saw was stored (keep_events = \"all\" in\n\
        [retention], or a span whose failures all explained it): from its events and the facts the\n\
        host gave when it closed, never from the host as it is now.")]
    Show {
        /// The span id (see `probe spans`).
        #[arg(required_unless_present = "all")]
        span: Option<u64>,
        /// The evidence database.
        #[arg(long, default_value = DEFAULT_DB)]
        db: PathBuf,
        /// The attribution object, with every stored event, as JSON.
        #[arg(long)]
        json: bool,
        /// Attribute the stored span again with this build and compare
        /// the verdict with the stored one.
        #[arg(long)]
        reattribute: bool,
        /// With --reattribute: every stored span.
        #[arg(long, requires = "reattribute", conflicts_with = "span")]
        all: bool,
    },
    /// Live decoded events from the daemon.
    Tail {
        /// The daemon's control socket.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Only this span.
        #[arg(long)]
        span: Option<u64>,
        /// Only this kind (syscall_failed, seccomp_denied, signal, oom_victim, fork, exec, exit, file_write, reclaim_stall, mount).
        #[arg(long)]
        kind: Option<String>,
        /// Raw JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Ship evidence home: spans with attributions and events.
    ///
    /// jsonl: one span per line. sqlite: a database with the same schema,
    /// to merge into a campaign's results DB with ATTACH.
    #[command(verbatim_doc_comment)]
    Export {
        /// The evidence database.
        #[arg(long, default_value = DEFAULT_DB)]
        db: PathBuf,
        /// jsonl (one span per line) or sqlite (same schema, for ATTACH).
        #[arg(long, value_parser = ["jsonl", "sqlite"], default_value = "jsonl")]
        format: String,
        /// Only this session's spans.
        #[arg(long)]
        session: Option<String>,
        /// Only spans started within this long (30s, 10m, 2h, 7d) or since this Unix time in ms.
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// The file to write (an existing sqlite file is not overwritten).
        #[arg(long)]
        out: PathBuf,
    },
    /// Import a jsonl or sqlite export into a database (created if missing).
    Import {
        /// The database to import into.
        #[arg(long)]
        db: PathBuf,
        /// A `probe export` file (jsonl or sqlite, detected by content).
        input: PathBuf,
    },
    /// Preflight: will the probe run on this kernel, and on which rung?
    ///
    /// One line per item — kernel and its config, user-space kernels
    /// (gVisor), bpf(2), BTF, tracefs and every tracepoint the probe uses
    /// with its format, JIT, PSI, cgroup v2, capabilities, io_uring — with
    /// what to do about a miss; then it loads and attaches the programs
    /// for real and detaches them.
    ///
    /// Exit status: 0 the probe runs on the BTF rung (everything seen);
    /// 2 it runs on the tracepoint rung (a kernel without BTF: seccomp
    /// denials without their arguments); 125 it cannot run here (the
    /// reason is one sentence). PROBE_BTF=none checks the tracepoint rung.
    ///
    /// Examples:
    ///   probe check
    ///   probe check --json | jq .rung
    #[command(verbatim_doc_comment)]
    Check {
        /// One JSON object: runs, rung, reason, items.
        #[arg(long)]
        json: bool,
    },
    /// Snapshot this environment from inside it, as the workload's user.
    ///
    /// Facets: runtime, identity, commands, browser, packages, writable
    /// places, resources, syscalls, network, variables.
    ///
    /// No root, no daemon; nothing is written (but --output) and no packet
    /// leaves but to the --reach addresses. Variables are recorded by name
    /// with a hash of their value, never the value; no file contents.
    /// What cannot be read is listed with why (`?` lines). Each command's
    /// `--version` runs under a 2 s timeout; browsers are never run.
    ///
    /// `probe env diff A B` compares two snapshots (exit status 0 when
    /// they agree, 1 when they differ).
    ///
    /// Examples:
    ///   probe env
    ///   probe env --json > sandbox.json
    ///   probe env --command terraform --reach 127.0.0.1:5432 --output env.json
    ///   probe env --sbom > sbom.cdx.json
    ///   probe env diff laptop.json sandbox.json
    #[command(verbatim_doc_comment, args_conflicts_with_subcommands = true)]
    Env {
        #[command(subcommand)]
        action: Option<EnvCmd>,
        /// Print the snapshot as JSON.
        #[arg(long, conflicts_with = "sbom")]
        json: bool,
        /// Print the packages as a CycloneDX 1.5 JSON SBOM.
        #[arg(long)]
        sbom: bool,
        /// Also look for this command (repeatable).
        #[arg(long = "command", value_name = "NAME")]
        commands: Vec<String>,
        /// Try a TCP connection to this address (repeatable; literal IPs
        /// and localhost only, 1 s timeout).
        #[arg(long, value_name = "HOST:PORT")]
        reach: Vec<String>,
        /// Also write the snapshot as JSON to FILE.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Print the primitives reference (the taxonomy and its rules) as Markdown.
    Primitives,
    /// Benchmark baseline: run CMD with only empty programs on the syscall
    /// tracepoints (the floor any tracer there pays).
    #[command(hide = true)]
    Floor {
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
}

/// `probe env`'s subcommands.
#[derive(Subcommand)]
enum EnvCmd {
    /// What differs between two snapshots (exit status 0: none, 1: some).
    ///
    /// Example:
    ///   probe env diff laptop.json sandbox.json
    #[command(verbatim_doc_comment)]
    Diff {
        /// The first snapshot (`probe env --json` output).
        a: PathBuf,
        /// The second snapshot.
        b: PathBuf,
        /// The differences as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // Allocations of 1 MiB and more (the kernel's BTF, read three times
    // while loading: twice by aya, once for the task offsets) come from
    // mmap and go back to the kernel when freed. glibc would otherwise
    // raise this threshold after the first such free and serve the next
    // ones from a heap it keeps: megabytes of peak RSS for nothing.
    // (glibc only: the static musl build's allocator has no such knob.)
    // One malloc arena, as in the bridge: the daemon's tokio workers and
    // blocking threads each grew an arena of their own, and its RSS crept
    // for 20 minutes after a start (the largest arena to 9.5 MB) before it
    // levelled. Small allocations still come from each thread's tcache.
    // SAFETY: mallopt before any other thread exists.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    };
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

fn seconds(t: Option<f64>) -> anyhow::Result<Option<Duration>> {
    match t {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            bail!("--timeout must be a positive number of seconds")
        }
        t => Ok(t.map(Duration::from_secs_f64)),
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Cmd::Check { json } => check(json),
        Cmd::Env {
            action: Some(EnvCmd::Diff { a, b, json }),
            ..
        } => env_diff(&a, &b, json),
        Cmd::Env {
            action: None,
            json,
            sbom,
            commands,
            reach,
            output,
        } => env_snapshot(json, sbom, commands, reach, output.as_deref()),
        Cmd::Primitives => {
            print!("{}", reference_markdown());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Floor { command } => {
            let _programs = probe::loader::attach_floor()?;
            let status = std::process::Command::new(&command[0])
                .args(&command[1..])
                .status()
                .with_context(|| format!("cannot start {}", command[0].to_string_lossy()))?;
            Ok(ExitCode::from(status.code().unwrap_or(128) as u8))
        }
        Cmd::Trace {
            json,
            events,
            timeout,
            event_cap,
            cgroup,
            gvisor,
            io_points,
            command,
        } => {
            // before loading: a wrong path is a usage error
            let cgroup = cgroup
                .map(|p| probe::cgroup::Cgroup::open(&p))
                .transpose()?;
            let opts = TraceOptions {
                command,
                timeout: seconds(timeout)?,
                all_events: events,
                stdout_to_stderr: json,
                event_cap: Some(event_cap.max(1)),
                cgroup,
            };
            let traced = if gvisor {
                // no eBPF: gVisor's own monitoring is the source
                let mut source = probe::gvisor::source::GvisorSource::for_trace(io_points)?;
                trace(&mut source, &opts)?
            } else {
                let probe = Probe::load()?;
                probe.warn_if_lower_rung();
                let mut source = probe::source::ebpf::EbpfSource::sole(probe)?;
                let traced = trace(&mut source, &opts)?;
                // the report first: detaching takes grace periods
                print_attribution(&traced.attribution, json)?;
                source.into_probe().detach_after_exit();
                if traced.interrupted {
                    eprintln!("probe: interrupted; the workload was stopped");
                }
                return Ok(exit_code(&traced.attribution.exit));
            };
            print_attribution(&traced.attribution, json)?;
            if traced.interrupted {
                eprintln!("probe: interrupted; the sandbox was stopped");
            }
            Ok(exit_code(&traced.attribution.exit))
        }
        Cmd::Run {
            socket,
            db,
            config,
            group,
            event_cap,
            max_open_spans,
            otlp,
            gvisor_socket,
            confine_clients,
        } => {
            let file = match &config {
                Some(path) => probe::config::load(path)?,
                None => Default::default(),
            };
            let group = match group.or(file.group) {
                Some(name) => Some(
                    nix::unistd::Group::from_name(&name)?
                        .with_context(|| format!("no group named {name}"))?
                        .gid,
                ),
                None => None,
            };
            let socket = socket
                .or(file.socket)
                .unwrap_or_else(|| DEFAULT_SOCKET.into());
            let gvisor_socket = gvisor_socket.or(file.gvisor_socket);
            probe::daemon::run(DaemonConfig {
                gvisor_socket_chosen: gvisor_socket.is_some(),
                gvisor_socket: match gvisor_socket {
                    Some(p) if p.as_os_str() == "off" => None,
                    Some(p) => Some(p),
                    None => Some(DaemonConfig::gvisor_socket_beside(&socket)),
                },
                confine: confine_clients.or(file.confine_clients).unwrap_or_default(),
                socket,
                db: db.or(file.db).unwrap_or_else(|| DEFAULT_DB.into()),
                group,
                event_cap: event_cap
                    .or(file.events_per_span)
                    .unwrap_or(probe::spans::DEFAULT_EVENT_CAP)
                    .max(1),
                max_open_spans: max_open_spans
                    .or(file.max_open_spans)
                    .unwrap_or(4096)
                    .max(1),
                retention: {
                    file.retention.check().map_err(anyhow::Error::msg)?;
                    file.retention
                },
                otlp: probe::otlp::OtlpConfig::resolve(
                    otlp.as_deref(),
                    file.otlp.as_ref(),
                    "probe",
                    |k| std::env::var(k).ok(),
                )
                .map_err(anyhow::Error::msg)?,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Span {
            socket,
            session,
            label,
            json,
            timeout,
            cgroup,
            keep_all_events,
            command,
        } => span(
            &socket,
            SpanArgs {
                session,
                label,
                json,
                timeout: seconds(timeout)?,
                cgroup,
                keep_all_events,
            },
            command,
        ),
        Cmd::GvisorSession {
            socket,
            session_only,
            io_points,
        } => {
            let socket = socket.unwrap_or_else(|| {
                DaemonConfig::gvisor_socket_beside(std::path::Path::new(DEFAULT_SOCKET))
            });
            // a sandbox starts while the daemon is down (its points lost)
            let start = probe::gvisor::session::IfNoMonitor::Start;
            let value = if session_only {
                probe::gvisor::session::session(&socket, start, io_points)
            } else {
                probe::gvisor::session::pod_init_config(&socket, start, io_points)
            };
            println!("{}", serde_json::to_string_pretty(&value)?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status { socket, json } => {
            let status = Client::connect(&socket)?.daemon_status()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", status.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Spans {
            db,
            session,
            failed,
            since,
            limit,
            json,
        } => {
            let store = Store::open_readonly(&db)?;
            let since_ms = since.as_deref().map(parse_since).transpose()?;
            let rows = store.spans(&SpanFilter {
                session,
                failed_only: failed,
                since_ms,
                limit: Some(limit),
                sandbox: None,
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", render_spans(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Show {
            span,
            db,
            json,
            reattribute,
            all,
        } if reattribute => {
            let store = Store::open_readonly(&db)?;
            let ids = match span {
                Some(s) => vec![s],
                None => store.span_ids()?,
            };
            let mut results = Vec::new();
            for id in ids {
                match probe::replay::span(&store, id)? {
                    Some(r) => results.push(r),
                    None => bail!(
                        "span {id} is not in {} (still open, removed by retention, or never existed)",
                        db.display()
                    ),
                }
            }
            let count =
                |f: fn(&probe::replay::Replayed) -> bool| results.iter().filter(|r| f(r)).count();
            let same = count(|r| matches!(r, probe::replay::Replayed::Same { .. }));
            let changed = count(|r| matches!(r, probe::replay::Replayed::Changed { .. }));
            let not_replayable = results.len() - same - changed;
            if json {
                let out = if all {
                    serde_json::json!({"spans": results, "same": same, "changed": changed, "not_replayable": not_replayable})
                } else {
                    serde_json::to_value(&results[0])?
                };
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                for r in &results {
                    println!("{}", probe::replay::line(r));
                }
                if all {
                    println!(
                        "{} span(s): {same} same, {changed} changed, {not_replayable} not replayable",
                        results.len()
                    );
                }
            }
            Ok(ExitCode::from(if changed > 0 {
                1
            } else if not_replayable > 0 && !all {
                2
            } else {
                0
            }))
        }
        Cmd::Show { span, db, json, .. } => {
            let span = span.expect("clap requires a span without --all");
            let store = Store::open_readonly(&db)?;
            let Some(a) = store.show(span)? else {
                bail!(
                    "span {span} is not in {} (still open, removed by retention, or never existed)",
                    db.display()
                );
            };
            print_attribution(&a, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Tail {
            socket,
            span,
            kind,
            json,
        } => {
            let mut client = Client::connect(&socket)?;
            client.subscribe(span, kind.as_deref())?;
            loop {
                let line = client.read_line()?;
                if json {
                    println!("{line}");
                } else if let Some(n) = line.get("lagged") {
                    println!("… {n} events not shown (tail could not keep up)");
                } else if let Ok(ev) =
                    serde_json::from_value::<probe::event::KernelEvent>(line["event"].clone())
                {
                    println!(
                        "span {:<6} {}",
                        line["span"],
                        probe::report::event_line(&ev)
                    );
                }
            }
        }
        Cmd::Export {
            db,
            format,
            session,
            since,
            out,
        } => {
            let store = Store::open_readonly(&db)?;
            let filter = SpanFilter {
                session,
                failed_only: false,
                since_ms: since.as_deref().map(parse_since).transpose()?,
                limit: None,
                sandbox: None,
            };
            let n = match format.as_str() {
                "sqlite" => store.export_sqlite(&filter, &out)?,
                _ => store.export_jsonl(&filter, &out)?,
            };
            eprintln!("probe: exported {n} span(s) to {}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Import { db, input } => {
            let mut store = Store::open(&db)?;
            let n = store.import(&input)?;
            eprintln!("probe: imported {n} span(s) into {}", db.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn exit_code(exit: &ExitStatus) -> ExitCode {
    ExitCode::from(exit.shell_code().clamp(0, 255) as u8)
}

fn print_attribution(a: &Attribution, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(a)?);
    } else {
        print!("{}", probe::report::render(a));
    }
    Ok(())
}

/// `probe span`: begin, run attached, end, print.
/// `probe span`'s options.
struct SpanArgs {
    session: Option<String>,
    label: Option<String>,
    json: bool,
    timeout: Option<Duration>,
    cgroup: Option<PathBuf>,
    keep_all_events: bool,
}

fn span(socket: &Path, args: SpanArgs, command: Vec<OsString>) -> anyhow::Result<ExitCode> {
    let SpanArgs {
        session,
        label,
        json,
        timeout,
        cgroup,
        keep_all_events,
    } = args;
    let mut client = Client::connect(socket)?;
    let line = command_line(&command);
    let label = label.as_deref().unwrap_or(&line);
    let begin = probe::protocol::BeginSpan {
        session,
        label: label.to_owned(),
        cgroup,
        keep_events: keep_all_events.then_some(probe::store::KeepEvents::All),
        // killed (or its sandbox gone) before it ends the span: the daemon
        // ends it when this connection closes, rather than keep it open
        ends_with_connection: true,
        ..Default::default()
    };
    let span = client.begin_span_with(begin)?;
    let (program, args) = command.split_first().context("no command")?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    if json {
        cmd.stdout(std::process::Stdio::from(std::io::stderr().as_fd_owned()?));
    }
    StderrTee::pipe(&mut cmd);
    let mut stderr = None;
    let spawned = probe::spawn::spawn_attached(&mut cmd, |pid| client.attach(span, pid));
    let (exit, timed_out) = match spawned {
        Ok((Ok(mut child), _)) => {
            stderr = child.stderr.take().map(StderrTee::start);
            wait_forwarding(child, timeout)?
        }
        Ok((Err(e), _)) => {
            eprintln!("probe: {}: {e}", program.to_string_lossy());
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            (
                ExitStatus {
                    code: Some(code),
                    signal: None,
                },
                None,
            )
        }
        Err(e) => {
            let _ = client.end_span(span, Some(&ExitStatus::default()), None);
            return Err(e.into());
        }
    };
    let words = Words::new(
        Some(line.clone()),
        stderr.as_ref().map(|t| t.said()).as_deref(),
    );
    let timed_out_ms = timed_out.map(|t| t.as_millis() as u64);
    let a = client.end_span_with(span, Some(&exit), timed_out_ms, &words)?;
    print_attribution(&a, json)?;
    Ok(exit_code(&a.exit))
}

trait AsFdOwned {
    fn as_fd_owned(&self) -> std::io::Result<std::os::fd::OwnedFd>;
}

impl AsFdOwned for std::io::Stderr {
    fn as_fd_owned(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd as _;
        self.as_fd().try_clone_to_owned()
    }
}

/// Waits for `child`, forwarding SIGINT/SIGTERM/SIGHUP and killing it at
/// the deadline. Returns its exit and whether the deadline killed it.
fn wait_forwarding(
    mut child: std::process::Child,
    timeout: Option<Duration>,
) -> anyhow::Result<(ExitStatus, Option<Duration>)> {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])?;
    let handle = signals.handle();
    let forwarder = std::thread::spawn(move || {
        for sig in signals.forever() {
            if let Ok(s) = nix::sys::signal::Signal::try_from(sig) {
                let _ = nix::sys::signal::kill(pid, s);
            }
        }
    });
    let started = Instant::now();
    let mut timed_out = None;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let Some(t) = timeout.filter(|t| timed_out.is_none() && started.elapsed() >= *t) {
            timed_out = Some(t);
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    handle.close();
    let _ = forwarder.join();
    Ok((status.into(), timed_out))
}

/// `30s`, `10m`, `2h`, `7d` ago, or Unix ms.
fn parse_since(t: &str) -> anyhow::Result<i64> {
    let now = probe::clock::now_ms();
    if let Ok(ms) = t.parse::<i64>() {
        // a bare number is Unix ms; a small one is surely a forgotten unit
        if ms < 1_000_000_000_000 {
            bail!("--since {t}: a bare number is Unix time in ms; did you mean {t}m or {t}h?");
        }
        return Ok(ms);
    }
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: i64 = num
        .parse()
        .with_context(|| format!("--since {t}: expected e.g. 30s, 10m, 2h, 7d, or Unix ms"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => bail!("--since {t}: unit must be s, m, h or d"),
    };
    Ok(now - secs * 1000)
}

/// `2026-11-29 17:55:01` (UTC) for Unix ms.
fn utc(ms: i64) -> String {
    probe::clock::utc(ms, ' ')
}

fn render_spans(rows: &[SpanRow]) -> String {
    use std::fmt::Write as _;
    if rows.is_empty() {
        return "no spans\n".into();
    }
    let mut out = format!(
        "{:<7} {:<19} {:>9} {:<8} {:<14} {:>4}  {:<12} {}\n",
        "SPAN", "STARTED (UTC)", "DURATION", "EXIT", "PRIMITIVE", "CONF", "SESSION", "LABEL"
    );
    for r in rows {
        let exit = match (&r.exit_code, &r.exit_signal) {
            (Some(c), _) => c.to_string(),
            (None, Some(s)) => s.clone(),
            _ => "-".into(),
        };
        let mut label = r.label.clone();
        if label.chars().count() > 48 {
            label = label.chars().take(47).collect::<String>() + "…";
        }
        let _ = writeln!(
            out,
            "{:<7} {:<19} {:>7.1}ms {:<8} {:<14} {:>4.2}  {:<12} {}",
            r.span,
            utc(r.started_ms),
            r.duration_ms,
            exit,
            r.primitive,
            r.confidence,
            r.session.as_deref().unwrap_or("-"),
            label
        );
    }
    out
}

/// `probe env`: one snapshot, shown as text, JSON or an SBOM.
fn env_snapshot(
    json: bool,
    sbom: bool,
    commands: Vec<String>,
    reach: Vec<String>,
    output: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    use probe::env::collect;
    let opts = collect::Options {
        extra_commands: commands,
        reach,
        ..collect::Options::default()
    };
    let s = collect::snapshot(&opts, "probe env");
    if let Some(path) = output {
        let text = serde_json::to_string_pretty(&s)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if sbom {
        println!("{}", serde_json::to_string_pretty(&collect::cyclonedx(&s))?);
    } else if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", collect::render_text(&s));
    }
    Ok(ExitCode::SUCCESS)
}

/// `probe env diff A B`: 0 when they agree, 1 when they differ.
fn env_diff(a: &Path, b: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let read = |path: &Path| -> anyhow::Result<probe::env::Snapshot> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        probe::env::Snapshot::parse(&bytes).with_context(|| format!("{}", path.display()))
    };
    let (a, b) = (read(a)?, read(b)?);
    let d = probe::env::diff::diff(&a, &b);
    if json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print!("{}", d.render_text());
    }
    Ok(ExitCode::from(u8::from(!d.is_empty())))
}

/// `probe check`: the preflight items, then a real load and detach.
fn check(json: bool) -> anyhow::Result<ExitCode> {
    use probe::loader::{PROGRAMS, Probe};
    use probe::preflight::{self, Item};
    let tracepoints: Vec<(&str, &str, bool)> = PROGRAMS
        .iter()
        .map(|&(_, cat, name, req)| (cat, name, req))
        .collect();
    let mut items = preflight::items(&tracepoints);
    let started = std::time::Instant::now();
    let (rung, reason, note) = match Probe::load() {
        Ok(probe) => {
            let loaded = format!(
                "{} programs attached on the {} rung in {} ms",
                probe.attached.len(),
                probe.rung.name(),
                started.elapsed().as_millis()
            );
            items.push(Item {
                item: "load".into(),
                ok: true,
                found: loaded,
                fix: String::new(),
                required: true,
            });
            let note = [
                probe.fell_back.clone(),
                probe.rung.cannot_see().map(String::from),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("; ");
            (Some(probe.rung), None, note)
        }
        Err(e) => {
            let reason = e.to_string();
            items.push(Item {
                item: "load".into(),
                ok: false,
                found: reason.clone(),
                fix: "see the items above and docs/KERNELS.md".into(),
                required: true,
            });
            (None, Some(reason), String::new())
        }
    };
    let code = match rung {
        Some(probe::loader::Rung::Btf) => 0,
        Some(probe::loader::Rung::Tracepoint) => 2,
        None => PROBE_FAILED,
    };
    if json {
        let out = serde_json::json!({
            "runs": rung.is_some(),
            "rung": rung.map(|r| r.name()),
            "reason": reason,
            "cannot_see": (!note.is_empty()).then_some(&note),
            "kernel": probe::preflight::release(),
            "items": items,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for i in &items {
            let mark = if i.ok {
                "ok  "
            } else if i.required {
                "FAIL"
            } else {
                "miss"
            };
            println!("{mark} {:<48} {}", i.item, i.found);
            if !i.ok && !i.fix.is_empty() {
                println!("     {:<48} -> {}", "", i.fix);
            }
        }
        match (rung, &reason) {
            (Some(r), _) => {
                println!("\nthe probe runs here, on the {} rung", r.name());
                if !note.is_empty() {
                    println!("  {note}");
                }
            }
            (None, Some(reason)) => println!("\nthe probe cannot run here: {reason}"),
            (None, None) => {}
        }
    }
    Ok(ExitCode::from(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_795_974_901_000), "2026-11-29 17:55:01");
    }

    #[test]
    fn since_parses_units_and_ms() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let two_h = parse_since("2h").unwrap();
        assert!((now - two_h - 7_200_000).abs() < 5_000);
        assert_eq!(parse_since("1700000000000").unwrap(), 1_700_000_000_000);
        assert!(parse_since("2w").is_err());
    }
}
