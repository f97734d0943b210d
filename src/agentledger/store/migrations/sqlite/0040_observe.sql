-- Version 40 (SQLite): observability -- a run's trace context, its stuck-episode mark, and
-- an index for the metrics that count audit events by type.
-- The W3C traceparent of the run's first execution: every later execution (a resume on
-- another worker) continues the same trace.
ALTER TABLE runs ADD COLUMN trace_context TEXT;
-- The stuck episode last reported ("reason:since"): a guarded UPDATE on it makes the
-- `run.stuck` event fire once per episode whatever the number of workers checking.
ALTER TABLE runs ADD COLUMN stuck_mark TEXT;
CREATE INDEX events_type ON events (type);
