//! One line per installation step: what is being installed, then `ok` with
//! the time it took. The package manager's own output (apt-get, rustup,
//! cargo install, pip, npm, mmdebstrap) goes to `target/xtask-install.log`,
//! and its last lines are shown only when the step fails.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail};

/// Where every step's output is appended.
pub fn log_path() -> PathBuf {
    crate::workspace_root().join("target/xtask-install.log")
}

/// Runs `cmd` as the step `what`, its output into the log.
pub fn run(what: &str, cmd: &mut Command) -> anyhow::Result<()> {
    let path = log_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(log, "\n=== {what}: {cmd:?}")?;
    let start = log.metadata().map(|m| m.len()).unwrap_or(0);
    eprint!("xtask: {what} … ");
    let started = Instant::now();
    let status = cmd
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if status.success() {
        eprintln!("ok ({:.0} s)", started.elapsed().as_secs_f64());
        return Ok(());
    }
    eprintln!("FAILED ({status})");
    let text = std::fs::read(&path).unwrap_or_default();
    let ours = String::from_utf8_lossy(&text[(start as usize).min(text.len())..]).into_owned();
    let tail: Vec<&str> = ours.lines().rev().take(20).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    bail!(
        "{what}: {cmd:?} failed ({status}); the end of its output (all of it in {}):\n{}",
        path.display(),
        tail.join("\n")
    )
}
