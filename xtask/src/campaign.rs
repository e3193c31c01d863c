//! The campaign jobs: the main job (`cargo xtask demo`), the confusion
//! matrix (`cargo xtask confusion`) and the campaign benchmark. Each starts
//! a probe daemon and bridges over Streamable HTTP on loopback, and drives
//! `agent-bridge campaign …` as a user would.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::KillOnDrop;

/// CPU seconds and peak RSS (MiB) of a live process, from /proc.
fn usage(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // fields after the command name: utime is the 14th field, stime the 15th
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = (ticks(11) + ticks(12)) / hz;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    (cpu, hwm_kib / 1024.0)
}

/// The CPU seconds process `pid` has used so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    usage(pid).0
}

/// `BRIDGE campaign ARGS…`, its stdout returned, stderr shown.
pub fn campaign_cli(bridge: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(bridge)
        .arg("campaign")
        .args(args)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("agent-bridge campaign {} failed", args.join(" "));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The default suite: `count` tests, seed 1, written to `out`.
pub fn generate(bridge: &Path, count: usize, out: &Path) -> anyhow::Result<()> {
    campaign_cli(
        bridge,
        &[
            "generate",
            "--count",
            &count.to_string(),
            "--seed",
            "1",
            "--out",
            out.to_str().context("a UTF-8 path")?,
        ],
    )
    .map(|_| ())
}

pub struct Lab {
    bin: PathBuf,
    pub dir: PathBuf,
    socket: PathBuf,
    probe: KillOnDrop,
}

impl Lab {
    /// A fresh directory under target/, a release build and a probe daemon.
    pub fn start(name: &str) -> anyhow::Result<Lab> {
        Lab::start_with(name, "")
    }

    /// [`Lab::start`] with a daemon config file of this TOML.
    pub fn start_with(name: &str, config: &str) -> anyhow::Result<Lab> {
        let bin = crate::build_release_binaries()?;
        let dir = crate::workspace_root().join("target").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("probe.sock");
        std::fs::write(dir.join("probe.toml"), config)?;
        let probe = KillOnDrop(
            Command::new(bin.join("probe"))
                .args(["run", "--socket"])
                .arg(&socket)
                .arg("--db")
                .arg(dir.join("evidence.db"))
                .arg("--config")
                .arg(dir.join("probe.toml"))
                .stderr(std::fs::File::create(dir.join("probe.log"))?)
                .spawn()
                .context("starting the probe daemon")?,
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let up = Command::new(bin.join("probe"))
                .args(["status", "--socket"])
                .arg(&socket)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?
                .success();
            if up {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "the probe daemon did not come up; see {}",
                    dir.join("probe.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(Lab {
            bin,
            dir,
            socket,
            probe,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn bridge_bin(&self) -> PathBuf {
        self.bin.join("agent-bridge")
    }

    /// The daemon's pid.
    pub fn probe_pid(&self) -> u32 {
        self.probe.0.id()
    }

    pub fn probe_bin(&self) -> PathBuf {
        self.bin.join("probe")
    }

    /// `agent-bridge campaign ARGS…`, its stdout returned, stderr shown.
    pub fn campaign(&self, args: &[&str]) -> anyhow::Result<String> {
        campaign_cli(&self.bridge_bin(), args)
    }

    pub fn generate(&self, count: usize) -> anyhow::Result<PathBuf> {
        let suite = self.dir.join("suite");
        generate(&self.bridge_bin(), count, &suite)?;
        Ok(suite)
    }

    /// Serves a bridge with `args` over HTTP on loopback, runs the suite
    /// against it, and stops it. Returns the runner's summary plus the
    /// bridge's and the daemon's CPU and peak RSS.
    pub fn run(
        &self,
        suite: &Path,
        db: &Path,
        name: &str,
        bridge_args: &[&str],
        workers: usize,
    ) -> anyhow::Result<Value> {
        let mut args: Vec<&OsStr> = vec![OsStr::new("--probe-socket"), self.socket.as_os_str()];
        args.extend(bridge_args.iter().map(OsStr::new));
        let (bridge, url) = crate::clients::start_http(&self.bridge_bin(), &args)?;
        let probe_before = usage(self.probe.0.id());
        let out = self.campaign(&[
            "run",
            "--suite",
            suite.to_str().unwrap(),
            "--target",
            &url,
            "--db",
            db.to_str().unwrap(),
            "--run",
            name,
            "--label",
            name,
            "--workers",
            &workers.to_string(),
            "--json",
            "--no-bar",
        ])?;
        let mut summary: Value = serde_json::from_str(&out).context("runner summary")?;
        let (cpu, rss) = usage(bridge.0.id());
        let probe_after = usage(self.probe.0.id());
        summary["bridge_cpu_s"] = cpu.into();
        summary["bridge_max_rss_mib"] = rss.into();
        summary["probe_cpu_s"] = (probe_after.0 - probe_before.0).into();
        summary["probe_max_rss_mib"] = probe_after.1.into();
        drop(bridge);
        Ok(summary)
    }
}

/// `cargo xtask demo`: the main job. 1,000 generated tests against the
/// clean sandbox and against one with a fault (an ephemeral /tmp), the
/// reports, the comparison and the HTML files.
pub fn main_job(count: usize, fault: &str) -> anyhow::Result<()> {
    let lab = Lab::start("campaign")?;
    let suite = lab.generate(count)?;
    let db = lab.dir.join("results.db");
    eprintln!("\n== campaign: {count} tests, clean profile, 8 workers");
    let clean = lab.run(&suite, &db, "clean", &[], 8)?;
    eprintln!("\n== campaign: {count} tests, profile `{fault}`, 8 workers");
    let faulty = lab.run(&suite, &db, fault, &["--profile", fault], 8)?;
    let dbs = db.to_str().unwrap();
    for (run, s) in [("clean", &clean), (fault, &faulty)] {
        let html = lab.dir.join(format!("{run}.html"));
        println!(
            "\n{}",
            lab.campaign(&[
                "report",
                "--db",
                dbs,
                "--run",
                run,
                "--html",
                html.to_str().unwrap()
            ])?
        );
        println!(
            "runner: {:.1} s wall, {:.1} tests/s, {:.1} s CPU, {:.0} MiB peak RSS; bridge: {:.1} s CPU, {:.0} MiB peak RSS",
            s["wall_s"].as_f64().unwrap_or(0.0),
            s["recorded"].as_f64().unwrap_or(0.0) / s["wall_s"].as_f64().unwrap_or(1.0),
            s["runner_cpu_s"].as_f64().unwrap_or(0.0),
            s["runner_max_rss_mib"].as_f64().unwrap_or(0.0),
            s["bridge_cpu_s"].as_f64().unwrap_or(0.0),
            s["bridge_max_rss_mib"].as_f64().unwrap_or(0.0),
        );
    }
    println!("\n== clean vs {fault}\n");
    let compared = lab.dir.join("compare.html");
    println!(
        "{}",
        lab.campaign(&[
            "compare",
            "--db",
            dbs,
            "clean",
            fault,
            "--html",
            compared.to_str().unwrap()
        ])?
    );
    println!(
        "results: {}\nHTML:    {}  {}  {}\nmore:    agent-bridge campaign --help",
        db.display(),
        lab.dir.join("clean.html").display(),
        lab.dir.join(format!("{fault}.html")).display(),
        compared.display()
    );
    Ok(())
}

/// `cargo xtask confusion`: the suite against the clean profile, every
/// built-in fault profile and every interface fault; writes the matrix to
/// docs/CONFUSION.md.
pub fn confusion(count: usize, write: bool) -> anyhow::Result<()> {
    let lab = Lab::start("confusion")?;
    let suite = lab.generate(count)?;
    let db = lab.dir.join("results.db");
    let profiles: Value = serde_json::from_slice(
        &Command::new(lab.bridge_bin())
            .args(["profiles", "--json"])
            .output()?
            .stdout,
    )?;
    lab.run(&suite, &db, "clean", &[], 8)?;
    let mut runs: Vec<(String, Vec<String>)> = Vec::new();
    for p in profiles.as_array().context("profiles --json")? {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        if name != "clean" {
            runs.push((name.clone(), vec!["--profile".into(), name]));
        }
    }
    for f in ["lossy-utf8", "nul-truncate", "crlf", "trim", "drop-tail"] {
        runs.push((f.to_string(), vec!["--interface-fault".into(), f.into()]));
    }
    for (name, args) in &runs {
        eprintln!("\n== {name}");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lab.run(&suite, &db, name, &args, 8)?;
    }
    let dbs = db.to_str().unwrap();
    let table = lab.campaign(&["matrix", "--db", dbs, "--baseline", "clean", "--markdown"])?;
    let clean = lab.campaign(&["report", "--db", dbs, "--run", "clean"])?;
    let tabs = tabs_sweep(&lab)?;
    println!("{clean}\n{table}\n{tabs}");
    if write {
        let text = format!(
            "# Confusion matrix: injected fault × attributed layer/primitive\n\n\
             Regenerate with `cargo xtask confusion` (about {} minutes; {count} generated tests, seed 1, \
             8 workers, one bridge per row over Streamable HTTP, probe attached).\n\n\
             Each row is one built-in fault profile or interface fault. *Newly failing* are the tests that \
             passed in the clean run and failed under the fault; the columns say where the triage put them \
             (bold: the injected fault). *Accuracy* is the share attributed to the injected primitive \
             (for interface faults: to the `interface` layer). The last three columns are about the tests \
             that fail in the clean run too (none, on a machine `cargo xtask setup` prepared): how many, \
             how many of them the fault run blames on the injected fault at an earlier step (the fault \
             struck first, e.g. a read-only /tmp at the setup step), and how many at the very step where \
             the clean run failed for another reason (the proximate cause).\n\n{table}\n{CHROMIUM_NOTES}\n{tabs}\n\
             The clean run these rows are compared against:\n\n```\n{clean}```\n",
            (runs.len() + 1) * count / 400 + 9
        );
        // the precision section is `cargo xtask precision`'s: kept as it is
        let old = std::fs::read_to_string("docs/CONFUSION.md").unwrap_or_default();
        let text = match crate::precision::section_of(&old) {
            Some(section) => crate::precision::with_section(&text, section),
            None => text,
        };
        std::fs::write("docs/CONFUSION.md", text)?;
        eprintln!("xtask: wrote docs/CONFUSION.md");
    }
    Ok(())
}

/// What running Chromium under each profile taught us (observed on the
/// runs `cargo xtask confusion` makes; kept here so the page regenerates
/// with it).
const CHROMIUM_NOTES: &str = "## What Chromium needed

The browser domain runs Debian's Chromium 148 headless, as an agent would. What it needed from the \
sandbox, found by running it under every profile above:

- **Threads, not processes.** A DOM dump starts more than 24 tasks (a pids cgroup counts threads): under `pids-limit` (24) its `clone` fails with EAGAIN and Chromium kills \
  itself with SIGTRAP at once. The probe used to name the SIGTRAP (`signal`); a fatal signal a process \
  raises on itself right after refused resources of its own is now attributed to them.
- **Address space, not memory.** Chromium reserves about 1.4 TiB of virtual address space at start \
  (V8's pointer-compression cages, PartitionAlloc's pools; the OOM killer's report says total-vm \
  1,518,639,104 kB). Under RLIMIT_AS of 1 GiB (`address-space`) its `mmap` fails with ENOMEM and it \
  traps: `mem.limit`, with nothing allocated yet.
- **Memory.** One browser of a tab-heavy test peaks near 1 GiB (PSS, see BENCHMARKS.md); under the 64 MiB \
  `memory-limit` even a one-page DOM dump is OOM-killed. When the OOM killer takes a renderer, the \
  browser does not exit: it waits for the dead renderer until the caller's timeout. The probe now \
  blames the OOM kill, not the timeout it caused.
- **Fonts.** With /usr/share emptied (`hidden-data`) most pages still render, but a form with a \
  password field makes Skia abort (`FATAL … SkFontMgr_FontConfigInterface.cpp: Not implemented`): \
  fontconfig found no fonts behind /etc/fonts/conf.d's now dangling links. A deliberate abort \
  (SIGABRT, SIGTRAP) right after missing files of its own is `fs.missing`, naming first the files that \
  exist outside the sandbox (hidden from it).
- **Its IPC.** A seccomp filter that refuses `socketpair` makes it trap at start (`seccomp`, tested); \
  the built-in seccomp profiles refuse `mkdir` and `socket`, which the tests' setup step needs first.
- **The network, quietly.** Even with every host name mapped to NOTFOUND it `connect()`s a UDP socket \
  to a public IPv6 address to learn its route (no packet is sent); in a network namespace without \
  routes that connect fails with ENETUNREACH. Its network service connects non-blocking, learns a \
  refusal from `getsockopt(SO_ERROR)` (not a failing syscall), renders an error page, and every \
  process exits 0. The probe now reads SO_ERROR, and counts a refused connection or a full disk that \
  a process reported (then exited 0) as the call's hidden failure.
- **A writable profile.** Its profile directory, shader and GPU caches are written on every start: on \
  the 1 MiB `full-disk` /tmp its writes hit ENOSPC and it exits 0 without the PDF (`fs.space`, from \
  the hidden failure). Under `readonly` and `unprivileged` the tests' own setup step fails first.
- **/dev/shm, decided by its launcher.** /usr/bin/chromium is a shell script. It runs \
  `ls /usr/share/chromium/extensions/*` (exit 2 when there is none: the probe must not take that for \
  the workload's failure), and /etc/chromium.d/dev-shm moves Chromium's shared memory from /dev/shm to \
  /tmp (`--disable-dev-shm-usage`) when /dev/shm has less than 3.8 GB free, because Chromium crashes \
  when /dev/shm runs out. On this machine that check itself breaks (`[: …: unexpected operator`: \
  `findmnt` prints two mounts), so Chromium keeps /dev/shm, and a sandbox with a small /dev/shm would \
  crash it where the check was meant to save it.
";

/// Memory limits of the tab-heavy sweep, loosest first.
const TAB_LIMITS: [&str; 7] = ["2G", "1G", "768M", "640M", "512M", "384M", "256M"];

/// The tab-heavy browser tests of a 1,000-test suite under memory cgroups
/// that tighten step by step: each cell says how the test ended there
/// (pass, degraded with its reclaim time, or the primitive it failed on).
/// The source article's browser tests went from slow to dead as memory
/// ran out; this is that curve, measured. Returns a Markdown section.
pub fn tabs_sweep(lab: &Lab) -> anyhow::Result<String> {
    let suite = lab.dir.join("tabs-suite");
    lab.campaign(&[
        "generate",
        "--count",
        "1000",
        "--seed",
        "1",
        "--out",
        suite.to_str().unwrap(),
    ])?;
    let mut tests = Vec::new();
    for e in std::fs::read_dir(&suite)? {
        let path = e?.path();
        let t: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        let title = t["title"].as_str().unwrap_or_default();
        if title.starts_with("open ") && title.contains(" tabs at once") {
            tests.push((
                t["id"].as_str().unwrap_or_default().to_string(),
                title.to_string(),
            ));
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    tests.sort();
    let db = lab.dir.join("tabs.db");
    for limit in TAB_LIMITS {
        let profile = lab.dir.join(format!("memory-{limit}.toml"));
        std::fs::write(
            &profile,
            format!(
                "description = \"a memory cgroup of {limit} per call\"\nreproduces = \"mem.oom\"\nmemory_limit = \"{limit}\"\n"
            ),
        )?;
        eprintln!("\n== tab-heavy tests, memory cgroup {limit}");
        lab.run(
            &suite,
            &db,
            &format!("mem-{limit}"),
            &["--profile", profile.to_str().unwrap()],
            4,
        )?;
    }
    let conn = rusqlite::Connection::open(&db)?;
    let mut out = format!(
        "## Tab-heavy browser tests as the memory limit tightens\n\n\
         The {} tests of the default suite (seed 1) that open many tabs at once (each tab fills its \
         memory and downloads as much into the browser's disk cache), under a memory cgroup per call, \
         4 workers. *degraded*: passed, but a step spent ≥ 5% (and ≥ 50 ms) of its time stalled in \
         memory reclaim (ms shown) or ran past its `max_duration_ms`. No swap on this machine: what \
         reclaim can take is page cache, so tabs go from degraded to killed over a narrow band.\n\n\
         | test | {} |\n|---|{}\n",
        tests.len(),
        TAB_LIMITS.join(" | "),
        "---|".repeat(TAB_LIMITS.len())
    );
    let mut tally: std::collections::BTreeMap<(&str, String), usize> = Default::default();
    for (id, title) in &tests {
        out.push_str(&format!("| {id}: {title} |"));
        for limit in TAB_LIMITS {
            let (outcome, primitive, reclaim): (String, Option<String>, Option<f64>) = conn.query_row(
                "SELECT t.outcome, t.primitive, (SELECT MAX(json_extract(s.kernel, '$.memory.reclaim_ms')) FROM campaign_steps s WHERE s.run = t.run AND s.test_id = t.test_id)
                 FROM campaign_tests t WHERE t.run = ?1 AND t.test_id = ?2",
                [format!("mem-{limit}"), id.clone()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            let cell = match (outcome.as_str(), primitive) {
                ("pass", _) => "pass".to_string(),
                ("degraded", _) => format!("degraded ({:.0} ms reclaim)", reclaim.unwrap_or(0.0)),
                (_, p) => format!("**{}**", p.unwrap_or_else(|| "none".into())),
            };
            *tally
                .entry((limit, cell.split(' ').next().unwrap_or("").to_string()))
                .or_default() += 1;
            out.push_str(&format!(" {cell} |"));
        }
        out.push('\n');
    }
    out.push_str("| **tests: pass / degraded / failed** |");
    for limit in TAB_LIMITS {
        let n = |k: &str| tally.get(&(limit, k.to_string())).copied().unwrap_or(0);
        let failed = tests.len() - n("pass") - n("degraded");
        out.push_str(&format!(
            " {} / {} / {} |",
            n("pass"),
            n("degraded"),
            failed
        ));
    }
    out.push('\n');
    Ok(out)
}

/// The campaign benchmark: the clean suite with 8 workers, probe attached.
/// Returns the Markdown section for docs/BENCHMARKS.md.
pub fn bench(count: usize) -> anyhow::Result<String> {
    let lab = Lab::start("campaign-bench")?;
    let suite = lab.generate(count)?;
    let db = lab.dir.join("results.db");
    let sampler = ChromiumSampler::start();
    let steal_before = crate::bench::cpu_ticks();
    let s = lab.run(&suite, &db, "bench", &[], 8)?;
    let steal_pct = crate::bench::steal_pct(steal_before, crate::bench::cpu_ticks());
    let chromium = sampler.stop();
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let conn = rusqlite::Connection::open(&db)?;
    let (browser_s, all_s, browser_n): (f64, f64, i64) = conn.query_row(
        "SELECT SUM(CASE WHEN domain = 'browser' THEN duration_ms ELSE 0 END) / 1000.0, SUM(duration_ms) / 1000.0,
                SUM(domain = 'browser')
         FROM campaign_tests WHERE run = 'bench'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let db_mib = std::fs::metadata(&db).map_or(0.0, |m| m.len() as f64 / (1 << 20) as f64)
        + std::fs::metadata(db.with_extension("db-wal"))
            .map_or(0.0, |m| m.len() as f64 / (1 << 20) as f64);
    let wall = f("wall_s");
    Ok(format!(
        "## Campaign\n\n\
         `cargo xtask bench` (or `cargo xtask bench --only campaign`): {count} generated tests (seed 1), \
         8 workers, one bridge over Streamable HTTP on loopback, probe daemon attached, release build, \
         this 2-vCPU VM. Targets: the whole clean campaign in ≤ 10 minutes, runner RSS ≤ 200 MiB.\n\n\
         | measure | value | target |\n|---|---:|---|\n\
         | wall time | {wall:.1} s ({:.1} min) | ≤ 10 min: {} |\n\
         | tests/s | {:.1} | |\n\
         | tests passed / degraded / failed | {} / {} / {} | |\n\
         | runner CPU | {:.1} s | |\n\
         | runner peak RSS | {:.0} MiB | ≤ 200 MiB: {} |\n\
         | bridge CPU (its own, not the workloads') | {:.1} s | |\n\
         | bridge peak RSS | {:.0} MiB | |\n\
         | probe daemon CPU during the run | {:.1} s | |\n\
         | results DB size | {db_mib:.1} MiB | |\n\
         | browser domain: share of the test time | {:.0}% ({browser_n} tests, {browser_s:.0} of {all_s:.0} s) | |\n\
         | Chromium: peak memory of one browser (PSS of one call's chromium processes) | {:.0} MiB | |\n\
         | Chromium: peak memory of all browsers at once (PSS) | {:.0} MiB ({} browsers at once at most) | |\n\n\
         Chromium's memory is sampled every 250 ms from /proc (`Pss` of smaps_rollup, so pages \
         its processes share are counted once); a browser is the chromium processes of one bridge call \
         (the call's cgroup). CPU steal during the run (time the hypervisor gave to other guests): \
         {steal_pct:.1}% of the vCPUs' time.\n",
        wall / 60.0,
        if wall <= 600.0 { "met" } else { "MISSED" },
        f("recorded") / wall.max(0.001),
        s["passed"],
        s["degraded"],
        s["failed"],
        f("runner_cpu_s"),
        f("runner_max_rss_mib"),
        if f("runner_max_rss_mib") <= 200.0 {
            "met"
        } else {
            "MISSED"
        },
        f("bridge_cpu_s"),
        f("bridge_max_rss_mib"),
        f("probe_cpu_s"),
        100.0 * browser_s / all_s.max(0.001),
        chromium.one_browser_mib,
        chromium.all_mib,
        chromium.most_browsers,
    ))
}

/// The fleet benchmark: the same suite against two bridges, once by one
/// runner of 16 workers into SQLite, once by 4 runner processes of 4
/// workers sharing one run in PostgreSQL (a cluster started here).
pub fn fleet_bench(count: usize) -> anyhow::Result<String> {
    let lab = Lab::start("fleet-bench")?;
    let suite = lab.generate(count)?;
    let suite = suite.to_str().context("a UTF-8 path")?;
    let socket = [OsStr::new("--probe-socket"), lab.socket().as_os_str()];
    let (_one, url_one) = crate::clients::start_http(&lab.bridge_bin(), &socket)?;
    let (_two, url_two) = crate::clients::start_http(&lab.bridge_bin(), &socket)?;
    let runner = |db: &str, workers: usize| {
        let mut c = Command::new(lab.bridge_bin());
        c.args(["campaign", "run", "--suite", suite, "--target", &url_one])
            .args(["--target", &url_two, "--db", db, "--run", "fleet"])
            .args(["--workers", &workers.to_string(), "--json", "--no-bar"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        c
    };
    let wait = |mut c: Command| -> anyhow::Result<Value> {
        let out = c.output()?;
        if !out.status.success() {
            bail!("a runner failed ({})", out.status);
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let lite = lab.dir.join("results.db");
    eprintln!("fleet: SQLite, one runner of 16 workers");
    let started = Instant::now();
    let one = wait(runner(lite.to_str().context("a UTF-8 path")?, 16))?;
    let lite_s = started.elapsed().as_secs_f64();

    let cluster = crate::pgcluster::Cluster::start(&lab.dir);
    let url = cluster.url("fleet");
    eprintln!("fleet: PostgreSQL, 4 runners of 4 workers");
    let started = Instant::now();
    let children: Vec<_> = (0..4)
        .map(|_| runner(&url, 4).spawn())
        .collect::<Result<_, _>>()?;
    let mut summaries = Vec::new();
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("a PostgreSQL runner failed ({})", out.status);
        }
        summaries.push(serde_json::from_slice::<Value>(&out.stdout)?);
    }
    let pg_s = started.elapsed().as_secs_f64();
    let rows: i64 = cluster
        .psql(
            "fleet",
            "SELECT COUNT(*) FROM campaign_tests WHERE run = 'fleet'",
        )
        .trim()
        .parse()?;
    let distinct: i64 = cluster
        .psql(
            "fleet",
            "SELECT COUNT(DISTINCT test_id) FROM campaign_tests WHERE run = 'fleet'",
        )
        .trim()
        .parse()?;
    let per_runner: Vec<String> = summaries
        .iter()
        .map(|s| s["recorded"].to_string())
        .collect();
    let valid = one["suite_tests"].as_i64().unwrap_or(0);
    let ratio = pg_s / lite_s;
    Ok(format!(
        "## Fleet\n\n\
         `cargo xtask bench --only fleet`: {valid} generated tests (seed 1) against two bridges (Streamable HTTP on \
         loopback, one probe daemon), once by one runner of 16 workers into SQLite, once by 4 runner processes of \
         4 workers sharing one run in PostgreSQL 15 (a cluster started by the benchmark; runners claim tests with \
         `FOR UPDATE SKIP LOCKED`). Target: 0 lost, 0 duplicated, wall time within 1.2× of SQLite's.\n\n\
         | run | wall time | tests recorded | |\n|---|---:|---:|---|\n\
         | SQLite, 1 runner × 16 workers | {lite_s:.1} s | {} | baseline |\n\
         | PostgreSQL, 4 runners × 4 workers | {pg_s:.1} s | {rows} ({} per runner), {distinct} distinct | **{ratio:.2}×** ({}) |\n\n\
         Lost: {}; duplicated: {}.\n\n",
        one["recorded"],
        per_runner.join(" + "),
        if ratio <= 1.2 { "met" } else { "MISSED" },
        valid - distinct,
        rows - distinct,
    ))
}

/// Peaks of Chromium's memory while a campaign runs.
#[derive(Default)]
struct ChromiumPeaks {
    one_browser_mib: f64,
    all_mib: f64,
    most_browsers: usize,
}

/// Samples every Chromium process's PSS on a thread of its own.
struct ChromiumSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<ChromiumPeaks>,
}

impl ChromiumSampler {
    fn start() -> ChromiumSampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peaks = ChromiumPeaks::default();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let (browsers, all) = chromium_pss_kib();
                peaks.all_mib = peaks.all_mib.max(all as f64 / 1024.0);
                peaks.most_browsers = peaks.most_browsers.max(browsers.len());
                if let Some(max) = browsers.iter().max() {
                    peaks.one_browser_mib = peaks.one_browser_mib.max(*max as f64 / 1024.0);
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            peaks
        });
        ChromiumSampler { stop, thread }
    }

    fn stop(self) -> ChromiumPeaks {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// (PSS of each Chromium browser; PSS of them all), in KiB, now. A browser
/// is the chromium processes of one bridge call: the call's own cgroup
/// (`0::/…/mcp-…`, the bridge makes one per call), not the process tree,
/// which Chromium's zygote breaks by double-forking its renderers.
fn chromium_pss_kib() -> (Vec<u64>, u64) {
    let mut browsers: std::collections::HashMap<String, u64> = Default::default();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return (vec![], 0);
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if !exe.to_string_lossy().contains("chromium") {
            continue;
        }
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("0::").map(str::to_string))
            .unwrap_or_else(|| format!("pid {pid}"));
        let pss: u64 = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        *browsers.entry(cgroup).or_default() += pss;
    }
    let all = browsers.values().sum();
    (browsers.into_values().collect(), all)
}
