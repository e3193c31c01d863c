-- A test that passed while its steps show memory pressure, or ran past
-- their max_duration_ms, is `degraded`: counted apart from pass and fail
-- (the source article's tab-heavy browser tests were "complete failures
-- rather than degraded results"). SQLite cannot change a CHECK in place,
-- so both campaign tables are rebuilt; the old ones are renamed first so
-- that dropping them cascades into nothing.

ALTER TABLE campaign_steps RENAME TO campaign_steps_old;
ALTER TABLE campaign_tests RENAME TO campaign_tests_old;
DROP INDEX campaign_tests_by_layer;

CREATE TABLE campaign_tests (
    run         TEXT NOT NULL REFERENCES campaign_runs (id) ON DELETE CASCADE,
    test_id     TEXT NOT NULL,
    domain      TEXT NOT NULL,
    title       TEXT NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('pass', 'fail', 'degraded')),
    layer       TEXT CHECK (layer IN ('interface', 'sandbox', 'test')),
    primitive   TEXT,            -- for a degraded test: mem.pressure when memory, else NULL
    confidence  REAL,
    explanation TEXT,            -- for a degraded test: what degraded it
    evidence    TEXT,            -- JSON: what the triage decided on
    duration_ms REAL NOT NULL,
    runner      TEXT NOT NULL,   -- pid/worker that ran it
    mcp_session TEXT,            -- also the probe session of its spans
    finished_ms INTEGER NOT NULL,
    PRIMARY KEY (run, test_id)
);
INSERT INTO campaign_tests SELECT * FROM campaign_tests_old;
CREATE INDEX campaign_tests_by_layer ON campaign_tests (run, layer, primitive);

CREATE TABLE campaign_steps (
    run             TEXT NOT NULL,
    test_id         TEXT NOT NULL,
    step            INTEGER NOT NULL,
    tool            TEXT NOT NULL,
    request         TEXT NOT NULL, -- arguments JSON (strings over 4 KiB elided with their sha256)
    response_sha256 TEXT,          -- of the whole JSON-RPC result; NULL when none came
    response_bytes  INTEGER,
    duration_ms     REAL NOT NULL,
    is_error        INTEGER,       -- the tool result's isError
    verdict         TEXT NOT NULL CHECK (verdict IN ('pass', 'fail', 'not-run')),
    failures        TEXT,          -- JSON array of failed expectations / protocol errors
    span_id         INTEGER,       -- the probe span (join spans on session = mcp_session)
    kernel_failed   INTEGER,
    kernel_primitive TEXT,
    kernel          TEXT,          -- the attribution JSON, events left out
    degraded        TEXT,          -- JSON array: why this passing step was degraded
    PRIMARY KEY (run, test_id, step),
    FOREIGN KEY (run, test_id) REFERENCES campaign_tests (run, test_id) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO campaign_steps
    SELECT run, test_id, step, tool, request, response_sha256, response_bytes, duration_ms,
           is_error, verdict, failures, span_id, kernel_failed, kernel_primitive, kernel, NULL
    FROM campaign_steps_old;

DROP TABLE campaign_steps_old;
DROP TABLE campaign_tests_old;

-- Files a test's workload made that a person wants to see in the report
-- (the PNG a browser test's screenshot returned), as the bytes came back.
CREATE TABLE campaign_artifacts (
    run     TEXT NOT NULL,
    test_id TEXT NOT NULL,
    step    INTEGER NOT NULL,
    mime    TEXT NOT NULL,
    data    BLOB NOT NULL,
    PRIMARY KEY (run, test_id, step),
    FOREIGN KEY (run, test_id) REFERENCES campaign_tests (run, test_id) ON DELETE CASCADE
) WITHOUT ROWID;
