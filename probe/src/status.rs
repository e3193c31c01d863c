//! The daemon's status (`{"op": "status"}`, `probe status`): one struct the
//! daemon fills and serializes, and clients deserialize and render. The JSON
//! field names are a contract (docs/PROTOCOL.md).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub protocol: u32,
    pub version: String,
    pub pid: u32,
    /// The PID namespace pids in requests and evidence belong to (`None`:
    /// the host's).
    pub pid_namespace: Option<PidNamespaceId>,
    pub uptime_s: u64,
    pub kernel: String,
    pub features: Features,
    pub programs: Vec<String>,
    pub missing_optional: Vec<String>,
    pub events_total: u64,
    pub events_per_sec: f64,
    pub late_events: u64,
    pub decode_errors: u64,
    pub drops: StatusDrops,
    pub open_spans: usize,
    pub spans_ended: u64,
    pub tracked_tasks: usize,
    pub sessions_remembered: usize,
    /// Their written paths and directories (bounded: `sessions::MAX_REMEMBERED`).
    #[serde(default)]
    pub paths_remembered: usize,
    /// OpenTelemetry export (`None` when off).
    pub otlp: Option<OtlpStatus>,
    /// The gVisor monitor (`None` when not listening).
    #[serde(default)]
    pub gvisor: Option<GvisorStatus>,
    pub rss_kib: Option<u64>,
    pub db: DbStatus,
    /// Clients confined to their sandbox (docs/PROTOCOL.md, "Who may
    /// reach what").
    #[serde(default)]
    pub clients: ClientsStatus,
    /// The sandbox the asking client is confined to (absent for a client
    /// in the daemon's own namespace, which sees everything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_sandbox: Option<String>,
}

/// Clients from other PID namespaces and gVisor sandboxes, and the spans
/// clients leave to their connection to end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientsStatus {
    /// Confined clients connected now.
    pub sandboxed: u64,
    /// Requests refused as reaching outside the client's sandbox.
    pub forbidden: u64,
    /// Spans begun with `ends_with_connection` and not ended yet: the
    /// daemon ends each when its connection closes (a server's spans
    /// between calls; flat under load, or a connection forgets nothing).
    #[serde(default)]
    pub spans_ending_with_connection: u64,
    /// Span ids the connections keep to end should their client's process
    /// die: those open, and at most as many again ended on another
    /// connection since the last pruning (flat under load).
    #[serde(default)]
    pub spans_ending_with_client: u64,
}

/// The daemon as gVisor's runtime monitor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GvisorStatus {
    pub socket: PathBuf,
    /// Sandboxes connected now: the runsc that started each and the
    /// containers its points named.
    pub sandboxes: Vec<GvisorSandbox>,
    /// Sandboxes that ever connected and shook hands.
    pub connections: u64,
    pub datagrams: u64,
    /// Points that made events; of their events, those of processes in
    /// no span.
    pub points: u64,
    pub unrouted: u64,
    /// Points runsc dropped (its `dropped_count`), counted into the
    /// spans of that sandbox as kernel drops.
    pub dropped: u64,
    /// Datagrams that were no point (skipped), connections without a
    /// handshake (closed).
    pub malformed: u64,
    pub refused: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GvisorSandbox {
    pub runsc_pid: Option<u32>,
    pub containers: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PidNamespaceId {
    pub dev: u64,
    pub inode: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Features {
    pub btf: bool,
    pub ring_buffer: bool,
    pub raw_tracepoints: bool,
    pub kprobes: bool,
    /// The rung the syscall programs run on: `btf` or `tracepoint`
    /// (docs/KERNELS.md).
    #[serde(default)]
    pub rung: String,
    /// The JIT's state (`net.core.bpf_jit_enable`): "on", or the
    /// interpreter's, slower.
    #[serde(default)]
    pub jit: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusDrops {
    /// Records the ring buffer had no room for.
    pub kernel_total: u64,
    /// Children that could not be traced at all (task map full): whole
    /// subtrees unseen.
    pub untracked_children: u64,
    pub kernel_by_kind: BTreeMap<String, u64>,
    pub retention_events_total: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OtlpStatus {
    pub endpoint: String,
    pub exported: u64,
    pub dropped_queue_full: u64,
    pub dropped_export_failed: u64,
    pub queued: usize,
    pub queue_capacity: usize,
    pub batches: u64,
    pub bytes_sent: u64,
    pub last_error: Option<String>,
    /// `traceparent`s in requests that did not parse (spans exported without a parent).
    #[serde(default)]
    pub invalid_traceparents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DbStatus {
    pub path: PathBuf,
    pub size_bytes: u64,
    pub store_queue: u64,
    pub stored_spans: u64,
    pub store_errors: u64,
    pub retention_removed: RetentionRemoved,
    /// What the DB (with its WAL) may use now: the smaller of
    /// `max_db_bytes` and `max_disk_share` of its filesystem's free space.
    #[serde(default)]
    pub budget_bytes: u64,
    /// Spans in the DB now, and its bytes per span.
    #[serde(default)]
    pub spans_in_db: u64,
    #[serde(default)]
    pub bytes_per_span: u64,
    /// `failed`: a span that explains nothing keeps its exit, counts,
    /// drops, duration, memory figures and evidence events, not its
    /// tolerated failures; `all`: every span keeps every event.
    #[serde(default)]
    pub keep_events: String,
    /// `incremental`: retention gives freed pages back; `none` (a DB made
    /// by an older version): it only reuses them.
    #[serde(default)]
    pub auto_vacuum: String,
    /// Event rows written since the daemon started.
    #[serde(default)]
    pub events_stored: u64,
    /// Time the store thread spent writing and making room, and its
    /// longest single stretch (how long ingestion waited at worst).
    #[serde(default)]
    pub store_busy_ms: f64,
    #[serde(default)]
    pub longest_write_ms: f64,
    /// A retention pass stopped at its time limit with work left (the DB
    /// may be over its budget until the next, which runs at once).
    #[serde(default)]
    pub retention_behind: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetentionRemoved {
    pub spans: u64,
    pub events: u64,
    /// Of `spans`, those that explained something (failed, hid a failure,
    /// met memory pressure): removed only when no other span was left.
    #[serde(default)]
    pub explaining_spans: u64,
}

impl DaemonStatus {
    /// The status for people: one line per part.
    pub fn render(&self) -> String {
        let mib = |bytes: u64| bytes as f64 / 1024.0 / 1024.0;
        let pids = match self.pid_namespace {
            Some(ns) => format!(
                "of PID namespace pid:[{}] (the sandbox's; the kernel's are translated)",
                ns.inode
            ),
            None => "of the host's PID namespace".to_owned(),
        };
        let missing = if self.missing_optional.is_empty() {
            String::new()
        } else {
            format!(" (missing optional: {})", self.missing_optional.join(", "))
        };
        let otlp = match &self.otlp {
            None => "off".to_owned(),
            Some(o) => format!(
                "{} — exported {}, dropped {} (queue full) / {} (export failed), queued {}{}",
                o.endpoint,
                o.exported,
                o.dropped_queue_full,
                o.dropped_export_failed,
                o.queued,
                match &o.last_error {
                    Some(e) => format!("; last error: {e}"),
                    None => String::new(),
                }
            ),
        };
        let gvisor = match &self.gvisor {
            None => "off".to_owned(),
            Some(g) => format!(
                "{} — {} sandbox(es) connected{}, {} ever; {} points ({} outside any span), {} dropped by runsc, {} malformed, {} refused",
                g.socket.display(),
                g.sandboxes.len(),
                match g
                    .sandboxes
                    .iter()
                    .flat_map(|s| s.containers.iter())
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                {
                    c if c.is_empty() => String::new(),
                    c => format!(" ({})", c.join(", ")),
                },
                g.connections,
                g.points,
                g.unrouted,
                g.dropped,
                g.malformed,
                g.refused,
            ),
        };
        let clients = match &self.client_sandbox {
            Some(id) => format!("this one is confined to its sandbox, {id}"),
            None => format!(
                "{} confined connection(s) now; {} request(s) refused as outside their sandbox; \
                 {} span(s) to end when their connection closes, {} kept to end if their client dies",
                self.clients.sandboxed,
                self.clients.forbidden,
                self.clients.spans_ending_with_connection,
                self.clients.spans_ending_with_client
            ),
        };
        let (d, db) = (&self.drops, &self.db);
        format!(
            "probe daemon   pid {}, up {}s, protocol {}, version {}\n\
             pids           {pids}\n\
             kernel         {} (rung: {}, btf: {}, jit: {}, kprobes: {})\n\
             programs       {} attached: {}{missing}\n\
             events         {} total, {}/s, {} late (after their span ended), {} undecodable\n\
             drops          kernel {} (ring buffer full), retention {} (per-span cap), {} children untraced (task map full)\n\
             spans          {} open, {} ended; {} threads traced; {} sessions remembered ({} paths)\n\
             db             {} — {:.1} MiB of a {:.1} MiB budget, {} spans ({} B each), queue {}, stored {}, errors {}\n\
             retention      removed {} spans ({} that explained something) / {} events; keep_events = {} ({}); auto_vacuum {}; longest write {:.1} ms{}\n\
             memory         RSS {:.1} MiB\n\
             otlp           {otlp}\n\
             gvisor         {gvisor}\n\
             clients        {clients}\n",
            self.pid,
            self.uptime_s,
            self.protocol,
            self.version,
            self.kernel,
            self.features.rung,
            self.features.btf,
            self.features.jit,
            self.features.kprobes,
            self.programs.len(),
            self.programs.join(", "),
            self.events_total,
            self.events_per_sec,
            self.late_events,
            self.decode_errors,
            d.kernel_total,
            d.retention_events_total,
            d.untracked_children,
            self.open_spans,
            self.spans_ended,
            self.tracked_tasks,
            self.sessions_remembered,
            self.paths_remembered,
            db.path.display(),
            mib(db.size_bytes),
            mib(db.budget_bytes),
            db.spans_in_db,
            db.bytes_per_span,
            db.store_queue,
            db.stored_spans,
            db.store_errors,
            db.retention_removed.spans,
            db.retention_removed.explaining_spans,
            db.retention_removed.events,
            db.keep_events,
            if db.keep_events == "all" {
                "every span keeps every event"
            } else {
                "a successful span keeps its exit, counts, drops, duration and memory figures, not its tolerated failures"
            },
            db.auto_vacuum,
            db.longest_write_ms,
            if db.retention_behind {
                "; behind (the next pass goes on at once)"
            } else {
                ""
            },
            self.rss_kib.unwrap_or(0) as f64 / 1024.0,
        )
    }
}
