-- Version 90: a redacted event keeps the digest of the data it was sealed with.
-- The audit chain hashes each record's data by its SHA-256 digest, not its text, so a
-- record whose data is erased (``memory forget`` replaces a forgotten user's text with a
-- redaction marker) still verifies: ``data_digest`` holds the digest of the data as it
-- was before the first redaction, and is NULL on every record never redacted.
ALTER TABLE events ADD COLUMN data_digest TEXT
