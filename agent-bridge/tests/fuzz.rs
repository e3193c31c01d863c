//! A fuzzer nobody here wrote, `mcp-fuzzer` (pinned with every package it
//! pulls in by tests/fuzz/requirements.txt; `cargo xtask test` installs it
//! into target/fuzz-venv), against `agent-bridge serve` over stdio and
//! Streamable HTTP and against `agent-bridge proxy`: tool arguments made
//! from each inputSchema (realistic and aggressive), then MCP messages,
//! structured and malformed. Workloads run under tests/fuzz/profile.toml
//! (nobody, no capabilities, no network, the world-writable places
//! read-only), so a random command changes nothing.
//!
//! Every run must end by itself (no hang) with no crash, exception or
//! transport anomaly in the fuzzer's report. On stdio the bytes both ways
//! are recorded, and every line the server wrote must be JSON-RPC 2.0, every
//! error code one JSON-RPC or MCP defines, and every request answered
//! exactly once with its own id (or `id: null` when its id cannot come back
//! as sent). Afterwards no workload of the profile runs and no call cgroup
//! is left; the HTTP server's descriptors and RSS come back to where they
//! were before the fuzzing.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{
    BRIDGE, Bridge, call_cgroups, gone, probe_socket, root, status_bytes, within, within_10s,
};
use serde_json::Value;

/// Reproducible payloads; runs per tool and phase; runs per message type.
const SEED: &str = "7";
const RUNS: &str = "3";
const RUNS_PER_TYPE: &str = "3";
/// The profile's uid: a process of it after a run is a workload that
/// outlived its server.
const NOBODY: u32 = 65534;
/// A fuzz run that takes longer than this hangs.
const RUN_LIMIT: Duration = Duration::from_secs(600);

/// The runs share the machine's cgroups and the nobody uid: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn fuzzer() -> PathBuf {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-venv/bin/mcp-fuzzer");
    assert!(
        bin.exists(),
        "{} is missing: `cargo xtask test` installs mcp-fuzzer there",
        bin.display()
    );
    bin
}

const PROFILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz/profile.toml");

/// A directory for one test's reports and workdir, outside /tmp and /run's
/// children the profile makes read-only to workloads (the bridge itself
/// writes there as root).
fn scratch(name: &str) -> PathBuf {
    let dir =
        Path::new("/run/agent-bridge-fuzz-tests").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("workdir")).unwrap();
    dir
}

/// `agent-bridge serve` arguments under the fuzz profile, with the probe.
fn serve_args(dir: &Path) -> Vec<String> {
    vec![
        "serve".into(),
        "--profile".into(),
        PROFILE.into(),
        "--probe-socket".into(),
        probe_socket().display().to_string(),
        "--workdir".into(),
        dir.join("workdir").display().to_string(),
    ]
}

/// The two passes of a surface: every tool with realistic then aggressive
/// arguments followed by structured MCP messages, then malformed ones.
const PASSES: [(&str, &[&str]); 2] = [
    (
        "tools and messages",
        &[
            "--mode",
            "all",
            "--phase",
            "both",
            "--protocol-phase",
            "realistic",
        ],
    ),
    (
        "malformed messages",
        &["--mode", "protocol", "--protocol-phase", "aggressive"],
    ),
];

/// One mcp-fuzzer run; its run summary and findings.
struct Fuzzed {
    summary: Value,
    findings: Vec<Value>,
}

/// Not in the servers' environment: `sandbox_environment` lists the
/// workloads' variable names, and the fuzzer's leak pattern
/// (`rust_backtrace`) matches the name CI sets. A real panic still says
/// "run with `RUST_BACKTRACE=1`", which it matches.
const BACKTRACE_VARIABLES: [&str; 2] = ["RUST_BACKTRACE", "RUST_LIB_BACKTRACE"];

fn fuzz(protocol: &str, endpoint: &str, pass: &[&str], out: &Path) -> Fuzzed {
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out.join("fs-root")).unwrap();
    let mut fuzzer_command = Command::new(fuzzer());
    // the stdio servers are the fuzzer's children
    for name in BACKTRACE_VARIABLES {
        fuzzer_command.env_remove(name);
    }
    let mut child = fuzzer_command
        .args(pass)
        .args(["--protocol", protocol, "--endpoint", endpoint])
        .args([
            "--seed",
            SEED,
            "--runs",
            RUNS,
            "--runs-per-type",
            RUNS_PER_TYPE,
        ])
        .args(["--timeout", "30", "--no-network", "--no-corpus"])
        .arg("--fs-root")
        .arg(out.join("fs-root"))
        .arg("--output-dir")
        .arg(out.join("reports"))
        .stdout(std::fs::File::create(out.join("fuzzer.log")).unwrap())
        .stderr(Stdio::from(
            std::fs::File::options()
                .append(true)
                .open(out.join("fuzzer.log"))
                .unwrap(),
        ))
        .spawn()
        .expect("start mcp-fuzzer");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "mcp-fuzzer {pass:?} against {endpoint} did not end within {RUN_LIMIT:?} (a hang); its log: {}",
                out.join("fuzzer.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(out.join("fuzzer.log")).unwrap_or_default();
    let tail: String = log
        .lines()
        .rev()
        .take(40)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        status.success(),
        "mcp-fuzzer {pass:?} against {endpoint}: {status}\n{tail}"
    );
    // Python's json writes the payloads' Infinity and NaN as such: not JSON
    let read = |name: &str| -> Option<Value> {
        let text = std::fs::read_to_string(out.join("reports").join(name)).ok()?;
        let text = ["-Infinity", "Infinity", "NaN"]
            .iter()
            .fold(text, |t, bare| t.replace(bare, "null"));
        Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}")))
    };
    let summary = read("run_summary.json")
        .unwrap_or_else(|| panic!("mcp-fuzzer wrote no run_summary.json\n{tail}"));
    let findings = read("findings.json")
        .and_then(|f| f["findings"].as_array().cloned())
        .unwrap_or_default();
    eprintln!(
        "fuzz {pass:?} against {endpoint}: {} tool runs, {} message runs, {} s, findings {}",
        summary["tools"]["total_runs"],
        summary["protocols"]["total_runs"],
        started.elapsed().as_secs(),
        summary["findings"]["by_category"]
    );
    Fuzzed { summary, findings }
}

/// The fuzzer's findings that are guesses about a server that are wrong
/// for this one; any other category (crash, hang, internal_error,
/// error_leakage, memory_growth, oversized_response, or one this version
/// does not know) fails the test.
/// - `accepted_malformed`: an answer that is not an error to input the
///   fuzzer thinks deserved one: a notification (JSON-RPC forbids an
///   answer), a tool's own error (MCP puts it in the result, `isError`, for
///   the model to read), `ping` with `_meta`, or an attack string to a tool
///   whose job is to run what it is given (under the profile it changes
///   nothing).
/// - `injection_reflection`: an argument error names the value it refused
///   (`argument `format`: `../../../etc/passwd` is not png or jpeg`), on
///   purpose: the caller reads back its own input, nobody else's.
/// - `performance_outlier`: a call that starts the session's browser takes
///   a second where a refused argument takes a millisecond.
/// - `non_determinism`: the same arguments mean another thing as the
///   session's state moves (`poll_process {"id": 1}` before and after a
///   process 1 exists).
const NOT_A_FAULT: [&str; 4] = [
    "accepted_malformed",
    "injection_reflection",
    "performance_outlier",
    "non_determinism",
];

/// No crash, no exception, no transport anomaly, no finding but the
/// fuzzer's guesses, the spec checks it ran all passed.
fn assert_no_fault(f: &Fuzzed, what: &str) {
    let s = &f.summary;
    assert_eq!(s["status"], "completed", "{what}: {s}");
    let tools = s["tools"]["by_name"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (tool, t) in &tools {
        for bucket in ["crashed", "anomaly", "exceptions"] {
            assert_eq!(
                t["outcomes"][bucket].as_u64(),
                Some(0),
                "{what}: {tool}: {bucket}: {t}"
            );
        }
    }
    for finding in &f.findings {
        let category = finding["category"].as_str().unwrap_or("?");
        assert!(
            NOT_A_FAULT.contains(&category),
            "{what}: a {category} finding: {finding:#}"
        );
    }
}

/// Whether `id`, as written on the wire, comes back exactly: a string, or an
/// integer a signed 64-bit number holds. The key it is counted under.
fn exact_key(raw: &str) -> Option<String> {
    if raw.starts_with('"') {
        let s: String = serde_json::from_str(raw).ok()?;
        return Some(format!("string {s:?}"));
    }
    raw.parse::<i64>().ok().map(|n| format!("number {n}"))
}

/// The raw text of a message's `id`, `Some("null")` for an id of null,
/// `None` for a message without one.
fn raw_id(line: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow, default)]
        id: Option<&'a serde_json::value::RawValue>,
    }
    let v: Value = serde_json::from_slice(line).ok()?;
    v.as_object()?.get("id")?;
    let parsed: Id<'_> = serde_json::from_slice(line).ok()?;
    Some(
        parsed
            .id
            .map_or_else(|| "null".to_string(), |r| r.get().to_string()),
    )
}

/// What one recorded exchange held.
#[derive(Debug, Default)]
struct Exchange {
    requests: usize,
    answers: usize,
    null_answers: usize,
    inexact_requests: usize,
}

/// JSON-RPC's codes, and the server-error range MCP's own codes sit in.
fn defined_code(code: i64) -> bool {
    matches!(code, -32700 | -32600 | -32601 | -32602 | -32603) || (-32099..=-32000).contains(&code)
}

/// Checks a recorded stdio exchange (`sent`: the client's bytes, `got`: the
/// server's): every line the server wrote is a JSON-RPC 2.0 message, an
/// answer has exactly one of `result` and `error`, an error's code is
/// defined; each request whose id comes back exactly got exactly one
/// answer with it, no answer names an id nobody sent, and there are at
/// least as many `id: null` answers as requests with an id that cannot
/// come back.
fn assert_clean_exchange(sent: &[u8], got: &[u8], what: &str) -> Exchange {
    let mut x = Exchange::default();
    let mut asked: BTreeMap<String, usize> = BTreeMap::new();
    for line in sent.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if !m.get("method").is_some_and(Value::is_string) {
            continue;
        }
        let Some(raw) = raw_id(line) else {
            continue; // a notification
        };
        x.requests += 1;
        match exact_key(&raw) {
            Some(key) => *asked.entry(key).or_default() += 1,
            None => x.inexact_requests += 1,
        }
    }
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for line in got.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let shown = String::from_utf8_lossy(&line[..line.len().min(300)]).into_owned();
        let m: Value = serde_json::from_slice(line).unwrap_or_else(|e| {
            panic!("{what}: the server wrote a line that is not JSON ({e}): {shown}")
        });
        assert_eq!(m["jsonrpc"], "2.0", "{what}: not JSON-RPC 2.0: {shown}");
        if m.get("method").is_some() {
            continue; // the server's own request or notification
        }
        x.answers += 1;
        let has = |k: &str| m.as_object().is_some_and(|o| o.contains_key(k));
        assert!(has("id"), "{what}: an answer without an id: {shown}");
        assert!(
            has("result") != has("error"),
            "{what}: an answer needs exactly one of result and error: {shown}"
        );
        if has("error") {
            let code = m["error"]["code"].as_i64();
            assert!(
                code.is_some_and(defined_code),
                "{what}: an error code JSON-RPC does not define: {shown}"
            );
            assert!(m["error"]["message"].is_string(), "{what}: {shown}");
        }
        let raw = raw_id(line).expect("has an id");
        if raw == "null" {
            x.null_answers += 1;
            continue;
        }
        let key = exact_key(&raw).unwrap_or_else(|| {
            panic!("{what}: an answer's id is neither a string nor an integer: {shown}")
        });
        *answered.entry(key).or_default() += 1;
    }
    for (key, n) in &asked {
        let got = answered.get(key).copied().unwrap_or(0);
        assert_eq!(
            got, *n,
            "{what}: {n} request(s) with id {key}, {got} answer(s) with it"
        );
    }
    for key in answered.keys() {
        assert!(
            asked.contains_key(key),
            "{what}: an answer with id {key}, which no request had"
        );
    }
    assert!(
        x.null_answers >= x.inexact_requests,
        "{what}: {} request(s) whose id cannot come back exactly, only {} answer(s) with id null",
        x.inexact_requests,
        x.null_answers
    );
    x
}

/// Pids of processes running as the profile's uid.
fn nobodys_processes() -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|l| l.split_whitespace().next()?.parse::<u32>().ok())
                    == Some(NOBODY)
            })
        })
        .filter(|pid| !gone(pid))
        .collect()
}

/// Call cgroups (`mcp-PID-…`) whose bridge is gone, in any hierarchy.
fn orphaned_call_cgroups() -> Vec<String> {
    call_cgroups()
        .iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.strip_prefix("mcp-")
                .and_then(|rest| rest.split('-').next())
                .is_some_and(gone)
        })
        .map(|p| p.display().to_string())
        .collect()
}

/// Nothing a fuzzed server started runs on, and its cgroups are gone.
fn assert_nothing_left(what: &str) {
    assert!(
        within_10s(|| nobodys_processes().is_empty()),
        "{what}: workloads outlived their server: {:?}",
        nobodys_processes()
            .iter()
            .map(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .replace('\0', " "))
            .collect::<Vec<_>>()
    );
    assert!(
        within_10s(|| orphaned_call_cgroups().is_empty()),
        "{what}: call cgroups left behind: {:?}",
        orphaned_call_cgroups()
    );
}

/// A stdio server, recorded both ways by `tee`, as mcp-fuzzer's endpoint.
fn recorded(dir: &Path, argv: &[String]) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let server: Vec<String> = argv.iter().map(|a| quote(a)).collect();
    let script = format!(
        "tee -a {} | {} | tee -a {}",
        quote(&dir.join("sent.jsonl").display().to_string()),
        server.join(" "),
        quote(&dir.join("got.jsonl").display().to_string()),
    );
    format!("sh -c {}", quote(&script))
}

/// Both passes against one recorded stdio server command.
fn fuzz_stdio(name: &str, server: impl Fn(&Path) -> Vec<String>) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(name);
    for (pass, args) in PASSES {
        let what = format!("{name}, {pass}");
        let run = dir.join(pass.replace(' ', "-"));
        std::fs::create_dir_all(&run).unwrap();
        let endpoint = recorded(&run, &server(&dir));
        let f = fuzz("stdio", &endpoint, args, &run);
        assert_no_fault(&f, &what);
        let sent = std::fs::read(run.join("sent.jsonl")).unwrap_or_default();
        let got = std::fs::read(run.join("got.jsonl")).unwrap_or_default();
        let x = assert_clean_exchange(&sent, &got, &what);
        assert!(
            x.requests > 0 && x.answers > 0,
            "{what}: nothing recorded: {x:?}"
        );
        eprintln!("{what}: {x:?}");
        assert_nothing_left(&what);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_fuzzer_finds_no_fault_in_serve_over_stdio() {
    if !root() {
        return;
    }
    fuzz_stdio("serve-stdio", |dir| {
        let mut argv = vec![BRIDGE.to_string()];
        argv.extend(serve_args(dir));
        argv.push("--stdio".into());
        argv
    });
}

#[test]
fn the_fuzzer_finds_no_fault_in_the_proxy_over_stdio() {
    if !root() {
        return;
    }
    fuzz_stdio("proxy-stdio", |dir| {
        let mut argv = vec![
            BRIDGE.to_string(),
            "proxy".into(),
            "--stdio".into(),
            "--probe-socket".into(),
            probe_socket().display().to_string(),
            "--".into(),
            BRIDGE.to_string(),
        ];
        argv.extend(serve_args(dir));
        argv.push("--stdio".into());
        argv
    });
}

/// One call of each kind a session makes: a workload, a file worker, the
/// probe's evidence.
fn warm_up_every_kind_of_call(url: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let session = common::raw_http_session(url).await;
        let calls = [
            ("exec", serde_json::json!({"argv": ["true"]})),
            ("stat", serde_json::json!({"path": "/"})),
            ("kernel_evidence", serde_json::json!({})),
        ];
        for (i, (tool, arguments)) in calls.into_iter().enumerate() {
            let call = serde_json::json!({"jsonrpc": "2.0", "id": i + 10, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
            let (_, status, answer) = common::raw_post(url, Some(&session), &call.to_string()).await;
            assert_eq!(status, 200, "{tool}: {answer}");
        }
    });
}

/// Open descriptors of `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn the_fuzzer_finds_no_fault_in_serve_over_http_and_it_comes_back_to_its_baseline() {
    if !root() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("serve-http");
    let mut args = serve_args(&dir);
    // the fuzzer never ends its sessions (no DELETE): they are ended when
    // idle, longer than any call under the profile (max_timeout_ms 5 s)
    let session_idle = Duration::from_secs(10);
    args.extend([
        "--http".into(),
        "127.0.0.1:0".into(),
        "--session-idle-timeout".into(),
        session_idle.as_secs().to_string(),
    ]);
    let (mut server, url) = Bridge::start_http_without(&args, &BACKTRACE_VARIABLES);
    let pid = server.0.id();
    // a first pass warms the server up (thread pools, allocator arenas):
    // the baseline is taken after it
    let warm = fuzz("streamablehttp", &url, PASSES[0].1, &dir.join("warm-up"));
    assert_no_fault(&warm, "serve over HTTP, warm-up");
    // and what is opened once and kept (the worker's binary, the probe's
    // connection), whatever the fuzzer's arguments happened to reach
    warm_up_every_kind_of_call(&url);
    std::thread::sleep(session_idle * 2);
    let (fds_before, rss_before) = (fds(pid), status_bytes(pid, "VmRSS"));
    for (pass, pass_args) in PASSES {
        let what = format!("serve over HTTP, {pass}");
        let f = fuzz(
            "streamablehttp",
            &url,
            pass_args,
            &dir.join(pass.replace(' ', "-")),
        );
        assert_no_fault(&f, &what);
        assert!(server.alive(), "{what}: the server died");
    }
    // the fuzzer's connections are closed, its sessions ended once idle
    // (their probe sessions with them), its calls' buffers freed
    let settled = within(session_idle * 3, || fds(pid) <= fds_before);
    let (fds_after, rss_after) = (fds(pid), status_bytes(pid, "VmRSS"));
    eprintln!(
        "serve over HTTP: fds {fds_before} -> {fds_after}, RSS {} -> {} KiB",
        rss_before >> 10,
        rss_after >> 10
    );
    assert!(
        settled,
        "descriptors did not come back: {fds_before} before, {fds_after} after"
    );
    // RSS: what the two passes' sessions may keep, not a leak per call
    assert!(
        rss_after <= rss_before + rss_before / 4 + (4 << 20),
        "RSS did not come back: {} KiB before, {} KiB after",
        rss_before >> 10,
        rss_after >> 10
    );
    drop(server);
    assert_nothing_left("serve over HTTP");
    let _ = std::fs::remove_dir_all(&dir);
}
