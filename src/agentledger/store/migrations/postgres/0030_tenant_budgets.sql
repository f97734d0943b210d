-- Version 30 (PostgreSQL): tenant period budgets for model calls (the gateway).
-- A tenant's usage in a period is summed from the journal's model steps (reservations of
-- calls in flight included), so the only new state is the limits.
CREATE TABLE tenant_budgets (
    tenant_id      TEXT PRIMARY KEY,
    period_seconds DOUBLE PRECISION NOT NULL,
    max_spend_usd  DOUBLE PRECISION,
    max_tokens     BIGINT,
    updated_at     DOUBLE PRECISION NOT NULL
);
CREATE INDEX runs_tenant ON runs (tenant_id);
