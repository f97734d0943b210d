-- Version 55 (SQLite): tenant usage counters and request-rate buckets (the gateway).
-- A reservation is one guarded UPDATE of the period's usage row (reserve only while
-- spend/tokens + this call stay within the limits; the row count says whether it was
-- taken), so concurrent workers cannot overshoot. A token bucket per tenant limits
-- model requests per second across every worker of the store.
ALTER TABLE tenant_budgets ADD COLUMN max_rps REAL;
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
