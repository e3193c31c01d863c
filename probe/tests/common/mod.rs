//! What the kernel and runtime tests share: root checks that refuse to
//! skip under CI, `probe trace --json` run and parsed, and a command run
//! in a daemon's span.
#![allow(dead_code)] // each test binary uses its own part

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

pub const PROBE: &str = env!("CARGO_BIN_EXE_probe");
pub const FAULT: &str = env!("CARGO_BIN_EXE_probe-fault");

pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// True when the test can run; panics under CI when it cannot.
pub fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        !ci(),
        "kernel tests need root, and CI=true forbids skipping them"
    );
    eprintln!("SKIPPED: kernel test needs root");
    false
}

pub struct Traced {
    pub json: Value,
    pub code: Option<i32>,
    pub stderr: String,
}

impl Traced {
    pub fn primitive(&self) -> &str {
        self.json["primitive"].as_str().unwrap_or("?")
    }
    pub fn decisive(&self, field: &str) -> Option<&str> {
        self.json["decisive"][field].as_str()
    }
    /// At least `n` failures sent one by one, the decisive one not a repeat.
    pub fn expect_distinct_failures(&self, n: u64) {
        assert!(
            self.json["decisive"].get("repeats").is_none(),
            "{}",
            self.context()
        );
        assert!(
            self.json["counts"]["syscall_failed"].as_u64().unwrap_or(0) >= n,
            "{}",
            self.json["counts"]
        );
    }
    pub fn context(&self) -> String {
        format!(
            "primitive={} explanation={}\ndecisive={}\nstderr={}",
            self.primitive(),
            self.json["explanation"],
            self.json["decisive"],
            self.stderr
        )
    }
    /// Asserts the primitive and, when given, the decisive syscall.
    pub fn expect(&self, primitive: &str, syscall: Option<&str>) {
        assert_eq!(self.primitive(), primitive, "{}", self.context());
        if let Some(s) = syscall {
            assert_eq!(self.decisive("syscall"), Some(s), "{}", self.context());
        }
        let layer = if primitive == "none" {
            "test"
        } else {
            "sandbox"
        };
        if self.json["failed"] == Value::Bool(true) {
            assert_eq!(self.json["layer"], layer, "{}", self.context());
        }
    }
}

pub fn parse(out: Output) -> Traced {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("stdout is not one JSON object ({e}):\n{stdout}\nstderr:\n{stderr}")
    });
    Traced {
        json,
        code: out.status.code(),
        stderr,
    }
}

/// `probe trace --json [extra] -- cmd...`
pub fn trace_with(extra: &[&str], cmd: &[&str]) -> Traced {
    trace_in(Path::new("."), extra, cmd)
}

/// [`trace_with`], run in directory `dir` (podman's conmon leaves files in
/// its working directory).
pub fn trace_in(dir: &Path, extra: &[&str], cmd: &[&str]) -> Traced {
    run_trace(dir, extra, &[], cmd)
}

/// `probe trace --json -- CMD` with the probe's environment extended by `env`.
pub fn trace_env(env: &[(&str, &str)], cmd: &[&str]) -> Traced {
    run_trace(Path::new("."), &[], env, cmd)
}

fn run_trace(dir: &Path, extra: &[&str], env: &[(&str, &str)], cmd: &[&str]) -> Traced {
    let out = Command::new(PROBE)
        .args(["trace", "--json"])
        .args(extra)
        .arg("--")
        .args(cmd)
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .expect("run probe");
    parse(out)
}

/// Begins a span (`begin`: the request's fields besides `op`), runs `cmd`
/// attached to it with its output discarded, and answers the span and how
/// the command ended. The caller ends the span.
pub fn run_attached(
    client: &mut probe::client::Client,
    begin: Value,
    cmd: &[&str],
) -> (u64, probe::attribution::ExitStatus) {
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::Stdio;
    let mut request = serde_json::json!({"op": "begin_span", "label": cmd.join(" ")});
    for (k, v) in begin.as_object().expect("begin_span fields") {
        request[k] = v.clone();
    }
    let span = client.call(request).unwrap()["span_id"]
        .as_u64()
        .expect("a span id");
    let mut c = Command::new(cmd[0]);
    c.args(&cmd[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let (child, _) = probe::spawn::spawn_attached(&mut c, |pid| client.attach(span, pid)).unwrap();
    let status = child.unwrap().wait().unwrap();
    let exit = probe::attribution::ExitStatus {
        code: status.code(),
        signal: status.signal().map(probe::event::signal_name),
    };
    (span, exit)
}
