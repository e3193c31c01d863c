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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use super::adapter::Adapter;
use super::db::{self, RunRow, TestRecord};
use super::spec::TestSpec;
use super::target::{CallError, Target};
use super::triage;
use super::upstream::Upstream;
use super::validate;
use super::verdict::{self, Sent};

pub struct Options {
    pub suite: PathBuf,
    pub target: Target,
    pub workers: usize,
    pub db: PathBuf,
    /// Name of the run (shards of one run share it).
    pub run: Option<String>,
    pub label: Option<String>,
    /// (i, n): this process runs the tests whose index is i-1 modulo n.
    pub shard: Option<(usize, usize)>,
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
    /// Run → test → step spans over OTLP (`--otlp URL`).
    pub otlp: Option<Arc<super::otel::Tracer>>,
}

/// What a runner process did.
#[derive(Debug, Default, serde::Serialize)]
pub struct Summary {
    pub run: String,
    pub suite_tests: usize,
    pub skipped_files: usize,
    pub already_recorded: usize,
    pub this_process: usize,
    pub recorded: usize,
    pub passed: usize,
    pub failed: usize,
    /// Passed, but a step ran past its max_duration_ms or stalled on memory.
    pub degraded: usize,
    /// A step the target cannot express (through its adapter) stopped the test.
    pub unsupported: usize,
    pub complete: bool,
    pub wall_s: f64,
    /// This runner process's own CPU time and peak RSS (not the bridges').
    pub runner_cpu_s: f64,
    pub runner_max_rss_mib: f64,
    /// Steps the bridge ran without kernel evidence, and the first reason it gave.
    pub steps_without_kernel: usize,
    pub kernel_unavailable_reason: Option<String>,
}

/// Parses `i/n` (1-based).
pub fn parse_shard(s: &str) -> Result<(usize, usize), String> {
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
    Ok((i, n))
}

/// A digest of the suite's tests, so a resume or a shard runs the same suite.
fn digest(tests: &[TestSpec]) -> String {
    let mut h = Sha256::new();
    for t in tests {
        h.update(serde_json::to_vec(t).expect("JSON"));
        h.update(b"\n");
    }
    crate::bytes::sha256_hex(&h.finalize())
}

pub async fn run(o: Options) -> anyhow::Result<Summary> {
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
    let conn = db::open(&o.db)?;
    let upstream = Arc::new(
        Upstream::start(o.upstream_host)
            .await
            .context("the campaign's local upstream (stands in for the internet)")?,
    );
    // fail fast when the target cannot start at all; learn what a bridge
    // injects, or check that a foreign server has every tool the adapter maps
    let probe = o
        .target
        .connect()
        .await
        .map_err(anyhow::Error::msg)
        .context("the target does not answer")?;
    let (profile, injected) = match &o.adapter {
        None => probe
            .sandbox()
            .await
            .map_err(|e| anyhow::anyhow!("sandbox_info: {e}"))?,
        Some(adapter) => {
            let tools = probe
                .list_tools()
                .await
                .map_err(|e| anyhow::anyhow!("tools/list: {e}"))?;
            let problems = super::adapter_check::problems(adapter, &tools);
            if !problems.is_empty() {
                bail!(
                    "{}: the target lacks what the adapter maps:\n  {}",
                    adapter.file.display(),
                    problems.join("\n  ")
                );
            }
            (None, None)
        }
    };
    probe.close().await;
    let run = open_run(&conn, &o, &suite.tests, profile, injected)?;
    let done = db::recorded(&conn, &run.id)?;
    let todo: VecDeque<TestSpec> = suite
        .tests
        .iter()
        .enumerate()
        .filter(|(i, _)| o.shard.is_none_or(|(k, n)| i % n == k - 1))
        .filter(|(_, t)| !done.contains(&t.id))
        .map(|(_, t)| t.clone())
        .collect();
    let mut summary = Summary {
        run: run.id.clone(),
        suite_tests: suite.tests.len(),
        skipped_files: suite.files - suite.tests.len(),
        already_recorded: done.len(),
        this_process: todo.len(),
        ..Summary::default()
    };
    eprintln!(
        "run {}: {} tests in the suite, {} already recorded, {} to run here with {} workers against {}\nupstream: {}",
        run.id,
        suite.tests.len(),
        done.len(),
        todo.len(),
        o.workers,
        o.target,
        upstream.describe()
    );

    let (written, was_interrupted) = execute(conn, &run.id, todo, &o, &upstream).await;
    let counts = written?;
    summary.recorded = counts.recorded;
    summary.steps_without_kernel = counts.without_kernel;
    summary.kernel_unavailable_reason = counts.kernel_reason;
    summary.passed = counts.passed;
    summary.degraded = counts.degraded;
    summary.unsupported = counts.unsupported;
    summary.failed = counts.recorded - counts.passed - counts.degraded - counts.unsupported;
    let conn = db::open(&o.db)?;
    summary.complete = db::finish_if_complete(&conn, &run.id)?;
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
    Ok(summary)
}

/// Runs `todo` on the workers; the writer stores what they send. Returns
/// the writer's counts (or why it stopped) and whether Ctrl-C stopped it.
async fn execute(
    mut conn: rusqlite::Connection,
    run_id: &str,
    todo: VecDeque<TestSpec>,
    o: &Options,
    upstream: &Arc<Upstream>,
) -> (anyhow::Result<Counts>, bool) {
    let total = todo.len();
    let queue = Arc::new(Mutex::new(todo));
    let stop = CancellationToken::new();
    let (tx, rx) = std::sync::mpsc::channel::<TestRecord>();
    let progress = Progress::new(total, o.quiet);
    let writer = {
        let (run_id, stop) = (run_id.to_string(), stop.clone());
        std::thread::spawn(move || write_all(&mut conn, &run_id, rx, &stop, progress))
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
    for w in 0..o.workers.max(1) {
        let (queue, tx, stop, target) = (queue.clone(), tx.clone(), stop.clone(), o.target.clone());
        let adapter = o.adapter.clone();
        let upstream = upstream.clone();
        let runner = format!("{}/w{w}", std::process::id());
        let reuse = o.reuse_sessions;
        let otlp = o.otlp.clone();
        workers.push(tokio::spawn(async move {
            let mut session = None;
            loop {
                let Some(test) = queue.lock().unwrap().pop_front() else {
                    break;
                };
                let test = upstream.bind(&test);
                let record = tokio::select! {
                    r = super::otel::scope(otlp.clone(), run_test(&target, adapter.as_deref(), &test, &runner, reuse.then_some(&mut session))) => r,
                    () = stop.cancelled() => break,
                };
                if tx.send(record).is_err() {
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
    (written, was_interrupted)
}

/// The run to record into: a new one, the one to resume, or the one a
/// shard shares; refused when it was made from another suite.
fn open_run(
    conn: &rusqlite::Connection,
    o: &Options,
    tests: &[TestSpec],
    profile: Option<String>,
    injected: Option<String>,
) -> anyhow::Result<RunRow> {
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
        target: o.target.to_string(),
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
        db::run(conn, id)?
            .with_context(|| format!("--resume {id}: no such run in {}", o.db.display()))?
    } else {
        let (run, created) = db::create_run(conn, &wanted)?;
        if !created && o.shard.is_none() {
            bail!(
                "run `{}` already exists in {}: continue it with --resume {0}, or pick another --run",
                run.id,
                o.db.display()
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
    without_kernel: usize,
    kernel_reason: Option<String>,
}

/// The one writer: stores each record, stops the run on a DB error
/// (everything committed before it stays).
fn write_all(
    conn: &mut rusqlite::Connection,
    run: &str,
    rx: std::sync::mpsc::Receiver<TestRecord>,
    stop: &CancellationToken,
    progress: Progress,
) -> anyhow::Result<Counts> {
    let mut counts = Counts::default();
    for record in rx {
        if let Err(e) = db::insert(conn, run, &record) {
            stop.cancel();
            progress.finish();
            bail!(
                "cannot record test {} ({e}); the run stopped, the {} tests recorded before it are kept: continue with --resume {run}",
                record.test_id,
                counts.recorded
            );
        }
        counts.recorded += 1;
        for o in record.steps.iter().filter_map(|(_, _, o)| o.as_ref()) {
            if let Some(reason) = &o.kernel_unavailable {
                counts.without_kernel += 1;
                counts.kernel_reason.get_or_insert_with(|| reason.clone());
            }
        }
        match (&record.triage, &record.degraded) {
            _ if record.unsupported.is_some() => counts.unsupported += 1,
            (None, None) => counts.passed += 1,
            (None, Some(_)) => counts.degraded += 1,
            (Some(_), _) => {}
        }
        progress.tick(
            &record,
            counts.recorded - counts.passed - counts.degraded - counts.unsupported,
        );
    }
    progress.finish();
    Ok(counts)
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
) -> TestRecord {
    let started = Instant::now();
    super::otel::test_begin();
    let mut steps: Vec<(String, Value, Option<verdict::StepOutcome>)> = test
        .steps
        .iter()
        .map(|s| (s.tool.clone(), verdict::stored_request(s), None))
        .collect();
    let mut outcomes = Vec::new();
    let mut session = None;
    let mut unsupported = None;
    let open = match kept.as_mut().and_then(|k| k.take()) {
        Some(c) => Ok(c),
        None => target.connect().await,
    };
    match open {
        Err(e) => {
            // the bridge would not start or answer: the test's first step failed on it
            let error = CallError::Transport(e);
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
                let sent_step = run_step(&conn, adapter, step, &mut sent);
                let o = match super::otel::step(test, step, sent_step).await {
                    Ok(o) => o,
                    Err(why) => {
                        unsupported = Some(format!("step {i} ({}): {why}", step.tool));
                        steps[i].2 = Some(verdict::StepOutcome {
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
) -> Result<verdict::StepOutcome, String> {
    let wait = Duration::from_millis(
        step.arguments
            .get("timeout_ms")
            .and_then(Value::as_u64)
            .unwrap_or(60_000)
            + 30_000,
    );
    let Some(adapter) = adapter else {
        let args: serde_json::Map<String, Value> = step.arguments.clone().into_iter().collect();
        let t0 = Instant::now();
        let answer = conn
            .call(&step.tool, args, wait)
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
    crate::bytes::base64_decode(blob).ok()
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
    o: &mut verdict::StepOutcome,
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
    )
    .await
    else {
        return;
    };
    let s = &r["structuredContent"];
    let printed = s["stdout"]["text"].as_str().unwrap_or_default();
    let Ok(file) = crate::bytes::base64_decode(printed.trim()) else {
        return;
    };
    if !crate::bytes::sha256_hex(&file).eq_ignore_ascii_case(want) {
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
        o.interface_primitive = Some(("interface.bytes", 0.9));
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
) -> Result<Value, CallError> {
    let mut results = Vec::new();
    let (mut tool, mut arguments) = first;
    let started = Instant::now();
    loop {
        let r = conn.call(&tool, arguments.clone(), wait).await?;
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
                return Err(CallError::Protocol(format!(
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
    done: AtomicUsize,
    started: Instant,
    last_line: Mutex<Instant>,
}

impl Progress {
    fn new(total: usize, quiet: bool) -> Progress {
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
            eprintln!(
                "progress: {done}/{} tests, {failed} failed, {secs:.0} s ({:.1} tests/s), last {}",
                self.total,
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
