//! Retention: what the evidence DB keeps when it must make room, and how
//! it gives the room back without stopping ingestion.
//!
//! - **By value.** Over its size budget the DB removes spans that explain
//!   nothing (succeeded, hid no failure, met no memory pressure: see
//!   [`Attribution::explains`]) oldest first, and only when none is left
//!   the ones that explain, oldest first. Each removal is logged in
//!   `retention_log` with its reason (`size`, `size-explaining`, `age`).
//! - **As spans arrive.** The store thread checks the budget after every
//!   batch it writes (a `stat` of the DB and its WAL), and cuts to three
//!   quarters of it, so the next batches do not each pay for a pass.
//! - **No whole-file VACUUM.** A new DB is made with `auto_vacuum =
//!   INCREMENTAL`: freed pages are reused by the next spans, and a pass
//!   gives back only the pages it freed (`PRAGMA incremental_vacuum`).
//!   It works in steps of the WAL's share of the budget, each
//!   checkpointed, so it needs about a step of free disk (a deletion or
//!   a move writes to the WAL about what it frees), and it stops after
//!   [`PASS_TIME`]: the next pass goes on as soon as the batches waiting
//!   are written, not at the next batch (ingestion may have stopped).
//! - **A budget the sandbox can afford**: the smaller of `max_db_bytes`
//!   and `max_disk_share` of what the DB's filesystem has free (the DB's
//!   own bytes counted as free), so the evidence never takes the disk the
//!   workload needs.
//!
//! [`Attribution::explains`]: crate::attribution::Attribution::explains

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::params;
use serde::{Deserialize, Serialize};

use super::Conversion;

use super::{Store, StoreError};

/// Which events a finished span keeps in the DB.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KeepEvents {
    /// Of a span that explains something, its lineage and the failures
    /// of its evidence; of one that does not, no event (what is left out
    /// is counted in `drops.not_kept`).
    #[default]
    Failed,
    /// Every event of every span (debugging a workload).
    All,
}

impl KeepEvents {
    pub fn id(self) -> &'static str {
        match self {
            KeepEvents::Failed => "failed",
            KeepEvents::All => "all",
        }
    }
}

/// Bounds on what the DB keeps (`[retention]` of the config file).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionPolicy {
    /// Delete spans older than this many seconds.
    pub max_age_secs: Option<u64>,
    /// The DB with its WAL stays under this many bytes…
    pub max_db_bytes: u64,
    /// …and under this share (0–1) of its filesystem's free space.
    pub max_disk_share: f64,
    /// What a span that explains nothing keeps.
    pub keep_events: KeepEvents,
}

/// 1 GiB.
pub const DEFAULT_MAX_DB_BYTES: u64 = 1 << 30;
/// A tenth of the free disk.
pub const DEFAULT_MAX_DISK_SHARE: f64 = 0.1;

impl Default for RetentionPolicy {
    fn default() -> Self {
        RetentionPolicy {
            max_age_secs: None,
            max_db_bytes: DEFAULT_MAX_DB_BYTES,
            max_disk_share: DEFAULT_MAX_DISK_SHARE,
            keep_events: KeepEvents::Failed,
        }
    }
}

impl RetentionPolicy {
    /// Why this policy cannot be used: a budget that would remove every
    /// span at once, or an age that means nothing.
    pub fn check(&self) -> Result<(), String> {
        const MIN_DB_BYTES: u64 = 256 << 10;
        if self.max_db_bytes < MIN_DB_BYTES {
            return Err(format!(
                "[retention] max_db_bytes = {} is below {MIN_DB_BYTES} (256 KiB): the schema alone takes most of that",
                self.max_db_bytes
            ));
        }
        if !(self.max_disk_share > 0.0 && self.max_disk_share <= 1.0) {
            return Err(format!(
                "[retention] max_disk_share = {} is not a share of the free disk above 0 and at most 1 (0.1 is a tenth)",
                self.max_disk_share
            ));
        }
        if self.max_age_secs == Some(0) {
            return Err("[retention] max_age_secs = 0 would remove every span as it is stored; leave it out for no age limit".into());
        }
        Ok(())
    }

    /// The bytes the DB at `db` may use now, being `db_bytes` big: the
    /// smaller of the byte cap and the share of the free disk.
    pub fn budget_bytes(&self, db: &Path, db_bytes: u64) -> u64 {
        let share = self.max_disk_share.clamp(0.0, 1.0);
        match super::free_bytes(db) {
            Some(free) => {
                let affordable = (free.saturating_add(db_bytes) as f64 * share) as u64;
                self.max_db_bytes.min(affordable)
            }
            None => self.max_db_bytes,
        }
    }
}

/// Totals of what retention removed.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RetentionTotals {
    pub spans_removed: u64,
    pub events_removed: u64,
    /// Of `spans_removed`, the ones that explained something (failed,
    /// hidden failure, memory pressure): removed only when nothing else
    /// was left to remove.
    #[serde(default)]
    pub explaining_removed: u64,
}

impl std::ops::AddAssign for RetentionTotals {
    fn add_assign(&mut self, o: RetentionTotals) {
        self.spans_removed += o.spans_removed;
        self.events_removed += o.events_removed;
        self.explaining_removed += o.explaining_removed;
    }
}

/// A stored span (alias `a` for its attribution row) explains something:
/// what [`Attribution::explains`](crate::attribution::Attribution::explains)
/// says of the live one.
pub const EXPLAINS_SQL: &str = "(a.failed = 1 \
     OR json_extract(a.object, '$.hidden_failure') IS NOT NULL \
     OR COALESCE(json_extract(a.object, '$.memory.reclaim_ms'), 0) > 0)";

/// Spans removed in one transaction at most (a pass has several).
const CHUNK_MAX: u64 = 2000;

/// The work one pass may do before it lets the store thread write the
/// next batch; the next pass goes on where it stopped.
pub const PASS_TIME: Duration = Duration::from_millis(200);

/// A step of the age pass, which has no budget to take a share of.
const DEFAULT_STEP_BYTES: u64 = 4 << 20;

/// How a retention pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Pass {
    /// Nothing is left to do (or nothing more can be done now).
    Done,
    /// It stopped at [`PASS_TIME`] with work left: the store thread runs
    /// the next pass as soon as it has written what is waiting.
    OutOfTime,
}

impl Store {
    /// Sets the WAL's checkpoint threshold and size limit from the budget,
    /// so the WAL stays a small share of it (a tenth, at most SQLite's
    /// default 1000 pages).
    pub fn limit_wal(&self, budget: u64) -> Result<(), StoreError> {
        let limit = self.wal_limit(budget)?;
        let pages = limit / self.page_size()?;
        self.conn
            .pragma_update(None, "wal_autocheckpoint", pages as i64)?;
        self.conn
            .pragma_update(None, "journal_size_limit", limit as i64)?;
        Ok(())
    }

    /// The WAL's share of `budget`: a tenth, between 8 pages and SQLite's
    /// default checkpoint threshold of 1000.
    fn wal_limit(&self, budget: u64) -> Result<u64, StoreError> {
        let page = self.page_size()?;
        Ok((budget / 10 / page).clamp(8, 1000) * page)
    }

    /// Removes spans older than `max_age_secs` (at most [`PASS_TIME`] of
    /// work: the next pass goes on), then gives their pages back. What it
    /// removed is added to `removed`, also when it fails halfway.
    pub fn enforce_age(
        &mut self,
        max_age_secs: u64,
        removed: &mut RetentionTotals,
    ) -> Result<Pass, StoreError> {
        let started = Instant::now();
        let age_ms = (max_age_secs.min(i64::MAX as u64 / 1000) as i64) * 1000;
        let cutoff = crate::clock::now_ms().saturating_sub(age_ms);
        let mut any = false;
        loop {
            if started.elapsed() >= PASS_TIME {
                return Ok(Pass::OutOfTime);
            }
            let victims = self.select_spans("s.started_ms < ?1", cutoff, CHUNK_MAX)?;
            let r = self.remove(&victims, "age")?;
            *removed += r;
            if r.spans_removed == 0 {
                break;
            }
            any = true;
            self.checkpoint_without_waiting()?;
        }
        if any {
            return self.release_free_pages(DEFAULT_STEP_BYTES, started);
        }
        Ok(Pass::Done)
    }

    /// When the DB is over `budget` bytes: removes the least valuable
    /// spans until what is live fits in three quarters of it with room for
    /// the WAL, then gives the freed pages back to the filesystem. Each
    /// step writes about a WAL's share of the budget and is checkpointed,
    /// so a nearly full disk can still be cut; a pass stops after
    /// [`PASS_TIME`] of work and the next one goes on. What it removed is
    /// added to `removed`, also when it fails halfway.
    pub fn enforce_size(
        &mut self,
        budget: u64,
        removed: &mut RetentionTotals,
    ) -> Result<Pass, StoreError> {
        if self.used_bytes()? <= budget {
            return Ok(Pass::Done);
        }
        let started = Instant::now();
        let step = self.wal_limit(budget)?;
        let target = (budget / 4 * 3).saturating_sub(step);
        loop {
            if started.elapsed() >= PASS_TIME {
                return Ok(Pass::OutOfTime);
            }
            let (live, spans) = (self.live_bytes()?, self.span_count()?);
            if live <= target || spans == 0 {
                break;
            }
            let per_span = (live / spans).max(1);
            let n = ((live - target) / per_span + 1)
                .min(step / per_span + 1)
                .min(CHUNK_MAX);
            let r = self.remove_least_valuable(n)?;
            *removed += r;
            if r.spans_removed == 0 {
                break;
            }
            self.checkpoint_without_waiting()?;
        }
        self.release_free_pages(step, started)
    }

    /// The bytes that count against the budget: the file and its WAL; of a
    /// DB made before incremental auto-vacuum, whose file never shrinks,
    /// the pages in use (free pages are reused before the file grows, so
    /// removing more would free nothing on disk).
    fn used_bytes(&self) -> Result<u64, StoreError> {
        if self.auto_vacuum()? == "incremental" {
            self.size_bytes()
        } else {
            self.live_bytes()
        }
    }

    /// Up to `n` spans that explain nothing, oldest first; only when none
    /// is left, up to `n` of those that explain, oldest first.
    fn remove_least_valuable(&mut self, n: u64) -> Result<RetentionTotals, StoreError> {
        let plain = self.select_spans(&format!("NOT {EXPLAINS_SQL}"), 0, n)?;
        if !plain.is_empty() {
            return self.remove(&plain, "size");
        }
        let explaining = self.select_spans(EXPLAINS_SQL, 0, n)?;
        let mut removed = self.remove(&explaining, "size-explaining")?;
        removed.explaining_removed = removed.spans_removed;
        Ok(removed)
    }

    /// (probe_id, span id) of up to `limit` spans matching `cond` (which
    /// may use `?1` = `value`), oldest first.
    fn select_spans(
        &self,
        cond: &str,
        value: i64,
        limit: u64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT s.probe_id, s.id FROM spans s
             JOIN attributions a ON a.probe_id = s.probe_id AND a.span_id = s.id
             WHERE {cond} ORDER BY s.started_ms, s.id LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![value, limit.min(i64::MAX as u64) as i64], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Deletes `spans` (their rows cascade) in one transaction and logs it.
    fn remove(
        &mut self,
        spans: &[(String, i64)],
        reason: &str,
    ) -> Result<RetentionTotals, StoreError> {
        if spans.is_empty() {
            return Ok(RetentionTotals::default());
        }
        let tx = self.conn.transaction()?;
        let mut events = 0i64;
        {
            let mut count = tx.prepare_cached(
                "SELECT COUNT(*) FROM events WHERE probe_id = ?1 AND span_id = ?2",
            )?;
            let mut delete =
                tx.prepare_cached("DELETE FROM spans WHERE probe_id = ?1 AND id = ?2")?;
            for (probe_id, id) in spans {
                events += count.query_row(params![probe_id, id], |r| r.get::<_, i64>(0))?;
                delete.execute(params![probe_id, id])?;
            }
        }
        tx.execute(
            "INSERT INTO retention_log (at_ms, reason, spans_removed, events_removed) VALUES (?1, ?2, ?3, ?4)",
            params![crate::clock::now_ms(), reason, spans.len() as i64, events],
        )?;
        tx.commit()?;
        Ok(RetentionTotals {
            spans_removed: spans.len() as u64,
            events_removed: events as u64,
            explaining_removed: 0,
        })
    }

    /// Gives the free pages back to the filesystem, `step` bytes at a
    /// time with a checkpoint after each (moving pages writes them to the
    /// WAL), until none is left or the pass has worked [`PASS_TIME`]. A DB
    /// made before incremental auto-vacuum only reuses them.
    fn release_free_pages(&self, step: u64, started: Instant) -> Result<Pass, StoreError> {
        if self.auto_vacuum()? != "incremental" {
            self.checkpoint_without_waiting()?;
            return Ok(Pass::Done);
        }
        let pages = (step / self.page_size()?).max(1);
        loop {
            let free: i64 = self
                .conn
                .query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
            if free == 0 {
                break;
            }
            // one page per step of the statement: step it to the end
            // (a pragma takes no bound parameter)
            let mut vacuum = self
                .conn
                .prepare_cached(&format!("PRAGMA incremental_vacuum({pages})"))?;
            let mut rows = vacuum.query([])?;
            while rows.next()?.is_some() {}
            drop(rows);
            self.checkpoint_without_waiting()?;
            if started.elapsed() >= PASS_TIME {
                return Ok(Pass::OutOfTime);
            }
        }
        Ok(Pass::Done)
    }

    /// Checkpoints the WAL and truncates it, unless a reader is in the
    /// way: the store does not wait for readers (the WAL is truncated at a
    /// later checkpoint, or when it restarts past `journal_size_limit`).
    fn checkpoint_without_waiting(&self) -> Result<(), StoreError> {
        self.conn.busy_timeout(std::time::Duration::ZERO)?;
        // a reader in the way is said in the result row, not as an error
        let checkpoint = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        self.conn.busy_timeout(super::BUSY_TIMEOUT)?;
        Ok(checkpoint?)
    }

    /// Everything retention removed since the DB was created.
    pub fn retention_totals(&self) -> Result<RetentionTotals, StoreError> {
        let (s, e, x): (i64, i64, i64) = self.conn.query_row(
            "SELECT COALESCE(SUM(spans_removed), 0), COALESCE(SUM(events_removed), 0),
                    COALESCE(SUM(CASE WHEN reason = 'size-explaining' THEN spans_removed END), 0)
             FROM retention_log",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        Ok(RetentionTotals {
            spans_removed: s as u64,
            events_removed: e as u64,
            explaining_removed: x as u64,
        })
    }

    /// Bytes of the pages in use (the file less its free pages).
    pub fn live_bytes(&self) -> Result<u64, StoreError> {
        let (pages, free): (i64, i64) = self.conn.query_row(
            "SELECT (SELECT page_count FROM pragma_page_count()), (SELECT freelist_count FROM pragma_freelist_count())",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok((pages - free).max(0) as u64 * self.page_size()?)
    }

    /// Spans stored (all probes').
    pub fn span_count(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM spans", [], |r| r.get(0))?;
        Ok(n as u64)
    }

    /// `incremental` for a DB this version made; `none` for an older one
    /// (freed pages are reused, never given back).
    pub fn auto_vacuum(&self) -> Result<&'static str, StoreError> {
        let mode: i64 = self
            .conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
        Ok(match mode {
            1 => "full",
            2 => "incremental",
            _ => "none",
        })
    }

    /// Converts a DB an earlier version made (`auto_vacuum = NONE`) to
    /// incremental auto-vacuum, so retention can give freed pages back:
    /// one whole-file VACUUM, which needs about the file's size free on
    /// its filesystem again. Without that room it converts nothing and
    /// says so; a DB in another mode is left as it is.
    pub fn convert_to_incremental(&mut self) -> Result<Conversion, StoreError> {
        if self.auto_vacuum()? != "none" {
            return Ok(Conversion::NotNeeded);
        }
        let size = self.size_bytes()?;
        // the rewritten copy, and the WAL the copy goes through
        let need = size.saturating_mul(2) + (16 << 20);
        let free = super::free_bytes(&self.path).unwrap_or(0);
        if free < need {
            return Ok(Conversion::NoRoom { need, free });
        }
        let started = std::time::Instant::now();
        self.conn.execute_batch(
            "PRAGMA auto_vacuum = INCREMENTAL; VACUUM; PRAGMA wal_checkpoint(TRUNCATE);",
        )?;
        Ok(Conversion::Converted {
            before: size,
            after: self.size_bytes()?,
            took: started.elapsed(),
        })
    }

    fn page_size(&self) -> Result<u64, StoreError> {
        let p: i64 = self.conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        Ok(p.max(512) as u64)
    }

    pub(super) fn wal_bytes(&self) -> u64 {
        std::fs::metadata(format!("{}-wal", self.path.display()))
            .map(|m| m.len())
            .unwrap_or(0)
    }
}
