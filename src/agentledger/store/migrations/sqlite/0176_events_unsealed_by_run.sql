-- Version 176: a run's unsealed events, by run. Retention checks that every record of a
-- run it may prune is sealed, 500 runs at a time; through events_unsealed (by id) that
-- read every unsealed event of the store once per run, and the walk over a large history
-- took hours. Only unsealed events are in this index: it stays as small as the sealer's
-- backlog.
CREATE INDEX IF NOT EXISTS events_unsealed_run ON events (run_id) WHERE hash IS NULL
