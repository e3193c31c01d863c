-- The campaign runner's results: one row per run, per test, per step.
-- Several runner processes (shards) write one run at once; the primary
-- keys make a lost or duplicated test impossible to miss.

CREATE TABLE campaign_runs (
    id           TEXT PRIMARY KEY,
    label        TEXT NOT NULL,
    target       TEXT NOT NULL,  -- stdio:CMD or the MCP URL
    suite        TEXT NOT NULL,  -- the suite directory, as given
    suite_digest TEXT NOT NULL,  -- sha256 over the test files: a resume must match it
    tests_total  INTEGER NOT NULL,
    profile      TEXT,           -- the bridge's profile (from sandbox_info)
    injected     TEXT,           -- the fault it injects: a primitive, `interface`, or NULL for none
    started_ms   INTEGER NOT NULL,
    finished_ms  INTEGER         -- set when every test of the suite is recorded
);

CREATE TABLE campaign_tests (
    run         TEXT NOT NULL REFERENCES campaign_runs (id) ON DELETE CASCADE,
    test_id     TEXT NOT NULL,
    domain      TEXT NOT NULL,
    title       TEXT NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('pass', 'fail')),
    layer       TEXT CHECK (layer IN ('interface', 'sandbox', 'test')),
    primitive   TEXT,
    confidence  REAL,
    explanation TEXT,
    evidence    TEXT,            -- JSON: what the triage decided on
    duration_ms REAL NOT NULL,
    runner      TEXT NOT NULL,   -- pid/worker that ran it
    mcp_session TEXT,            -- also the probe session of its spans
    finished_ms INTEGER NOT NULL,
    PRIMARY KEY (run, test_id)
);
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
    PRIMARY KEY (run, test_id, step),
    FOREIGN KEY (run, test_id) REFERENCES campaign_tests (run, test_id) ON DELETE CASCADE
) WITHOUT ROWID;
