-- The environment each target of a run ran in: `probe env`'s snapshot,
-- taken through the target before the first test (or read from a file),
-- with whether what the run wrote at its start was there at its end.
-- Names and hashes only: a snapshot never holds a secret.

CREATE TABLE campaign_environments (
    run      TEXT NOT NULL REFERENCES campaign_runs (id) ON DELETE CASCADE,
    target   TEXT NOT NULL,  -- the target it was taken through, or `file:PATH`
    snapshot TEXT NOT NULL,  -- JSON: a probe-env document
    taken_ms INTEGER NOT NULL,
    PRIMARY KEY (run, target)
);
