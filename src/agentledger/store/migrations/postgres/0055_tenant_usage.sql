-- Version 55 (PostgreSQL): tenant usage counters and request-rate buckets (the gateway).
-- A reservation is one guarded UPDATE of the period's usage row (reserve only while
-- spend/tokens + this call stay within the limits; the row count says whether it was
-- taken), so concurrent workers cannot overshoot. A token bucket per tenant limits
-- model requests per second across every worker of the store.
ALTER TABLE tenant_budgets ADD COLUMN max_rps DOUBLE PRECISION;
CREATE TABLE tenant_usage (
    tenant_id    TEXT NOT NULL,
    period_start DOUBLE PRECISION NOT NULL,
    spend_usd    DOUBLE PRECISION NOT NULL,
    tokens       BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, period_start)
);
CREATE TABLE tenant_rate (
    tenant_id TEXT PRIMARY KEY,
    level     DOUBLE PRECISION NOT NULL,
    at        DOUBLE PRECISION NOT NULL
);
