"""Schema migrations: numbered scripts per dialect, applied once each."""

from __future__ import annotations

import time
from typing import Any

from agentledger.store.dialect import Dialect


def migrate(d: Dialect, conn: Any) -> list[int]:
    """Apply every migration not yet applied; return the versions applied."""
    d.begin_write(conn)
    d.execute(
        conn,
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
        "applied_at DOUBLE PRECISION NOT NULL)",
    )
    done = {r["version"] for r in d.fetchall(conn, "SELECT version FROM schema_migrations")}
    applied = []
    for version, script in d.migrations():
        if version in done:
            continue
        for statement in d.split_script(script):
            d.execute(conn, statement)
        d.execute(
            conn,
            "INSERT INTO schema_migrations (version, applied_at) VALUES (:v, :t)",
            {"v": version, "t": time.time()},
        )
        applied.append(version)
    d.commit(conn)
    return applied
