//! One daemon serving many containers (`cargo xtask bench --only hostd`):
//! eight campaign runners at once against one host daemon, each against a
//! bridge in a container of its own (four podman, four bubblewrap). The
//! baseline runs the same containers in the host's PID namespace
//! (`--pid=host`, bubblewrap without `--unshare-pid`), so the daemon serves
//! them as host clients; then each gets a PID namespace of its own, and the
//! daemon translates its every pid at the door and checks its every
//! request. Same machine, same suite, same root filesystems: the daemon's
//! CPU and the events it handled per second, and the ratio of the two.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::campaign::Lab;

/// The domains a minimal container's root can run (no compiler, no
/// browser): what the campaign's own tests use for containers too.
const DOMAINS: [&str; 3] = ["files", "process", "encoding"];

const RUNNERS: usize = 8;

/// What one phase of eight runners cost the daemon.
struct Phase {
    wall_s: f64,
    daemon_cpu_s: f64,
    events: u64,
    spans: u64,
    tests: u64,
    steps_without_kernel: u64,
}

/// The daemon's status as the host's CLI reads it.
fn status(lab: &Lab) -> anyhow::Result<Value> {
    let out = Command::new(lab.probe_bin())
        .args(["status", "--json", "--socket"])
        .arg(lab.socket())
        .output()?;
    if !out.status.success() {
        bail!(
            "probe status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// A suite of `count` generated tests, only [`DOMAINS`] kept.
fn suite(lab: &Lab, count: usize) -> anyhow::Result<(PathBuf, usize)> {
    let suite = lab.generate(count)?;
    for entry in std::fs::read_dir(&suite)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !DOMAINS.iter().any(|d| name.starts_with(&format!("{d}-"))) {
            std::fs::remove_file(&path)?;
        }
    }
    let n = std::fs::read_dir(&suite)?.count();
    Ok((suite, n))
}

/// Eight runners at once, runner `i` against a bridge under `wrapper(i)`.
fn phase(
    lab: &Lab,
    suite: &Path,
    name: &str,
    wrapper: impl Fn(usize) -> Vec<String>,
    socket_inside: &str,
) -> anyhow::Result<Phase> {
    let before = status(lab)?;
    let cpu_before = crate::campaign::cpu_seconds(lab.probe_pid());
    let started = Instant::now();
    let children: Vec<Child> = (0..RUNNERS)
        .map(|i| {
            let mut words = wrapper(i);
            words.push(lab.bridge_bin().display().to_string());
            words.extend(["serve", "--stdio", "--probe-socket", socket_inside].map(String::from));
            let db = lab.dir.join(format!("results-{name}-{i}.db"));
            Command::new(lab.bridge_bin())
                .args(["campaign", "run", "--suite"])
                .arg(suite)
                .arg("--target")
                .arg(format!("stdio:{}", words.join(" ")))
                .arg("--db")
                .arg(&db)
                .args(["--run", name, "--workers", "2", "--json", "--no-bar"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .context("starting a campaign runner")
        })
        .collect::<anyhow::Result<_>>()?;
    let (mut tests, mut without) = (0, 0);
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("{name}: a runner failed ({})", out.status);
        }
        let summary: Value = serde_json::from_slice(&out.stdout)?;
        if summary["complete"] != true {
            bail!("{name}: a runner's run is incomplete: {summary}");
        }
        tests += summary["recorded"].as_u64().unwrap_or(0);
        without += summary["steps_without_kernel"].as_u64().unwrap_or(0);
    }
    let wall_s = started.elapsed().as_secs_f64();
    let after = status(lab)?;
    let delta =
        |field: &str| after[field].as_u64().unwrap_or(0) - before[field].as_u64().unwrap_or(0);
    Ok(Phase {
        wall_s,
        daemon_cpu_s: crate::campaign::cpu_seconds(lab.probe_pid()) - cpu_before,
        events: delta("events_total"),
        spans: delta("spans_ended"),
        tests,
        steps_without_kernel: without,
    })
}

pub fn bench(count: usize) -> anyhow::Result<String> {
    let rootfs = crate::runtimes::install()?.rootfs;
    let lab = Lab::start("hostd-bench")?;
    let (suite, n) = suite(&lab, count)?;
    let sockdir = lab.socket().parent().context("the socket's directory")?;
    let inside = "/run/probe/probe.sock";
    let bridge_dir = lab.bridge_bin().parent().context("bin dir")?.to_owned();
    let podman = |own_pidns: bool| -> Vec<String> {
        [
            "podman",
            "run",
            "-i",
            "--rm",
            if own_pidns {
                "--pid=private"
            } else {
                "--pid=host"
            },
            "--runtime",
            "runc",
            "--network",
            "none",
            "--read-only",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=4096:4096",
            "-v",
            &format!("{}:/run/probe", sockdir.display()),
            "-v",
            &format!("{0}:{0}:ro", bridge_dir.display()),
            "--rootfs",
            &format!("{}:O", rootfs.display()),
        ]
        .map(String::from)
        .to_vec()
    };
    // /usr, /etc and the binaries, not the host's whole root: a recursive
    // bind of / takes in podman containers' mounts that come and go
    let bwrap = |own_pidns: bool| -> Vec<String> {
        // the private /tmp first: the workspace may live under /tmp
        let mut words: Vec<String> = vec![
            "bwrap".into(),
            "--die-with-parent".into(),
            "--tmpfs".into(),
            "/tmp".into(),
        ];
        if own_pidns {
            words.push("--unshare-pid".into());
        }
        let bin = bridge_dir.display().to_string();
        for dir in ["/usr", "/etc", bin.as_str()] {
            words.extend(["--ro-bind".into(), dir.to_string(), dir.to_string()]);
        }
        for link in ["/bin", "/sbin", "/lib", "/lib64"] {
            match std::fs::read_link(link) {
                Ok(target) => words.extend([
                    "--symlink".into(),
                    target.display().to_string(),
                    link.to_string(),
                ]),
                Err(_) => words.extend(["--ro-bind-try".into(), link.into(), link.into()]),
            }
        }
        words.extend(
            [
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--bind",
                &sockdir.display().to_string(),
                "/run/probe",
            ]
            .map(String::from),
        );
        words
    };
    let containers = |own_pidns: bool| {
        move |i: usize| {
            if i.is_multiple_of(2) {
                podman(own_pidns)
            } else {
                bwrap(own_pidns)
            }
        }
    };
    eprintln!("hostd: {RUNNERS} runners × {n} tests, containers in the host's PID namespace");
    let host = phase(&lab, &suite, "host", containers(false), inside)?;
    eprintln!("hostd: {RUNNERS} runners × {n} tests, containers of their own PID namespace");
    let contained = phase(&lab, &suite, "containers", containers(true), inside)?;
    let clients = status(&lab)?["clients"].clone();
    if clients["forbidden"] != 0 {
        bail!("the containers' own requests were refused: {clients}");
    }
    for (name, p) in [("host", &host), ("containers", &contained)] {
        if p.steps_without_kernel > 0 || p.tests != (RUNNERS * n) as u64 {
            bail!(
                "{name}: {} of {} tests recorded, {} steps without kernel evidence",
                p.tests,
                RUNNERS * n,
                p.steps_without_kernel
            );
        }
    }
    let row = |label: &str, p: &Phase| {
        format!(
            "| {label} | {} | {:.1} | {} | {} | {:.2} | {:.0} | {:.2} |\n",
            p.tests,
            p.wall_s,
            p.spans,
            p.events,
            p.daemon_cpu_s,
            p.events as f64 / p.wall_s,
            p.daemon_cpu_s * 1e3 / p.spans.max(1) as f64,
        )
    };
    let per_span = |p: &Phase| p.daemon_cpu_s / p.spans.max(1) as f64;
    let per_cpu = |p: &Phase| p.events as f64 / p.daemon_cpu_s.max(1e-9);
    Ok(format!(
        "## One daemon, many containers\n\n\
         `cargo xtask bench --only hostd`: one host daemon serving {RUNNERS} campaign runners \
         at once (2 workers each, {n} tests of the files, process and encoding domains \
         each), each against a bridge in a container (4 podman with runc, 4 bubblewrap). \
         The baseline runs those containers in the host's PID namespace (`--pid=host`, \
         bubblewrap without `--unshare-pid`): the daemon serves them as host clients. Then \
         each container has a PID namespace of its own: the daemon translates its every pid \
         at the door (`NSpid`) and checks its every request against its sandbox. Every step \
         of both runs had kernel evidence; no request of a container was refused.\n\n\
         | containers | tests | wall s | spans | events | daemon CPU s | events/s | daemon CPU ms per span |\n\
         |---|---|---|---|---|---|---|---|\n\
         {}{}\n\
         Daemon CPU per span, confined / baseline: **{:.2}×** (the translation at the door \
         and the sandbox checks included); events handled per daemon CPU second: {:.0} in \
         the baseline, {:.0} confined (**{:.2}×**). Events per wall second is the load the \
         runs put on the daemon, not its capacity.\n",
        row("in the host's PID namespace (baseline)", &host),
        row("each in its own PID namespace", &contained),
        per_span(&contained) / per_span(&host).max(1e-9),
        per_cpu(&host),
        per_cpu(&contained),
        per_cpu(&contained) / per_cpu(&host).max(1e-9),
    ))
}
