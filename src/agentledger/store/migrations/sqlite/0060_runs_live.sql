-- Version 60 (SQLite): unfinished runs, read by every /metrics scrape and by the stuck-run
-- check. An index over them alone stays small however many finished runs the store holds.
CREATE INDEX runs_live ON runs (status, name, version, tenant_id)
    WHERE status IN ('queued', 'running', 'waiting');
