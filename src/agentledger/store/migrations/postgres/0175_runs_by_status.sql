-- Version 175: `runs list --status S` (and the service's list filtered by status) reads its
-- first page newest first from this index. Without it, a state few runs are in
-- (needs_human, expired, failed) is found by walking the whole history by created_at, or
-- by scanning the table: a cost that grows with every finished run kept.
CREATE INDEX IF NOT EXISTS runs_status_created ON runs (status, created_at)
