-- Version 125: a run's outbox rows by run (`runs show` says how each outbox step was
-- delivered) without reading the whole outbox.
CREATE INDEX IF NOT EXISTS outbox_run ON outbox (run_id, step_no)
