"""The observability feature's SQL: metrics, run stats, stuck runs, resume, trace context."""
