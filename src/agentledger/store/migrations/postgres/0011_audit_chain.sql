-- Version 11 (PostgreSQL): the audit chain. Each event, once sealed, carries its tenant's
-- chain position, the hash of the tenant's previous record and its own hash; the
-- tenant's head is in audit_heads. Sealing sets these once; nothing edits them after.
ALTER TABLE events ADD COLUMN chain_no BIGINT;
ALTER TABLE events ADD COLUMN prev_hash TEXT;
ALTER TABLE events ADD COLUMN hash TEXT;
ALTER TABLE events ADD COLUMN tenant_id TEXT;
CREATE INDEX events_unsealed ON events (id) WHERE hash IS NULL;
CREATE UNIQUE INDEX events_chain ON events (tenant_id, chain_no);
CREATE TABLE audit_heads (
    tenant_id TEXT PRIMARY KEY,
    chain_no  BIGINT NOT NULL,
    hash      TEXT NOT NULL
)
