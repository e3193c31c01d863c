//! `campaign run`: N workers, each opening one MCP session per test (so
//! each test has its own probe session and its own bridge-side cleanup),
//! send their records to one writer that stores them in SQLite.
//!
//! Data flows one way: suite → queue → workers → channel → writer (DB and
//! progress). A runner killed at any point leaves only whole tests behind;
//! `--resume RUN` runs the rest.

use std::collections::VecDeque;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use super::adapter::Adapter;
use super::db::{Db, Location, RunRow};
use super::record::{CallError, InterfacePrimitive, Outcome, StepOutcome, TestRecord};
use super::spec::TestSpec;
use super::target::{SandboxInfo, Target};
use super::triage;
use super::upstream::Upstream;
use super::validate;
use super::verdict::{self, Sent};

pub struct Options {
    pub suite: PathBuf,
    /// One or more targets: the tests are spread over them.
    pub targets: Vec<Target>,
    /// Workers in all, shared out over the targets.
    pub workers: usize,
    pub db: Location,
    /// Name of the run (shards and other runners of one run share it).
    pub run: Option<String>,
    pub label: Option<String>,
    /// (i, n): this process runs the tests whose index is i-1 modulo n.
    pub shard: Option<Shard>,
    /// Continue this run: only tests without a row are run.
    pub resume: Option<String>,
    /// Print the plain progress lines even on a terminal.
    pub quiet: bool,
    /// Off-machine hosts the tests may name (see [`super::egress`]).
    pub allow_egress: Vec<String>,
    /// Where the local upstream listens.
    pub upstream_host: std::net::Ipv4Addr,
    /// How the campaign's steps map onto a target that is not an agent-bridge.
    pub adapter: Option<Arc<Adapter>>,
    /// One MCP session per worker, not per test (for slow-starting servers).
    pub reuse_sessions: bool,
    /// The environment from a snapshot file instead of the targets' own.
    pub env_file: Option<PathBuf>,
    /// Run → test → step spans over OTLP (`--otlp URL`).
    pub otlp: Option<Arc<super::otel::Tracer>>,
    /// How long a step may run past its own timeout before its target
    /// counts as not answering.
    pub target_timeout: Duration,
}

/// What a runner process did.
#[derive(Debug, Default, serde::Serialize)]
pub struct Summary {
    pub run: String,
    pub suite_tests: usize,
    pub skipped_files: usize,
    pub already_recorded: usize,
    /// Tests this process set out to run (with PostgreSQL: claimed as it went).
    pub this_process: usize,
    pub recorded: usize,
    pub passed: usize,
    pub failed: usize,
    /// Passed, but a step ran past its max_duration_ms or stalled on memory.
    pub degraded: usize,
    /// A step the target cannot express (through its adapter) stopped the test.
    pub unsupported: usize,
    /// Tests another runner recorded first (kept once, by their key).
    pub recorded_elsewhere: usize,
    pub complete: bool,
    pub wall_s: f64,
    /// This runner process's own CPU time and peak RSS (not the bridges').
    pub runner_cpu_s: f64,
    pub runner_max_rss_mib: f64,
    /// Steps the bridge ran without kernel evidence, and the first reason it gave.
    pub steps_without_kernel: usize,
    pub kernel_unavailable_reason: Option<String>,
    /// Per target: its workers, what it ran, and whether it went down.
    pub targets: Vec<TargetSummary>,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct TargetSummary {
    pub target: String,
    pub workers: usize,
    pub recorded: usize,
    pub failed: usize,
    /// Why it was marked down (it died or stopped answering), if it was.
    pub down: Option<String>,
}

/// Shard `index` of `count` (1-based): the tests whose position is
/// `index - 1` modulo `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    pub fn holds(self, position: usize) -> bool {
        position % self.count == self.index - 1
    }
}

/// Parses `I/N` (1-based).
pub fn parse_shard(s: &str) -> Result<Shard, String> {
    let (i, n) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}`: a shard is I/N, e.g. 2/4"))?;
    let (i, n): (usize, usize) = (
        i.trim()
            .parse()
            .map_err(|_| format!("`{s}`: I is not a number"))?,
        n.trim()
            .parse()
            .map_err(|_| format!("`{s}`: N is not a number"))?,
    );
    if n == 0 || i == 0 || i > n {
        return Err(format!("`{s}`: need 1 <= I <= N"));
    }
    Ok(Shard { index: i, count: n })
}

/// Reads `--targets FILE`: one target per line; blank lines and `#`
/// comments skipped.
pub fn read_targets(file: &std::path::Path) -> anyhow::Result<Vec<Target>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("--targets {}", file.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| (i, l.split('#').next().unwrap_or_default().trim()))
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| {
            l.parse::<Target>()
                .map_err(|e| anyhow::anyhow!("{}:{}: {e}", file.display(), i + 1))
        })
        .collect()
}

/// A digest of the suite's tests, so a resume or a shard runs the same suite.
fn digest(tests: &[TestSpec]) -> String {
    let mut h = Sha256::new();
    for t in tests {
        h.update(serde_json::to_vec(t).expect("JSON"));
        h.update(b"\n");
    }
    contract::bytes::sha256_hex(&h.finalize())
}

/// This runner's name in the DB: host, pid and start time.
fn runner_name() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".into());
    format!("{host}/{}/{}", std::process::id(), probe::clock::now_ms())
}

/// Runs the campaign. Blocking: the database is used from plain threads
/// (the PostgreSQL client runs its own runtime), the targets from a tokio
/// runtime of its own.
pub fn run(o: Options) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let suite = validate::load_dir(&o.suite)
        .with_context(|| format!("cannot read the suite {}", o.suite.display()))?;
    for p in &suite.problems {
        eprintln!("skipped: {p}");
    }
    let egress = suite.egress_problems(&o.allow_egress);
    if !egress.is_empty() {
        let lines: Vec<String> = egress.iter().take(20).map(|p| format!("  {p}")).collect();
        bail!(
            "refusing to run: {} steps name hosts outside this machine, and no packet may leave it unless you say so:\n{}{}\nuse the local upstream ({{{{upstream.http}}}}…), or pass --allow-egress HOST[,HOST…]",
            egress.len(),
            lines.join("\n"),
            if egress.len() > 20 {
                format!("\n  … and {} more", egress.len() - 20)
            } else {
                String::new()
            }
        );
    }
    if suite.tests.is_empty() {
        bail!(
            "{}: no valid test files ({} problems)",
            o.suite.display(),
            suite.problems.len()
        );
    }
    if o.targets.is_empty() {
        bail!("no target: pass --target (more than once for several) or --targets FILE");
    }
    let mut db = Db::open(&o.db)?;
    if db.is_postgres() && o.shard.is_some() {
        bail!(
            "--shard splits a SQLite run by hand; runners on PostgreSQL share a run by claiming tests: start each with the same --run NAME"
        );
    }
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    let upstream = Arc::new(
        rt.block_on(Upstream::start(o.upstream_host))
            .context("the campaign's local upstream (stands in for the internet)")?,
    );
    // fail fast when no target answers; learn what a bridge injects, or
    // check that a foreign server has every tool the adapter maps
    let mut answered = Vec::new();
    let mut down_at_start = Vec::new();
    for target in &o.targets {
        match rt.block_on(inspect(target, o.adapter.as_deref())) {
            Ok(info) => answered.push(info),
            Err(e) if o.targets.len() == 1 => return Err(e),
            Err(e) => {
                eprintln!("target {target} is down: {e:#}");
                down_at_start.push((target.to_string(), format!("{e:#}")));
            }
        }
    }
    let Some(SandboxInfo { profile, injected }) = answered.first().cloned() else {
        bail!("none of the {} targets answers", o.targets.len());
    };
    let run = open_run(&mut db, &o, &suite.tests, profile, injected)?;
    let runner = runner_name();
    let environments = attach_environments(
        &mut db,
        &rt,
        &o,
        (&run.id, &runner),
        &suite.tests,
        &down_at_start,
    )?;
    let done = db.recorded(&run.id)?;
    let work = if db.is_postgres() {
        let all = suite
            .tests
            .iter()
            .map(|t| (t.id.clone(), t.clone()))
            .collect();
        let targets = serde_json::to_string(
            &o.targets
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
        )?;
        Work::Claims(Claims::start(&o.db, &run.id, &runner, &targets, all)?)
    } else {
        Work::Local(Mutex::new(
            suite
                .tests
                .iter()
                .enumerate()
                .filter(|(i, _)| o.shard.is_none_or(|s| s.holds(*i)))
                .filter(|(_, t)| !done.contains(&t.id))
                .map(|(_, t)| t.clone())
                .collect(),
        ))
    };
    let to_run = match &work {
        Work::Local(q) => q.lock().unwrap().len(),
        Work::Claims(_) => suite.tests.len() - done.len(),
    };
    let mut summary = Summary {
        run: run.id.clone(),
        suite_tests: suite.tests.len(),
        skipped_files: suite.files - suite.tests.len(),
        already_recorded: done.len(),
        this_process: to_run,
        ..Summary::default()
    };
    let plan = share_workers(o.workers, o.targets.len());
    eprintln!(
        "run {}: {} tests in the suite, {} already recorded, {} to run {} with {} workers against {}\nupstream: {}",
        run.id,
        suite.tests.len(),
        done.len(),
        to_run,
        if db.is_postgres() {
            format!("by the runners sharing {} (this one is {runner})", o.db)
        } else {
            "here".to_string()
        },
        plan.iter().sum::<usize>(),
        o.targets
            .iter()
            .zip(&plan)
            .map(|(t, n)| format!("{t} ({n})"))
            .collect::<Vec<_>>()
            .join(", "),
        upstream.describe()
    );
    for (target, reason) in &down_at_start {
        db.target_down(&run.id, &runner, target, reason)?;
    }
    let down: Vec<Option<String>> = o
        .targets
        .iter()
        .map(|t| {
            down_at_start
                .iter()
                .find(|(d, _)| *d == t.to_string())
                .map(|(_, r)| r.clone())
        })
        .collect();
    let (written, was_interrupted) = rt.block_on(execute(
        db, &run.id, &runner, work, to_run, &o, &plan, down, &upstream,
    ));
    let (mut db, counts) = written?;
    for (target, mut snapshot, left) in environments {
        if !left.is_empty() {
            rt.block_on(super::environment::read_markers(
                &target,
                (&run.id, &runner),
                &left,
                &mut snapshot,
            ));
            db.store_environment(&run.id, &target.to_string(), &snapshot)?;
        }
    }
    summary.recorded = counts.recorded;
    summary.recorded_elsewhere = counts.elsewhere;
    summary.steps_without_kernel = counts.without_kernel;
    summary.kernel_unavailable_reason = counts.kernel_reason;
    summary.passed = counts.passed;
    summary.degraded = counts.degraded;
    summary.unsupported = counts.unsupported;
    summary.failed = counts.recorded - counts.passed - counts.degraded - counts.unsupported;
    summary.targets = counts.targets;
    summary.complete = db.finish_if_complete(&run.id)?;
    if db.is_postgres() {
        db.runner_finished(&run.id, &runner)?;
    }
    summary.wall_s = started.elapsed().as_secs_f64();
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    summary.runner_cpu_s = secs(usage.user_time()) + secs(usage.system_time());
    summary.runner_max_rss_mib = usage.max_rss() as f64 / 1024.0;
    if was_interrupted {
        bail!(
            "interrupted: {} tests recorded in this process; continue with --resume {}",
            summary.recorded,
            run.id
        );
    }
    if summary.targets.iter().all(|t| t.down.is_some()) && !summary.complete {
        bail!(
            "every target is down ({}); {} tests recorded in this process, the run is not complete: continue with --resume {}",
            summary
                .targets
                .iter()
                .map(|t| format!("{}: {}", t.target, t.down.as_deref().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join("; "),
            summary.recorded,
            run.id
        );
    }
    Ok(summary)
}

/// The environment of each target that answered, stored with the run
/// before its first test (a resumed run keeps the one it has), and the
/// persistence markers left through a bridge, read back at the end.
fn attach_environments(
    db: &mut Db,
    rt: &tokio::runtime::Runtime,
    o: &Options,
    (run, runner): (&str, &str),
    tests: &[TestSpec],
    down: &[(String, String)],
) -> anyhow::Result<Vec<(Target, probe::env::Snapshot, Vec<&'static str>)>> {
    use super::environment;
    let from_file = o
        .env_file
        .as_deref()
        .map(environment::from_file)
        .transpose()?;
    let names = environment::commands_of(tests);
    let mut attached = vec![];
    for target in &o.targets {
        let key = target.to_string();
        if down.iter().any(|(d, _)| *d == key) || db.has_environment(run, &key)? {
            continue;
        }
        let snapshot = match &from_file {
            Some(s) => s.clone(),
            None => match rt.block_on(environment::take(target, &names)) {
                Ok(s) => s,
                Err(why) => {
                    eprintln!(
                        "environment of {target}: none stored ({why}); pass --env FILE (from `probe env --output FILE` inside it)"
                    );
                    continue;
                }
            },
        };
        db.store_environment(run, &key, &snapshot)?;
        // markers need the bridge's own file tools
        let left = if from_file.is_none() && o.adapter.is_none() {
            rt.block_on(environment::leave_markers(target, run, runner))
        } else {
            vec![]
        };
        attached.push((target.clone(), snapshot, left));
    }
    Ok(attached)
}

/// Asks a target what it is: a bridge's profile and injected fault, or
/// (through an adapter) whether the server has every tool mapped.
async fn inspect(target: &Target, adapter: Option<&Adapter>) -> anyhow::Result<SandboxInfo> {
    let probe = tokio::time::timeout(Duration::from_secs(60), target.connect())
        .await
        .map_err(|_| anyhow::anyhow!("no answer in 60 s"))?
        .with_context(|| format!("the target {target} does not answer"))?;
    let answer = match adapter {
        None => probe
            .sandbox()
            .await
            .map_err(|e| anyhow::anyhow!("sandbox_info: {e}")),
        Some(adapter) => match probe.list_tools().await {
            Err(e) => Err(anyhow::anyhow!("tools/list: {e}")),
            Ok(tools) => {
                let problems = super::adapter_check::problems(adapter, &tools);
                if problems.is_empty() {
                    Ok(SandboxInfo::default())
                } else {
                    Err(anyhow::anyhow!(
                        "{}: the target lacks what the adapter maps:\n  {}",
                        adapter.file.display(),
                        problems.join("\n  ")
                    ))
                }
            }
        },
    };
    probe.close().await;
    answer
}

/// `workers` shared out over `targets`, at least one each.
fn share_workers(workers: usize, targets: usize) -> Vec<usize> {
    let workers = workers.max(targets);
    (0..targets)
        .map(|i| workers / targets + usize::from(i < workers % targets))
        .collect()
}

/// Where a worker gets its next test.
enum Work {
    /// This process's own queue (SQLite: shards split a run by hand).
    Local(Mutex<VecDeque<TestSpec>>),
    /// Claimed one by one from the run's queue in PostgreSQL.
    Claims(Claims),
}

impl Work {
    async fn next(&self) -> Option<TestSpec> {
        match self {
            Work::Local(q) => q.lock().unwrap().pop_front(),
            Work::Claims(c) => c.next().await,
        }
    }
}

/// The claiming thread: one PostgreSQL connection that claims tests for
/// the workers and renews this runner's heartbeat every second.
struct Claims {
    ask: std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<Option<TestSpec>>>,
    /// Why claiming stopped, if the database failed.
    failed: Arc<Mutex<Option<String>>>,
}

impl Claims {
    fn start(
        at: &Location,
        run: &str,
        runner: &str,
        targets: &str,
        tests: std::collections::HashMap<String, TestSpec>,
    ) -> anyhow::Result<Claims> {
        let mut db = Db::open(at)?;
        db.heartbeat(run, runner, targets)?;
        let (ask, asked) =
            std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<Option<TestSpec>>>();
        let failed = Arc::new(Mutex::new(None));
        let (run, runner, targets) = (run.to_string(), runner.to_string(), targets.to_string());
        let why = failed.clone();
        std::thread::spawn(move || {
            let beat = Duration::from_secs(1);
            let mut last_beat = Instant::now();
            let mut step = || -> anyhow::Result<bool> {
                if last_beat.elapsed() >= beat {
                    db.heartbeat(&run, &runner, &targets)?;
                    last_beat = Instant::now();
                }
                let reply = match asked.recv_timeout(beat) {
                    Ok(reply) => reply,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Ok(true),
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Ok(false),
                };
                // none free: wait while other runners hold unrecorded tests
                // (they record them, or fall silent and give them up)
                let next = loop {
                    if let Some(id) = db.claim(&run, &runner)? {
                        break tests.get(&id).cloned();
                    }
                    if db.held_elsewhere(&run, &runner)? == 0 || reply.is_closed() {
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                    if last_beat.elapsed() >= beat {
                        db.heartbeat(&run, &runner, &targets)?;
                        last_beat = Instant::now();
                    }
                };
                let _ = reply.send(next);
                Ok(true)
            };
            loop {
                match step() {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        *why.lock().unwrap() = Some(format!("{e:#}"));
                        // every later ask is answered "no more": the senders drop
                        break;
                    }
                }
            }
        });
        Ok(Claims { ask, failed })
    }

    async fn next(&self) -> Option<TestSpec> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.ask.send(tx).ok()?;
        rx.await.ok().flatten()
    }
}

/// What the workers send the writer.
enum Written {
    Test(Box<TestRecord>),
    /// A target died or stopped answering (index, why).
    Down(usize, String),
}

/// Runs the work on the workers; the writer stores what they send. Returns
/// the DB and the writer's counts (or why it stopped), and whether Ctrl-C
/// stopped it.
#[allow(clippy::too_many_arguments)]
async fn execute(
    db: Db,
    run_id: &str,
    runner_id: &str,
    work: Work,
    total: usize,
    o: &Options,
    plan: &[usize],
    down: Vec<Option<String>>,
    upstream: &Arc<Upstream>,
) -> (anyhow::Result<(Db, Counts)>, bool) {
    let work = Arc::new(work);
    let stop = CancellationToken::new();
    let (tx, rx) = std::sync::mpsc::channel::<Written>();
    let progress = Progress::new(total, o.quiet, matches!(*work, Work::Claims(_)));
    let is_down: Arc<Vec<AtomicBool>> =
        Arc::new(down.iter().map(|d| AtomicBool::new(d.is_some())).collect());
    let names: Vec<String> = o.targets.iter().map(ToString::to_string).collect();
    let writer = {
        let (run_id, runner_id, stop) = (run_id.to_string(), runner_id.to_string(), stop.clone());
        let mut counts = Counts {
            targets: names
                .iter()
                .zip(plan)
                .zip(&down)
                .map(|((t, w), d)| TargetSummary {
                    target: t.clone(),
                    workers: *w,
                    down: d.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Counts::default()
        };
        std::thread::spawn(move || {
            let result = write_all(db, &run_id, &runner_id, rx, &stop, &progress, &mut counts);
            progress.finish();
            result.map(|db| (db, counts))
        })
    };
    let interrupted = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                r = tokio::signal::ctrl_c() => { r.is_ok() && { stop.cancel(); true } }
                () = stop.cancelled() => false,
            }
        })
    };
    let mut workers = Vec::new();
    let assignment = plan
        .iter()
        .enumerate()
        .flat_map(|(t, n)| std::iter::repeat_n(t, *n));
    for (w, t) in assignment.enumerate() {
        let (work, tx, stop, target) =
            (work.clone(), tx.clone(), stop.clone(), o.targets[t].clone());
        let adapter = o.adapter.clone();
        let upstream = upstream.clone();
        let is_down = is_down.clone();
        let runner = format!("{}/w{w}", std::process::id());
        let reuse = o.reuse_sessions;
        let otlp = o.otlp.clone();
        let extra = o.target_timeout;
        let name = (o.targets.len() > 1).then(|| names[t].clone());
        workers.push(tokio::spawn(async move {
            let mut session = None;
            loop {
                if is_down[t].load(Ordering::SeqCst) {
                    break;
                }
                let Some(test) = work.next().await else {
                    break;
                };
                let test = upstream.bind(&test);
                let mut record = tokio::select! {
                    r = super::otel::scope(otlp.clone(), run_test(&target, adapter.as_deref(), &test, &runner, reuse.then_some(&mut session), extra)) => r,
                    () = stop.cancelled() => break,
                };
                record.target = name.clone();
                let lost = record
                    .steps
                    .iter()
                    .any(|(_, _, o)| o.as_ref().is_some_and(|o| o.transport_lost));
                if tx.send(Written::Test(Box::new(record))).is_err() {
                    break;
                }
                if lost && let Err(why) = alive(&target).await {
                    if !is_down[t].swap(true, Ordering::SeqCst) {
                        eprintln!("target {target} is down ({why}): its queued tests go to the others");
                        let _ = tx.send(Written::Down(t, why));
                    }
                    break;
                }
            }
            if let Some(c) = session {
                c.close().await;
            }
        }));
    }
    drop(tx);
    for w in workers {
        let _ = w.await;
    }
    let written = writer.join().expect("the writer thread does not panic");
    // ends the Ctrl-C watcher, which says whether it fired
    stop.cancel();
    let was_interrupted = interrupted.await.unwrap_or(false);
    let written = match (&*work, written) {
        (Work::Claims(c), Ok(w)) => match c.failed.lock().unwrap().take() {
            Some(why) => Err(anyhow::anyhow!(
                "cannot claim tests ({why}); the run stopped, the {} tests recorded here before it are kept: continue with --resume {run_id}",
                w.1.recorded
            )),
            None => Ok(w),
        },
        (_, w) => w,
    };
    (written, was_interrupted)
}

/// Whether a target still answers (a new MCP session within 10 s).
async fn alive(target: &Target) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(10), target.connect()).await {
        Err(_) => Err("no answer to a new session in 10 s".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(c)) => {
            c.close().await;
            Ok(())
        }
    }
}

/// The run to record into: a new one, the one to resume, or the one a
/// shard or another runner shares; refused when it was made from another
/// suite.
fn open_run(
    db: &mut Db,
    o: &Options,
    tests: &[TestSpec],
    profile: Option<String>,
    injected: Option<String>,
) -> anyhow::Result<RunRow> {
    let joins = o.shard.is_some() || db.is_postgres();
    let wanted = RunRow {
        id: match (&o.resume, &o.run) {
            (Some(r), _) | (None, Some(r)) => r.clone(),
            (None, None) if o.shard.is_some() => {
                bail!("the shards of one run need the same --run NAME")
            }
            (None, None) => format!(
                "{}-{}",
                o.label.as_deref().unwrap_or("run"),
                chrono::Utc::now().format("%Y%m%dT%H%M%S")
            ),
        },
        label: o
            .label
            .clone()
            .or_else(|| o.run.clone())
            .unwrap_or_else(|| "run".into()),
        target: o
            .targets
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" "),
        suite: o.suite.display().to_string(),
        suite_digest: digest(tests),
        tests_total: tests.len() as i64,
        profile,
        injected,
        started_ms: probe::clock::now_ms() as i64,
        finished_ms: None,
        adapter: o
            .adapter
            .as_ref()
            .map(|a| format!("{} (sha256 {})", a.name, &a.digest[..16])),
    };
    let run = if let Some(id) = &o.resume {
        db.run_row(id)?
            .with_context(|| format!("--resume {id}: no such run in {}", o.db))?
    } else {
        let ids: Vec<String> = tests.iter().map(|t| t.id.clone()).collect();
        let (run, created) = db.create_run(&wanted, &ids)?;
        if !created && !joins {
            bail!(
                "run `{}` already exists in {}: continue it with --resume {0}, or pick another --run",
                run.id,
                o.db
            );
        }
        run
    };
    if run.suite_digest != wanted.suite_digest {
        bail!(
            "run `{}` was made from a different suite ({} tests, digest {}…); this one has {} tests, digest {}…",
            run.id,
            run.tests_total,
            &run.suite_digest[..12],
            wanted.tests_total,
            &wanted.suite_digest[..12]
        );
    }
    Ok(run)
}

#[derive(Default)]
struct Counts {
    recorded: usize,
    passed: usize,
    degraded: usize,
    unsupported: usize,
    elsewhere: usize,
    without_kernel: usize,
    kernel_reason: Option<String>,
    targets: Vec<TargetSummary>,
}

/// The one writer: stores what arrives, several tests per transaction when
/// they queue up; stops the run on a DB error (everything committed before
/// it stays) and hands the DB back.
fn write_all(
    mut db: Db,
    run: &str,
    runner: &str,
    rx: std::sync::mpsc::Receiver<Written>,
    stop: &CancellationToken,
    progress: &Progress,
    counts: &mut Counts,
) -> anyhow::Result<Db> {
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::new();
        let mut downs = Vec::new();
        for w in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok()).take(63)) {
            match w {
                Written::Test(t) => batch.push(*t),
                Written::Down(t, why) => downs.push((t, why)),
            }
        }
        for (t, why) in downs {
            let name = counts.targets[t].target.clone();
            counts.targets[t].down = Some(why.clone());
            db.target_down(run, runner, &name, &why)?;
        }
        let inserted = match db.insert(run, &batch) {
            Ok(inserted) => inserted,
            Err(e) => {
                stop.cancel();
                bail!(
                    "cannot record test {} ({e:#}); the run stopped, the {} tests recorded before it are kept: continue with --resume {run}",
                    batch[0].test_id,
                    counts.recorded
                );
            }
        };
        for (record, fresh) in batch.iter().zip(inserted) {
            if !fresh {
                counts.elsewhere += 1;
                continue;
            }
            count(counts, record);
            progress.tick(
                record,
                counts.recorded - counts.passed - counts.degraded - counts.unsupported,
            );
        }
    }
    Ok(db)
}

fn count(counts: &mut Counts, record: &TestRecord) {
    counts.recorded += 1;
    for o in record.steps.iter().filter_map(|(_, _, o)| o.as_ref()) {
        if let Some(reason) = &o.kernel_unavailable {
            counts.without_kernel += 1;
            counts.kernel_reason.get_or_insert_with(|| reason.clone());
        }
    }
    let outcome = record.outcome();
    match outcome {
        Outcome::Unsupported => counts.unsupported += 1,
        Outcome::Pass => counts.passed += 1,
        Outcome::Degraded => counts.degraded += 1,
        Outcome::Fail => {}
    }
    let target = match &record.target {
        Some(name) => counts.targets.iter_mut().find(|t| &t.target == name),
        None => counts.targets.first_mut(),
    };
    if let Some(t) = target {
        t.recorded += 1;
        t.failed += usize::from(outcome == Outcome::Fail);
    }
}

/// Runs one test in its own MCP session; through `adapter` when the
/// target is not an agent-bridge.
pub async fn run_test(
    target: &Target,
    adapter: Option<&Adapter>,
    test: &TestSpec,
    runner: &str,
    // Some: the worker's session, used and kept for the next test
    mut kept: Option<&mut Option<super::target::Connection>>,
    // how long a step may run past its own timeout
    extra_wait: Duration,
) -> TestRecord {
    let started = Instant::now();
    super::otel::test_begin();
    let mut steps: Vec<(String, Value, Option<StepOutcome>)> = test
        .steps
        .iter()
        .map(|s| (s.tool.clone(), verdict::stored_request(s), None))
        .collect();
    let mut outcomes = Vec::new();
    let mut session = None;
    let mut unsupported = None;
    // a target that accepts connections but never answers must not hold
    // the worker forever
    let patience = Duration::from_secs(30) + extra_wait;
    let open = match kept.as_mut().and_then(|k| k.take()) {
        Some(c) => Ok(c),
        None => match tokio::time::timeout(patience, target.connect()).await {
            Ok(connected) => connected.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "no answer to initialize in {} s",
                patience.as_secs()
            )),
        },
    };
    match open {
        Err(e) => {
            // the bridge would not start or answer: the test's first step failed on it
            let error = CallError::transport(e);
            let o = verdict::judge(
                &test.steps[0],
                Err(error),
                started.elapsed(),
                &mut Sent::default(),
            );
            outcomes.push(o.clone());
            steps[0].2 = Some(o);
        }
        Ok(conn) => {
            let mut sent = Sent::default();
            for (i, step) in test.steps.iter().enumerate() {
                let sent_step = run_step(&conn, adapter, step, &mut sent, extra_wait);
                let o = match super::otel::step(test, step, sent_step).await {
                    Ok(o) => o,
                    Err(why) => {
                        unsupported = Some(format!("step {i} ({}): {why}", step.tool));
                        steps[i].2 = Some(StepOutcome {
                            unsupported: Some(why),
                            ..Default::default()
                        });
                        break;
                    }
                };
                if session.is_none() {
                    session = o
                        .kernel
                        .as_ref()
                        .and_then(|k| k["session"].as_str().map(String::from));
                }
                let stop = !o.passed();
                outcomes.push(o.clone());
                steps[i].2 = Some(o);
                if stop {
                    break;
                }
            }
            let broken = outcomes.iter().any(|o| o.transport_lost);
            match kept {
                Some(k) if !broken => *k = Some(conn),
                _ => conn.close().await,
            }
        }
    }
    let judged = unsupported.is_none();
    let record = TestRecord {
        test_id: test.id.clone(),
        domain: test.domain.clone(),
        title: test.title.clone(),
        triage: judged.then(|| triage::triage(&outcomes)).flatten(),
        degraded: judged.then(|| triage::degraded(&outcomes)).flatten(),
        unsupported,
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
        runner: runner.to_string(),
        mcp_session: session,
        target: None,
        steps,
    };
    super::otel::test_end(test, &record);
    record
}

/// One step: sent (through the adapter when there is one) and judged; or
/// why the target cannot express it.
async fn run_step(
    conn: &super::target::Connection,
    adapter: Option<&Adapter>,
    step: &super::spec::Step,
    sent: &mut Sent,
    extra_wait: Duration,
) -> Result<StepOutcome, String> {
    let wait = Duration::from_millis(
        step.arguments
            .get("timeout_ms")
            .and_then(Value::as_u64)
            .unwrap_or(60_000),
    ) + extra_wait;
    let Some(adapter) = adapter else {
        let args: serde_json::Map<String, Value> = step.arguments.clone().into_iter().collect();
        let t0 = Instant::now();
        let answer = conn
            .call(&step.tool, args, wait, super::otel::step_meta())
            .await
            .map(|r| serde_json::to_value(r).unwrap_or(Value::Null));
        return Ok(verdict::judge(step, answer, t0.elapsed(), sent));
    };
    let prepared = adapter.prepare(step).map_err(|u| u.0)?;
    let call = serde_json::json!({"tool": prepared.tool, "arguments": prepared.arguments});
    let t0 = Instant::now();
    let answer = send_adapted(
        conn,
        adapter,
        step,
        (prepared.tool.clone(), prepared.arguments),
        wait,
        super::otel::step_meta(),
    )
    .await;
    let returned = answer.as_ref().ok().and_then(read_bytes);
    let mut o = verdict::judge(&prepared.judged, answer, t0.elapsed(), sent);
    o.unchecked = prepared.unchecked;
    o.target_call = Some(call);
    if let Some(got) = returned {
        cross_check(conn, adapter, step, &got, &mut o).await;
    }
    Ok(o)
}

/// The bytes a read_file result carries (its resource blob).
fn read_bytes(r: &Value) -> Option<Vec<u8>> {
    let blob = r["content"]
        .as_array()?
        .iter()
        .find_map(|b| b["resource"]["blob"].as_str())?;
    contract::bytes::base64_decode(blob).ok()
}

/// A read through a foreign server's file tool that came back different
/// from the bytes the test expects, where no earlier step sent them (the
/// workload made the file): the file is read again through the server's
/// own command tool as base64, a channel that carries any byte. When that
/// copy is what the test expects, the file tool mangled it: named on the
/// interface, with how.
async fn cross_check(
    conn: &super::target::Connection,
    adapter: &Adapter,
    step: &super::spec::Step,
    got: &[u8],
    o: &mut StepOutcome,
) {
    let (Some(want), Some(Value::String(path))) = (&step.expect.sha256, step.arguments.get("path"))
    else {
        return;
    };
    if step.tool != "read_file" || o.passed() || !o.interface.is_empty() {
        return;
    }
    let exec = super::spec::Step {
        tool: "exec".into(),
        arguments: [(
            "command".to_string(),
            Value::String(format!(
                "base64 -w0 -- {}",
                super::adapter::shell_quote(path)
            )),
        )]
        .into(),
        expect: Default::default(),
    };
    let Ok(p) = adapter.prepare(&exec) else {
        return; // no command tool: nothing to check with
    };
    let Ok(r) = send_adapted(
        conn,
        adapter,
        &exec,
        (p.tool, p.arguments),
        Duration::from_secs(60),
        super::otel::step_meta(),
    )
    .await
    else {
        return;
    };
    let s = &r["structuredContent"];
    let printed = s["stdout"]["text"].as_str().unwrap_or_default();
    let Ok(file) = contract::bytes::base64_decode(printed.trim()) else {
        return;
    };
    if !contract::bytes::sha256_hex(&file).eq_ignore_ascii_case(want) {
        return; // the file itself is not what the test expects
    }
    let how = super::mangle::describe(&file, got).map_or(String::new(), |m| {
        format!(": {} ({})", m.description, m.kind)
    });
    o.interface.push(format!(
        "read_file: the file holds the expected {} bytes (read again as base64 through the server's exec), the read tool returned {}{how}",
        file.len(),
        got.len()
    ));
    if o.interface_primitive.is_none() {
        o.interface_primitive = Some((InterfacePrimitive::Bytes, 0.9));
    }
}

/// Sends a step's first call and every follow-up the adapter maps; the
/// result in the bridge's shape. A follow-up that cannot be rendered (a
/// value it needs was not found) is left out: the missing values say so.
pub async fn send_adapted(
    conn: &super::target::Connection,
    adapter: &Adapter,
    step: &super::spec::Step,
    first: (String, serde_json::Map<String, Value>),
    wait: Duration,
    meta: Option<rmcp::model::RequestMetaObject>,
) -> Result<Value, CallError> {
    let mut results = Vec::new();
    let (mut tool, mut arguments) = first;
    let started = Instant::now();
    loop {
        let r = match conn
            .call(&tool, arguments.clone(), wait, meta.clone())
            .await
        {
            Ok(r) => r,
            // a follow-up that failed, answered with an error, broke its
            // connection or never answered: the calls before it may hold
            // why (the tab the OOM killer took, which the server then
            // waited on)
            Err(e) if !results.is_empty() => {
                let before: Vec<&Value> = results
                    .iter()
                    .filter_map(super::adapter::call_kernel)
                    .collect();
                // the failed call's evidence, or why it has none: either
                // way the step's last call failed
                let failed = e.kernel().cloned().unwrap_or_else(|| {
                    serde_json::json!({"available": false, "reason": e.to_string(),
                        "label": format!("tools/call {tool}")})
                });
                let kernel = super::adapter::step_kernel(&before, Some(&failed));
                return Err(e.with_kernel(kernel));
            }
            Err(e) => return Err(e),
        };
        let r = serde_json::to_value(r).unwrap_or(Value::Null);
        if adapter.again(&step.tool, results.len(), &r) && started.elapsed() < wait {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        results.push(r);
        match adapter.follow_up(step, &results) {
            Some(Ok(next)) => (tool, arguments) = next,
            // a value the next call needs is not in the answer
            Some(Err(e)) => {
                return Err(CallError::protocol(format!(
                    "adapter: the {tool} answer lacks what the next call needs: {}",
                    e.0
                )));
            }
            None => break,
        }
    }
    Ok(adapter.read(&step.tool, &results))
}

/// A bar on a terminal; otherwise a line every 10 % or 10 s.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: usize,
    /// Other runners share the run: `total` is what the run had left.
    shared: bool,
    done: AtomicUsize,
    started: Instant,
    last_line: Mutex<Instant>,
}

impl Progress {
    fn new(total: usize, quiet: bool, shared: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(total as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:40}] {pos}/{len} {per_sec} eta {eta} {msg}",
                )
                .expect("template")
                .progress_chars("=> "),
            );
            b
        });
        Progress {
            bar,
            total,
            shared,
            done: AtomicUsize::new(0),
            started: Instant::now(),
            last_line: Mutex::new(Instant::now()),
        }
    }

    fn tick(&self, r: &TestRecord, failed: usize) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(b) = &self.bar {
            b.inc(1);
            b.set_message(format!("{failed} failed"));
            return;
        }
        let mut last = self.last_line.lock().unwrap();
        let step = (self.total / 10).max(1);
        if done.is_multiple_of(step)
            || done == self.total
            || last.elapsed() >= Duration::from_secs(10)
        {
            *last = Instant::now();
            let secs = self.started.elapsed().as_secs_f64();
            let of = if self.shared {
                format!(" here (of {} left in the shared run at start)", self.total)
            } else {
                format!("/{}", self.total)
            };
            eprintln!(
                "progress: {done}{of} tests, {failed} failed, {secs:.0} s ({:.1} tests/s), last {}",
                done as f64 / secs.max(0.001),
                r.test_id
            );
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_the_suite_without_overlap() {
        let s = parse_shard("2/4").unwrap();
        assert_eq!(s, Shard { index: 2, count: 4 });
        let held: Vec<usize> = (0..10).filter(|&i| s.holds(i)).collect();
        assert_eq!(held, [1, 5, 9]);
        let every: usize = (1..=4)
            .map(|k| {
                (0..10)
                    .filter(|&i| Shard { index: k, count: 4 }.holds(i))
                    .count()
            })
            .sum();
        assert_eq!(every, 10);
        for bad in ["0/4", "5/4", "2", "a/4", "1/0"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }
}
