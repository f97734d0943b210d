-- Version 120: each API key keeps a fingerprint of the AGENTLEDGER_KEY_PEPPER it was made
-- under (``api_keys.pepper_id``: a slow one-way hash of the pepper, never the pepper), so
-- `serve` can say at start and at a 401 that a key was made under another pepper instead
-- of only "unknown API key". NULL for keys made before this version.
ALTER TABLE api_keys ADD COLUMN pepper_id TEXT
