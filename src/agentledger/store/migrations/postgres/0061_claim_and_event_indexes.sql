-- Version 60 (PostgreSQL): the fair claim's index (same as SQLite's): each tenant's
-- due runs in available_at order, the target carried for the claim's filter.
CREATE INDEX runs_fair ON runs (tenant_id, available_at, target) WHERE status IN ('queued', 'waiting');

-- Two indexes of events that every journal write paid for and no query of a step
-- event uses (see the SQLite script): the audit chain's holds sealed events only, the
-- index by type leaves out the step.* events.
DROP INDEX events_chain;
CREATE UNIQUE INDEX events_chain ON events (tenant_id, chain_no) WHERE chain_no IS NOT NULL;
DROP INDEX events_type;
CREATE INDEX events_type ON events (type) WHERE type NOT LIKE 'step.%';
-- A run's events are found by (run_id, seq), the unique index every reader of a run's
-- events uses; the older (run_id, id) index duplicated it (within a run, id and seq
-- grow together: both are taken under the run row's lock).
DROP INDEX events_run;
