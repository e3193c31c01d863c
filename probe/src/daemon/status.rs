//! What `probe status` says: the core's figures, and what a sandboxed
//! client may see of them.

use super::*;

impl Core {
    pub(super) fn status(&self) -> DaemonStatus {
        let rss_kib = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .map(|v| v.trim().trim_end_matches(" kB").trim().to_string())
            })
            .and_then(|v| v.parse::<u64>().ok());
        let db_size = std::fs::metadata(&self.config.db)
            .map(|m| m.len())
            .unwrap_or(0)
            + std::fs::metadata(format!("{}-wal", self.config.db.display()))
                .map(|m| m.len())
                .unwrap_or(0);
        let s = &self.store_stats;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let mut status = DaemonStatus {
            protocol: protocol::PROTOCOL_VERSION,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            pid_namespace: None,
            uptime_s: self.started.elapsed().as_secs(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            features: Features::default(),
            programs: Vec::new(),
            missing_optional: Vec::new(),
            events_total: self.events_total,
            events_per_sec: (self.rate.2 * 10.0).round() / 10.0,
            late_events: self.late_events,
            decode_errors: self.decode_errors,
            drops: StatusDrops {
                retention_events_total: self.retention_drops_total,
                ..StatusDrops::default()
            },
            open_spans: self.spans.len(),
            spans_ended: self.spans_ended,
            tracked_tasks: 0,
            sessions_remembered: self.sessions.len(),
            paths_remembered: self.sessions.remembered(),
            otlp: self.otlp.as_ref().map(|e| OtlpStatus {
                invalid_traceparents: self.invalid_traceparents,
                ..e.status()
            }),
            gvisor: None,
            rss_kib,
            db: DbStatus {
                path: self.config.db.clone(),
                size_bytes: db_size,
                store_queue: load(&s.queued).saturating_sub(load(&s.written) + load(&s.errors)),
                stored_spans: load(&s.written),
                store_errors: load(&s.errors),
                retention_removed: RetentionRemoved {
                    spans: load(&s.retention_spans),
                    events: load(&s.retention_events),
                    explaining_spans: load(&s.retention_explaining),
                },
                budget_bytes: load(&s.budget_bytes),
                spans_in_db: load(&s.in_db),
                bytes_per_span: db_size.checked_div(load(&s.in_db)).unwrap_or(0),
                keep_events: self.config.retention.keep_events.id().to_owned(),
                auto_vacuum: self.auto_vacuum.to_owned(),
                events_stored: load(&s.events_written),
                store_busy_ms: load(&s.busy_us) as f64 / 1e3,
                longest_write_ms: load(&s.longest_write_us) as f64 / 1e3,
                retention_behind: s.retention_behind.load(Ordering::Relaxed),
            },
            // filled by the connection, which holds the client counts
            clients: Default::default(),
            client_sandbox: None,
        };
        // what each source says of itself
        for source in &self.sources {
            source.describe(&mut status);
        }
        status
    }
}

/// The status as a client of `scope` may see it: a confined client sees
/// no other sandbox's name and no host path.
pub(super) fn seen_by(mut status: DaemonStatus, scope: &Scope) -> DaemonStatus {
    let Scope::Sandbox(s) = scope else {
        return status;
    };
    status.client_sandbox = Some(s.id.clone());
    status.db.path = PathBuf::new();
    if let Some(g) = status.gvisor.as_mut() {
        g.socket = PathBuf::new();
        for sandbox in &mut g.sandboxes {
            sandbox
                .containers
                .retain(|c| s.id.strip_prefix("gvisor:") == Some(c.as_str()));
        }
        g.sandboxes.retain(|sb| !sb.containers.is_empty());
    }
    status
}
