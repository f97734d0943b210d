-- Version 135: retention (`agentledger prune`, docs/architecture.md "Retention").
-- A pruned run's rows are found by run in every table that holds them, without reading
-- the table (outbox_run is also created by version 125 where that is applied first).
CREATE INDEX IF NOT EXISTS outbox_run ON outbox (run_id, step_no);
CREATE INDEX IF NOT EXISTS effects_run ON effects (run_id);
CREATE INDEX IF NOT EXISTS webhook_deliveries_run ON webhook_deliveries (run_id);
CREATE INDEX IF NOT EXISTS idempotency_keys_run ON idempotency_keys (run_id);
-- What a prune removed from the front of a tenant's audit chain, in place of those
-- records: records 1..last_chain_no, the last one's hash (the next record's prev_hash),
-- how many of each type, a digest folded over their hashes in chain order, the runs
-- removed with them, and a signature under AGENTLEDGER_AUDIT_KEY (NULL: unsigned chain).
CREATE TABLE audit_pruned (
    tenant_id     TEXT PRIMARY KEY,
    last_chain_no INTEGER NOT NULL,
    last_hash     TEXT NOT NULL,
    records       INTEGER NOT NULL,
    runs          INTEGER NOT NULL,
    counts        TEXT NOT NULL,
    digest        TEXT NOT NULL,
    first_at      REAL,
    last_at       REAL,
    pruned_at     REAL NOT NULL,
    sig           TEXT
);
-- A tenant's retention: finished runs of these statuses, last changed longer than
-- older_than seconds ago, are pruned by `agentledger prune` and by `worker --prune-every`.
CREATE TABLE retention (
    tenant_id  TEXT PRIMARY KEY,
    older_than REAL NOT NULL,
    statuses   TEXT NOT NULL,
    updated_at REAL NOT NULL
)
;
-- The scheduled prune's round (`worker --prune-every`): one worker at a time claims it.
CREATE TABLE prune_rounds (
    id            INTEGER PRIMARY KEY,
    claimed_until REAL NOT NULL
);
INSERT INTO prune_rounds (id, claimed_until) VALUES (1, 0)
