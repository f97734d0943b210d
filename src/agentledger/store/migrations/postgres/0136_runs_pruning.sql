-- Version 136: runs a prune has begun removing (docs/architecture.md, "Retention"). A
-- batch may end inside a run: its first records are gone into the tenant's pruned-span
-- summary while its row and its later records wait for the next batch. `runs resume`
-- refuses such a run (it would go back to work without its history); the row goes with
-- the run's last record.
CREATE TABLE runs_pruning (
    run_id    TEXT PRIMARY KEY,
    pruned_at DOUBLE PRECISION NOT NULL
)
