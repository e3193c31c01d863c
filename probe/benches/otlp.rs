//! OTLP export benchmark (`cargo bench -p probe --bench otlp`, run by
//! `cargo xtask bench --only otlp`): a daemon with `--otlp` to a local
//! receiver that decodes every request (`opentelemetry-proto`), driven
//! with begin/end span pairs (MCP tool fields and a traceparent) from
//! several client connections. Measures the spans/s the collector
//! received, exported and dropped counts, the daemon's peak RSS (VmHWM)
//! and bytes per span on the wire. Prints a Markdown section on stdout.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use probe::client::Client;
use probe::otlp_receiver::Receiver;
use serde_json::json;

const PROBE: &str = env!("CARGO_BIN_EXE_probe");
const CLIENTS: usize = 4;
const SPANS: usize = 200_000;

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("the OTLP benchmark needs root (it loads the eBPF programs)");
        std::process::exit(1);
    }
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start().unwrap();
    rx.counts_only(true);
    let socket = dir.path().join("bench.sock");
    let mut child = Command::new(PROBE)
        .args(["run", "--socket"])
        .arg(&socket)
        .arg("--db")
        .arg(dir.path().join("bench.db"))
        .args(["--otlp", &rx.url()])
        .stderr(Stdio::null())
        .spawn()
        .expect("probe run");
    probe::client::wait_until_ready(&socket, Duration::from_secs(20)).expect("daemon up");
    let pid = child.id();
    let rss_idle = status_kib(pid, "VmRSS:");
    let t0 = Instant::now();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|w| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).unwrap();
                for i in 0..SPANS / CLIENTS {
                    let tp = format!("00-{:032x}-{:016x}-01", (w * SPANS + i + 1) as u128, i + 1);
                    let r = c
                        .call(json!({"op": "begin_span", "session": format!("bench-{w}"),
                            "label": "exec: true", "tool": "exec", "mcp_method": "tools/call",
                            "mcp_session": "bench", "traceparent": tp}))
                        .unwrap();
                    let span = r["span_id"].as_u64().unwrap();
                    c.call(json!({"op": "end_span", "span_id": span, "exit": {"code": 0, "signal": null}}))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let driven = t0.elapsed();
    // everything accounted for: exported or dropped
    let deadline = Instant::now() + Duration::from_secs(60);
    let o = loop {
        let o = Client::connect(&socket).unwrap().status().unwrap()["otlp"].clone();
        let done = o["exported"].as_u64().unwrap()
            + o["dropped_queue_full"].as_u64().unwrap()
            + o["dropped_export_failed"].as_u64().unwrap();
        if done >= SPANS as u64 || Instant::now() > deadline {
            break o;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let received_all = t0.elapsed();
    let received = rx.span_count();
    let hwm = status_kib(pid, "VmHWM:");
    let bytes = rx.bytes();
    let requests = rx.requests();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    let rate = |n: u64, d: Duration| n as f64 / d.as_secs_f64();
    println!("## OpenTelemetry export (`probe run --otlp`)\n");
    println!(
        "`cargo bench -p probe --bench otlp`: one daemon exporting to a local OTLP/HTTP receiver \
         that decodes every request (`ExportTraceServiceRequest`); {SPANS} begin/end span pairs \
         (tool, MCP session, traceparent; nothing attached) from {CLIENTS} client connections; \
         {} CPUs.\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("| measure | value |\n|---|---|");
    println!(
        "| spans ended by the clients | {SPANS} in {:.2} s ({:.0} spans/s) |",
        driven.as_secs_f64(),
        rate(SPANS as u64, driven)
    );
    println!(
        "| spans received by the collector | {received} in {:.2} s (**{:.0} spans/s**) |",
        received_all.as_secs_f64(),
        rate(received, received_all)
    );
    println!(
        "| exported / dropped (queue full) / dropped (export failed) | {} / {} / {} |",
        o["exported"], o["dropped_queue_full"], o["dropped_export_failed"]
    );
    println!(
        "| export requests | {requests} ({:.0} spans each) |",
        received as f64 / requests.max(1) as f64
    );
    println!(
        "| bytes per span on the wire (protobuf, uncompressed) | {:.0} |",
        bytes as f64 / received.max(1) as f64
    );
    println!(
        "| daemon RSS idle → peak (VmHWM) | {:.1} MiB → **{:.1} MiB** |",
        rss_idle as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    println!();
}
