//! `cargo xtask soak --minutes N`: the daemon, `agent-bridge serve` (over
//! HTTP, and over stdio under every fault profile) and `agent-bridge proxy`
//! under continuous load for N minutes, with hostile clients mixed in, a
//! `kill -9` of each process at a planned moment and the evidence DB's
//! filesystem filled to its last megabyte once. Every `--interval` seconds
//! it samples each process (RSS, fds, threads) and the daemon (open spans,
//! events, drops, DB and WAL); at the end it checks what must hold and
//! writes SOAK.md with a plot of each series.
//!
//! One job per module: [`fleet`] starts, kills and restarts the processes;
//! [`load`] drives them (campaign loops, hostile clients); [`sample`]
//! reads their figures; [`checks`] are the planned moments and what each
//! must show; [`report`] fits slopes and writes the Markdown and SVGs.

mod checks;
mod fleet;
mod load;
mod report;
pub mod sample;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

pub use fleet::Fleet;

pub struct Options {
    /// How long the load runs.
    pub minutes: f64,
    /// Seconds between samples.
    pub interval_s: u64,
    /// The directory holding `probe` and `agent-bridge`.
    pub bin: PathBuf,
    /// Work directory (wiped first).
    pub dir: PathBuf,
    /// Where SOAK.md and its plots go.
    pub out: PathBuf,
    /// Tests in the generated suite each campaign loop runs.
    pub count: usize,
}

/// The planned moments, as fractions of the run. The kills come early so
/// each process's last life spans most of the run: its series are judged
/// over that life's second half, past a warm-up that can be long (the
/// daemon's RSS rose for 20 minutes after a restart in the 60-minute run).
const KILL_DAEMON_AT: f64 = 0.10;
const KILL_BRIDGE_AT: f64 = 0.15;
const KILL_PROXY_AT: f64 = 0.20;
const FILL_DISK_AT: f64 = 0.75;

/// A shorter run is all warm-up: its slopes are shown, not judged.
pub const JUDGED_FROM_MINUTES: f64 = 30.0;

/// Whether a run of `minutes` judges its series' growth.
pub fn judges_growth(minutes: f64) -> bool {
    minutes >= JUDGED_FROM_MINUTES
}

/// Runs the soak; fails when a check failed (and, for a run of 30 minutes
/// or more, when a series grows). SOAK.md is written either way.
pub fn run(o: &Options) -> anyhow::Result<()> {
    if !crate::is_root() {
        bail!("the soak loads the probe's eBPF programs and mounts a tmpfs: run it as root");
    }
    // a soak killed before its end leaves its tmpfs mounted
    let _ = std::process::Command::new("umount")
        .arg(o.dir.join("fs"))
        .stderr(std::process::Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(&o.dir);
    std::fs::create_dir_all(&o.dir)?;
    let suite = o.dir.join("suite");
    crate::campaign::generate(&o.bin.join("agent-bridge"), o.count, &suite)?;
    // the browser domain needs Chromium and a second per test: the soak
    // is about the processes, which the other nine domains drive alike
    for e in std::fs::read_dir(&suite)? {
        let p = e?.path();
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("browser-"))
        {
            std::fs::remove_file(p)?;
        }
    }
    let tests = std::fs::read_dir(&suite)?.count();
    let fleet = Arc::new(Fleet::start(&o.bin, &o.dir).context("starting the processes")?);
    let started = Instant::now();
    let total = Duration::from_secs_f64(o.minutes * 60.0);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample::Sampler::spawn(
        Arc::clone(&fleet),
        Duration::from_secs(o.interval_s),
        started,
        Arc::clone(&stop),
    );
    let drivers = load::Drivers::spawn(&fleet, &suite, tests, &o.dir, Arc::clone(&stop));
    let mut timeline = checks::Timeline::new(started);
    let at = |f: f64| total.mul_f64(f);
    let plan: [(f64, checks::Moment); 4] = [
        (KILL_DAEMON_AT, checks::Moment::Kill(fleet::Role::Daemon)),
        (KILL_BRIDGE_AT, checks::Moment::Kill(fleet::Role::Bridge)),
        (KILL_PROXY_AT, checks::Moment::Kill(fleet::Role::Proxy)),
        (FILL_DISK_AT, checks::Moment::FullDisk),
    ];
    for (fraction, moment) in plan {
        sleep_until(started + at(fraction), &stop);
        eprintln!(
            "xtask: soak: {:.0} s: {}",
            started.elapsed().as_secs_f64(),
            moment.name()
        );
        timeline.run(&fleet, &moment);
    }
    sleep_until(started + total, &stop);
    eprintln!("xtask: soak: load stops; the campaign loops finish their runs");
    stop.store(true, Ordering::SeqCst);
    let load = drivers.join();
    let samples = sampler.join();
    timeline.finish(&fleet, &load);
    let clock = checks::clock_step();
    let report = report::Report {
        minutes: o.minutes,
        interval_s: o.interval_s,
        tests,
        samples: &samples,
        timeline: &timeline,
        load: &load,
        clock: &clock,
    };
    let grows = report.write(&o.out)?;
    drop(fleet);
    let failed: Vec<&checks::Check> = timeline.checks.iter().filter(|c| !c.passed).collect();
    let judged = judges_growth(o.minutes);
    eprintln!(
        "xtask: soak: {} checks, {} failed; {} series {}; report: {}",
        timeline.checks.len(),
        failed.len(),
        grows.len(),
        if judged {
            "grow"
        } else {
            "rise (not judged: the run is shorter than its warm-ups)"
        },
        o.out.join("SOAK.md").display()
    );
    for c in &failed {
        eprintln!("xtask: soak: FAILED: {}: {}", c.what, c.detail);
    }
    if !failed.is_empty() {
        bail!("the soak failed {} of its checks", failed.len());
    }
    if judged && !grows.is_empty() {
        bail!(
            "over {} minutes, these grow: {}",
            o.minutes,
            grows.join(", ")
        );
    }
    Ok(())
}

/// Sleeps until `when`, or until `stop` is set.
fn sleep_until(when: Instant, stop: &AtomicBool) {
    while Instant::now() < when && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(
            when.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(500)),
        );
    }
}
