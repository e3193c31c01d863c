//! `cargo xtask image-demo` and the image's part of `cargo xtask test`: the
//! campaign run from the host against the bridge inside a booted sandbox,
//! ssh inspection, the probe's export imported and joined to the steps.

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::campaign::campaign_cli as campaign;

use super::*;

/// How the kernel evidence joined the campaign's steps after the import.
#[derive(Debug, Default)]
pub struct Joined {
    pub steps: i64,
    pub steps_with_span: i64,
    pub steps_with_events: i64,
    pub events: i64,
    pub table: String,
}

/// Steps joined to their spans (session = mcp_session, id = span_id) and
/// the spans' events, per domain, with an example.
pub fn joined(db: &Path, run_name: &str) -> anyhow::Result<Joined> {
    let conn = rusqlite::Connection::open(db)?;
    let mut j = Joined::default();
    let mut t = format!(
        "{:<12} {:>6} {:>10} {:>12} {:>8}\n",
        "DOMAIN", "STEPS", "WITH SPAN", "WITH EVENTS", "EVENTS"
    );
    let mut stmt = conn.prepare(
        "SELECT t.domain, COUNT(*), COUNT(p.id),
                SUM((SELECT COUNT(*) FROM events e WHERE e.probe_id = p.probe_id AND e.span_id = p.id) > 0),
                COALESCE(SUM((SELECT COUNT(*) FROM events e WHERE e.probe_id = p.probe_id AND e.span_id = p.id)), 0)
         FROM campaign_steps s JOIN campaign_tests t USING (run, test_id)
         LEFT JOIN spans p ON p.session = t.mcp_session AND p.id = s.span_id
         WHERE s.run = ?1 AND s.verdict != 'not-run'
         GROUP BY t.domain ORDER BY t.domain",
    )?;
    let rows = stmt.query_map([run_name], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, Option<i64>>(3)?.unwrap_or(0),
            r.get::<_, i64>(4)?,
        ))
    })?;
    for row in rows {
        let (domain, steps, spans, with_events, events) = row?;
        let _ = writeln!(
            t,
            "{domain:<12} {steps:>6} {spans:>10} {with_events:>12} {events:>8}"
        );
        j.steps += steps;
        j.steps_with_span += spans;
        j.steps_with_events += with_events;
        j.events += events;
    }
    let _ = writeln!(
        t,
        "{:<12} {:>6} {:>10} {:>12} {:>8}",
        "total", j.steps, j.steps_with_span, j.steps_with_events, j.events
    );
    // one step's events, as an example: a failed one when there is one
    let example: Option<(String, i64, String, i64)> = conn
        .query_row(
            "SELECT t.test_id, s.step, s.tool, p.id
             FROM campaign_steps s JOIN campaign_tests t USING (run, test_id)
             JOIN spans p ON p.session = t.mcp_session AND p.id = s.span_id
             WHERE s.run = ?1 AND EXISTS (SELECT 1 FROM events e WHERE e.probe_id = p.probe_id AND e.span_id = p.id)
             ORDER BY s.verdict = 'fail' DESC, t.test_id, s.step LIMIT 1",
            [run_name],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .ok();
    if let Some((test, step, tool, span)) = example {
        let _ = writeln!(
            t,
            "\n{test} step {step} ({tool}), span {span}: its first events"
        );
        let mut stmt = conn.prepare(
            "SELECT e.kind, e.pid, e.comm, COALESCE(e.syscall, ''), COALESCE(e.errno, ''), COALESCE(e.path, '')
             FROM events e JOIN spans p ON e.probe_id = p.probe_id AND e.span_id = p.id
             JOIN campaign_tests t ON p.session = t.mcp_session
             WHERE t.run = ?1 AND t.test_id = ?2 AND p.id = ?3 ORDER BY e.seq LIMIT 8",
        )?;
        let rows = stmt.query_map(rusqlite::params![run_name, test, span], |r| {
            Ok(format!(
                "  {:<8} {}[{}] {} {} {}",
                r.get::<_, String>(0)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?
            ))
        })?;
        for row in rows {
            let _ = writeln!(t, "{}", row?.trim_end());
        }
    }
    j.table = t;
    Ok(j)
}

/// What a campaign in a booted sandbox produced.
pub struct Outcome {
    /// Tests run (the suite less the omitted domains').
    pub count: usize,
    pub summary: Value,
    pub status: String,
    pub failed_spans: String,
    pub export: PathBuf,
    pub import: String,
    pub joined: Joined,
    pub report: String,
    pub db: PathBuf,
    pub html: PathBuf,
    pub zombies: usize,
}

/// What the campaign needs of a booted image, a bubblewrap sandbox or a
/// VM: a directory for its files, the bridge's URL from the host, ssh.
pub trait Booted {
    fn run_dir(&self) -> &Path;
    fn bridge_url(&self) -> String;
    fn ssh(&self, command: &str) -> anyhow::Result<String>;
    fn scp_from(&self, remote: &str, local: &Path) -> anyhow::Result<()>;
}

impl Booted for Sandbox {
    fn run_dir(&self) -> &Path {
        &self.run_dir
    }
    fn bridge_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.ports.bridge)
    }
    fn ssh(&self, command: &str) -> anyhow::Result<String> {
        Sandbox::ssh(self, command)
    }
    fn scp_from(&self, remote: &str, local: &Path) -> anyhow::Result<()> {
        Sandbox::scp_from(self, remote, local)
    }
}

/// Generates `count` tests (less those of the `omit` domains), runs them
/// from the host against the bridge in the sandbox, inspects the sandbox
/// over ssh (`probe status`, `probe spans --failed`, `probe export --format
/// sqlite`), copies the export out with scp and imports it into the
/// results DB.
pub fn campaign_in(
    sb: &impl Booted,
    bridge: &Path,
    count: usize,
    omit: &[&str],
    workers: usize,
) -> anyhow::Result<Outcome> {
    let dir = sb.run_dir();
    let suite = dir.join("suite");
    let db = dir.join("results.db");
    let export = dir.join("evidence.sqlite");
    for f in [&db, &export] {
        let _ = std::fs::remove_file(f);
        let _ = std::fs::remove_file(f.with_extension("db-wal"));
        let _ = std::fs::remove_file(f.with_extension("db-shm"));
    }
    let _ = std::fs::remove_dir_all(&suite);
    let s = |p: &Path| p.display().to_string();
    crate::campaign::generate(bridge, count, &suite)?;
    let omitted = omit_domains(&suite, omit)?;
    let count = count - omitted;
    if omitted > 0 {
        say(format!(
            "left out {omitted} tests of {} (this image has not what they need)",
            omit.join(", ")
        ));
    }
    let url = sb.bridge_url();
    say(format!(
        "running {count} tests from the host against {url} ({workers} workers)"
    ));
    let out = campaign(
        bridge,
        &[
            "run",
            "--suite",
            &s(&suite),
            "--target",
            &url,
            "--db",
            &s(&db),
            "--run",
            "sandbox",
            "--label",
            "sandbox",
            "--workers",
            &workers.to_string(),
            "--json",
            "--no-bar",
        ],
    )?;
    let summary: Value = serde_json::from_str(&out).context("the runner's summary")?;
    say("inspecting the sandbox over ssh: probe status, probe spans --failed, probe export");
    let status = sb.ssh("probe status")?;
    let failed_spans = sb.ssh("probe spans --failed --limit 20")?;
    // an orphan (its parent shell exits at once) is reparented to init,
    // which must reap it when it exits
    let zombies = sb
        .ssh("sh -c 'sleep 0.3 & exit 0'; sleep 3; ps -eo stat= | grep -c '^Z' || true")?
        .trim()
        .parse()
        .unwrap_or(0);
    sb.ssh(
        "rm -f /var/lib/probe/export.sqlite && \
         probe export --format sqlite --out /var/lib/probe/export.sqlite",
    )?;
    sb.scp_from("/var/lib/probe/export.sqlite", &export)?;
    let import = campaign(bridge, &["import", "--db", &s(&db), &s(&export)])?;
    let html = dir.join("report.html");
    let report = campaign(
        bridge,
        &[
            "report",
            "--db",
            &s(&db),
            "--run",
            "sandbox",
            "--html",
            &s(&html),
        ],
    )?;
    let joined = joined(&db, "sandbox")?;
    Ok(Outcome {
        count,
        summary,
        status,
        failed_spans,
        export,
        import,
        joined,
        report,
        db,
        html,
        zombies,
    })
}

/// Removes a generated suite's tests of the `domains`; returns how many.
fn omit_domains(suite: &Path, domains: &[&str]) -> anyhow::Result<usize> {
    let mut n = 0;
    if domains.is_empty() {
        return Ok(0);
    }
    for e in std::fs::read_dir(suite)?.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let test: Value = serde_json::from_slice(&std::fs::read(&path)?)
            .with_context(|| format!("reading {}", path.display()))?;
        if test["domain"]
            .as_str()
            .is_some_and(|d| domains.contains(&d))
        {
            std::fs::remove_file(&path)?;
            n += 1;
        }
    }
    Ok(n)
}

/// The binaries to install: `bin_dir`, or `cargo xtask dist`'s for `arch`.
pub fn binaries(arch: Arch, bin_dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(d) = bin_dir {
        return Ok(std::path::absolute(d)?);
    }
    crate::setup()?;
    // the static executables, installed as a user would install a release
    // (and the package beside them, which the image test installs)
    Ok(crate::dist::build_all(&[arch])?.remove(0).1)
}

/// `cargo xtask image-demo`.
pub fn demo(
    count: usize,
    workers: usize,
    ports: Ports,
    bin_dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    require_root("image-demo")?;
    ports.require_free()?;
    let started = Instant::now();
    let bin = binaries(Arch::X86_64, bin_dir)?;
    let image = build(Arch::X86_64, &bin, false)?;
    let run_dir = crate::workspace_root().join("target/image-demo");
    let sb = Sandbox::boot(&image, ports, &run_dir)?;
    let booted = sb.booted_in;
    let o = campaign_in(&sb, &bin.join("agent-bridge"), count, &[], workers)?;
    let logs = sb.logs.clone();
    let ssh_config = sb.ssh_config.clone();
    say("stopping the sandbox");
    let t = sb.shutdown()?;
    println!("\n== the campaign, run from the host against the bridge in the sandbox\n");
    println!("{}", o.report);
    println!("== probe status (over ssh)\n\n{}", o.status);
    println!("== probe spans --failed (over ssh)\n\n{}", o.failed_spans);
    println!(
        "== the export, imported into the results DB\n\n{}",
        o.import
    );
    println!(
        "== kernel events joined to the steps (spans.session = campaign_tests.mcp_session, \
         spans.id = campaign_steps.span_id)\n\n{}",
        o.joined.table
    );
    if o.joined.events == 0 {
        println!(
            "no kernel events joined: the probe in the sandbox recorded spans without events \
             (the bridge names its workloads by their pids in the sandbox's PID namespace, \
             the kernel reports host pids; see docs/IMAGE.md)\n"
        );
    }
    let (base, layer) = image.sizes();
    println!(
        "image:    {} ({}) + {} ({})\n\
         results:  {}\nHTML:     {}\nexport:   {}\nlogs:     {} (init, sshd, probe, agent-bridge, console)\n\
         ssh:      ssh -F {} sandbox   (while a sandbox runs)\n\
         times:    boot {:.1} s, campaign {:.1} s, stop {:.1} s ({}), all {:.0} s; nothing left running",
        image.base.display(),
        mib(base),
        image.layer.display(),
        mib(layer),
        o.db.display(),
        o.html.display(),
        o.export.display(),
        logs.display(),
        ssh_config.display(),
        booted.as_secs_f64(),
        o.summary["wall_s"].as_f64().unwrap_or(0.0),
        t.stopped_in.as_secs_f64(),
        if t.clean_stop { "SIGTERM" } else { "killed" },
        started.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// One check of the test: its name and its failure, if any.
#[derive(Default)]
pub(super) struct Checks(Vec<(String, Option<String>)>);

impl Checks {
    pub(super) fn check(&mut self, name: &str, result: anyhow::Result<()>) {
        match &result {
            Ok(()) => say(format!("ok: {name}")),
            Err(e) => say(format!("FAILED: {name}: {e:#}")),
        }
        self.0
            .push((name.to_string(), result.err().map(|e| format!("{e:#}"))));
    }

    pub(super) fn ensure(&mut self, name: &str, ok: bool, why: impl std::fmt::Display) {
        self.check(
            name,
            if ok {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{why}"))
            },
        );
    }

    /// The checks of a campaign in a booted image: every test recorded and
    /// passed, the inspection over ssh, the export, the import's joins.
    pub(super) fn campaign(&mut self, o: &Outcome) {
        let n = |k: &str| o.summary[k].as_i64().unwrap_or(-1);
        self.ensure(
            &format!("campaign: {} tests recorded", o.count),
            n("recorded") == o.count as i64,
            format!("{} recorded", n("recorded")),
        );
        self.ensure(
            "campaign: every test passed (as on the host)",
            n("passed") + n("degraded") == o.count as i64,
            format!(
                "{} passed, {} degraded, {} failed:\n{}",
                n("passed"),
                n("degraded"),
                n("failed"),
                o.report
            ),
        );
        self.ensure(
            "ssh: probe status",
            o.status.contains("programs"),
            format!("{:?}", o.status),
        );
        self.ensure(
            "ssh: probe spans --failed",
            o.failed_spans.contains("SPAN"),
            format!("{:?}", o.failed_spans),
        );
        self.ensure(
            "scp: the export came out",
            std::fs::metadata(&o.export).is_ok_and(|m| m.len() > 0),
            o.export.display(),
        );
        print!("{}", o.joined.table);
        self.ensure(
            "import: steps joined to their spans",
            o.joined.steps_with_span > 0,
            format!("none of {} steps:\n{}", o.joined.steps, o.import),
        );
        self.ensure(
            "import: kernel events joined to steps",
            o.joined.events > 0,
            format!(
                "{} steps, {} with a span, but no span has events: the probe in the sandbox \
                 traced nothing (pids in the sandbox's PID namespace?); see {}",
                o.joined.steps,
                o.joined.steps_with_span,
                o.db.display()
            ),
        );
    }

    /// Says how many of the `test`'s checks failed (and `summary`); fails
    /// listing them.
    pub(super) fn finish(&self, test: &str, summary: &str) -> anyhow::Result<()> {
        let failed: Vec<&(String, Option<String>)> =
            self.0.iter().filter(|(_, e)| e.is_some()).collect();
        say(format!(
            "{test}: {} checks, {} failed; {summary}",
            self.0.len(),
            failed.len()
        ));
        if !failed.is_empty() {
            bail!(
                "the {test} failed:\n{}",
                failed
                    .iter()
                    .map(|(n, e)| format!("- {n}: {}", e.as_deref().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        Ok(())
    }
}

/// The amd64 package beside the dist directory `bin` (`dist/x86_64`).
fn packaged_deb(bin: &Path) -> anyhow::Result<PathBuf> {
    let dist = bin.parent().context("the dist directory's parent")?;
    std::fs::read_dir(dist)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("probe_") && n.ends_with("_amd64.deb"))
        })
        .with_context(|| {
            format!(
                "no probe_*_amd64.deb in {} (`cargo xtask dist` makes it)",
                dist.display()
            )
        })
}

/// Runs this binary (`cargo xtask …`) with `args`; `prefix` goes before it
/// (e.g. setpriv to drop root). Returns (success, stderr).
fn xtask(
    prefix: &[&str],
    args: &[&str],
    env_path: Option<&Path>,
) -> anyhow::Result<(bool, String)> {
    let mut exe = std::env::current_exe()?;
    if !prefix.is_empty() {
        // another user runs a copy: the tree may be closed to it
        let dir = std::env::temp_dir().join(format!("xtask-image-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(&exe, dir.join("xtask"))?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        }
        exe = dir.join("xtask");
    }
    let mut cmd = if let Some((first, rest)) = prefix.split_first() {
        let mut c = Command::new(first);
        c.args(rest).arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    cmd.args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if let Some(p) = env_path {
        cmd.env("PATH", p);
    }
    let out = cmd.output()?;
    if !prefix.is_empty()
        && let Some(dir) = exe.parent()
    {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Expects a failure whose message contains every one of `words`.
fn refused(r: anyhow::Result<(bool, String)>, words: &[&str]) -> anyhow::Result<()> {
    let (ok, err) = r?;
    if ok {
        bail!("it succeeded");
    }
    for w in words {
        if !err.contains(w) {
            bail!("the message does not say `{w}`: {}", err.trim());
        }
    }
    say(format!(
        "  said: {}",
        err.trim().lines().last().unwrap_or("")
    ));
    Ok(())
}

/// The image's part of `cargo xtask test` (root): bad input first, then
/// the image (cached), a boot, a campaign of `count` tests against the
/// bridge inside, inspection over ssh, the import, and a teardown that
/// leaves nothing behind. Every check runs; the failures are listed at
/// the end.
pub fn test(bin: &Path, count: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = crate::workspace_root().join("target/image-test");
    std::fs::create_dir_all(&dir)?;
    let mut c = Checks::default();

    // bad input: each refused with a message that says what to do
    c.check(
        "not root: refused",
        refused(
            xtask(
                &[
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "--",
                ],
                &["image"],
                None,
            ),
            &["needs root", "sudo"],
        ),
    );
    let fake = dir.join("no-mmdebstrap");
    let _ = std::fs::remove_dir_all(&fake);
    std::fs::create_dir_all(&fake)?;
    std::os::unix::fs::symlink("/bin/sh", fake.join("sh"))?;
    std::fs::write(
        fake.join("apt-get"),
        "#!/bin/sh\necho \"E: Unable to locate package (apt-get $*, a stand-in that fails)\" >&2\nexit 100\n",
    )?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(fake.join("apt-get"), std::fs::Permissions::from_mode(0o755))?;
    }
    c.check(
        "mmdebstrap missing and not installable: refused",
        refused(
            xtask(
                &[],
                &[
                    "image",
                    "--rebuild",
                    "--bin-dir",
                    &bin.display().to_string(),
                ],
                Some(&fake),
            ),
            &["mmdebstrap", "not installed", "apt-get install"],
        ),
    );
    let held = TcpListener::bind("127.0.0.1:0")?;
    let held_port = held.local_addr()?.port().to_string();
    let free = Ports::pick()?;
    for (which, ssh, bridge) in [
        ("bridge's", free.ssh.to_string(), held_port.clone()),
        ("ssh", held_port.clone(), free.bridge.to_string()),
    ] {
        let flag = if which == "ssh" {
            "--ssh-port"
        } else {
            "--bridge-port"
        };
        c.check(
            &format!("the {which} port taken: refused before booting"),
            refused(
                xtask(
                    &[],
                    &[
                        "image-demo",
                        "--count",
                        "1",
                        "--ssh-port",
                        &ssh,
                        "--bridge-port",
                        &bridge,
                    ],
                    None,
                ),
                &[&format!("port {held_port}"), flag],
            ),
        );
    }
    drop(held);
    let no_probe = dir.join("bin-without-probe");
    let _ = std::fs::remove_dir_all(&no_probe);
    std::fs::create_dir_all(&no_probe)?;
    std::fs::copy(bin.join("agent-bridge"), no_probe.join("agent-bridge"))?;
    c.check(
        "binaries without probe: refused",
        refused(
            xtask(
                &[],
                &["image", "--bin-dir", &no_probe.display().to_string()],
                None,
            ),
            &["no `probe`", "cargo build --release -p probe"],
        ),
    );

    // the image (cached after the first build)
    let t = Instant::now();
    let image = build(Arch::X86_64, bin, false)?;
    let build_s = t.elapsed().as_secs_f64();
    let broken = Image {
        layer: no_probe.clone(),
        ..image.clone()
    };
    c.check(
        "an image without the probe binary does not boot",
        match Sandbox::boot(&broken, Ports::pick()?, &dir.join("broken")) {
            Ok(_) => Err(anyhow::anyhow!("it booted")),
            Err(e) if e.to_string().contains("/usr/local/bin/probe") => {
                say(format!("  said: {e}"));
                Ok(())
            }
            Err(e) => Err(e),
        },
    );

    // the Debian package `cargo xtask dist` made beside these executables
    c.check(
        "the package: apt-get install ./probe_*.deb, the daemon started from its unit",
        packaged_deb(bin).and_then(|deb| {
            let saw = super::package::check(&image, &deb)?;
            say(format!("  {saw}"));
            Ok(())
        }),
    );

    let sb = Sandbox::boot(&image, Ports::pick()?, &dir)?;
    let booted = sb.booted_in;
    let run = campaign_in(&sb, &bin.join("agent-bridge"), count, &[], 4);
    let hostname = sb.ssh("hostname; ps -o pid= -p 1; cat /proc/1/cmdline | tr '\\0' ' '");
    let units = sb.ssh(
        "systemd-analyze verify /etc/systemd/system/probe.service \
         /etc/systemd/system/agent-bridge.service 2>&1",
    );
    let t = sb.shutdown();
    c.check(
        "teardown: nothing left running, no mounts, cgroups removed",
        t.as_ref().map(|_| ()).map_err(|e| anyhow::anyhow!("{e:#}")),
    );
    if let Ok(t) = &t {
        c.ensure(
            "teardown: stopped by SIGTERM",
            t.clean_stop,
            "it had to be killed",
        );
    }
    c.check(
        "inside: hostname sandbox, sandbox-init is PID 1",
        hostname.and_then(|h| {
            let mut l = h.lines();
            if l.next() == Some("sandbox")
                && l.next().map(str::trim) == Some("1")
                && l.next().is_some_and(|c| c.contains("sandbox-init"))
            {
                Ok(())
            } else {
                Err(anyhow::anyhow!("got {h:?}"))
            }
        }),
    );
    c.check(
        "inside: the systemd units verify (systemd-analyze verify)",
        units.map(|_| ()),
    );
    match run {
        Err(e) => c.check("the campaign in the sandbox", Err(e)),
        Ok(o) => {
            c.ensure(
                "no zombies in the sandbox (init reaps orphans)",
                o.zombies == 0,
                format!("{} zombies", o.zombies),
            );
            c.campaign(&o);
        }
    }
    c.finish(
        "image test",
        &format!(
            "image build {build_s:.1} s, boot {:.1} s, all {:.0} s",
            booted.as_secs_f64(),
            started.elapsed().as_secs_f64()
        ),
    )
}
