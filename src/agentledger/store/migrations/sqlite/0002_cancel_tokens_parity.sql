-- Version 2 (SQLite): cancel requests, retry-safe writes, fenced outbox settles, and the
-- same indexes as PostgreSQL (schema parity).
-- A cancel is a request the worker honours at the next step boundary (its reason).
ALTER TABLE runs ADD COLUMN cancel_requested TEXT;
-- The caller's request id of a submit: a submit retried after a lost reply finds its run.
ALTER TABLE runs ADD COLUMN request_id TEXT;
-- The token of the last write that passed the fence (a journal batch, a claim): a write
-- retried after a lost reply finds out whether it committed.
ALTER TABLE runs ADD COLUMN write_token TEXT;
CREATE UNIQUE INDEX runs_request ON runs (request_id);
-- Every claim of an outbox row bumps its epoch; a settle must carry the claim's epoch.
ALTER TABLE outbox ADD COLUMN claim_epoch INTEGER NOT NULL DEFAULT 0;
DROP INDEX runs_claimable;
CREATE INDEX runs_claimable ON runs (target, available_at) WHERE status IN ('queued', 'waiting');
CREATE INDEX runs_running ON runs (target) WHERE status = 'running';
CREATE INDEX runs_created ON runs (created_at);
CREATE INDEX approvals_pending ON approvals (requested_at) WHERE decision IS NULL;
