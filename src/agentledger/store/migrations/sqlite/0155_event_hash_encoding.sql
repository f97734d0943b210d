-- Version 155: a sealed event names the encoding its hash was computed over.
-- 2: canonical JSON (agentledger/canonical.py), what every sealer writes from now on.
-- NULL: the encoding of records sealed before it (ASCII-escaped text, the time as the
-- string of its repr); their hashes stay valid, and verify checks each record in the
-- encoding it names. NULL is also what a process that predates this column writes,
-- so a fleet upgraded one process at a time keeps a chain that verifies.
ALTER TABLE events ADD COLUMN hash_v INTEGER
