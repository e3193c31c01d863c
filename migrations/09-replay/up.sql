-- What replaying a stored span needs besides its events (`probe show
-- --reattribute`): the span's header when it closed, the facts the host
-- gave then (memory PSI, the clock, paths present outside the sandbox) and
-- what its caller knew (exit, deadline, the workload's words), as JSON.
-- Written only for a span whose every event is stored.
CREATE TABLE replay (
    probe_id TEXT NOT NULL,
    span_id  INTEGER NOT NULL,
    input    TEXT NOT NULL,
    PRIMARY KEY (probe_id, span_id),
    FOREIGN KEY (probe_id, span_id) REFERENCES spans (probe_id, id) ON DELETE CASCADE
) WITHOUT ROWID;
