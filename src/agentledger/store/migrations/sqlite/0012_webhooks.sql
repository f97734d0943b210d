-- Version 12 (SQLite): signed webhooks. A delivery is enqueued in the transaction that
-- seals the event it reports (exactly once per event) and delivered by the service with
-- retries; its id is the event id a receiver deduplicates on.
CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    url             TEXT NOT NULL,
    type            TEXT NOT NULL,
    body            TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    lease_until     REAL,
    last_error      TEXT,
    created_at      REAL NOT NULL,
    delivered_at    REAL
);
CREATE INDEX webhook_due ON webhook_deliveries (status, next_attempt_at)
