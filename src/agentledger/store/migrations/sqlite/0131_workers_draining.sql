-- Version 131: a worker started with --exit-when-drained says so (``workers.draining``,
-- 1). A version another live worker serves is not left to a draining worker, unless
-- that worker drains too: two old workers of a deploy never leave on each other's word.
ALTER TABLE workers ADD COLUMN draining INTEGER NOT NULL DEFAULT 0
