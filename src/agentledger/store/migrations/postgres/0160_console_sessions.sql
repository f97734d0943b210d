-- Version 160: the web console's sign-in sessions (service/_console/sessions.py).
-- A person pastes an API key once; the browser then holds only a random session id, of
-- which only the SHA-256 is stored (a copy of the database cannot act as anyone). Every
-- request also checks the key it was made with: revoking the key ends its sessions.
CREATE TABLE console_sessions (
    id_hash    TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL,
    tenant_id  TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    roles      TEXT NOT NULL,
    csrf       TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION
);
CREATE INDEX console_sessions_key ON console_sessions (key_id);
CREATE INDEX console_sessions_expires ON console_sessions (expires_at)
