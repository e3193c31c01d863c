//! The Debian package in the image's base, as a Dockerfile installs it:
//! a podman container of the base (an overlay: the cached base is never
//! written) with systemd as PID 1, `apt-get install ./probe_*.deb`, then
//! the daemon started from the package's unit, asked for a span, stopped.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::Image;

/// A container removed on drop.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "2", &self.0])
            .output();
    }
}

impl Container {
    /// Runs `script` in the container; its stdout, or an error with both streams.
    fn sh(&self, script: &str) -> anyhow::Result<String> {
        let out = Command::new("podman")
            .args([
                "exec",
                "-e",
                "DEBIAN_FRONTEND=noninteractive",
                &self.0,
                "sh",
                "-c",
                script,
            ])
            .output()
            .context("running podman exec")?;
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() {
            bail!(
                "`{script}`: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(stdout)
    }
}

/// Installs `deb` in a systemd container of `image`'s base and runs the
/// daemon from its unit; returns what it saw, one line.
pub fn check(image: &Image, deb: &Path) -> anyhow::Result<String> {
    let name = format!("probe-package-{}", std::process::id());
    let _ = Command::new("podman").args(["rm", "-f", &name]).output();
    // privileged: the daemon loads eBPF programs; runc and explicit limits
    // as the host-daemon tests start their containers
    let run = Command::new("timeout")
        .args(["120", "podman", "run", "-d", "--name", &name])
        .args(["--runtime", "runc", "--privileged", "--network", "none"])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=4096:4096",
        ])
        .args(["--systemd", "always", "--rootfs"])
        .arg(format!("{}:O", image.base.display()))
        .arg("/sbin/init")
        .output()
        .context("running podman")?;
    if !run.status.success() {
        bail!(
            "podman run: {}",
            String::from_utf8_lossy(&run.stderr).trim()
        );
    }
    let ctr = Container(name);
    let started = Instant::now();
    loop {
        let state = ctr.sh("systemctl is-system-running || true")?;
        if state == "running" || state == "degraded" {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("systemd in the container did not come up: {state}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let file = deb
        .file_name()
        .and_then(|n| n.to_str())
        .context("a .deb name")?;
    let copied = Command::new("podman")
        .args(["cp"])
        .arg(deb)
        .arg(format!("{}:/root/{file}", ctr.0))
        .status()?;
    if !copied.success() {
        bail!("podman cp {}: {copied}", deb.display());
    }
    ctr.sh(&format!("cd /root && apt-get install -y -q ./{file}"))?;
    let enabled = ctr.sh("systemctl is-enabled probe || true")?;
    if enabled != "disabled" {
        bail!("probe.service is `{enabled}` after the install: the package must not enable it");
    }
    ctr.sh("systemctl start probe && systemctl is-active probe")?;
    // Type=simple: started is not listening yet (the programs load first)
    ctr.sh(
        "for i in $(seq 300); do [ -S /run/probe/probe.sock ] && exit 0; sleep 0.1; done; \
         journalctl -u probe --no-pager | tail -20; exit 1",
    )
    .context("the daemon's socket did not appear in 30 s")?;
    let span = ctr.sh(
        "probe span --socket /run/probe/probe.sock --session package --json -- \
         sh -c 'cat /nonexistent/data.csv 2>/dev/null' || true",
    )?;
    let verdict: serde_json::Value =
        serde_json::from_str(&span).with_context(|| format!("the span's JSON: {span}"))?;
    if verdict["primitive"] != "fs.missing" {
        bail!("a span through the packaged daemon: expected fs.missing, got {span}");
    }
    ctr.sh(
        "systemctl stop probe && ! systemctl is-active probe && test -s /var/lib/probe/evidence.db",
    )?;
    let version = ctr.sh("dpkg-query -W -f '${Version} ${Architecture}' probe")?;
    Ok(format!(
        "probe {version} installed by apt-get, unit disabled, started by systemd: \
         a span said fs.missing; stopped, its evidence in /var/lib/probe/evidence.db"
    ))
}
