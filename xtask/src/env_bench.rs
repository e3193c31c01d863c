//! The environment snapshot's cost (`cargo xtask bench --only env`): how
//! long `probe env --json` takes and how big its document is, on the host,
//! with a PATH of 5,000 directories, and inside a bubblewrap sandbox; as
//! a ratio against the same binary doing nothing (`probe --version`) in
//! the same run.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail};

/// Runs of each row; the median and the slowest are reported.
const RUNS: usize = 21;

struct Row {
    label: &'static str,
    median_ms: f64,
    max_ms: f64,
    bytes: usize,
    facets: usize,
    unreadable: usize,
}

fn time(label: &'static str, mut cmd: impl FnMut() -> Command) -> anyhow::Result<Row> {
    let mut ms = Vec::with_capacity(RUNS);
    let mut last = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let out = cmd()
            .output()
            .with_context(|| format!("{label}: cannot start"))?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        if !out.status.success() {
            bail!("{label}: {}", String::from_utf8_lossy(&out.stderr));
        }
        last = out.stdout;
    }
    ms.sort_by(f64::total_cmp);
    let doc: serde_json::Value = serde_json::from_slice(&last).unwrap_or_default();
    let facets = doc["facets"].as_object().map_or(0, |f| f.len());
    let unreadable = doc["facets"].as_object().map_or(0, |f| {
        f.values()
            .map(|v| v["unreadable"].as_object().map_or(0, |u| u.len()))
            .sum()
    });
    Ok(Row {
        label,
        median_ms: ms[RUNS / 2],
        max_ms: ms[RUNS - 1],
        bytes: last.len(),
        facets,
        unreadable,
    })
}

pub fn bench(bin: &Path) -> anyhow::Result<String> {
    let probe = bin.join("probe");
    let base = time("`probe --version` (baseline: start and exit)", || {
        let mut c = Command::new(&probe);
        c.arg("--version");
        c
    })?;
    let host = time("`probe env --json` on the host", || {
        let mut c = Command::new(&probe);
        c.args(["env", "--json"]);
        c
    })?;
    // the system's directories first, as a real PATH has them, then
    // thousands more that a name is looked up in before it is called absent
    let long_path: String = std::iter::once("/usr/bin:/bin".to_string())
        .chain((0..5000).map(|i| format!("/nonexistent/bench-{i}")))
        .collect::<Vec<_>>()
        .join(":");
    let path = time("… with a PATH of 5,000 directories", || {
        let mut c = Command::new(&probe);
        c.args(["env", "--json"]).env("PATH", &long_path);
        c
    })?;
    let mut rows = vec![base, host, path];
    if Path::new("/usr/bin/bwrap").exists() {
        let p = probe.display().to_string();
        let dir = bin.display().to_string();
        rows.push(time(
            "… inside bubblewrap (no network, private /tmp)",
            || {
                let mut c = Command::new("bwrap");
                c.args([
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--tmpfs",
                    "/tmp",
                ])
                // the binary again over the private /tmp: the workspace may live under /tmp
                .args(["--ro-bind", dir.as_str(), dir.as_str()])
                .args(["--unshare-net", "--unshare-pid", "--die-with-parent", "--"])
                .args([p.as_str(), "env", "--json"]);
                c
            },
        )?);
    }
    let baseline = rows[0].median_ms.max(1e-3);
    let mut out = String::from(
        "## Environment snapshot\n\n\
         `cargo xtask bench --only env`: `probe env --json` (the release build) run 21 times \
         each way, one after another; the median and the slowest wall time, the document's \
         size, its facets and the items it could not read. The baseline is the same binary \
         starting and exiting (`probe --version`), in the same run.\n\n\
         | what | median ms | slowest ms | × baseline | bytes | facets | unreadable |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1}× | {} | {} | {} |\n",
            r.label,
            r.median_ms,
            r.max_ms,
            r.median_ms / baseline,
            r.bytes,
            r.facets,
            r.unreadable
        ));
    }
    out.push_str(
        "\nMost of the time is the version lines of the commands found (each `--version` runs \
         in parallel, cut at 2 s); a PATH of thousands of entries is searched once per name, \
         its first 256 directories only (said in the snapshot), so it costs little more.\n",
    );
    Ok(out)
}
