-- One daemon per host serves the bridges of many containers: each span
-- remembers the sandbox whose client opened it (`pidns:INODE` for a client
-- in another PID namespace, `gvisor:CONTAINER` for one inside gVisor;
-- NULL for a client in the daemon's own namespace), so a sandbox's client
-- reads back only its own spans.
ALTER TABLE spans ADD COLUMN sandbox TEXT;
CREATE INDEX spans_by_sandbox ON spans (sandbox, started_ms);
