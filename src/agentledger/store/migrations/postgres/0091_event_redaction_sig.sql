-- Version 91: a redaction is signed under the audit key (``events.redaction_sig``).
-- A redacted record is chained by the digest of its data as sealed (``data_digest``);
-- without a signature over (that digest, the digest of the data now), whoever writes the
-- database could edit any record's data, set ``data_digest`` to the old digest and call
-- it a redaction. NULL on every record never redacted, and on records redacted by a
-- process without the key (``audit verify`` with the key names those).
ALTER TABLE events ADD COLUMN redaction_sig TEXT
