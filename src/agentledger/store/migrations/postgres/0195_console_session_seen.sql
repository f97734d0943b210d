-- Version 195: console sessions end after a time without use (service/_console/sessions.py),
-- besides their absolute expiry. When the session's browser last made a request; NULL
-- (sessions made before this version) counts from created_at.
ALTER TABLE console_sessions ADD COLUMN last_seen_at DOUBLE PRECISION
