-- Version 2 (PostgreSQL): cancel requests, retry-safe writes, fenced outbox settles.
-- A cancel is a request the worker honours at the next step boundary (its reason).
ALTER TABLE runs ADD COLUMN cancel_requested TEXT;
-- The caller's request id of a submit: a submit retried after a lost reply finds its run.
ALTER TABLE runs ADD COLUMN request_id TEXT;
-- The token of the last write that passed the fence (a journal batch, a claim): a write
-- retried after a lost reply (an ambiguous COMMIT) finds out whether it committed.
-- Not indexed, so fenced writes stay HOT updates.
ALTER TABLE runs ADD COLUMN write_token TEXT;
CREATE UNIQUE INDEX runs_request ON runs (request_id);
-- Every claim of an outbox row bumps its epoch; a settle must carry the claim's epoch.
ALTER TABLE outbox ADD COLUMN claim_epoch BIGINT NOT NULL DEFAULT 0
