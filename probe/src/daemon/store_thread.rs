//! The store thread: the only write connection to SQLite, batched
//! transactions, then retention.

use super::*;

/// Counters the store thread shares with status.
#[derive(Default)]
pub(super) struct StoreStats {
    pub(super) queued: AtomicU64,
    pub(super) written: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) retention_spans: AtomicU64,
    pub(super) retention_events: AtomicU64,
    /// Of `retention_spans`, those that explained something.
    pub(super) retention_explaining: AtomicU64,
    /// Spans in the DB now (all probes').
    pub(super) in_db: AtomicU64,
    /// Event rows written.
    pub(super) events_written: AtomicU64,
    /// Time spent writing batches and making room (µs), and its longest
    /// stretch: how long ingestion waited at worst.
    pub(super) busy_us: AtomicU64,
    pub(super) longest_write_us: AtomicU64,
    /// The size budget of the moment.
    pub(super) budget_bytes: AtomicU64,
    /// The last retention pass stopped at its time limit with work left.
    pub(super) retention_behind: AtomicBool,
}

impl StoreStats {
    /// Runs one step of the store thread, counting its time as busy and
    /// keeping the longest (how long ingestion waited at worst).
    pub(super) fn timed<T>(&self, step: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = step();
        let us = started.elapsed().as_micros() as u64;
        self.busy_us.fetch_add(us, Ordering::Relaxed);
        self.longest_write_us.fetch_max(us, Ordering::Relaxed);
        out
    }
}

/// How long the store thread gathers ended spans into one transaction.
pub(super) const STORE_GATHER: Duration = Duration::from_millis(20);

pub(super) fn store_loop(
    mut store: Store,
    rx: mpsc::Receiver<StoredSpan>,
    policy: RetentionPolicy,
    stats: Arc<StoreStats>,
) {
    let retention = Retention {
        policy,
        stats: &stats,
    };
    let mut pass = retention.both(&mut store);
    let mut last_age_pass = Instant::now();
    loop {
        // a pass that stopped at its time limit goes on as soon as the
        // spans waiting are written: ingestion may have stopped, and the
        // DB must not stay over its budget until the next span
        let idle = match pass {
            Pass::Done => Duration::from_secs(10),
            Pass::OutOfTime => Duration::ZERO,
        };
        match rx.recv_timeout(idle) {
            Ok(first) => {
                // spans that end within STORE_GATHER go in one transaction:
                // a transaction per span cost 145 µs of CPU each (locks and
                // WAL frames of the same pages again), on the CPUs the
                // calls being traced need. The thread sleeps through the
                // window instead of waiting on the channel, so the spans
                // sent meanwhile wake nobody (a wake-up per span was 5% of
                // the request thread's CPU); with a full batch queued
                // already it does not wait at all.
                const BATCH: usize = 512;
                let mut batch = vec![first];
                batch.extend(rx.try_iter().take(BATCH - 1));
                if batch.len() < BATCH {
                    std::thread::sleep(STORE_GATHER);
                    batch.extend(rx.try_iter().take(BATCH - batch.len()));
                }
                let (spans, events) = stats.timed(|| {
                    let written = write_batch(&mut store, &batch, &stats);
                    stats.in_db.fetch_add(written.0, Ordering::Relaxed);
                    // the cap holds as spans arrive, not once a minute
                    pass = retention.fit(&mut store);
                    written
                });
                // stored, for status and `stored_so_far`; room made, or
                // `retention_behind` already says a pass is owed
                stats.written.fetch_add(spans, Ordering::Relaxed);
                stats.events_written.fetch_add(events, Ordering::Relaxed);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                pass = stats.timed(|| retention.both(&mut store));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if last_age_pass.elapsed() >= Duration::from_secs(60) {
            // the free disk may have shrunk (the workload writes too)
            pass = stats.timed(|| retention.both(&mut store));
            last_age_pass = Instant::now();
        }
    }
    if let Err(e) = store
        .connection()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
    {
        tracing::warn!("final checkpoint: {e}");
    }
}

/// Writes a batch in one transaction; when that fails, span by span, so
/// one bad span does not take the batch down. Answers (spans, events)
/// written; failures are counted in `stats`.
pub(super) fn write_batch(
    store: &mut Store,
    batch: &[StoredSpan],
    stats: &StoreStats,
) -> (u64, u64) {
    let events = |spans: &[StoredSpan]| -> u64 {
        spans
            .iter()
            .map(|s| s.attribution.events.len() as u64)
            .sum()
    };
    let Err(e) = store.insert(batch) else {
        return (batch.len() as u64, events(batch));
    };
    tracing::warn!(
        "batch of {} span(s) failed ({e}); storing them one by one",
        batch.len()
    );
    let mut written = (0, 0);
    for span in batch {
        let one = std::slice::from_ref(span);
        match store.insert(one) {
            Ok(()) => written = (written.0 + 1, written.1 + events(one)),
            Err(e) => {
                tracing::error!("cannot store span {}: {e}", span.attribution.span);
                stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    written
}

/// The store thread's retention: the policy, and where it counts.
pub(super) struct Retention<'a> {
    pub(super) policy: RetentionPolicy,
    pub(super) stats: &'a StoreStats,
}

impl Retention<'_> {
    fn age_pass(&self, store: &mut Store) -> Pass {
        let Some(age) = self.policy.max_age_secs else {
            return Pass::Done;
        };
        let mut removed = RetentionTotals::default();
        let done = store.enforce_age(age, &mut removed);
        self.count(removed, done)
    }

    /// The age pass, then the size pass: behind if either is. Said in
    /// status once, when both have ended (each saying its own would show a
    /// pass owed by the age as done for an instant).
    fn both(&self, store: &mut Store) -> Pass {
        let age = self.age_pass(store);
        let size = self.size_pass(store);
        self.ended(if age == Pass::Done {
            size
        } else {
            Pass::OutOfTime
        })
    }

    /// Says how the last pass ended in status: before the spans of its
    /// batch count as stored, so who waits for them waits for the room.
    fn ended(&self, pass: Pass) -> Pass {
        let behind = pass == Pass::OutOfTime;
        self.stats.retention_behind.store(behind, Ordering::Relaxed);
        pass
    }

    /// Under the budget of the moment (bytes, and the share of free disk);
    /// how the pass ended, said in status.
    pub(super) fn fit(&self, store: &mut Store) -> Pass {
        self.ended(self.size_pass(store))
    }

    fn size_pass(&self, store: &mut Store) -> Pass {
        let budget = self
            .policy
            .budget_bytes(store.path(), store.size_bytes().unwrap_or(0));
        if self.stats.budget_bytes.swap(budget, Ordering::Relaxed) != budget
            && let Err(e) = store.limit_wal(budget)
        {
            tracing::warn!("cannot limit the WAL: {e}");
        }
        let mut removed = RetentionTotals::default();
        let done = store.enforce_size(budget, &mut removed);
        self.count(removed, done)
    }

    /// Counts what a pass removed, also when it failed halfway; how it
    /// ended (a failed pass is not tried again at once).
    pub(super) fn count(
        &self,
        r: RetentionTotals,
        done: Result<Pass, crate::store::StoreError>,
    ) -> Pass {
        let s = self.stats;
        s.retention_spans
            .fetch_add(r.spans_removed, Ordering::Relaxed);
        s.retention_events
            .fetch_add(r.events_removed, Ordering::Relaxed);
        s.retention_explaining
            .fetch_add(r.explaining_removed, Ordering::Relaxed);
        // saturating: spans imported by hand are removed too
        let _ = s
            .in_db
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(r.spans_removed))
            });
        done.unwrap_or_else(|e| {
            tracing::error!("retention failed: {e}");
            Pass::Done
        })
    }
}
