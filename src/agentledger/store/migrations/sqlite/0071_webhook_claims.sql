-- Version 13: webhook deliveries are claimed like outbox rows. Workers deliver them too,
-- not only the service, so several processes claim at once: each claim takes the next
-- epoch and names its owner, and an attempt is written back only under its own claim.
ALTER TABLE webhook_deliveries ADD COLUMN lease_owner TEXT;
ALTER TABLE webhook_deliveries ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
