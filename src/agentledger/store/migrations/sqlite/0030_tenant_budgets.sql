-- Version 30 (SQLite): tenant period budgets for model calls (the gateway).
-- A tenant's usage in a period is summed from the journal's model steps (reservations of
-- calls in flight included), so the only new state is the limits.
CREATE TABLE tenant_budgets (
    tenant_id      TEXT PRIMARY KEY,
    period_seconds REAL NOT NULL,
    max_spend_usd  REAL,
    max_tokens     INTEGER,
    updated_at     REAL NOT NULL
);
CREATE INDEX runs_tenant ON runs (tenant_id);
