//! The gVisor benchmark (`cargo xtask bench --only gvisor`): what the probe
//! as a sandbox's runtime monitor costs, as the ratio of the same runsc
//! command monitored (`probe trace --gvisor`) to bare, alternated in one
//! run. Most of the cost is gVisor's own: a point per syscall exit the
//! session enables, successes included.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::bench::median;

/// The workloads: a sandbox that does nothing, an interpreter's start (many
/// lookups it gets past), and a loop of failing commands (a fork, an exec
/// and a failed open each).
const WORKLOADS: [(&str, &str); 3] = [
    ("`true`", "true"),
    (
        "`python3 -c 'import json, sqlite3, ssl'`",
        "python3 -c 'import json, sqlite3, ssl'",
    ),
    (
        "200 × `cat /missing` in a shell loop",
        "for i in $(seq 200); do cat /nonexistent 2>/dev/null; done; true",
    ),
];

fn once(probe: Option<&Path>, script: &str) -> anyhow::Result<(f64, serde_json::Value)> {
    let mut cmd = match probe {
        Some(p) => {
            let mut c = Command::new(p);
            c.args(["trace", "--gvisor", "--json", "--", "runsc"]);
            c
        }
        None => Command::new("runsc"),
    };
    cmd.args(["--network=none", "do", "sh", "-c", script]);
    let started = Instant::now();
    let out = cmd
        .stderr(Stdio::null())
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
        let (mut bare, mut monitored) = (Vec::new(), Vec::new());
        let mut last = serde_json::Value::Null;
        for _ in 0..runs {
            bare.push(once(None, script)?.0);
            let (secs, json) = once(Some(&probe), script)?;
            monitored.push(secs);
            last = json;
        }
        if last["source"] != "gvisor" || last["primitive"] != "none" {
            bail!("{label}: the monitored run was not a clean gVisor span: {last}");
        }
        let (b, m) = (median(bare), median(monitored));
        let events: u64 = last["counts"]
            .as_object()
            .map(|o| o.values().filter_map(|v| v.as_u64()).sum())
            .unwrap_or(0);
        rows.push_str(&format!(
            "| {label} | {:.0} ms | {:.0} ms | {:.2}× | {events} | {} |\n",
            b * 1e3,
            m * 1e3,
            m / b,
            last["drops"]["kernel"].as_u64().unwrap_or(0),
        ));
    }
    Ok(format!(
        "## gVisor monitoring\n\n\
         `cargo xtask bench --only gvisor`: the same `runsc --network=none do sh -c …` bare and \
         under `probe trace --gvisor` (release build), alternated, {runs} runs each, medians of \
         wall time from the command's start to its exit (runsc's start and the sandbox's \
         teardown included). {version}. Events: what the monitored run's span counted (points \
         that made an event: failures, forks, execs, exits, opens for writing); drops: points \
         runsc could not send.\n\n\
         | workload | bare | monitored | ratio | events | drops |\n|---|---:|---:|---:|---:|---:|\n\
         {rows}\n\
         The cost is mostly gVisor's: the Sentry sends a point for every exit of an enabled \
         syscall, successes included (an interpreter's start opens and stats hundreds of files), \
         and the probe decodes each one as it comes.\n\n"
    ))
}
