//! `cargo bench -p agent-bridge --bench proxy`: what `agent-bridge proxy`
//! costs over calling the same foreign server directly (raw JSON-RPC over
//! pipes, in the same run, interleaved), with a probe daemon attached; and
//! a 64 MiB result through it. Markdown on stdout (docs/BENCHMARKS.md).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const BRIDGE: &str = env!("CARGO_BIN_EXE_agent-bridge");
const BATCH: usize = 50;
const BATCHES: usize = 12;
/// 64 MiB reads each way (the best is reported).
const BIG_RUNS: usize = 5;

/// A stdio MCP server process and its pipes, killed on drop.
struct Peer {
    child: Child,
    tx: ChildStdin,
    rx: BufReader<ChildStdout>,
    next: u64,
}

impl Peer {
    fn start(args: &[&str]) -> Peer {
        let mut child = Command::new(BRIDGE)
            .args(args)
            .env_remove("LD_LIBRARY_PATH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start agent-bridge");
        let tx = child.stdin.take().unwrap();
        let rx = BufReader::with_capacity(1 << 20, child.stdout.take().unwrap());
        let mut p = Peer {
            child,
            tx,
            rx,
            next: 1,
        };
        p.ask("initialize", r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}"#);
        writeln!(
            p.tx,
            r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
        )
        .unwrap();
        p
    }

    /// One request; its answer line.
    fn ask(&mut self, method: &str, params: &str) -> Vec<u8> {
        let id = self.next;
        self.next += 1;
        writeln!(
            self.tx,
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#
        )
        .unwrap();
        let mut line = Vec::new();
        self.rx.read_until(b'\n', &mut line).unwrap();
        assert!(line.len() > 1, "{method}: no answer");
        line
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn vm_hwm_kib(pid: u32) -> u64 {
    agent_bridge::process::status_kib(pid, "VmHWM")
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the proxy benchmark needs root (probe daemon)"
    );
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("probe.sock");
    let mut daemon = Command::new(Path::new(BRIDGE).with_file_name("probe"))
        .args(["run", "--socket"])
        .arg(&socket)
        .arg("--db")
        .arg(dir.path().join("evidence.db"))
        .stderr(Stdio::null())
        .spawn()
        .expect("probe run (cargo build --release -p probe)");
    probe::client::wait_until_ready(&socket, Duration::from_secs(30)).expect("probe daemon");
    let sock = socket.display().to_string();
    let server = [BRIDGE, "serve", "--stdio", "--no-probe"];
    let mut proxy_cmd = vec!["proxy", "--stdio", "--probe-socket", &sock, "--", BRIDGE];
    proxy_cmd.extend(&server[1..]);
    let mut direct = Peer::start(&server[1..]);
    let mut proxied = Peer::start(&proxy_cmd);
    let stat = r#"{"name":"stat","arguments":{"path":"/etc/hostname"}}"#;
    // warm up both, and check the proxy's answer carries live evidence
    for _ in 0..20 {
        direct.ask("tools/call", stat);
        let a = proxied.ask("tools/call", stat);
        assert!(String::from_utf8_lossy(&a).contains(r#""probe/kernel":{"#));
    }
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for _ in 0..BATCHES {
        for (peer, out) in [(&mut direct, &mut d), (&mut proxied, &mut p)] {
            for _ in 0..BATCH {
                let t = Instant::now();
                peer.ask("tools/call", stat);
                out.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let (d50, d99, p50, p99) = (
        pct(&mut d, 0.5),
        pct(&mut d, 0.99),
        pct(&mut p, 0.5),
        pct(&mut p, 0.99),
    );
    eprintln!("bench: stat direct p50 {d50:.3} ms, through the proxy p50 {p50:.3} ms");
    // 64 MiB through the proxy
    let file: PathBuf =
        std::env::temp_dir().join(format!("proxy-bench-{}.bin", std::process::id()));
    let data: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    std::fs::write(&file, &data).unwrap();
    let read = format!(
        r#"{{"name":"read_file","arguments":{{"path":"{}"}}}}"#,
        file.display()
    );
    // interleaved, so that a busy moment of the machine hits both alike
    let (mut direct_s, mut proxy_s, mut line_len) = (f64::MAX, f64::MAX, 0);
    for _ in 0..BIG_RUNS {
        for (peer, best) in [(&mut direct, &mut direct_s), (&mut proxied, &mut proxy_s)] {
            let t = Instant::now();
            let line = peer.ask("tools/call", &read);
            *best = best.min(t.elapsed().as_secs_f64());
            line_len = line.len();
        }
    }
    let hwm_mib = vm_hwm_kib(proxied.child.id()) as f64 / 1024.0;
    let _ = std::fs::remove_file(&file);
    let mbps = |s: f64| data.len() as f64 / 1e6 / s;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.wait();
    println!("## Proxy\n");
    println!(
        "`agent-bridge proxy --stdio` in front of `agent-bridge serve --stdio --no-probe`, against the same\n\
         server called directly, in the same run (raw JSON-RPC over pipes; {BATCHES} interleaved batches of {BATCH}\n\
         calls each way), with a probe daemon attached: every proxied call opens and ends a span over\n\
         the server's whole process tree. Release build.\n"
    );
    println!("| tools/call `stat` | direct | through the proxy | overhead | ratio |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| p50 | {d50:.3} ms | {p50:.3} ms | {:.3} ms | {:.2}× |",
        p50 - d50,
        p50 / d50
    );
    println!(
        "| p99 | {d99:.3} ms | {p99:.3} ms | {:.3} ms | {:.2}× |",
        p99 - d99,
        p99 / d99
    );
    println!();
    println!(
        "| read_file of 64 MiB ({:.1} MB answer line) | direct | through the proxy | ratio |",
        line_len as f64 / 1e6
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| best of {BIG_RUNS} (interleaved) | {:.0} ms ({:.0} MB/s) | {:.0} ms ({:.0} MB/s) | {:.2}× |",
        direct_s * 1e3,
        mbps(direct_s),
        proxy_s * 1e3,
        mbps(proxy_s),
        proxy_s / direct_s
    );
    println!(
        "| proxy peak RSS (VmHWM) | | {hwm_mib:.0} MiB ({:.2}× the payload) | |",
        hwm_mib / 64.0
    );
    println!();
    let ok = |b: bool| if b { "met" } else { "MISSED" };
    println!(
        "Targets: p50 ≤ 1.2× the direct call in the same run: {} ({:.2}×, {:.3} ms over it); 64 MiB at ≥ 150 MB/s: {} ({:.0} MB/s); peak RSS ≤ 3× the payload: {} ({:.2}×).\n",
        ok(p50 / d50 <= 1.2),
        p50 / d50,
        p50 - d50,
        ok(mbps(proxy_s) >= 150.0),
        mbps(proxy_s),
        ok(hwm_mib <= 192.0),
        hwm_mib / 64.0
    );
}
