-- Version 60 (SQLite): the fair claim's index. A claim ranks each tenant's due runs
-- by available_at and takes at most :limit of each; with the tenant first and the
-- time second, it seeks each tenant's first runs instead of ranking the whole backlog
-- (50,000 due runs: a sort of all of them per claim before). The target is carried
-- in the index so the claim filters by it without reading the row.
CREATE INDEX runs_fair ON runs (tenant_id, available_at, target) WHERE status IN ('queued', 'waiting');
