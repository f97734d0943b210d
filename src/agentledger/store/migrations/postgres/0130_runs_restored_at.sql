-- Version 130: when the store was restored from a backup (`agentledger restore`), every
-- run not yet terminal is marked: its journal may be older than the providers' ledgers, so
-- the engine status-checks each write it is about to make for the first time (and hands a
-- write with neither keys nor a status check to a person) instead of sending it blind.
-- NULL for a run never restored.
ALTER TABLE runs ADD COLUMN restored_at DOUBLE PRECISION
