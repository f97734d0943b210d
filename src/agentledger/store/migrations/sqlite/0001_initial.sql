-- agentledger schema, version 1 (SQLite). Times are UNIX epoch seconds (REAL).
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
    tokens           INTEGER NOT NULL DEFAULT 0,
    cost_usd         REAL NOT NULL DEFAULT 0,
    active_seconds   REAL NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at REAL,
    available_at     REAL,
    resumes          INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    error            TEXT,
    handover_reason  TEXT
);
CREATE INDEX runs_claimable ON runs (status, available_at);
CREATE INDEX runs_lease ON runs (lease_owner);

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
    started_at      REAL,
    duration_ms     REAL,
    tokens          INTEGER NOT NULL DEFAULT 0,
    cost_usd        REAL NOT NULL DEFAULT 0,
    error_class     TEXT,
    error           TEXT,
    lease_epoch     INTEGER NOT NULL,
    PRIMARY KEY (run_id, step_no)
) WITHOUT ROWID;

CREATE TABLE effects (
    key        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    step_no    INTEGER NOT NULL,
    status     TEXT NOT NULL,
    result     TEXT,
    updated_at REAL NOT NULL
);

CREATE TABLE outbox (
    key             TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL,
    step_no         INTEGER NOT NULL,
    tool            TEXT NOT NULL,
    payload         TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending',
    lease_owner     TEXT,
    lease_expires_at REAL,
    last_error      TEXT,
    history         TEXT NOT NULL DEFAULT '[]',
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL
);
CREATE INDEX outbox_due ON outbox (status, next_attempt_at);

CREATE TABLE approvals (
    id               TEXT PRIMARY KEY,
    run_id           TEXT NOT NULL,
    step_no          INTEGER NOT NULL,
    tool             TEXT NOT NULL,
    arguments        TEXT,
    required_role    TEXT NOT NULL,
    requested_at     REAL NOT NULL,
    expires_at       REAL NOT NULL,
    default_decision TEXT NOT NULL,
    decision         TEXT,
    decided_by       TEXT,
    decided_at       REAL,
    UNIQUE (run_id, step_no)
);

CREATE TABLE events (
    id     INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    at     REAL NOT NULL,
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
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);

CREATE TABLE registrations (
    target        TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    kind          TEXT NOT NULL,
    registered_at REAL NOT NULL
);
