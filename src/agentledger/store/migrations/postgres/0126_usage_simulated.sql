-- Version 126: whether a run's tokens and cost were simulated (an offline scripted model
-- answered): 1 once any of its model steps was. Shown next to every such figure.
ALTER TABLE runs ADD COLUMN usage_simulated INTEGER NOT NULL DEFAULT 0
