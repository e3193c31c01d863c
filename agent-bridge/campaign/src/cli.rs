//! `agent-bridge campaign …`: the campaign's command line. The binary only
//! dispatches here; every subcommand's flags, help and output live in this
//! module, on top of the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Subcommand;

use crate::db::{Location, Needs};
use crate::{compare, db as rdb, export, generate, html, report, spec, validate};

#[derive(Subcommand)]
pub enum CampaignCommand {
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
        /// Where the tests work, in the sandbox: each test empties and uses BASE/ID.
        /// Campaigns that run at the same time on one machine need different bases.
        #[arg(long, default_value = crate::generate::DEFAULT_BASE, value_name = "DIR")]
        base: String,
        /// Only this domain's tests (ids numbered as in the whole suite).
        #[arg(long, value_name = "DOMAIN", value_parser = clap::builder::PossibleValuesParser::new(crate::spec::DOMAINS))]
        domain: Option<String>,
        /// Browser tests in the browser vocabulary (browser_open, browser_eval,
        /// browser_screenshot, …) instead of the suite: for browser MCP servers
        /// (@playwright/mcp, chrome-devtools-mcp) through their adapters.
        #[arg(long, conflicts_with = "domain")]
        browser_tools: bool,
        /// With --browser-tools: MiB each of the 8 frames of a tab-heavy page holds.
        #[arg(
            long,
            default_value_t = 16,
            value_name = "MIB",
            requires = "browser_tools"
        )]
        heavy_mib: u64,
    },
    /// Check test files (e.g. ones a coding agent wrote): every problem with file, field and reason.
    ///
    /// Also reports every step that names a host or address outside this
    /// machine (IPv4/IPv6 literals, URL hosts, public domain names): a
    /// campaign sends no packet off the machine unless --allow-egress says so.
    Validate {
        dir: PathBuf,
        /// Machine-readable output on stdout.
        #[arg(long)]
        json: bool,
        /// Hosts the tests may name although they are off this machine.
        #[arg(long, value_name = "HOST[,HOST…]", value_delimiter = ',')]
        allow_egress: Vec<String>,
    },
    /// Print the JSON Schema of a test file.
    Schema,
    /// Serve the campaign's local upstream (the pages, bytes, login and
    /// tab-heavy pages tests open) on its own, until Ctrl-C: for sessions
    /// driven by hand, e.g. a browser MCP server pointed at /page/3.
    #[command(
        after_help = "Example:\n  agent-bridge campaign upstream --host 127.66.0.1\n  \
        # then open http://127.66.0.1:PORT/page/3, /form/3, /tabs/8?mib=16, /canvas/7?w=640&h=360"
    )]
    Upstream {
        /// The address to listen on (an address of this machine).
        #[arg(long, default_value_t = crate::upstream::UPSTREAM_HOST, value_name = "IPV4")]
        host: std::net::Ipv4Addr,
    },
    /// Run a suite against a bridge; every step's outcome goes into a SQLite DB.
    #[command(after_help = "Examples:\n  \
        agent-bridge campaign run --suite suite --target stdio:'agent-bridge serve --stdio' --db results.db\n  \
        agent-bridge campaign run --suite suite --target http://127.0.0.1:8765/mcp --workers 8 --db results.db --label clean\n  \
        agent-bridge campaign run ... --run nightly --shard 2/4      # one of four processes sharing a run\n  \
        agent-bridge campaign run ... --resume nightly              # continue a run that was killed\n\n\
        Each test gets its own MCP session (and so its own probe session). A stdio target is started\n\
        once per test with `sh -c`. Tests run to their first failing step; failures are triaged into\n\
        interface / sandbox / test with a primitive. Exit status: 0 when this process ran its tests\n\
        (failing tests are findings, not errors); 2 when the run stopped early or on bad usage.")]
    Run(RunArgs),
    /// The runs in a results DB.
    Runs {
        /// The results: a SQLite file, or postgres://USER:PASSWORD@HOST:PORT/DB.
        #[arg(long, value_name = "FILE|URL")]
        db: Location,
        /// Machine-readable output on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Report one run: domain × outcome, layer × primitive, top explanations; --html for a file.
    Report {
        /// The results: a SQLite file, or postgres://USER:PASSWORD@HOST:PORT/DB.
        #[arg(long, value_name = "FILE|URL")]
        db: Location,
        /// The run (default: the newest).
        #[arg(long)]
        run: Option<String>,
        /// Also write one self-contained HTML report here.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// The whole report as JSON on stdout.
        /// Machine-readable output on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Two runs side by side: tests that flipped, primitives that appeared or vanished.
    Compare {
        /// The results: a SQLite file, or postgres://USER:PASSWORD@HOST:PORT/DB.
        #[arg(long, value_name = "FILE|URL")]
        db: Location,
        /// The run to compare from (e.g. the current sandbox); RUN@TARGET
        /// takes only the tests that one target of a run over several ran.
        run_a: String,
        /// The run to compare to (e.g. the hardened one), or RUN@TARGET.
        run_b: String,
        /// Machine-readable output on stdout.
        #[arg(long)]
        json: bool,
        /// Also write the comparison, its environment section included, as
        /// one self-contained HTML page.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Confusion matrix: for every run with an injected fault, where its newly failing tests were attributed.
    Matrix {
        /// The results: a SQLite file, or postgres://USER:PASSWORD@HOST:PORT/DB.
        #[arg(long, value_name = "FILE|URL")]
        db: Location,
        /// The run without injected faults that the others are compared to.
        #[arg(long)]
        baseline: String,
        /// A Markdown table (for docs/) instead of the text table.
        #[arg(long, conflicts_with = "json")]
        markdown: bool,
        /// Machine-readable output on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Before a run: which tests of a suite the environment will likely fail, and why.
    ///
    /// Reads what each test needs (the programs its steps run, the paths it
    /// writes, a browser, files that must survive from one call to the next,
    /// the local upstream) against a snapshot: a file from `probe env
    /// --output FILE`, or the one a target takes of itself. With --db and
    /// --run, also how the prediction held against that run.
    #[command(after_help = "Examples:\n  \
        agent-bridge campaign preflight --suite suite --env remote.json\n  \
        agent-bridge campaign preflight --suite suite --target http://127.0.0.1:8765/mcp --json\n  \
        agent-bridge campaign preflight --suite suite --env remote.json --db results.db --run remote")]
    Preflight {
        /// The suite directory (from `campaign generate`).
        #[arg(long, value_name = "DIR")]
        suite: PathBuf,
        /// The environment: a snapshot file.
        #[arg(
            long,
            value_name = "FILE",
            required_unless_present = "target",
            conflicts_with = "target"
        )]
        env: Option<PathBuf>,
        /// Or the target to ask for its snapshot (stdio:'COMMAND' or http(s)://HOST:PORT/mcp).
        #[arg(long, value_name = "TARGET", value_parser = clap::value_parser!(crate::target::Target))]
        target: Option<crate::target::Target>,
        /// With --run: the results to check the prediction against.
        #[arg(long, value_name = "FILE|URL", requires = "run")]
        db: Option<Location>,
        /// The run of the same suite to check the prediction against.
        #[arg(long, requires = "db")]
        run: Option<String>,
        /// Machine-readable output on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Export a run's tests for other tools: CSV (one row per test) or JSON lines (with steps).
    Export {
        /// The results: a SQLite file, or postgres://USER:PASSWORD@HOST:PORT/DB.
        #[arg(long, value_name = "FILE|URL")]
        db: Location,
        /// The run (default: the newest).
        #[arg(long)]
        run: Option<String>,
        #[arg(long, value_enum, default_value = "csv")]
        format: ExportFormat,
        /// Write here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Find the smallest input that still fails the same way, for a step whose bytes did not survive.
    #[command(after_help = "Examples:\n  \
        agent-bridge campaign shrink --db results.db lossy encoding-0007\n  \
        agent-bridge campaign shrink --db results.db dc-clean files-0042 --step 2 \\\n      \
            --adapter agent-bridge/adapters/desktop-commander.toml --json\n\n\
        Re-runs the step through the run's target (or --target) with smaller and simpler payloads:\n\
        the length is bisected, then every byte value is tried alone, keeping the way the bytes came\n\
        back mangled (lossy UTF-8, cut at NUL, CRLF, truncated…) the same. Two channels carry bytes:\n\
        a command's stdout (printed with printf) and a file written and read back. The finding is\n\
        stored with the run; `campaign report` shows it beside the failure.")]
    Shrink {
        /// The results: a SQLite file, or postgres://USER:PASSWORD@HOST:PORT/DB.
        #[arg(long, value_name = "FILE|URL")]
        db: Location,
        /// The run the failure is in.
        run: String,
        /// The failed test.
        test: String,
        /// The step (default: the test's failed step).
        #[arg(long)]
        step: Option<usize>,
        /// Where to re-run it (default: the run's own target).
        #[arg(long, value_name = "TARGET", value_parser = clap::value_parser!(crate::target::Target))]
        target: Option<crate::target::Target>,
        /// The adapter the run used (required when it used one).
        #[arg(long, value_name = "FILE")]
        adapter: Option<PathBuf>,
        /// Give up after this many calls to the target.
        #[arg(long, default_value_t = 600)]
        max_calls: usize,
        /// Machine-readable output on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Target adapters: run the campaign against MCP servers that are not agent-bridge.
    #[command(subcommand)]
    Adapter(AdapterCommand),
    /// Merge `probe export` files (SQLite or JSONL) into a results DB, so the
    /// kernel evidence travels with the results (join: spans.session = campaign_tests.mcp_session).
    Import {
        /// The results: a SQLite file, or postgres://USER:PASSWORD@HOST:PORT/DB.
        #[arg(long, value_name = "FILE|URL")]
        db: Location,
        /// Files written by `probe export` (--format sqlite or jsonl).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ExportFormat {
    Csv,
    Jsonl,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// Directory of test files (`campaign generate` writes one).
    #[arg(long, value_name = "DIR")]
    pub suite: PathBuf,
    /// stdio:'COMMAND' (a bridge started per test) or http(s)://HOST:PORT/mcp.
    /// Give it more than once to spread the tests over several sandboxes.
    #[arg(long, value_name = "TARGET", value_parser = clap::value_parser!(crate::target::Target), required_unless_present = "targets")]
    pub target: Vec<crate::target::Target>,
    /// A file of targets, one per line (# comments), added to --target.
    #[arg(long, value_name = "FILE")]
    pub targets: Option<PathBuf>,
    /// Seconds a step may run past its own timeout before its target
    /// counts as not answering (the test is recorded as
    /// interface.transport and the target is checked; a dead one is marked
    /// down and its share of the tests goes to the others).
    #[arg(long, default_value = "30", value_name = "SECONDS", value_parser = contract::units::parse_seconds)]
    pub target_timeout: Duration,
    /// Concurrent workers in all, shared out over the targets; each has its own MCP sessions.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Results: a SQLite file (created if missing), or
    /// postgres://USER:PASSWORD@HOST:PORT/DB, shared by runners on several
    /// machines (each claims tests as it goes; start them with one --run NAME).
    #[arg(long, value_name = "FILE|URL")]
    pub db: Location,
    /// Name of the run (default: LABEL-TIMESTAMP). Shards of one run pass the same name.
    #[arg(long, value_name = "NAME", conflicts_with = "resume")]
    pub run: Option<String>,
    /// A label for reports, e.g. the profile or sandbox under test.
    #[arg(long)]
    pub label: Option<String>,
    /// Run only shard I of N (1-based), e.g. 2/4.
    #[arg(long, value_name = "I/N", value_parser = crate::run::parse_shard)]
    pub shard: Option<crate::run::Shard>,
    /// Continue RUN: run only the tests it has not recorded.
    #[arg(long, value_name = "RUN")]
    pub resume: Option<String>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Plain progress lines even on a terminal.
    #[arg(long)]
    pub no_bar: bool,
    /// Hosts off this machine the tests may name (refused otherwise: a
    /// campaign sends no packet off the machine unless told to).
    #[arg(long, value_name = "HOST[,HOST…]", value_delimiter = ',')]
    pub allow_egress: Vec<String>,
    /// Where the run's local upstream (HTTP, TCP echo, DNS stub) listens;
    /// tests reach it through {{upstream.http}}, {{upstream.host}}… It must
    /// be an address of this machine that the sandbox's workloads reach.
    #[arg(long, default_value_t = crate::upstream::UPSTREAM_HOST, value_name = "IPV4")]
    pub upstream_host: std::net::Ipv4Addr,
    /// The target is not an agent-bridge: map the campaign's steps onto its
    /// tools with this adapter (docs/ADAPTERS.md). Checked against the
    /// target's tools/list before anything runs.
    #[arg(long, value_name = "FILE")]
    pub adapter: Option<PathBuf>,
    /// One MCP session per worker instead of one per test, for servers
    /// that start slowly (a Node server takes 1–2 s). Tests then share the
    /// server's state; each still works in its own directory, and a
    /// session whose connection broke is replaced.
    #[arg(long)]
    pub reuse_sessions: bool,
    /// The environment to store with the run, from a snapshot file
    /// (`probe env --output FILE`), instead of asking each target for its
    /// own (`sandbox_environment`, which `agent-bridge serve` and
    /// `agent-bridge proxy` answer): for a target that cannot take one.
    #[arg(long, value_name = "FILE")]
    pub env: Option<PathBuf>,
    /// Export the run as OpenTelemetry spans (run → test → step) over
    /// OTLP/HTTP protobuf to this URL (e.g. http://127.0.0.1:4318/v1/traces);
    /// each step's context goes to the bridge in `params._meta.traceparent`.
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
}

#[derive(Subcommand)]
pub enum AdapterCommand {
    /// Check an adapter against a server: every mapped tool or argument it does not have.
    #[command(after_help = "Examples:\n  \
        agent-bridge campaign adapter check adapters/desktop-commander.toml \\\n      \
            --target stdio:'agent-bridge proxy -- node dc/dist/index.js'\n  \
        agent-bridge campaign adapter check adapters/agent-bridge.toml --target http://127.0.0.1:8765/mcp --json\n\n\
        Loading the file checks it on its own (unknown steps, bad templates, patterns that do not\n\
        match their example); then tools/list shows what the server has. Exit status: 0 when every\n\
        mapping fits, 1 when some do not, 2 when the file or the server cannot be read.")]
    Check {
        /// The adapter file (TOML).
        file: PathBuf,
        /// stdio:'COMMAND' or http(s)://HOST:PORT/mcp.
        #[arg(long, value_name = "TARGET", value_parser = clap::value_parser!(crate::target::Target))]
        target: crate::target::Target,
        /// Machine-readable output on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one `campaign` subcommand and says how it went as the exit code.
pub fn main(cmd: CampaignCommand) -> ExitCode {
    // `campaign export | head` ends quietly, like other CLI tools; but a
    // runner talks to stdio bridges through pipes, and a bridge that died
    // must be an EPIPE it records (interface.transport), not its own death
    if !matches!(cmd, CampaignCommand::Run(_)) {
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cmd {
        CampaignCommand::Run(a) => report(campaign_run(a)),
        CampaignCommand::Runs { db, json } => report(campaign_runs(&db, json)),
        CampaignCommand::Report {
            db,
            run,
            html,
            json,
        } => report(campaign_report(&db, run.as_deref(), html, json)),
        CampaignCommand::Preflight {
            suite,
            env,
            target,
            db,
            run,
            json,
        } => report(campaign_preflight(
            &suite,
            env.as_deref(),
            target.as_ref(),
            db.as_ref().zip(run.as_deref()),
            json,
        )),
        CampaignCommand::Compare {
            db,
            run_a,
            run_b,
            json,
            html,
        } => report(campaign_compare(&db, &run_a, &run_b, json, html.as_deref())),
        CampaignCommand::Matrix {
            db,
            baseline,
            markdown,
            json,
        } => report(campaign_matrix(&db, &baseline, markdown, json)),
        CampaignCommand::Export {
            db,
            run,
            format,
            out,
        } => report(campaign_export(&db, run.as_deref(), format, out)),
        CampaignCommand::Import { db, files } => report(campaign_import(&db, &files)),
        CampaignCommand::Shrink {
            db,
            run,
            test,
            step,
            target,
            adapter,
            max_calls,
            json,
        } => report(campaign_shrink(
            &db,
            &run,
            &test,
            step,
            target,
            adapter.as_deref(),
            max_calls,
            json,
        )),
        CampaignCommand::Adapter(AdapterCommand::Check { file, target, json }) => {
            match adapter_check(&file, &target, json) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => report(Err(e)),
            }
        }
        CampaignCommand::Upstream { host } => report((|| {
            let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
            rt.block_on(async {
                let up = crate::upstream::Upstream::start(host)
                    .await
                    .with_context(|| format!("starting the upstream on {host}"))?;
                println!("upstream: {}", up.describe());
                tokio::signal::ctrl_c()
                    .await
                    .context("waiting for Ctrl-C")?;
                anyhow::Ok(())
            })
        })()),
        CampaignCommand::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&spec::schema()).expect("JSON")
            );
            ExitCode::SUCCESS
        }
        CampaignCommand::Generate {
            count,
            seed,
            out,
            base,
            domain,
            browser_tools,
            heavy_mib,
        } => {
            let tests = if browser_tools {
                generate::browser_tools_suite(count, seed, heavy_mib)
            } else {
                let mut tests = generate::suite(count, seed, &base);
                tests.retain(|t| domain.as_ref().is_none_or(|d| &t.domain == d));
                tests
            };
            let count = tests.len();
            report(
                generate::write_suite(&out, &tests)
                    .with_context(|| format!("writing {}", out.display()))
                    .map(|()| eprintln!("wrote {count} tests (seed {seed}) to {}", out.display())),
            )
        }
        CampaignCommand::Validate {
            dir,
            json,
            allow_egress,
        } => {
            let mut suite = match validate::load_dir(&dir) {
                Ok(s) => s,
                Err(e) => {
                    return report(Err(anyhow::anyhow!("cannot read {}: {e}", dir.display())));
                }
            };
            // a test that names an off-machine host is valid but not runnable as is
            let egress = suite.egress_problems(&allow_egress);
            let offending: std::collections::HashSet<_> =
                egress.iter().map(|p| p.file.clone()).collect();
            suite.problems.extend(egress);
            let with_problems = suite.files - suite.tests.len() + offending.len();
            if json {
                let problems: Vec<_> = suite
                    .problems
                    .iter()
                    .map(|p| serde_json::json!({"file": p.file, "field": p.field, "reason": p.reason}))
                    .collect();
                let v = serde_json::json!({"files": suite.files, "valid": suite.files - with_problems, "problems": problems});
                println!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
            } else {
                for p in &suite.problems {
                    println!("{p}");
                }
                println!(
                    "{} files: {} valid, {} with problems ({} problems)",
                    suite.files,
                    suite.files - with_problems,
                    with_problems,
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

/// `campaign shrink`.
#[allow(clippy::too_many_arguments)]
fn campaign_shrink(
    db: &Location,
    run: &str,
    test: &str,
    step: Option<usize>,
    target: Option<crate::target::Target>,
    adapter: Option<&std::path::Path>,
    max_calls: usize,
    json: bool,
) -> anyhow::Result<()> {
    use crate::{adapter::Adapter, shrink, validate};
    let conn = rdb::reader(db, Needs::Run(Some(run)))?;
    let row = report::pick_run(&conn, Some(run))?;
    let step = match step {
        Some(s) => s,
        None => conn
            .query_row(
                "SELECT step FROM campaign_steps WHERE run = ?1 AND test_id = ?2 AND verdict = 'fail' ORDER BY step LIMIT 1",
                [run, test],
                |r| r.get::<_, i64>(0),
            )
            .map(|s| s as usize)
            .map_err(|_| anyhow::anyhow!("run {run} has no failed step in test {test} (pass --step N)"))?,
    };
    let suite = validate::load_dir(std::path::Path::new(&row.suite))
        .with_context(|| format!("the run's suite {}", row.suite))?;
    let spec = suite
        .tests
        .iter()
        .find(|t| t.id == test)
        .with_context(|| format!("the suite {} has no test {test}", row.suite))?;
    let adapter = match (adapter, &row.adapter) {
        (Some(file), recorded) => {
            let a = Adapter::load(file)?;
            if let Some(r) = recorded
                && !r.contains(&a.digest[..16])
            {
                eprintln!(
                    "warning: the run used adapter {r}; {} differs",
                    file.display()
                );
            }
            Some(a)
        }
        (None, Some(r)) => anyhow::bail!("run {run} went through adapter {r}: pass --adapter FILE"),
        (None, None) => None,
    };
    let target = match target {
        Some(t) => t,
        None => row.target.parse().map_err(anyhow::Error::msg)?,
    };
    let shrink::StepBytes {
        channel,
        bytes: original,
    } = shrink::channel_of(spec, step)?;
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let finding = rt.block_on(async {
        let mut oracle = shrink::Oracle::new(&target, adapter.as_ref(), channel, max_calls);
        let f = shrink::shrink(&mut oracle, test, step, &original).await;
        oracle.close().await;
        f
    })?;
    shrink::store(&conn, run, &finding)?;
    if let Location::Postgres(url) = db {
        // the snapshot took the finding: it goes back into the shared DB
        let mut pg = crate::pg::Pg::connect(url)?;
        pg.execute(
            "DELETE FROM campaign_shrinks WHERE run = ?1 AND test_id = ?2 AND step = ?3",
            &[
                run.to_string().into(),
                test.to_string().into(),
                (step as i64).into(),
            ],
        )?;
        pg.copy_in(
            &conn,
            "campaign_shrinks",
            Some((
                "run = ?1 AND test_id = ?2 AND step = ?3",
                &[
                    run.to_string().into(),
                    test.to_string().into(),
                    (step as i64).into(),
                ],
            )),
            false,
        )?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&finding)?);
    } else {
        print!("{}", shrink::text(&finding));
    }
    Ok(())
}

/// `campaign adapter check`: true when every mapping fits the server.
fn adapter_check(
    file: &std::path::Path,
    target: &crate::target::Target,
    json: bool,
) -> anyhow::Result<bool> {
    use crate::{adapter::Adapter, adapter_check};
    let adapter = Adapter::load(file)?;
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let tools = rt.block_on(async {
        let conn = target.connect().await?;
        let tools = conn.list_tools().await;
        conn.close().await;
        tools.map_err(|e| anyhow::anyhow!("tools/list: {e}"))
    })?;
    let rows = adapter_check::rows(&adapter, &tools);
    if json {
        let v = adapter_check::json(&adapter, &rows);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", adapter_check::text(&adapter, &rows));
    }
    Ok(rows.iter().all(|r| r.problems.is_empty()))
}

fn campaign_run(a: RunArgs) -> anyhow::Result<()> {
    use crate::run;
    let adapter = a
        .adapter
        .as_deref()
        .map(crate::adapter::Adapter::load)
        .transpose()?
        .map(std::sync::Arc::new);
    let mut targets = a.target;
    if let Some(file) = &a.targets {
        targets.extend(run::read_targets(file)?);
    }
    let opts = run::Options {
        suite: a.suite,
        targets,
        target_timeout: a.target_timeout,
        workers: a.workers,
        db: a.db,
        run: a.run,
        label: a.label,
        shard: a.shard,
        resume: a.resume,
        quiet: a.no_bar,
        allow_egress: a.allow_egress,
        upstream_host: a.upstream_host,
        adapter,
        reuse_sessions: a.reuse_sessions,
        env_file: a.env,
        otlp: a
            .otlp
            .as_deref()
            .map(crate::otel::Tracer::start)
            .transpose()?
            .map(std::sync::Arc::new),
    };
    let tracer = opts.otlp.clone();
    let s = run::run(opts)?;
    if let Some(t) = tracer {
        let o = t.finish(
            &serde_json::to_value(&s).unwrap_or_default(),
            std::time::Duration::from_secs(15),
        );
        eprintln!(
            "otlp: {} span(s) exported to {}, {} dropped (queue full), {} dropped (export failed){}",
            o.exported,
            o.endpoint,
            o.dropped_queue_full,
            o.dropped_export_failed,
            o.last_error
                .map(|e| format!("; last error: {e}"))
                .unwrap_or_default()
        );
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!(
            "run {}: {} recorded here ({} passed, {} degraded, {} failed{}) in {:.1} s; {} of {} suite tests recorded in all{}",
            s.run,
            s.recorded,
            s.passed,
            s.degraded,
            s.failed,
            if s.unsupported > 0 {
                format!(", {} unsupported by the target", s.unsupported)
            } else {
                String::new()
            },
            s.wall_s,
            s.already_recorded + s.recorded,
            s.suite_tests,
            if s.complete { " — complete" } else { "" }
        );
        if s.steps_without_kernel > 0 {
            eprintln!(
                "warning: {} steps ran without kernel evidence ({}); their failures cannot be placed on a sandbox primitive",
                s.steps_without_kernel,
                s.kernel_unavailable_reason.as_deref().unwrap_or("?")
            );
        }
    }
    Ok(())
}

fn campaign_runs(db: &Location, json: bool) -> anyhow::Result<()> {
    let conn = rdb::reader(db, Needs::All)?;
    let mut all = Vec::new();
    for run in rdb::runs(&conn)? {
        all.push(report::report(&conn, &run)?.run);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!(
        "{:<36} {:<12} {:>9} {:>6} {:>6}  TARGET",
        "RUN", "LABEL", "RECORDED", "TOTAL", "DONE"
    );
    for r in all {
        println!(
            "{:<36} {:<12} {:>9} {:>6} {:>6}  {}",
            r.id,
            r.label,
            r.recorded,
            r.tests_total,
            if r.complete { "yes" } else { "no" },
            r.target
        );
    }
    Ok(())
}

fn campaign_report(
    db: &Location,
    run: Option<&str>,
    html: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<()> {
    let conn = rdb::reader(db, Needs::Run(run))?;
    let run = report::pick_run(&conn, run)?;
    let r = report::report(&conn, &run)?;
    if let Some(path) = &html {
        std::fs::write(path, html::html(&r))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", report::text(&r));
        if let Some(path) = &html {
            println!("\nHTML report: {}", path.display());
        }
    }
    Ok(())
}

fn campaign_preflight(
    suite: &std::path::Path,
    env: Option<&std::path::Path>,
    target: Option<&crate::target::Target>,
    against: Option<(&Location, &str)>,
    json: bool,
) -> anyhow::Result<()> {
    let loaded = validate::load_dir(suite)
        .with_context(|| format!("cannot read the suite {}", suite.display()))?;
    let snapshot = match (env, target) {
        (Some(file), _) => crate::environment::from_file(file)?,
        (None, Some(t)) => {
            let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
            let names = crate::environment::commands_of(&loaded.tests);
            rt.block_on(crate::environment::take(t, &names))
                .map_err(|why| anyhow::anyhow!("the target {t} gave no snapshot: {why}"))?
        }
        (None, None) => anyhow::bail!("give --env FILE or --target TARGET"),
    };
    let mut p = crate::preflight::preflight(&loaded.tests, &snapshot);
    if let Some((db, run)) = against {
        let conn = rdb::reader(db, Needs::Run(Some(run)))?;
        let row = report::pick_run(&conn, Some(run))?;
        let mut stmt = conn.prepare(
            "SELECT test_id, outcome = 'fail' FROM campaign_tests WHERE run = ?1 AND outcome != 'unsupported'",
        )?;
        let failed = stmt
            .query_map([&row.id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        crate::preflight::held(&mut p, &row.id, &failed);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print!("{}", crate::preflight::text(&p));
    }
    Ok(())
}

fn campaign_compare(
    db: &Location,
    a: &str,
    b: &str,
    json: bool,
    html_out: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let conn = rdb::reader(db, Needs::These(&[a, b]))?;
    rdb::with_splits(&conn, &[a, b])?;
    let (a, b) = (
        report::pick_run(&conn, Some(a))?,
        report::pick_run(&conn, Some(b))?,
    );
    let c = compare::compare(&conn, &a, &b)?;
    if let Some(path) = html_out {
        std::fs::write(path, html::compare_html(&c))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!("{}", compare::compare_text(&c));
    }
    Ok(())
}

fn campaign_matrix(
    db: &Location,
    baseline: &str,
    markdown: bool,
    json: bool,
) -> anyhow::Result<()> {
    let conn = rdb::reader(db, Needs::All)?;
    let base = report::pick_run(&conn, Some(baseline))?;
    let m = compare::matrix(&conn, &base)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&m)?);
    } else if markdown {
        print!("{}", compare::matrix_markdown(&m));
    } else {
        println!("baseline {}", m.baseline);
        println!(
            "{:<16} {:<16} {:>7} {:>9} {:>5} {:>9} {:>9}  ATTRIBUTED",
            "RUN", "INJECTED", "NEWLY", "ACCURACY", "BOTH", "PREEMPTED", "SAME-STEP"
        );
        for r in &m.rows {
            let attributed: Vec<String> = r
                .attributed
                .iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            println!(
                "{:<16} {:<16} {:>7} {:>9} {:>5} {:>9} {:>9}  {}",
                r.label,
                r.injected,
                r.newly_failed,
                r.accuracy
                    .map_or("-".into(), |a| format!("{:.1}%", a * 100.0)),
                r.failed_in_both,
                r.preempted,
                r.wrongly_blamed,
                attributed.join(", ")
            );
        }
    }
    Ok(())
}

fn campaign_export(
    db: &Location,
    run: Option<&str>,
    format: ExportFormat,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let conn = rdb::reader(db, Needs::Run(run))?;
    let run = report::pick_run(&conn, run)?;
    let text = match format {
        ExportFormat::Csv => export::csv(&conn, &run.id)?,
        ExportFormat::Jsonl => export::jsonl(&conn, &run.id)?,
    };
    match out {
        Some(p) => std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}

fn campaign_import(db: &Location, files: &[PathBuf]) -> anyhow::Result<()> {
    let db = match db {
        Location::Sqlite(path) => path,
        Location::Postgres(url) => return campaign_import_pg(url, files),
    };
    let mut store = probe::store::Store::open(db)?;
    for f in files {
        let n = store
            .import(f)
            .with_context(|| format!("importing {}", f.display()))?;
        println!("{}: {n} spans imported", f.display());
    }
    let linked: i64 = store.connection().query_row(
        "SELECT COUNT(*) FROM campaign_steps s JOIN campaign_tests t USING (run, test_id)
         JOIN spans p ON p.session = t.mcp_session AND p.id = s.span_id",
        [],
        |r| r.get(0),
    )?;
    println!(
        "{linked} campaign steps now have their kernel spans in {}",
        db.display()
    );
    Ok(())
}

/// `campaign import` into PostgreSQL: each export is read into a scratch
/// SQLite store (the same importer, the same checks), then its rows are
/// copied over in one transaction.
fn campaign_import_pg(url: &str, files: &[PathBuf]) -> anyhow::Result<()> {
    let mut pg = crate::pg::Pg::connect(url)?;
    for f in files {
        let mut scratch = probe::store::Store::open_in_memory()?;
        let n = scratch
            .import(f)
            .with_context(|| format!("importing {}", f.display()))?;
        pg.batch("BEGIN")?;
        let copied = (|| -> anyhow::Result<()> {
            pg.copy_in(scratch.connection(), "sessions", None, true)?;
            for table in ["spans", "attributions", "events", "drops"] {
                pg.copy_in(scratch.connection(), table, None, false)?;
            }
            Ok(())
        })();
        match copied {
            Ok(()) => pg.batch("COMMIT")?,
            Err(e) => {
                let _ = pg.batch("ROLLBACK");
                return Err(e.context(format!("importing {} into {}", f.display(), pg.shown)));
            }
        }
        println!("{}: {n} spans imported", f.display());
    }
    let linked = pg.query(
        "SELECT COUNT(*) FROM campaign_steps s JOIN campaign_tests t USING (run, test_id)
         JOIN spans p ON p.session = t.mcp_session AND p.id = s.span_id",
        &[],
    )?;
    println!(
        "{} campaign steps now have their kernel spans in {}",
        match linked.first().and_then(|r| r.first()) {
            Some(rusqlite::types::Value::Integer(n)) => *n,
            _ => 0,
        },
        pg.shown
    );
    Ok(())
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
