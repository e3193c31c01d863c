//! Store: the SQLite evidence database (schema in `migrations/`, embedded).
//!
//! WAL, busy_timeout, synchronous=NORMAL, foreign_keys=ON on every
//! connection. One writer per process (the daemon's store thread); readers
//! (`probe spans`, `probe show`, exports) open their own connections. A DB
//! that is locked, full or corrupt is an error at open, never a reset.

use std::path::{Path, PathBuf};
use std::time::Duration;

use include_dir::{Dir, include_dir};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use rusqlite_migration::Migrations;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::attribution::Attribution;
use crate::event::KernelEvent;

mod retention;
pub use retention::{
    DEFAULT_MAX_DB_BYTES, DEFAULT_MAX_DISK_SHARE, EXPLAINS_SQL, KeepEvents, Pass, RetentionPolicy,
    RetentionTotals,
};

static MIGRATIONS_DIR: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../migrations");

/// What went wrong with the database, said so a person can act.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file is not a SQLite database, or it is damaged.
    #[error(
        "{0}: the database is corrupt or not a probe database ({1}); it was left untouched — move it aside to start a new one"
    )]
    Corrupt(PathBuf, String),
    /// Another process holds the lock longer than busy_timeout.
    #[error(
        "{0}: the database is locked by another process ({1}); is another probe daemon using it?"
    )]
    Locked(PathBuf, String),
    /// The disk or quota is full.
    #[error("{0}: the disk is full ({1}); free space or point --db elsewhere")]
    Full(PathBuf, String),
    /// Opening failed for another reason (permissions, missing directory…).
    #[error("{0}: cannot open the database: {1}")]
    Open(PathBuf, String),
    /// The schema could not be brought up to date.
    #[error("{0}: cannot migrate the schema: {1}")]
    Migrate(PathBuf, String),
    /// A query failed.
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    /// A stored JSON document did not parse.
    #[error("stored JSON is malformed: {0}")]
    Json(#[from] serde_json::Error),
    /// Reading or writing an export file failed.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

fn classify(path: &Path, e: rusqlite::Error) -> StoreError {
    let msg = e.to_string();
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
            StoreError::Corrupt(path.into(), msg)
        }
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            StoreError::Locked(path.into(), msg)
        }
        Some(rusqlite::ErrorCode::DiskFull) => StoreError::Full(path.into(), msg),
        // SQLite reports ENOSPC on write as a plain I/O error: look at the disk
        Some(rusqlite::ErrorCode::SystemIoFailure) if disk_nearly_full(path) => {
            StoreError::Full(path.into(), msg)
        }
        _ => StoreError::Open(path.into(), msg),
    }
}

/// Less than 1 MiB free where `path` lives.
fn disk_nearly_full(path: &Path) -> bool {
    free_bytes(path).is_some_and(|free| free < (1 << 20))
}

/// Bytes free to this user on the filesystem of the file at `path`.
fn free_bytes(path: &Path) -> Option<u64> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(s.blocks_available().saturating_mul(s.fragment_size()))
}

/// What [`Store::convert_to_incremental`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Conversion {
    /// The DB already gives freed pages back (or is in `full` mode).
    NotNeeded,
    /// Rewritten with incremental auto-vacuum.
    Converted {
        before: u64,
        after: u64,
        took: std::time::Duration,
    },
    /// Not enough free disk for the rewrite: left as it was.
    NoRoom { need: u64, free: u64 },
}

/// One finished span, as stored.
#[derive(Debug, Clone)]
pub struct StoredSpan {
    pub started_ms: i64,
    pub ended_ms: i64,
    /// The attribution; its `events` are all retained events of the span.
    pub attribution: Attribution,
    /// What replaying it needs, when every event it saw is stored.
    pub replay: Option<crate::spans::Replay>,
}

/// A row of `probe spans`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpanRow {
    /// Which probe recorded it (several after an import or a merge).
    pub probe_id: String,
    pub span: u64,
    pub session: Option<String>,
    pub label: String,
    pub started_ms: i64,
    pub duration_ms: f64,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<String>,
    pub failed: bool,
    pub primitive: String,
    pub layer: Option<String>,
    pub confidence: f64,
    pub explanation: String,
    pub events: u64,
    pub drops_kernel: u64,
    pub drops_retention: u64,
    /// Events the span saw but did not keep: it explained nothing
    /// (`keep_events = "failed"`).
    #[serde(default)]
    pub events_not_kept: u64,
}

/// Which spans to list or export.
#[derive(Debug, Clone, Default)]
pub struct SpanFilter {
    pub session: Option<String>,
    pub failed_only: bool,
    pub since_ms: Option<i64>,
    pub limit: Option<u64>,
    /// Only the spans this sandbox's client opened (`Attribution::sandbox`);
    /// `None`: every span.
    pub sandbox: Option<String>,
}

/// One span in a JSONL export: the rows, verbatim, so a re-import is
/// identical.
#[derive(Serialize, Deserialize)]
struct ExportLine {
    probe_id: String,
    span: ExportSpan,
    attribution: Box<RawValue>,
    decisive: Option<Box<RawValue>>,
    events: Vec<Box<RawValue>>,
    drops: (u64, u64),
    /// The replay input, when stored (absent in older exports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replay: Option<Box<RawValue>>,
}

#[derive(Serialize, Deserialize)]
struct ExportSpan {
    id: u64,
    session: Option<String>,
    label: String,
    started_ms: i64,
    ended_ms: i64,
    duration_ms: f64,
    exit_code: Option<i32>,
    exit_signal: Option<String>,
    failed: bool,
    primitive: String,
    layer: Option<String>,
    confidence: f64,
    explanation: String,
}

pub struct Store {
    conn: Connection,
    path: PathBuf,
    probe_id: String,
}

/// How long a connection waits for another's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(())
}

/// An exclusive lock on `PATH.lock`, held while the caller sets up the DB.
/// Best effort: where the file cannot be made, opening the DB fails with
/// its own, clearer error.
fn schema_lock(path: &Path) -> Option<std::fs::File> {
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(PathBuf::from(lock))
        .ok()?;
    file.lock().ok()?;
    Some(file)
}

/// The schema's migrations in order, as (directory name, `up.sql`): the one
/// source both SQLite and the campaign's PostgreSQL backend are built from.
pub fn migration_sources() -> Vec<(&'static str, &'static str)> {
    let mut all: Vec<(&'static str, &'static str)> = MIGRATIONS_DIR
        .dirs()
        .filter_map(|d| {
            let name = d.path().file_name()?.to_str()?;
            let up = d.get_file(d.path().join("up.sql"))?.contents_utf8()?;
            Some((name, up))
        })
        .collect();
    all.sort();
    all
}

impl Store {
    /// A migrated database in memory (a scratch copy of rows kept elsewhere).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let path = Path::new(":memory:");
        let mut conn = Connection::open_in_memory().map_err(|e| classify(path, e))?;
        configure(&conn).map_err(|e| classify(path, e))?;
        let migrations = Migrations::from_directory(&MIGRATIONS_DIR)
            .map_err(|e| StoreError::Migrate(path.into(), e.to_string()))?;
        migrations
            .to_latest(&mut conn)
            .map_err(|e| StoreError::Migrate(path.into(), e.to_string()))?;
        Ok(Store {
            conn,
            path: path.into(),
            probe_id: new_probe_id(),
        })
    }

    /// Opens (creating if needed) and migrates the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        // processes opening a new DB at the same moment (campaign shards)
        // would race on creating the schema: they take turns
        let _schema_turn = schema_lock(path);
        let mut conn = Connection::open(path).map_err(|e| classify(path, e))?;
        configure(&conn).map_err(|e| classify(path, e))?;
        // before any table exists, so retention can give pages back without
        // a whole-file VACUUM (an existing DB keeps its mode)
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(|e| classify(path, e))?;
        // WAL next: it also proves the file is a database at all
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(|e| classify(path, e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Open(
                path.into(),
                format!("cannot switch to WAL (journal_mode is {mode})"),
            ));
        }
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(|e| classify(path, e))?;
        if check != "ok" {
            return Err(StoreError::Corrupt(path.into(), check));
        }
        let migrations = Migrations::from_directory(&MIGRATIONS_DIR)
            .map_err(|e| StoreError::Migrate(path.into(), e.to_string()))?;
        migrations.to_latest(&mut conn).map_err(|e| match e {
            rusqlite_migration::Error::RusqliteError { err, .. } => classify(path, err),
            other => StoreError::Migrate(path.into(), other.to_string()),
        })?;
        // a writer must be able to write: take the write lock once now, so a
        // DB held by another process fails here rather than at the first span
        conn.execute_batch("BEGIN IMMEDIATE; COMMIT;")
            .map_err(|e| classify(path, e))?;
        let probe_id = match conn
            .query_row("SELECT value FROM meta WHERE key = 'probe_id'", [], |r| {
                r.get::<_, String>(0)
            })
            .optional()?
        {
            Some(id) => id,
            None => {
                let id = new_probe_id();
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('probe_id', ?1), ('created_ms', ?2)",
                    params![id, crate::clock::now_ms().to_string()],
                )
                .map_err(|e| classify(path, e))?;
                id
            }
        };
        Ok(Store {
            conn,
            path: path.into(),
            probe_id,
        })
    }

    /// Opens an existing database read-only (inspection commands).
    pub fn open_readonly(path: &Path) -> Result<Store, StoreError> {
        if !path.exists() {
            return Err(StoreError::Open(
                path.into(),
                "no such file (is the daemon using another --db?)".into(),
            ));
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| classify(path, e))?;
        configure(&conn).map_err(|e| classify(path, e))?;
        let probe_id = conn
            .query_row("SELECT value FROM meta WHERE key = 'probe_id'", [], |r| {
                r.get::<_, String>(0)
            })
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(..) => classify(path, e),
                other => StoreError::Corrupt(path.into(), format!("no probe_id: {other}")),
            })?;
        Ok(Store {
            conn,
            path: path.into(),
            probe_id,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn probe_id(&self) -> &str {
        &self.probe_id
    }

    /// The next unused span id of this probe (ids are never reused).
    pub fn next_span_id(&self) -> Result<u64, StoreError> {
        // meta remembers the highest id ever stored: retention may have
        // deleted it, and an id must never be handed out twice
        let max: i64 = self.conn.query_row(
            "SELECT MAX(COALESCE((SELECT MAX(id) FROM spans WHERE probe_id = ?1), 0),
                        COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'last_span_id'), 0))",
            [&self.probe_id],
            |r| r.get(0),
        )?;
        Ok(max as u64 + 1)
    }

    /// Inserts finished spans in one transaction.
    pub fn insert(&mut self, spans: &[StoredSpan]) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        {
            let mut session = tx.prepare_cached(
                "INSERT INTO sessions (probe_id, id, first_seen_ms, last_seen_ms) VALUES (?1, ?2, ?3, ?3)
                 ON CONFLICT (probe_id, id) DO UPDATE SET last_seen_ms = MAX(last_seen_ms, excluded.last_seen_ms)",
            )?;
            let mut span = tx.prepare_cached(
                "INSERT INTO spans (probe_id, id, session, label, started_ms, ended_ms, duration_ms, exit_code, exit_signal, sandbox)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?;
            let mut attribution = tx.prepare_cached(
                "INSERT INTO attributions (probe_id, span_id, failed, primitive, layer, confidence, explanation, decisive, object)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?;
            let mut event = tx.prepare_cached(INSERT_EVENT)?;
            let mut drops = tx.prepare_cached(
                "INSERT INTO drops (probe_id, span_id, kernel, retention) VALUES (?1, ?2, ?3, ?4)",
            )?;
            let mut replay = tx.prepare_cached(
                "INSERT INTO replay (probe_id, span_id, input) VALUES (?1, ?2, ?3)",
            )?;
            for s in spans {
                let a = &s.attribution;
                let id = a.span as i64;
                if let Some(sess) = &a.session {
                    session.execute(params![self.probe_id, sess, s.started_ms])?;
                }
                span.execute(params![
                    self.probe_id,
                    id,
                    a.session,
                    a.label,
                    s.started_ms,
                    s.ended_ms,
                    a.duration_ms,
                    a.exit.code,
                    a.exit.signal,
                    a.sandbox.as_ref().map(|v| v.id.as_str())
                ])?;
                let object = {
                    let mut bare = a.clone();
                    bare.events = Vec::new();
                    serde_json::to_string(&bare)?
                };
                let decisive = a.decisive.as_ref().map(serde_json::to_string).transpose()?;
                attribution.execute(params![
                    self.probe_id,
                    id,
                    a.failed,
                    a.primitive.id(),
                    a.layer.map(|l| l.id()),
                    a.confidence,
                    a.explanation,
                    decisive,
                    object
                ])?;
                for (seq, e) in a.events.iter().enumerate() {
                    insert_event(
                        &mut event,
                        &self.probe_id,
                        id,
                        seq,
                        e,
                        &serde_json::to_string(e)?,
                    )?;
                }
                drops.execute(params![
                    self.probe_id,
                    id,
                    a.drops.kernel as i64,
                    a.drops.retention as i64
                ])?;
                if let Some(r) = &s.replay {
                    replay.execute(params![self.probe_id, id, serde_json::to_string(r)?])?;
                }
            }
            if let Some(max) = spans.iter().map(|s| s.attribution.span as i64).max() {
                tx.execute(
                    "INSERT INTO meta (key, value) VALUES ('last_span_id', ?1)
                     ON CONFLICT (key) DO UPDATE
                     SET value = MAX(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
                    [max.to_string()],
                )?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Spans matching `filter`, newest first.
    pub fn spans(&self, filter: &SpanFilter) -> Result<Vec<SpanRow>, StoreError> {
        let mut sql = String::from(
            "SELECT s.id, s.session, s.label, s.started_ms, s.duration_ms, s.exit_code, s.exit_signal,
                    a.failed, a.primitive, a.layer, a.confidence, a.explanation,
                    (SELECT COUNT(*) FROM events e WHERE e.probe_id = s.probe_id AND e.span_id = s.id),
                    d.kernel, d.retention, s.probe_id,
                    COALESCE(json_extract(a.object, '$.drops.not_kept'), 0)
             FROM spans s JOIN attributions a ON a.probe_id = s.probe_id AND a.span_id = s.id
             LEFT JOIN drops d ON d.probe_id = s.probe_id AND d.span_id = s.id
             WHERE 1 = 1",
        );
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        if let Some(sess) = &filter.session {
            sql.push_str(" AND s.session = ?");
            args.push(sess.clone().into());
        }
        if filter.failed_only {
            sql.push_str(" AND a.failed = 1");
        }
        if let Some(sandbox) = &filter.sandbox {
            sql.push_str(" AND s.sandbox = ?");
            args.push(sandbox.clone().into());
        }
        if let Some(since) = filter.since_ms {
            sql.push_str(" AND s.started_ms >= ?");
            args.push(since.into());
        }
        sql.push_str(" ORDER BY s.started_ms DESC, s.id DESC");
        if let Some(limit) = filter.limit {
            sql.push_str(&format!(" LIMIT {limit}"));
        }
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| {
            Ok(SpanRow {
                span: r.get::<_, i64>(0)? as u64,
                session: r.get(1)?,
                label: r.get(2)?,
                started_ms: r.get(3)?,
                duration_ms: r.get(4)?,
                exit_code: r.get(5)?,
                exit_signal: r.get(6)?,
                failed: r.get(7)?,
                primitive: r.get(8)?,
                layer: r.get(9)?,
                confidence: r.get(10)?,
                explanation: r.get(11)?,
                events: r.get::<_, i64>(12)? as u64,
                drops_kernel: r.get::<_, Option<i64>>(13)?.unwrap_or(0) as u64,
                drops_retention: r.get::<_, Option<i64>>(14)?.unwrap_or(0) as u64,
                probe_id: r.get(15)?,
                events_not_kept: r.get::<_, i64>(16)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// What replaying span `span` needs besides its events, when it was
    /// stored (see [`StoredSpan::replay`]); an input this build cannot
    /// read is an error naming it.
    pub fn replay_input(&self, span: u64) -> Result<Option<crate::spans::Replay>, StoreError> {
        let input: Option<String> = self
            .conn
            .query_row(
                "SELECT input FROM replay WHERE span_id = ?2
                 ORDER BY probe_id = ?1 DESC, probe_id LIMIT 1",
                params![self.probe_id, span as i64],
                |r| r.get(0),
            )
            .optional()?;
        Ok(input.map(|i| serde_json::from_str(&i)).transpose()?)
    }

    /// Ids of the stored spans, oldest first.
    pub fn span_ids(&self) -> Result<Vec<u64>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT DISTINCT id FROM spans ORDER BY id")?;
        let ids = stmt.query_map([], |r| r.get::<_, i64>(0))?;
        Ok(ids.map(|i| i.map(|i| i as u64)).collect::<Result<_, _>>()?)
    }

    /// One span's attribution with every stored event.
    pub fn show(&self, span: u64) -> Result<Option<Attribution>, StoreError> {
        // this DB's own probe first; an imported span is found by its id too
        let found: Option<(String, String)> = self
            .conn
            .query_row(
                "SELECT probe_id, object FROM attributions WHERE span_id = ?2
                 ORDER BY probe_id = ?1 DESC, probe_id LIMIT 1",
                params![self.probe_id, span as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((probe_id, object)) = found else {
            return Ok(None);
        };
        let mut a: Attribution = serde_json::from_str(&object)?;
        let mut stmt = self.conn.prepare(
            "SELECT detail FROM events WHERE probe_id = ?1 AND span_id = ?2 ORDER BY seq",
        )?;
        let details = stmt.query_map(params![probe_id, span as i64], |r| r.get::<_, String>(0))?;
        a.events = Vec::new();
        for d in details {
            a.events.push(serde_json::from_str::<KernelEvent>(&d?)?);
        }
        Ok(Some(a))
    }

    /// Size of the DB file plus its WAL.
    pub fn size_bytes(&self) -> Result<u64, StoreError> {
        let main = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        Ok(main + self.wal_bytes())
    }

    /// Writes matching spans as JSON lines (one span per line).
    pub fn export_jsonl(&self, filter: &SpanFilter, out: &Path) -> Result<usize, StoreError> {
        use std::io::Write as _;
        let file = std::fs::File::create(out).map_err(|e| StoreError::Io(out.into(), e))?;
        let mut w = std::io::BufWriter::new(file);
        let rows = self.spans(filter)?;
        for row in rows.iter().rev() {
            let line = self.export_line(&row.probe_id, row.span)?;
            serde_json::to_writer(&mut w, &line)?;
            w.write_all(b"\n")
                .map_err(|e| StoreError::Io(out.into(), e))?;
        }
        w.flush().map_err(|e| StoreError::Io(out.into(), e))?;
        Ok(rows.len())
    }

    fn export_line(&self, probe_id: &str, id: u64) -> Result<ExportLine, StoreError> {
        let (span, object, decisive, drops) = self.conn.query_row(
            "SELECT s.session, s.label, s.started_ms, s.ended_ms, s.duration_ms, s.exit_code, s.exit_signal,
                    a.failed, a.primitive, a.layer, a.confidence, a.explanation, a.object, a.decisive,
                    d.kernel, d.retention
             FROM spans s JOIN attributions a ON a.probe_id = s.probe_id AND a.span_id = s.id
             JOIN drops d ON d.probe_id = s.probe_id AND d.span_id = s.id
             WHERE s.probe_id = ?1 AND s.id = ?2",
            params![probe_id, id as i64],
            |r| {
                Ok((
                    ExportSpan {
                        id,
                        session: r.get(0)?,
                        label: r.get(1)?,
                        started_ms: r.get(2)?,
                        ended_ms: r.get(3)?,
                        duration_ms: r.get(4)?,
                        exit_code: r.get(5)?,
                        exit_signal: r.get(6)?,
                        failed: r.get(7)?,
                        primitive: r.get(8)?,
                        layer: r.get(9)?,
                        confidence: r.get(10)?,
                        explanation: r.get(11)?,
                    },
                    r.get::<_, String>(12)?,
                    r.get::<_, Option<String>>(13)?,
                    (r.get::<_, i64>(14)? as u64, r.get::<_, i64>(15)? as u64),
                ))
            },
        )?;
        let mut stmt = self.conn.prepare(
            "SELECT detail FROM events WHERE probe_id = ?1 AND span_id = ?2 ORDER BY seq",
        )?;
        let events = stmt
            .query_map(params![probe_id, id as i64], |r| r.get::<_, String>(0))?
            .map(|d| Ok(RawValue::from_string(d?)?))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let replay: Option<String> = self
            .conn
            .query_row(
                "SELECT input FROM replay WHERE probe_id = ?1 AND span_id = ?2",
                params![probe_id, id as i64],
                |r| r.get(0),
            )
            .optional()?;
        Ok(ExportLine {
            probe_id: probe_id.to_string(),
            span,
            attribution: RawValue::from_string(object)?,
            decisive: decisive.map(RawValue::from_string).transpose()?,
            events,
            drops,
            replay: replay.map(RawValue::from_string).transpose()?,
        })
    }

    /// Copies matching spans into a new SQLite file with the same schema.
    /// The new file's connection does the writing, so this works from a
    /// read-only store.
    pub fn export_sqlite(&self, filter: &SpanFilter, out: &Path) -> Result<usize, StoreError> {
        if out.exists() {
            return Err(StoreError::Open(
                out.into(),
                "already exists; refusing to overwrite".into(),
            ));
        }
        let rows = self.spans(filter)?;
        let mut dest = Store::open(out)?;
        let conn = &mut dest.conn;
        conn.execute("ATTACH DATABASE ?1 AS src", [self.path.to_string_lossy()])?;
        let result = (|| -> Result<(), StoreError> {
            let tx = conn.transaction()?;
            tx.execute("DELETE FROM main.meta", [])?;
            tx.execute("INSERT INTO main.meta SELECT * FROM src.meta", [])?;
            for row in &rows {
                let id = row.span as i64;
                for table in ["spans", "attributions", "events", "drops", "replay"] {
                    let key = if table == "spans" { "id" } else { "span_id" };
                    tx.execute(
                        &format!("INSERT INTO main.{table} SELECT * FROM src.{table} WHERE probe_id = ?1 AND {key} = ?2"),
                        params![row.probe_id, id],
                    )?;
                }
            }
            tx.execute(
                "INSERT OR IGNORE INTO main.sessions SELECT * FROM src.sessions s
                 WHERE EXISTS (SELECT 1 FROM main.spans m WHERE m.probe_id = s.probe_id AND m.session = s.id)",
                [],
            )?;
            tx.commit()?;
            Ok(())
        })();
        conn.execute("DETACH DATABASE src", [])?;
        result.map(|()| rows.len())
    }

    /// Imports a JSONL or SQLite export into this DB. Returns spans imported.
    pub fn import(&mut self, input: &Path) -> Result<usize, StoreError> {
        let mut head = [0u8; 16];
        let is_sqlite = std::fs::File::open(input)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
            .map(|()| &head == b"SQLite format 3\0")
            .unwrap_or(false);
        if is_sqlite {
            self.conn
                .execute("ATTACH DATABASE ?1 AS import", [input.to_string_lossy()])?;
            let result = (|| -> Result<usize, StoreError> {
                let n: i64 = self
                    .conn
                    .query_row("SELECT COUNT(*) FROM import.spans", [], |r| r.get(0))?;
                self.conn.execute_batch(
                    "BEGIN;
                     INSERT OR IGNORE INTO main.sessions SELECT * FROM import.sessions;
                     INSERT INTO main.spans SELECT * FROM import.spans;
                     INSERT INTO main.attributions SELECT * FROM import.attributions;
                     INSERT INTO main.events SELECT * FROM import.events;
                     INSERT INTO main.drops SELECT * FROM import.drops;",
                )?;
                // an export made before replay inputs were stored has none
                let has_replay: bool = self.conn.query_row(
                    "SELECT EXISTS (SELECT 1 FROM import.sqlite_master WHERE name = 'replay')",
                    [],
                    |r| r.get(0),
                )?;
                if has_replay {
                    self.conn
                        .execute_batch("INSERT INTO main.replay SELECT * FROM import.replay;")?;
                }
                self.conn.execute_batch("COMMIT;")?;
                Ok(n as usize)
            })();
            if result.is_err() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            self.conn.execute("DETACH DATABASE import", [])?;
            return result;
        }
        let text = std::fs::read_to_string(input).map_err(|e| StoreError::Io(input.into(), e))?;
        let tx = self.conn.transaction()?;
        let mut n = 0;
        for (lineno, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let l: ExportLine = serde_json::from_str(line).map_err(|e| {
                StoreError::Io(
                    input.into(),
                    std::io::Error::other(format!("line {}: {e}", lineno + 1)),
                )
            })?;
            let s = &l.span;
            let id = s.id as i64;
            if let Some(sess) = &s.session {
                tx.execute(
                    "INSERT INTO sessions (probe_id, id, first_seen_ms, last_seen_ms) VALUES (?1, ?2, ?3, ?3)
                     ON CONFLICT (probe_id, id) DO UPDATE SET last_seen_ms = MAX(last_seen_ms, excluded.last_seen_ms)",
                    params![l.probe_id, sess, s.started_ms],
                )?;
            }
            tx.execute(
                "INSERT INTO spans (probe_id, id, session, label, started_ms, ended_ms, duration_ms, exit_code, exit_signal, sandbox)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, json_extract(?10, '$.sandbox.id'))",
                params![l.probe_id, id, s.session, s.label, s.started_ms, s.ended_ms, s.duration_ms, s.exit_code, s.exit_signal, l.attribution.get()],
            )?;
            tx.execute(
                "INSERT INTO attributions (probe_id, span_id, failed, primitive, layer, confidence, explanation, decisive, object)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    l.probe_id,
                    id,
                    s.failed,
                    s.primitive,
                    s.layer,
                    s.confidence,
                    s.explanation,
                    l.decisive.as_ref().map(|d| d.get()),
                    l.attribution.get()
                ],
            )?;
            let mut event = tx.prepare_cached(INSERT_EVENT)?;
            for (seq, raw) in l.events.iter().enumerate() {
                let e: KernelEvent = serde_json::from_str(raw.get())?;
                insert_event(&mut event, &l.probe_id, id, seq, &e, raw.get())?;
            }
            drop(event);
            tx.execute(
                "INSERT INTO drops (probe_id, span_id, kernel, retention) VALUES (?1, ?2, ?3, ?4)",
                params![l.probe_id, id, l.drops.0 as i64, l.drops.1 as i64],
            )?;
            if let Some(r) = &l.replay {
                tx.execute(
                    "INSERT INTO replay (probe_id, span_id, input) VALUES (?1, ?2, ?3)",
                    params![l.probe_id, id, r.get()],
                )?;
            }
            n += 1;
        }
        tx.commit()?;
        Ok(n)
    }

    /// `PRAGMA integrity_check` result ("ok" when sound).
    pub fn integrity_check(&self) -> Result<String, StoreError> {
        Ok(self
            .conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))?)
    }

    /// The raw connection, for tests and ad-hoc queries.
    /// The connection, for callers that keep their own tables in this DB
    /// (the campaign's results).
    pub fn into_connection(self) -> Connection {
        self.conn
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }
}

const INSERT_EVENT: &str = "INSERT INTO events (probe_id, span_id, seq, ts_ns, kind, pid, comm, syscall, errno, path, detail)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";

/// One `events` row; `detail` is the event's JSON.
fn insert_event(
    stmt: &mut rusqlite::CachedStatement<'_>,
    probe_id: &str,
    span: i64,
    seq: usize,
    e: &KernelEvent,
    detail: &str,
) -> rusqlite::Result<usize> {
    stmt.execute(params![
        probe_id,
        span,
        seq as i64,
        e.ts_ns as i64,
        e.kind.id(),
        e.pid,
        e.comm,
        e.syscall.as_deref(),
        e.errno.as_deref(),
        e.path,
        detail
    ])
}

/// hostname-random: distinct per DB, readable in merged results.
fn new_probe_id() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "probe".into());
    let mut bytes = [0u8; 4];
    let _ = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    format!("{host}-{:08x}", u32::from_ne_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::{ExitStatus, Outcome, attribute};
    use crate::spans::SpanEvidence;

    fn span(id: u64, session: &str, code: i32) -> StoredSpan {
        let mut s = SpanEvidence::new(id, Some(session.into()), format!("label {id}"), 0);
        s.root_pid = Some(5);
        let mut ev: KernelEvent = serde_json::from_value(serde_json::json!({
            "kind": "syscall_failed", "ts_ns": 10, "pid": 5, "tid": 5, "comm": "cat",
            "syscall": "openat", "syscall_nr": 257, "ret": -2, "errno": "ENOENT", "path": "/data/x.csv"
        }))
        .unwrap();
        ev.duration_ns = Some(100);
        s.add(ev);
        let mut all = attribute(
            &s,
            &Outcome {
                exit: ExitStatus {
                    code: Some(code),
                    signal: None,
                },
                all_events: true,
                words: crate::attribution::Words {
                    command: Some("cat /data/x.csv".into()),
                    output: None,
                },
                ..Default::default()
            },
        );
        all.events = s.events.iter().cloned().collect();
        StoredSpan {
            started_ms: 1000 + id as i64,
            ended_ms: 1001 + id as i64,
            attribution: all,
            replay: None,
        }
    }

    #[test]
    fn insert_list_show_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = Store::open(&dir.path().join("e.db")).unwrap();
        assert_eq!(st.next_span_id().unwrap(), 1);
        st.insert(&[span(1, "s1", 1), span(2, "s1", 0), span(3, "s2", 1)])
            .unwrap();
        assert_eq!(st.next_span_id().unwrap(), 4);
        let failed = st
            .spans(&SpanFilter {
                failed_only: true,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            failed.iter().map(|r| r.span).collect::<Vec<_>>(),
            vec![3, 1]
        );
        assert_eq!(failed[0].primitive, "fs.missing");
        let s1 = st
            .spans(&SpanFilter {
                session: Some("s1".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(s1.len(), 2);
        let shown = st.show(1).unwrap().unwrap();
        assert_eq!(shown.events.len(), 1);
        assert_eq!(shown.events[0].path.as_deref(), Some("/data/x.csv"));
        assert!(st.show(99).unwrap().is_none());
        assert_eq!(st.integrity_check().unwrap(), "ok");
        // a span a sandbox's client opened is listed for that sandbox only
        let mut theirs = span(4, "s3", 1);
        theirs.attribution.sandbox = Some(crate::attribution::SandboxView {
            id: "pidns:4026532714".into(),
            pids: crate::attribution::PidsIn::Daemon,
            root_pid: None,
        });
        st.insert(&[theirs]).unwrap();
        let of = |sandbox: &str| {
            st.spans(&SpanFilter {
                sandbox: Some(sandbox.into()),
                ..Default::default()
            })
            .unwrap()
            .iter()
            .map(|r| r.span)
            .collect::<Vec<_>>()
        };
        assert_eq!(of("pidns:4026532714"), vec![4]);
        assert!(of("pidns:1").is_empty());
        assert_eq!(st.spans(&SpanFilter::default()).unwrap().len(), 4);
        assert_eq!(
            st.show(4).unwrap().unwrap().sandbox.map(|v| v.id),
            Some("pidns:4026532714".into())
        );
    }

    #[test]
    fn corrupt_file_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.db");
        std::fs::write(
            &p,
            b"this is not sqlite at all, not even close to a header......",
        )
        .unwrap();
        let err = Store::open(&p).err().expect("must fail");
        assert!(matches!(err, StoreError::Corrupt(..)), "{err}");
        assert!(err.to_string().contains("left untouched"));
        assert_eq!(
            std::fs::read(&p).unwrap(),
            b"this is not sqlite at all, not even close to a header......"
        );
    }

    #[test]
    fn retention_by_age_is_logged() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = Store::open(&dir.path().join("e.db")).unwrap();
        st.insert(&[span(1, "s", 1), span(2, "s", 1)]).unwrap();
        let mut removed = RetentionTotals::default();
        by_age(&mut st, 60, &mut removed);
        assert_eq!(
            removed,
            RetentionTotals {
                spans_removed: 2,
                events_removed: 2,
                explaining_removed: 0,
            }
        );
        assert_eq!(st.retention_totals().unwrap(), removed);
        assert!(st.spans(&SpanFilter::default()).unwrap().is_empty());
    }

    #[test]
    fn jsonl_and_sqlite_exports_reimport_identically() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = Store::open(&dir.path().join("e.db")).unwrap();
        st.insert(&[replayable(span(1, "s1", 1)), span(2, "s1", 0)])
            .unwrap();
        assert_eq!(replayed(&st, 1), "same");
        let dump = |s: &Store| -> Vec<String> {
            let mut out = Vec::new();
            for t in [
                "sessions",
                "spans",
                "attributions",
                "events",
                "drops",
                "replay",
            ] {
                let mut stmt = s
                    .connection()
                    .prepare(&format!("SELECT * FROM {t} ORDER BY 1, 2"))
                    .unwrap();
                let n = stmt.column_count();
                let rows = stmt
                    .query_map([], |r| {
                        let vals: Vec<String> = (0..n)
                            .map(|i| {
                                format!("{:?}", r.get::<_, rusqlite::types::Value>(i).unwrap())
                            })
                            .collect();
                        Ok(format!("{t}: {}", vals.join("|")))
                    })
                    .unwrap();
                out.extend(rows.map(Result::unwrap));
            }
            out
        };
        let jsonl = dir.path().join("x.jsonl");
        assert_eq!(st.export_jsonl(&SpanFilter::default(), &jsonl).unwrap(), 2);
        let mut fresh = Store::open(&dir.path().join("fresh.db")).unwrap();
        assert_eq!(fresh.import(&jsonl).unwrap(), 2);
        assert_eq!(dump(&st), dump(&fresh));
        assert!(dump(&fresh).iter().any(|r| r.starts_with("replay: ")));
        assert_eq!(replayed(&fresh, 1), "same");
        let sq = dir.path().join("x.sqlite");
        assert_eq!(st.export_sqlite(&SpanFilter::default(), &sq).unwrap(), 2);
        let mut fresh2 = Store::open(&dir.path().join("fresh2.db")).unwrap();
        assert_eq!(fresh2.import(&sq).unwrap(), 2);
        assert_eq!(dump(&st), dump(&fresh2));
        assert_eq!(replayed(&fresh2, 1), "same");
        assert!(replayed(&fresh2, 2).contains("not replayable: no replay input"));
    }

    /// `s` with the replay input a daemon stores beside a span whose every
    /// event is kept.
    fn replayable(mut s: StoredSpan) -> StoredSpan {
        let a = &s.attribution;
        let mut span = SpanEvidence::new(a.span, a.session.clone(), a.label.clone(), 0);
        span.root_pid = Some(5);
        s.replay = Some(span.replay(&Outcome {
            exit: a.exit.clone(),
            words: crate::attribution::Words {
                command: Some("cat /data/x.csv".into()),
                output: None,
            },
            ..Default::default()
        }));
        s
    }

    /// What `probe show --reattribute` says of span `id`.
    fn replayed(st: &Store, id: u64) -> String {
        match crate::replay::span(st, id).unwrap().unwrap() {
            crate::replay::Replayed::Same { .. } => "same".into(),
            r => crate::replay::line(&r),
        }
    }

    #[test]
    fn span_ids_are_not_reused_after_retention_and_imports_are_shown() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = Store::open(&dir.path().join("e.db")).unwrap();
        st.insert(&[span(1, "s", 1), span(2, "s", 1)]).unwrap();
        by_age(&mut st, 60, &mut RetentionTotals::default());
        assert_eq!(
            st.next_span_id().unwrap(),
            3,
            "ids continue after retention emptied the DB"
        );
        // another probe's export, imported: listed and shown by id
        let mut other = Store::open(&dir.path().join("other.db")).unwrap();
        other.insert(&[span(7, "o", 1)]).unwrap();
        let out = dir.path().join("o.jsonl");
        other.export_jsonl(&SpanFilter::default(), &out).unwrap();
        st.import(&out).unwrap();
        let rows = st.spans(&SpanFilter::default()).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].probe_id, other.probe_id());
        assert_eq!(st.show(7).unwrap().unwrap().events.len(), 1);
    }

    /// A span of `n` failed lookups (a worked program's tolerated ones when
    /// `code` is 0), stored with all its events, started at `started_ms`.
    fn span_of(id: u64, code: i32, n: usize, started_ms: i64) -> StoredSpan {
        let mut s = span(id, "big", code);
        let e = s.attribution.events[0].clone();
        s.attribution.events = (0..n)
            .map(|i| KernelEvent {
                path: Some(format!("/usr/lib/python3/dist-packages/module_{i:05}.so")),
                ..e.clone()
            })
            .collect();
        s.started_ms = started_ms;
        s
    }

    /// Successful spans `ids` of `events` events each, started in id
    /// order, in batches of 50.
    fn insert_successful(st: &mut Store, ids: std::ops::Range<u64>, events: usize) {
        let all: Vec<StoredSpan> = ids.map(|id| span_of(id, 0, events, id as i64)).collect();
        for batch in all.chunks(50) {
            st.insert(batch).unwrap();
        }
    }

    /// Size passes as the store thread makes them, each at most
    /// `PASS_TIME`, until one ends with nothing left to do; what they
    /// removed.
    fn fit(st: &mut Store, budget: u64) -> RetentionTotals {
        let mut removed = RetentionTotals::default();
        for _ in 0..1000 {
            if st.enforce_size(budget, &mut removed).unwrap() == Pass::Done {
                return removed;
            }
        }
        panic!("1000 passes did not fit the DB in {budget} bytes: {removed:?}");
    }

    /// Age passes until one ends with nothing left to do.
    fn by_age(st: &mut Store, max_age_secs: u64, removed: &mut RetentionTotals) {
        while st.enforce_age(max_age_secs, removed).unwrap() == Pass::OutOfTime {}
    }

    #[test]
    fn a_size_cap_removes_spans_that_explain_nothing_first_and_stays_under() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = Store::open(&dir.path().join("e.db")).unwrap();
        assert_eq!(st.auto_vacuum().unwrap(), "incremental");
        let budget = 1 << 20;
        st.limit_wal(budget).unwrap();
        // failed spans first (the oldest), then many successful ones
        let failed: Vec<StoredSpan> = (1..=20).map(|i| span_of(i, 1, 20, i as i64)).collect();
        st.insert(&failed).unwrap();
        insert_successful(&mut st, 100..600, 50);
        let before = st.size_bytes().unwrap();
        assert!(
            before > budget,
            "the test needs a DB over its budget: {before}"
        );
        let removed = fit(&mut st, budget);
        assert!(
            st.size_bytes().unwrap() <= budget,
            "{} > {budget} after a pass (wal {}, live {}, removed {removed:?})",
            st.size_bytes().unwrap(),
            st.wal_bytes(),
            st.live_bytes().unwrap()
        );
        assert!(removed.spans_removed > 0);
        assert_eq!(removed.explaining_removed, 0, "{removed:?}");
        let left = st.spans(&SpanFilter::default()).unwrap();
        assert_eq!(
            left.iter().filter(|r| r.failed).count(),
            20,
            "every failed span survives"
        );
        // the successful ones that survive are the newest
        let oldest_ok = left
            .iter()
            .filter(|r| !r.failed)
            .map(|r| r.span)
            .min()
            .unwrap();
        assert!(left.iter().filter(|r| !r.failed).count() as u64 == 600 - oldest_ok);
        assert_eq!(st.retention_totals().unwrap(), removed);
        // a budget no successful span can meet: failed ones go, oldest first
        // room for the schema and about ten failed spans: a budget whose
        // ¾, less the WAL's 8 pages, is that (measured on a fresh DB)
        let mut fresh = Store::open(&dir.path().join("fresh.db")).unwrap();
        let empty = fresh.live_bytes().unwrap();
        fresh.insert(&[span_of(1, 1, 20, 1)]).unwrap();
        let one_failed = fresh.live_bytes().unwrap() - empty;
        let budget = (empty + 10 * one_failed + (8 << 12)) / 3 * 4;
        let removed = fit(&mut st, budget);
        assert!(removed.explaining_removed > 0, "{removed:?}");
        let left = st.spans(&SpanFilter::default()).unwrap();
        assert!(left.iter().all(|r| r.failed));
        let kept: Vec<u64> = left.iter().map(|r| r.span).collect();
        assert!(
            kept.windows(2).all(|w| w[0] > w[1]) && kept.first() == Some(&20),
            "{kept:?}"
        );
        assert_eq!(st.integrity_check().unwrap(), "ok");
    }

    #[test]
    fn explains_sql_says_what_attribution_explains_says() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = Store::open(&dir.path().join("e.db")).unwrap();
        let mut cases = vec![
            span(1, "s", 1),
            span(2, "s", 0),
            span(3, "s", 0),
            span(4, "s", 0),
        ];
        cases[2].attribution.hidden_failure = Some(crate::attribution::HiddenFailure {
            primitive: crate::primitive::Primitive::FsMissing,
            confidence: 0.8,
            explanation: "find failed".into(),
            decisive: None,
        });
        cases[3].attribution.memory.reclaim_ms = 12.5;
        st.insert(&cases).unwrap();
        for c in &cases {
            let sql: bool = st
                .connection()
                .query_row(
                    &format!("SELECT {EXPLAINS_SQL} FROM attributions a WHERE a.span_id = ?1"),
                    [c.attribution.span as i64],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(sql, c.attribution.explains(), "span {}", c.attribution.span);
        }
        assert_eq!(
            cases
                .iter()
                .map(|c| c.attribution.explains())
                .collect::<Vec<_>>(),
            [true, false, true, true]
        );
    }

    /// 40 spans in a DB as an earlier version made it: no auto-vacuum.
    fn old_db() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let mut st = Store::open(&dir.path().join("old.db")).unwrap();
        let spans: Vec<StoredSpan> = (1..=40).map(|i| span_of(i, 0, 50, i as i64)).collect();
        st.insert(&spans).unwrap();
        st.connection()
            .execute_batch("PRAGMA auto_vacuum = NONE; VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        assert_eq!(st.auto_vacuum().unwrap(), "none");
        (dir, st)
    }

    #[test]
    fn a_db_made_before_incremental_auto_vacuum_loses_nothing_for_no_disk_gain() {
        let (_dir, mut st) = old_db();
        st.connection()
            .execute_batch("DELETE FROM spans WHERE id <= 20")
            .unwrap();
        // a budget under the file but over what is in use: freed pages
        // would only be reused, so nothing is removed
        let mut removed = RetentionTotals::default();
        let over_use = st.live_bytes().unwrap() + (64 << 10);
        assert!(over_use < st.size_bytes().unwrap(), "the file is over it");
        assert_eq!(st.enforce_size(over_use, &mut removed).unwrap(), Pass::Done);
        assert_eq!(removed.spans_removed, 0, "{removed:?}");
        assert_eq!(st.span_count().unwrap(), 20);
        // over the budget in use: the oldest go, and their pages are reused
        let half = st.live_bytes().unwrap() / 2;
        let removed = fit(&mut st, half);
        assert!(removed.spans_removed > 0 && st.span_count().unwrap() < 20);
    }

    #[test]
    fn a_db_made_before_incremental_auto_vacuum_is_converted_with_every_span() {
        let (_dir, mut st) = old_db();
        st.connection()
            .execute_batch("DELETE FROM spans WHERE id <= 20")
            .unwrap();
        let before = st.size_bytes().unwrap();
        let converted = st.convert_to_incremental().unwrap();
        assert!(
            matches!(converted, Conversion::Converted { after, .. } if after < before),
            "{converted:?} (from {before} bytes)"
        );
        assert_eq!(st.auto_vacuum().unwrap(), "incremental");
        assert_eq!(st.span_count().unwrap(), 20);
        let check: String = st
            .connection()
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        // once is enough
        assert_eq!(st.convert_to_incremental().unwrap(), Conversion::NotNeeded);
    }

    #[test]
    fn a_policy_that_would_remove_everything_is_refused() {
        let ok = RetentionPolicy::default();
        assert!(ok.check().is_ok());
        for bad in [
            RetentionPolicy {
                max_db_bytes: 0,
                ..ok
            },
            RetentionPolicy {
                max_disk_share: 0.0,
                ..ok
            },
            RetentionPolicy {
                max_disk_share: f64::NAN,
                ..ok
            },
            RetentionPolicy {
                max_disk_share: 1.5,
                ..ok
            },
            RetentionPolicy {
                max_age_secs: Some(0),
                ..ok
            },
        ] {
            let why = bad.check().expect_err("refused");
            assert!(why.starts_with("[retention] "), "{why}");
        }
    }

    /// A tmpfs of `mib` MiB, unmounted on drop.
    struct Tmpfs(tempfile::TempDir);

    impl Tmpfs {
        fn mount(mib: u32) -> Tmpfs {
            let dir = tempfile::tempdir().unwrap();
            let st = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(st.success(), "mount tmpfs");
            Tmpfs(dir)
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg(self.0.path())
                .status();
        }
    }

    #[test]
    fn retention_makes_room_on_a_nearly_full_disk() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("CI").is_err_and(|_| true)
                    || std::env::var("CI").as_deref() == Ok(""),
                "mounting a tmpfs needs root; CI=true forbids skipping"
            );
            return;
        }
        let disk = Tmpfs::mount(16);
        let path = disk.0.path().join("e.db");
        let mut st = Store::open(&path).unwrap();
        insert_successful(&mut st, 1..101, 150);
        st.connection()
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        // the workload takes the disk: 1 MiB is left
        let free = |p: &Path| {
            let s = nix::sys::statvfs::statvfs(p).unwrap();
            s.blocks_available() * s.fragment_size()
        };
        let filler = vec![0u8; (free(disk.0.path()) - (1 << 20)) as usize];
        std::fs::write(disk.0.path().join("filler"), filler).unwrap();
        let policy = RetentionPolicy {
            max_disk_share: 0.5,
            ..RetentionPolicy::default()
        };
        let size = st.size_bytes().unwrap();
        let budget = policy.budget_bytes(&path, size);
        assert!(
            budget < size,
            "{budget} of {size}: the disk share must bind"
        );
        st.limit_wal(budget).unwrap();
        // a pass that needed as much free disk as it removes would fail here
        let removed = fit(&mut st, budget);
        assert!(removed.spans_removed > 0);
        assert!(
            st.size_bytes().unwrap() <= budget,
            "{} > {budget}",
            st.size_bytes().unwrap()
        );
        assert_eq!(st.integrity_check().unwrap(), "ok");
    }
}
