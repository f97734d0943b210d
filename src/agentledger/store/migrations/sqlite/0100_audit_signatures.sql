-- Version 100: audit seals signed under a key the database does not hold
-- (AGENTLEDGER_AUDIT_KEY). Each sealed record's sig is the HMAC of its chain link
-- (tenant, chain_no, hash) as "<key id>:<hex>"; a head's sig is its last record's.
-- NULL: sealed without a key (or before this version).
ALTER TABLE events ADD COLUMN sig TEXT;
ALTER TABLE audit_heads ADD COLUMN sig TEXT
