//! Independent MCP clients for the bridge: the official Python SDK and the
//! MCP conformance suite, installed under target/ at pinned versions.

use std::ffi::OsStr;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

use crate::{KillOnDrop, install_step, quiet_ok, run};

const PYTHON_MCP: &str = "mcp==2.3.0";
/// 0.1.15+ needs Node 22; the machine has Node 20.
const CONFORMANCE: &str = "@modelcontextprotocol/conformance@0.1.13";

fn venv() -> PathBuf {
    PathBuf::from("target/mcp-venv")
}

/// mcp-fuzzer (agent-bridge/tests/fuzz.rs) has a venv of its own: its pins
/// (agent-bridge/tests/fuzz/requirements.txt) need not agree with the SDK's.
const FUZZER_PINS: &str = "agent-bridge/tests/fuzz/requirements.txt";

fn fuzz_venv() -> PathBuf {
    PathBuf::from("target/fuzz-venv")
}

fn conformance_dir() -> PathBuf {
    PathBuf::from("target/conformance")
}

/// Installs the Python SDK in a venv and the conformance suite with npm,
/// unless they are already there.
pub fn install() -> anyhow::Result<()> {
    let python = venv().join("bin/python");
    if !quiet_ok(Command::new(&python).args(["-c", "import mcp"])) {
        let what = format!("installing the MCP Python SDK ({PYTHON_MCP})");
        install_step::run(
            "creating a Python venv",
            Command::new("python3").args(["-m", "venv"]).arg(venv()),
        )?;
        install_step::run(
            &what,
            Command::new(venv().join("bin/pip")).args(["install", PYTHON_MCP]),
        )?;
    }
    install_fuzzer()?;
    install_foreign()?;
    let suite = conformance_dir().join("node_modules/.bin/conformance");
    if !suite.exists() {
        std::fs::create_dir_all(conformance_dir())?;
        let what = format!("installing the MCP conformance suite ({CONFORMANCE})");
        install_step::run(
            &what,
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--prefix"])
                .arg(conformance_dir())
                .arg(CONFORMANCE),
        )?;
    }
    Ok(())
}

/// mcp-fuzzer and its dependencies at the versions of `FUZZER_PINS`,
/// unless that venv holds them already (the pins file is copied in last).
fn install_fuzzer() -> anyhow::Result<()> {
    let pins = std::fs::read(FUZZER_PINS)?;
    let installed = fuzz_venv().join("requirements.txt");
    if std::fs::read(&installed).ok().as_ref() == Some(&pins)
        && fuzz_venv().join("bin/mcp-fuzzer").exists()
    {
        return Ok(());
    }
    install_step::run(
        "creating a Python venv for mcp-fuzzer",
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(fuzz_venv()),
    )?;
    install_step::run(
        "installing mcp-fuzzer (pinned by agent-bridge/tests/fuzz/requirements.txt)",
        Command::new(fuzz_venv().join("bin/pip")).args(["install", "--no-deps", "-r", FUZZER_PINS]),
    )?;
    std::fs::write(installed, pins)?;
    Ok(())
}

/// The third-party MCP servers the target adapters are tested against,
/// pinned by `agent-bridge/adapters/npm/NAME/package-lock.json`, installed
/// into `target/foreign/NAME` (where the adapters' launchers look).
/// `--ignore-scripts`: desktop-commander's install script sends telemetry.
/// The two browser servers run Debian's chromium: no browser is downloaded.
pub const FOREIGN: [&str; 4] = [
    "desktop-commander",
    "server-filesystem",
    "playwright-mcp",
    "chrome-devtools-mcp",
];

pub fn install_foreign() -> anyhow::Result<()> {
    let root = crate::workspace_root();
    for name in FOREIGN {
        npm_ci_pinned(
            name,
            &root.join("agent-bridge/adapters/npm").join(name),
            &root.join("target/foreign").join(name),
        )?;
    }
    Ok(())
}

/// `npm ci --ignore-scripts` of the package.json and package-lock.json in
/// `pinned` into `dir`, unless `dir` already holds that lock's install.
pub fn npm_ci_pinned(name: &str, pinned: &Path, dir: &Path) -> anyhow::Result<()> {
    let lock = std::fs::read(pinned.join("package-lock.json"))?;
    let installed = std::fs::read(dir.join("package-lock.json")).ok();
    if installed.as_ref() == Some(&lock) && dir.join("node_modules").is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(pinned.join(f), dir.join(f))?;
    }
    let what = format!("installing {name} (pinned by its package-lock.json)");
    install_step::run(
        &what,
        Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
            .env("PUPPETEER_SKIP_DOWNLOAD", "1")
            .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
            .env("CHROME_DEVTOOLS_MCP_NO_UPDATE_CHECKS", "1")
            .current_dir(dir),
    )
}

/// Round trips through the Python SDK over stdio and HTTP.
pub fn python_sdk(bridge: &Path) -> anyhow::Result<()> {
    run(Command::new(venv().join("bin/python"))
        .arg("agent-bridge/tests/sdk/python_client.py")
        .arg(bridge))
}

/// `agent-bridge serve --http 127.0.0.1:0 ARGS…`: the process (killed on
/// drop) and the URL it serves. Its stderr keeps being drained.
pub fn start_http(bridge: &Path, args: &[&OsStr]) -> anyhow::Result<(KillOnDrop, String)> {
    let mut child = Command::new(bridge)
        // `cargo xtask` runs under cargo, which points LD_LIBRARY_PATH into
        // target/: the sandbox's workloads must not inherit that
        .env_remove("LD_LIBRARY_PATH")
        .args(["serve", "--http", "127.0.0.1:0"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .context("starting agent-bridge")?;
    let stderr = child.stderr.take().expect("piped");
    let guard = KillOnDrop(child);
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let Some(line) = lines.next() else {
            bail!("agent-bridge exited before it listened");
        };
        if let Some(url) = line?.split("serving MCP at ").nth(1) {
            break url.trim().to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Ok((guard, url))
}

/// The conformance suite against the HTTP transport, with the expected
/// failures (and their reasons) in agent-bridge/tests/sdk/conformance-baseline.yml.
pub fn conformance(bridge: &Path) -> anyhow::Result<()> {
    let (_bridge, url) = start_http(bridge, &[OsStr::new("--no-probe")])?;
    let out = std::env::temp_dir().join(format!("bridge-conformance-{}", std::process::id()));
    let baseline = Path::new("agent-bridge/tests/sdk/conformance-baseline.yml").canonicalize()?;
    let result = run(
        Command::new(conformance_dir().join("node_modules/.bin/conformance"))
            .args(["server", "--url", &url, "--expected-failures"])
            .arg(baseline)
            .arg("-o")
            .arg(&out),
    );
    let _ = std::fs::remove_dir_all(&out);
    result
}
