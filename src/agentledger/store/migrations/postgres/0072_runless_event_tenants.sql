-- Events under no run (a tenant's document changes under docs/<tenant>, a user's
-- memory changes under memory/<tenant>/<user>) now carry their tenant from insert, and
-- the sealer chains them into that tenant's audit chain. Those written before get it
-- here (a memory event's data names its tenant), so they are chained too.
UPDATE events SET tenant_id = substr(run_id, 6)
 WHERE hash IS NULL AND tenant_id IS NULL AND run_id LIKE 'docs/%' AND type LIKE 'docs.%'
   AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.id = events.run_id);
UPDATE events SET tenant_id = (data::json) ->> 'tenant_id'
 WHERE hash IS NULL AND tenant_id IS NULL AND run_id LIKE 'memory/%' AND type LIKE 'memory.%'
   AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.id = events.run_id);
