-- An SQLite database as the code before canonical audit hashes wrote it (schema
-- version 136): four records sealed and signed under LEGACY_KEY in
-- tests/service/test_audit_hash_encoding.py, in tenants and by users with names that
-- are not ASCII, and one event left unsealed.
PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL);
INSERT INTO schema_migrations VALUES(1,1796198009.1426372527);
INSERT INTO schema_migrations VALUES(2,1796198009.1435883044);
INSERT INTO schema_migrations VALUES(3,1796198009.1438720226);
INSERT INTO schema_migrations VALUES(10,1796198009.1465878486);
INSERT INTO schema_migrations VALUES(11,1796198009.147340536);
INSERT INTO schema_migrations VALUES(12,1796198009.1474514007);
INSERT INTO schema_migrations VALUES(20,1796198009.1479992866);
INSERT INTO schema_migrations VALUES(30,1796198009.1481137276);
INSERT INTO schema_migrations VALUES(40,1796198009.1538953781);
INSERT INTO schema_migrations VALUES(50,1796198009.154877901);
INSERT INTO schema_migrations VALUES(55,1796198009.1625142097);
INSERT INTO schema_migrations VALUES(56,1796198009.1625471114);
INSERT INTO schema_migrations VALUES(60,1796198009.1626114845);
INSERT INTO schema_migrations VALUES(61,1796198009.1628665924);
INSERT INTO schema_migrations VALUES(70,1796198009.1633942126);
INSERT INTO schema_migrations VALUES(71,1796198009.163873434);
INSERT INTO schema_migrations VALUES(72,1796198009.1639537811);
INSERT INTO schema_migrations VALUES(90,1796198009.1641957759);
INSERT INTO schema_migrations VALUES(91,1796198009.1644332408);
INSERT INTO schema_migrations VALUES(100,1796198009.1692917346);
INSERT INTO schema_migrations VALUES(120,1796198009.1695375441);
INSERT INTO schema_migrations VALUES(125,1796198009.1696000098);
INSERT INTO schema_migrations VALUES(126,1796198009.1698720455);
INSERT INTO schema_migrations VALUES(130,1796198009.170207262);
INSERT INTO schema_migrations VALUES(131,1796198009.1705935001);
INSERT INTO schema_migrations VALUES(135,1796198009.1710276603);
INSERT INTO schema_migrations VALUES(136,1796198009.1710999012);
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
, cancel_requested TEXT, request_id TEXT, write_token TEXT, principal TEXT, webhook TEXT, idempotency_key TEXT, event_seq INTEGER NOT NULL DEFAULT 0, trace_context TEXT, stuck_mark TEXT, usage_simulated INTEGER NOT NULL DEFAULT 0, restored_at REAL);
INSERT INTO runs VALUES('r1a235be897d6d5e58bad5','acmé','josé','workflow','echo','1','echo@1','{"text":"h\u00e9llo jos\u00e9"}','queued',0,0,0.0,0.0,1796198009.2129960059,1796198009.2129960059,NULL,0,NULL,1796198009.2129960059,0,NULL,NULL,NULL,NULL,'q1a235be897bfad02c3079',NULL,NULL,NULL,NULL,1,NULL,NULL,0,NULL);
INSERT INTO runs VALUES('r1a235be8982b70d730d19','plain','bob','workflow','echo','1','echo@1','{"text":"h\u00e9llo bob"}','queued',0,0,0.0,0.0,1796198009.2179849147,1796198009.2179849147,NULL,0,NULL,1796198009.2179849147,0,NULL,NULL,NULL,NULL,'q1a235be8982894982a52b',NULL,NULL,NULL,NULL,1,NULL,NULL,0,NULL);
INSERT INTO runs VALUES('r1a235be8984ecc00bc003','東京','ユーザー 🙂','workflow','echo','1','echo@1','{"text":"h\u00e9llo \u30e6\u30fc\u30b6\u30fc \ud83d\ude42"}','queued',0,0,0.0,0.0,1796198009.2199966907,1796198009.2199966907,NULL,0,NULL,1796198009.2199966907,0,NULL,NULL,NULL,NULL,'q1a235be89844390a0520b',NULL,NULL,NULL,NULL,1,NULL,NULL,0,NULL);
INSERT INTO runs VALUES('r1a235be8987bf8daad628','plain','xy\"q','workflow','echo','1','echo@1','{"text":"h\u00e9llo x\u007fy\\\"q"}','queued',0,0,0.0,0.0,1796198009.2230141162,1796198009.2230141162,NULL,0,NULL,1796198009.2230141162,0,NULL,NULL,NULL,NULL,'q1a235be898758b19ef792',NULL,NULL,NULL,NULL,1,NULL,NULL,0,NULL);
INSERT INTO runs VALUES('r1a235be898f946cf209fa','acmé','zoë','workflow','echo','1','echo@1','{"text":"unsealed"}','queued',0,0,0.0,0.0,1796198009.2309803962,1796198009.2309803962,NULL,0,NULL,1796198009.2309803962,0,NULL,NULL,NULL,NULL,'q1a235be898f0282d3c1e1',NULL,NULL,NULL,NULL,1,NULL,NULL,0,NULL);
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
, claim_epoch INTEGER NOT NULL DEFAULT 0, claim_token TEXT);
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
    decided_at       REAL, requested_by TEXT, not_requester INTEGER NOT NULL DEFAULT 0, approvals_needed INTEGER NOT NULL DEFAULT 1, approvers TEXT,
    UNIQUE (run_id, step_no)
);
CREATE TABLE events (
    id     INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    at     REAL NOT NULL,
    type   TEXT NOT NULL,
    actor  TEXT NOT NULL,
    data   TEXT
, token TEXT, seq INTEGER, chain_no INTEGER, prev_hash TEXT, hash TEXT, tenant_id TEXT, data_digest TEXT, redaction_sig TEXT, sig TEXT);
INSERT INTO events VALUES(1,'r1a235be897d6d5e58bad5',1796198009.2139854431,'run.submitted','josé','{"input":{"text":"h\u00e9llo jos\u00e9"}}',NULL,1,1,'0000000000000000000000000000000000000000000000000000000000000000','6a9c1e7a42bb7f3ce3275d5c3902a8b4682d00ee30ac40c60b5921e4706c8727','acmé',NULL,NULL,'aa69370ddc8554be:a40d0fef02e1f38e54e79db981869316536b1e8260bdf0a691584b1691f3c3df');
INSERT INTO events VALUES(2,'r1a235be8982b70d730d19',1796198009.2187459468,'run.submitted','bob','{"input":{"text":"h\u00e9llo bob"}}',NULL,1,1,'0000000000000000000000000000000000000000000000000000000000000000','4c45dac2a913f4a124f37a3579ae2b626eebd67c08bfab322718580ac2447210','plain',NULL,NULL,'aa69370ddc8554be:91a27a248542c4a1a0caa9edd047b3b0f76e962d66ed84fb8606fc2c127a4d88');
INSERT INTO events VALUES(3,'r1a235be8984ecc00bc003',1796198009.2203953265,'run.submitted','ユーザー 🙂','{"input":{"text":"h\u00e9llo \u30e6\u30fc\u30b6\u30fc \ud83d\ude42"}}',NULL,1,1,'0000000000000000000000000000000000000000000000000000000000000000','4e3ff58d187a008ecd4e5545a87ce684985537b681987abdbaac97c358735ca9','東京',NULL,NULL,'aa69370ddc8554be:40f45beaf92f0bc86fdbeb31fcf21c197ca3b295cc6318f416eb85cc3f9ec84a');
INSERT INTO events VALUES(4,'r1a235be8987bf8daad628',1796198009.2239148616,'run.submitted','xy\"q','{"input":{"text":"h\u00e9llo x\u007fy\\\"q"}}',NULL,1,2,'4c45dac2a913f4a124f37a3579ae2b626eebd67c08bfab322718580ac2447210','d6420a77bb26d50af96ebb4764b46782d5a5a4fb63068ee2a13fb39102e32000','plain',NULL,NULL,'aa69370ddc8554be:6a2b20886ed5c52812a0b48e44fa49cdd43aa79661ce12bb35f6803f40a85ad4');
INSERT INTO events VALUES(5,'r1a235be898f946cf209fa',1796198009.2314071655,'run.submitted','zoë','{"input":{"text":"unsealed"}}',NULL,1,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
CREATE TABLE workers (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    targets      TEXT NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
, draining INTEGER NOT NULL DEFAULT 0);
CREATE TABLE registrations (
    target        TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    kind          TEXT NOT NULL,
    registered_at REAL NOT NULL
);
CREATE TABLE tenants (
    id              TEXT PRIMARY KEY,
    runs_per_minute INTEGER,
    max_in_flight   INTEGER,
    webhook_secret  TEXT,
    created_at      REAL NOT NULL
);
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
, pepper_id TEXT);
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
CREATE TABLE audit_heads (
    tenant_id TEXT PRIMARY KEY,
    chain_no  INTEGER NOT NULL,
    hash      TEXT NOT NULL
, sig TEXT);
INSERT INTO audit_heads VALUES('acmé',1,'6a9c1e7a42bb7f3ce3275d5c3902a8b4682d00ee30ac40c60b5921e4706c8727','aa69370ddc8554be:a40d0fef02e1f38e54e79db981869316536b1e8260bdf0a691584b1691f3c3df');
INSERT INTO audit_heads VALUES('plain',2,'d6420a77bb26d50af96ebb4764b46782d5a5a4fb63068ee2a13fb39102e32000','aa69370ddc8554be:6a2b20886ed5c52812a0b48e44fa49cdd43aa79661ce12bb35f6803f40a85ad4');
INSERT INTO audit_heads VALUES('東京',1,'4e3ff58d187a008ecd4e5545a87ce684985537b681987abdbaac97c358735ca9','aa69370ddc8554be:40f45beaf92f0bc86fdbeb31fcf21c197ca3b295cc6318f416eb85cc3f9ec84a');
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
, lease_owner TEXT, lease_epoch INTEGER NOT NULL DEFAULT 0);
CREATE TABLE memory_facts (
    id         TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    fact_key   TEXT NOT NULL,
    fact       TEXT NOT NULL,
    source_run TEXT,
    source_key TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE documents (
    id         TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    source     TEXT NOT NULL,
    title      TEXT NOT NULL,
    kind       TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    chunks     INTEGER NOT NULL,
    chars      INTEGER NOT NULL,
    created_at REAL NOT NULL
, embedder TEXT);
CREATE TABLE doc_chunks (
    seq         INTEGER PRIMARY KEY,
    id          TEXT NOT NULL,
    document_id TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    chunk_no    INTEGER NOT NULL,
    heading     TEXT NOT NULL,
    text        TEXT NOT NULL
, embedding BLOB);
PRAGMA writable_schema=ON;
INSERT INTO sqlite_schema(type,name,tbl_name,rootpage,sql)VALUES('table','doc_chunks_fts','doc_chunks_fts',0,'CREATE VIRTUAL TABLE doc_chunks_fts USING fts5(
    heading, text, content=''doc_chunks'', content_rowid=''seq'', tokenize=''porter unicode61''
)');
CREATE TABLE IF NOT EXISTS 'doc_chunks_fts_data'(id INTEGER PRIMARY KEY, block BLOB);
INSERT INTO doc_chunks_fts_data VALUES(1,X'');
INSERT INTO doc_chunks_fts_data VALUES(10,X'00000000000000');
CREATE TABLE IF NOT EXISTS 'doc_chunks_fts_idx'(segid, term, pgno, PRIMARY KEY(segid, term)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS 'doc_chunks_fts_docsize'(id INTEGER PRIMARY KEY, sz BLOB);
CREATE TABLE IF NOT EXISTS 'doc_chunks_fts_config'(k PRIMARY KEY, v) WITHOUT ROWID;
INSERT INTO doc_chunks_fts_config VALUES('version',4);
CREATE TABLE tenant_budgets (
    tenant_id      TEXT PRIMARY KEY,
    period_seconds REAL NOT NULL,
    max_spend_usd  REAL,
    max_tokens     INTEGER,
    updated_at     REAL NOT NULL
, max_rps REAL);
CREATE TABLE tenant_usage (
    tenant_id    TEXT NOT NULL,
    period_start REAL NOT NULL,
    spend_usd    REAL NOT NULL,
    tokens       INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, period_start)
);
CREATE TABLE tenant_rate (
    tenant_id TEXT PRIMARY KEY,
    level     REAL NOT NULL,
    at        REAL NOT NULL
);
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
CREATE TABLE retention (
    tenant_id  TEXT PRIMARY KEY,
    older_than REAL NOT NULL,
    statuses   TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE prune_rounds (
    id            INTEGER PRIMARY KEY,
    claimed_until REAL NOT NULL
);
INSERT INTO prune_rounds VALUES(1,0.0);
CREATE TABLE runs_pruning (
    run_id    TEXT PRIMARY KEY,
    pruned_at REAL NOT NULL
);
CREATE INDEX runs_lease ON runs (lease_owner);
CREATE INDEX outbox_due ON outbox (status, next_attempt_at);
CREATE UNIQUE INDEX runs_request ON runs (request_id);
CREATE INDEX runs_claimable ON runs (target, available_at) WHERE status IN ('queued', 'waiting');
CREATE INDEX runs_running ON runs (target) WHERE status = 'running';
CREATE INDEX runs_created ON runs (created_at);
CREATE INDEX approvals_pending ON approvals (requested_at) WHERE decision IS NULL;
CREATE UNIQUE INDEX events_run_seq ON events (run_id, seq);
CREATE INDEX runs_tenant_created ON runs (tenant_id, created_at);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);
CREATE INDEX idempotency_expiry ON idempotency_keys (expires_at);
CREATE INDEX events_unsealed ON events (id) WHERE hash IS NULL;
CREATE INDEX webhook_due ON webhook_deliveries (status, next_attempt_at);
CREATE UNIQUE INDEX memory_facts_user_key ON memory_facts (tenant_id, user_id, fact_key);
CREATE INDEX memory_facts_source ON memory_facts (source_key);
CREATE UNIQUE INDEX documents_source ON documents (tenant_id, source);
CREATE UNIQUE INDEX doc_chunks_id ON doc_chunks (id);
CREATE INDEX doc_chunks_document ON doc_chunks (document_id, chunk_no);
CREATE INDEX runs_tenant ON runs (tenant_id);
CREATE INDEX runs_live ON runs (status, name, version, tenant_id)
    WHERE status IN ('queued', 'running', 'waiting');
CREATE INDEX runs_fair ON runs (tenant_id, available_at, target) WHERE status IN ('queued', 'waiting');
CREATE UNIQUE INDEX events_chain ON events (tenant_id, chain_no) WHERE chain_no IS NOT NULL;
CREATE INDEX events_type ON events (type) WHERE type NOT LIKE 'step.%';
CREATE INDEX outbox_run ON outbox (run_id, step_no);
CREATE INDEX effects_run ON effects (run_id);
CREATE INDEX webhook_deliveries_run ON webhook_deliveries (run_id);
CREATE INDEX idempotency_keys_run ON idempotency_keys (run_id);
PRAGMA writable_schema=OFF;
COMMIT;
