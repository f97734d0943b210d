-- Version 180: the daily rollup (docs/architecture.md, "The daily rollup"). What the numbers
-- page and the metrics' settled history read instead of every finished run: per tenant,
-- agent or workflow, version, UTC day of creation and terminal status, the runs and their
-- totals; the completed runs' durations in fixed log-spaced buckets; the failing steps by
-- failure class. A run or outbox row is folded in once (`rolled` 0 -> 1 in the same
-- transaction as the sums) by the workers' background pass (terminal runs, delivered
-- outbox rows) or by a prune (what it removes); a resume takes a folded run back out
-- first. What is not folded (rolled = 0: unfinished, or finished since the last fold) is
-- read live through the partial indexes below, small whatever the history. Online: new
-- columns with a constant default, new tables, indexes the previous release never reads
-- (building them holds writes to runs and outbox for one pass over each table).
ALTER TABLE runs ADD COLUMN rolled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN rolled INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS runs_unrolled ON runs (status, tenant_id, created_at) WHERE rolled = 0;
CREATE INDEX IF NOT EXISTS outbox_unrolled ON outbox (status) WHERE rolled = 0;
CREATE TABLE IF NOT EXISTS rollup_runs (
    tenant_id TEXT NOT NULL,
    name      TEXT NOT NULL,
    version   TEXT NOT NULL,
    day       INTEGER NOT NULL,
    status    TEXT NOT NULL,
    simulated INTEGER NOT NULL,
    runs      BIGINT NOT NULL,
    cost_usd  DOUBLE PRECISION NOT NULL,
    tokens    BIGINT NOT NULL,
    resumes   BIGINT NOT NULL,
    seconds   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant_id, name, version, day, status, simulated)
);
CREATE TABLE IF NOT EXISTS rollup_durations (
    tenant_id TEXT NOT NULL,
    name      TEXT NOT NULL,
    version   TEXT NOT NULL,
    day       INTEGER NOT NULL,
    bucket    INTEGER NOT NULL,
    runs      BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, name, version, day, bucket)
);
CREATE TABLE IF NOT EXISTS rollup_failing (
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    version     TEXT NOT NULL,
    day         INTEGER NOT NULL,
    step        TEXT NOT NULL,
    error_class TEXT NOT NULL,
    runs        BIGINT NOT NULL,
    cost_usd    DOUBLE PRECISION NOT NULL,
    seconds     DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant_id, name, version, day, step, error_class)
);
CREATE TABLE IF NOT EXISTS rollup_outbox (
    status TEXT PRIMARY KEY,
    n      BIGINT NOT NULL
)
