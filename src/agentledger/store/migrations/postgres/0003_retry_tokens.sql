-- Version 3 (PostgreSQL): tokens that make retried writes idempotent.
-- The token of the job that appended an event (an event appended on its own, a release):
-- a job retried after a lost reply finds its event instead of appending it twice.
ALTER TABLE events ADD COLUMN token TEXT;
-- The token of the claim that leased an outbox row: a claim retried after a lost reply
-- returns the rows it leased instead of finding them leased (until expiry) by itself.
ALTER TABLE outbox ADD COLUMN claim_token TEXT
