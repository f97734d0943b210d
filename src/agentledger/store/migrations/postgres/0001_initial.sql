-- agentledger schema, version 1 (PostgreSQL). Times are UNIX epoch seconds (DOUBLE PRECISION)
-- so that the SQL shared with SQLite compares and stores them the same way. Counters that
-- SQLite keeps in 64-bit INTEGER are BIGINT here. JSON columns are TEXT written by the store.
CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL DEFAULT 'default',
    user_id          TEXT,
    kind             TEXT NOT NULL,
    name             TEXT NOT NULL,
    version          TEXT NOT NULL,
    target           TEXT NOT NULL,
    input            TEXT,
    status           TEXT NOT NULL,
    step_count       INTEGER NOT NULL DEFAULT 0,
    tokens           BIGINT NOT NULL DEFAULT 0,
    cost_usd         DOUBLE PRECISION NOT NULL DEFAULT 0,
    active_seconds   DOUBLE PRECISION NOT NULL DEFAULT 0,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    lease_owner      TEXT,
    lease_epoch      BIGINT NOT NULL DEFAULT 0,
    lease_expires_at DOUBLE PRECISION,
    available_at     DOUBLE PRECISION,
    resumes          INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    error            TEXT,
    handover_reason  TEXT
) WITH (fillfactor = 90);
-- The claim reads queued/waiting runs due by available_at, and running runs (their
-- expired leases); lease_expires_at is left out of every index so that lease renewals
-- and journal writes stay HOT updates.
CREATE INDEX runs_claimable ON runs (target, available_at) WHERE status IN ('queued', 'waiting');
CREATE INDEX runs_running ON runs (target) WHERE status = 'running';
CREATE INDEX runs_lease ON runs (lease_owner);
CREATE INDEX runs_created ON runs (created_at);

CREATE TABLE steps (
    run_id          TEXT NOT NULL,
    step_no         INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    name            TEXT NOT NULL,
    status          TEXT NOT NULL,
    input           TEXT,
    input_hash      TEXT,
    output          TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    idempotency_key TEXT UNIQUE,
    started_at      DOUBLE PRECISION,
    duration_ms     DOUBLE PRECISION,
    tokens          BIGINT NOT NULL DEFAULT 0,
    cost_usd        DOUBLE PRECISION NOT NULL DEFAULT 0,
    error_class     TEXT,
    error           TEXT,
    lease_epoch     BIGINT NOT NULL,
    PRIMARY KEY (run_id, step_no)
);

CREATE TABLE effects (
    key        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    step_no    INTEGER NOT NULL,
    status     TEXT NOT NULL,
    result     TEXT,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE outbox (
    key             TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL,
    step_no         INTEGER NOT NULL,
    tool            TEXT NOT NULL,
    payload         TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending',
    lease_owner     TEXT,
    lease_expires_at DOUBLE PRECISION,
    last_error      TEXT,
    history         TEXT NOT NULL DEFAULT '[]',
    created_at      DOUBLE PRECISION NOT NULL,
    updated_at      DOUBLE PRECISION NOT NULL
);
CREATE INDEX outbox_due ON outbox (status, next_attempt_at);

CREATE TABLE approvals (
    id               TEXT PRIMARY KEY,
    run_id           TEXT NOT NULL,
    step_no          INTEGER NOT NULL,
    tool             TEXT NOT NULL,
    arguments        TEXT,
    required_role    TEXT NOT NULL,
    requested_at     DOUBLE PRECISION NOT NULL,
    expires_at       DOUBLE PRECISION NOT NULL,
    default_decision TEXT NOT NULL,
    decision         TEXT,
    decided_by       TEXT,
    decided_at       DOUBLE PRECISION,
    UNIQUE (run_id, step_no)
);
CREATE INDEX approvals_pending ON approvals (requested_at) WHERE decision IS NULL;

CREATE TABLE events (
    id     BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL,
    at     DOUBLE PRECISION NOT NULL,
    type   TEXT NOT NULL,
    actor  TEXT NOT NULL,
    data   TEXT
);
CREATE INDEX events_run ON events (run_id, id);

CREATE TABLE workers (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    targets      TEXT NOT NULL,
    started_at   DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE registrations (
    target        TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    kind          TEXT NOT NULL,
    registered_at DOUBLE PRECISION NOT NULL
);
