-- Version 196: events_unsealed_run (migration 0176) dropped. Only retention read it, to
-- check that every record of a run it may prune is sealed; that check now counts the
-- run's sealed records among its events found by events_run_seq, whatever the sealer's
-- backlog, so the index no longer pays its way: every event entered it at insert and left
-- it at seal, on the journal's hot path. A previous release's prune still running
-- against this schema stays correct (its NOT EXISTS of an unsealed event of the run
-- finds the same events through events_run_seq or events_unsealed); it may only be
-- slower, its plan reading the sealer's backlog once per run on a large history.
DROP INDEX IF EXISTS events_unsealed_run
