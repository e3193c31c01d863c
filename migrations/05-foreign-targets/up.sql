-- Foreign MCP servers (through a target adapter): a step the target cannot
-- express is `unsupported`, its own outcome, never a pass or a fail; an
-- expectation the target cannot report is `unchecked` and named. A run
-- records the adapter it used. `campaign shrink` stores the smallest
-- input that still breaks the same way, shown beside the failure.
-- SQLite cannot change a CHECK in place: both tables are rebuilt as in 04.

ALTER TABLE campaign_runs ADD COLUMN adapter TEXT; -- name and sha256 of the adapter file, NULL for none

-- the artifacts table is rebuilt too: renaming campaign_tests rewrites the
-- foreign keys that point at it, and the children are dropped first so
-- that dropping the old tests table cascades into nothing
ALTER TABLE campaign_artifacts RENAME TO campaign_artifacts_old;
ALTER TABLE campaign_steps RENAME TO campaign_steps_old;
ALTER TABLE campaign_tests RENAME TO campaign_tests_old;
DROP INDEX campaign_tests_by_layer;

CREATE TABLE campaign_tests (
    run         TEXT NOT NULL REFERENCES campaign_runs (id) ON DELETE CASCADE,
    test_id     TEXT NOT NULL,
    domain      TEXT NOT NULL,
    title       TEXT NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('pass', 'fail', 'degraded', 'unsupported')),
    layer       TEXT CHECK (layer IN ('interface', 'sandbox', 'test')),
    primitive   TEXT,            -- for a degraded test: mem.pressure when memory, else NULL
    confidence  REAL,
    explanation TEXT,            -- degraded: what degraded it; unsupported: what the target cannot express
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
    verdict         TEXT NOT NULL CHECK (verdict IN ('pass', 'fail', 'not-run', 'unsupported')),
    failures        TEXT,          -- JSON array of failed expectations / protocol errors
    span_id         INTEGER,       -- the probe span (join spans on session = mcp_session)
    kernel_failed   INTEGER,
    kernel_primitive TEXT,
    kernel          TEXT,          -- the attribution JSON, events left out
    degraded        TEXT,          -- JSON array: why this passing step was degraded
    unchecked       TEXT,          -- JSON array: expectations the target cannot report
    target_call     TEXT,          -- JSON {tool, arguments} as the adapter sent it (NULL without adapter)
    PRIMARY KEY (run, test_id, step),
    FOREIGN KEY (run, test_id) REFERENCES campaign_tests (run, test_id) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO campaign_steps
    SELECT run, test_id, step, tool, request, response_sha256, response_bytes, duration_ms,
           is_error, verdict, failures, span_id, kernel_failed, kernel_primitive, kernel, degraded,
           NULL, NULL
    FROM campaign_steps_old;

CREATE TABLE campaign_artifacts (
    run     TEXT NOT NULL,
    test_id TEXT NOT NULL,
    step    INTEGER NOT NULL,
    mime    TEXT NOT NULL,
    data    BLOB NOT NULL,
    PRIMARY KEY (run, test_id, step),
    FOREIGN KEY (run, test_id) REFERENCES campaign_tests (run, test_id) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO campaign_artifacts SELECT * FROM campaign_artifacts_old;

DROP TABLE campaign_artifacts_old;
DROP TABLE campaign_steps_old;
DROP TABLE campaign_tests_old;

-- `campaign shrink`: the smallest payload that still fails the same way.
CREATE TABLE campaign_shrinks (
    run         TEXT NOT NULL,
    test_id     TEXT NOT NULL,
    step        INTEGER NOT NULL,
    channel     TEXT NOT NULL,   -- stdout (a command's output) or file (write_file, then read_file)
    kind        TEXT NOT NULL,   -- the mangling kept constant while shrinking (e.g. cut-at-nul)
    cause       TEXT NOT NULL,   -- the finding in words: "one byte 0x00 is enough"
    minimal     BLOB NOT NULL,   -- the smallest failing input
    came_back   BLOB,            -- what the target returned for it
    calls       INTEGER NOT NULL,
    created_ms  INTEGER NOT NULL,
    PRIMARY KEY (run, test_id, step),
    FOREIGN KEY (run, test_id) REFERENCES campaign_tests (run, test_id) ON DELETE CASCADE
) WITHOUT ROWID;
