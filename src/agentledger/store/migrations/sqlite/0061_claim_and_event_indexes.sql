-- Version 60 (SQLite): indexes for the fair claim and for journal writes.
-- A claim ranks each tenant's due runs by available_at and takes at most :limit of
-- each; with the tenant first and the time second, it seeks each tenant's first runs
-- instead of ranking the whole backlog (50,000 due runs: a sort of all of them per
-- claim before). The target is carried in the index so the claim filters by it
-- without reading the row.
CREATE INDEX runs_fair ON runs (tenant_id, available_at, target) WHERE status IN ('queued', 'waiting');

-- Two indexes of events that every journal write paid for and no query of a step
-- event uses: the audit chain's (tenant, chain_no) holds sealed events only (an
-- unsealed one has no chain_no yet), and the index by type leaves out the step.*
-- events (queries by type name the same condition: queries/events.py).
DROP INDEX events_chain;
CREATE UNIQUE INDEX events_chain ON events (tenant_id, chain_no) WHERE chain_no IS NOT NULL;
DROP INDEX events_type;
CREATE INDEX events_type ON events (type) WHERE type NOT LIKE 'step.%';
-- A run's events are found by (run_id, seq), the unique index every reader of a run's
-- events uses; the older (run_id, id) index duplicated it (within a run, id and seq
-- grow together: both are taken under the run row's lock).
DROP INDEX events_run;
