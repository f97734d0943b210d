-- Version 60 (PostgreSQL): the fair claim's index (same as SQLite's): each tenant's
-- due runs in available_at order, the target carried for the claim's filter.
CREATE INDEX runs_fair ON runs (tenant_id, available_at, target) WHERE status IN ('queued', 'waiting');
