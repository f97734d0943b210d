-- Version 10 (SQLite): the HTTP service -- API keys, tenants and their quotas,
-- Idempotency-Key rows, the principal that started a run, per-run event sequence.
-- The principal (key id, user, roles) that submitted the run, as JSON.
ALTER TABLE runs ADD COLUMN principal TEXT;
-- The URL the run's webhooks go to (given at submit).
ALTER TABLE runs ADD COLUMN webhook TEXT;
ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
-- The last per-run event sequence number handed out; bumped under the run row's lock in
-- the transaction that inserts the event, so a run's seqs commit in order and without gaps.
ALTER TABLE runs ADD COLUMN event_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN seq INTEGER;
CREATE UNIQUE INDEX events_run_seq ON events (run_id, seq);
CREATE INDEX runs_tenant_created ON runs (tenant_id, created_at);
CREATE TABLE tenants (
    id              TEXT PRIMARY KEY,
    runs_per_minute INTEGER,
    max_in_flight   INTEGER,
    webhook_secret  TEXT,
    created_at      REAL NOT NULL
);
-- Only an HMAC-SHA256 of a key's secret (under the server's pepper) is stored.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    roles       TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    last4       TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    revoked_at  REAL
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);
-- An Idempotency-Key, scoped by tenant, committed with the run it created.
CREATE TABLE idempotency_keys (
    tenant_id   TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    status_code INTEGER NOT NULL,
    response    TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX idempotency_expiry ON idempotency_keys (expires_at)
