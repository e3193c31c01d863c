-- Test outcomes an outside agent records through the bridge's
-- `record_result` tool. The campaign runner builds on this table.
CREATE TABLE recorded_results (
    run         TEXT NOT NULL,
    test_id     TEXT NOT NULL,
    domain      TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('pass', 'fail', 'error', 'skip')),
    layer       TEXT CHECK (layer IN ('interface', 'sandbox', 'test')),
    primitive   TEXT,
    notes       TEXT,
    mcp_session TEXT NOT NULL,
    recorded_ms INTEGER NOT NULL,
    PRIMARY KEY (run, test_id)
);
