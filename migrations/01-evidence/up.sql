-- The probe's evidence: sessions, spans, attributions, events, drops.
-- Shared with the campaign's results DB, so a probe export merges into it
-- with plain SQL (ATTACH ... ; INSERT INTO main.x SELECT * FROM export.x).
-- Rows carry the probe_id of the daemon that recorded them, so exports of
-- several sandboxes merge without colliding span ids.

CREATE TABLE sessions (
    probe_id      TEXT NOT NULL,
    id            TEXT NOT NULL,
    first_seen_ms INTEGER NOT NULL,
    last_seen_ms  INTEGER NOT NULL,
    PRIMARY KEY (probe_id, id)
);

CREATE TABLE spans (
    probe_id    TEXT NOT NULL,
    id          INTEGER NOT NULL,
    session     TEXT,
    label       TEXT NOT NULL,
    started_ms  INTEGER NOT NULL,
    ended_ms    INTEGER NOT NULL,
    duration_ms REAL NOT NULL,
    exit_code   INTEGER,
    exit_signal TEXT,
    PRIMARY KEY (probe_id, id)
);
CREATE INDEX spans_by_session ON spans (probe_id, session);
CREATE INDEX spans_by_start ON spans (started_ms);

CREATE TABLE attributions (
    probe_id    TEXT NOT NULL,
    span_id     INTEGER NOT NULL,
    failed      INTEGER NOT NULL,
    primitive   TEXT NOT NULL,
    layer       TEXT,
    confidence  REAL NOT NULL,
    explanation TEXT NOT NULL,
    decisive    TEXT,          -- JSON event, or NULL
    object      TEXT NOT NULL, -- the whole attribution JSON (without events)
    PRIMARY KEY (probe_id, span_id),
    FOREIGN KEY (probe_id, span_id) REFERENCES spans (probe_id, id) ON DELETE CASCADE
);
CREATE INDEX attributions_by_primitive ON attributions (primitive);

CREATE TABLE events (
    probe_id TEXT NOT NULL,
    span_id  INTEGER NOT NULL,
    seq      INTEGER NOT NULL,
    ts_ns    INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    pid      INTEGER NOT NULL,
    comm     TEXT NOT NULL,
    syscall  TEXT,
    errno    TEXT,
    path     TEXT,
    detail   TEXT NOT NULL, -- the whole event JSON
    PRIMARY KEY (probe_id, span_id, seq),
    FOREIGN KEY (probe_id, span_id) REFERENCES spans (probe_id, id) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE TABLE drops (
    probe_id  TEXT NOT NULL,
    span_id   INTEGER NOT NULL,
    kernel    INTEGER NOT NULL, -- ring-buffer records lost while the span was open
    retention INTEGER NOT NULL, -- events evicted by the per-span cap
    PRIMARY KEY (probe_id, span_id),
    FOREIGN KEY (probe_id, span_id) REFERENCES spans (probe_id, id) ON DELETE CASCADE
);

-- What retention removed, and why: nothing is deleted silently.
CREATE TABLE retention_log (
    at_ms          INTEGER NOT NULL,
    reason         TEXT NOT NULL, -- age | size
    spans_removed  INTEGER NOT NULL,
    events_removed INTEGER NOT NULL
);

-- Facts about this database: probe_id (who writes it), created_ms.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
