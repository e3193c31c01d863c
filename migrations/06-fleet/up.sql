-- Fleets: one run spread over many targets, and runners on several
-- machines sharing one run in one PostgreSQL database (the same schema is
-- created in SQLite, where one runner process schedules its own tests).

ALTER TABLE campaign_tests ADD COLUMN target TEXT; -- the target that ran it (NULL before 06: the run's own target)

-- Work claiming: every test of a run is claimed by one runner at a time.
-- A claim held by a runner whose heartbeat stopped is taken over, so a
-- runner killed with kill -9 loses nothing: its recorded tests stay, its
-- claimed ones are run again elsewhere. A test's claim is deleted in the
-- transaction that records it: the queue holds only what is left.
CREATE TABLE campaign_claims (
    run        TEXT NOT NULL REFERENCES campaign_runs (id) ON DELETE CASCADE,
    test_id    TEXT NOT NULL,
    seq        INTEGER NOT NULL,  -- the test's place in the suite: tests are claimed in order
    runner     TEXT,              -- NULL while nobody has claimed it
    claimed_ms INTEGER,
    PRIMARY KEY (run, test_id)
);
CREATE INDEX campaign_claims_by_seq ON campaign_claims (run, seq);

CREATE TABLE campaign_runners (
    run          TEXT NOT NULL REFERENCES campaign_runs (id) ON DELETE CASCADE,
    runner       TEXT NOT NULL,   -- host/pid/start
    targets      TEXT NOT NULL,   -- JSON array of the targets it drives
    started_ms   INTEGER NOT NULL,
    heartbeat_ms INTEGER NOT NULL,-- renewed every second while it runs
    finished_ms  INTEGER,
    PRIMARY KEY (run, runner)
);

-- A target that died or stopped answering during a run, and why.
CREATE TABLE campaign_target_downs (
    run     TEXT NOT NULL REFERENCES campaign_runs (id) ON DELETE CASCADE,
    runner  TEXT NOT NULL,
    target  TEXT NOT NULL,
    down_ms INTEGER NOT NULL,
    reason  TEXT NOT NULL,
    PRIMARY KEY (run, runner, target)
);
