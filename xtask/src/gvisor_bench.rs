//! The gVisor benchmark (`cargo xtask bench --only gvisor`): what the probe
//! as a sandbox's runtime monitor costs, as the ratio of the same runsc
//! command monitored (`probe trace --gvisor`) to bare, alternated in one
//! run. Most of the cost is gVisor's own: a point per syscall exit the
//! session enables, successes included. The same again with the session's
//! read/write/close exits (`--io-points writes`, `all`): the numbers behind
//! leaving them off by default.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::bench::median;

/// The workloads: a sandbox that does nothing, an interpreter's start (many
/// lookups it gets past), a loop of failing commands (a fork, an exec and
/// a failed open each), and a copy in small blocks (a read and a write
/// each: the case read/write points cost most).
const WORKLOADS: [(&str, &str); 4] = [
    ("`true`", "true"),
    (
        "`python3 -c 'import json, sqlite3, ssl'`",
        "python3 -c 'import json, sqlite3, ssl'",
    ),
    (
        "200 × `cat /missing` in a shell loop",
        "for i in $(seq 200); do cat /nonexistent 2>/dev/null; done; true",
    ),
    (
        "`dd bs=512 count=20000` (20,000 reads and writes)",
        "dd if=/dev/zero of=/tmp/out bs=512 count=20000 2>/dev/null",
    ),
];

/// The sessions compared: the default, and with read/write/close exits.
const IO_POINTS: [&str; 3] = ["none", "writes", "all"];

/// One run: bare (`probe` None) or monitored with a session's io points.
fn once(probe: Option<(&Path, &str)>, script: &str) -> anyhow::Result<(f64, serde_json::Value)> {
    let mut cmd = match probe {
        Some((p, io)) => {
            let mut c = Command::new(p);
            c.args([
                "trace",
                "--gvisor",
                "--io-points",
                io,
                "--json",
                "--",
                "runsc",
            ]);
            c
        }
        None => Command::new("runsc"),
    };
    cmd.args(["--network=none", "do", "sh", "-c", script]);
    let started = Instant::now();
    // pipes, never /dev/null: runsc chowns its stdio to its sandbox's user
    let out = cmd
        .stdin(Stdio::piped())
        .output()
        .context("running runsc (cargo xtask setup installs it)")?;
    let secs = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("`{script}` under runsc failed: {}", out.status);
    }
    let json = if probe.is_some() {
        serde_json::from_slice(&out.stdout).context("probe trace --gvisor --json")?
    } else {
        serde_json::Value::Null
    };
    Ok((secs, json))
}

pub fn bench(probe_dir: &Path, runs: usize) -> anyhow::Result<String> {
    let probe = probe_dir.join("probe");
    let version = Command::new("runsc").arg("--version").output()?;
    let version = String::from_utf8_lossy(&version.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let runs = runs.max(5);
    let mut rows = String::new();
    for (label, script) in WORKLOADS {
        // warm the page cache and runsc's first start
        once(None, script)?;
        let mut bare = Vec::new();
        let mut monitored: [Vec<f64>; 3] = Default::default();
        let mut last: [serde_json::Value; 3] = Default::default();
        for _ in 0..runs {
            bare.push(once(None, script)?.0);
            for (i, io) in IO_POINTS.iter().enumerate() {
                let (secs, json) = once(Some((&probe, io)), script)?;
                monitored[i].push(secs);
                last[i] = json;
            }
        }
        for (io, json) in IO_POINTS.iter().zip(&last) {
            if json["source"] != "gvisor" || json["primitive"] != "none" {
                bail!(
                    "{label}, --io-points {io}: the monitored run was not a clean gVisor span: {json}"
                );
            }
        }
        let b = median(bare);
        let cells: Vec<String> = monitored
            .into_iter()
            .map(|m| {
                let m = median(m);
                format!("{:.0} ms ({:.2}×)", m * 1e3, m / b)
            })
            .collect();
        let events = |j: &serde_json::Value| -> u64 {
            j["counts"]
                .as_object()
                .map(|o| o.values().filter_map(|v| v.as_u64()).sum())
                .unwrap_or(0)
        };
        let drops: u64 = last
            .iter()
            .map(|j| j["drops"]["kernel"].as_u64().unwrap_or(0))
            .sum();
        rows.push_str(&format!(
            "| {label} | {:.0} ms | {} | {} | {} | {} | {drops} |\n",
            b * 1e3,
            cells[0],
            cells[1],
            cells[2],
            last.iter()
                .map(|j| events(j).to_string())
                .collect::<Vec<_>>()
                .join(" / "),
        ));
    }
    Ok(format!(
        "## gVisor monitoring\n\n\
         `cargo xtask bench --only gvisor`: the same `runsc --network=none do sh -c …` bare and \
         under `probe trace --gvisor` (release build) with `--io-points none`, with `--io-points \
         writes` (the default: the exits of write, writev, pwrite64, pwritev, pwritev2) and with \
         `--io-points all` (also read, readv, pread64, preadv, preadv2, close; each with the path \
         behind its fd), alternated, {runs} runs each, medians of wall time from the command's \
         start to its exit (runsc's start and the sandbox's teardown included), and each as a \
         ratio to bare. {version}. Events: what the monitored run's span counted, per session \
         (points that made an event: failures, forks, execs, exits, opens for writing); drops: \
         points runsc could not send, over the three.\n\n\
         | workload | bare | `--io-points none` | `writes` (the default) | `all` | events | drops |\n\
         |---|---:|---:|---:|---:|---:|---:|\n\
         {rows}\n\
         The cost is mostly gVisor's: the Sentry sends a point for every exit of an enabled \
         syscall, successes included (an interpreter's start opens and stats hundreds of files), \
         and the probe decodes each one as it comes. A successful read or write makes no event, \
         so the events do not change; the time does, with the number of calls.\n\n"
    ))
}
