"""What PostgreSQL's audit sealing reads, not how long it takes: rows visited, from
EXPLAIN ANALYZE of every SELECT a seal makes, for a tenant with a long history, an
unsealed backlog, and statistics taken while the tables were young. A seal reads about
its backlog, never the tenant's history (a join through the tenant's runs did: it held
the writer 0.2-0.6 s per seal under load)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agentledger.service._queries import audit as service_audit
from agentledger.store._postgres import PostgresDialect, connect, convert_placeholders
from agentledger.store._tx import Tx
from tests.store.pg_claims import rows_read

pytestmark = pytest.mark.postgres


class _Explaining:
    """The dialect, with every SELECT also run under EXPLAIN ANALYZE (rows read summed)."""

    def __init__(self, d: PostgresDialect) -> None:
        self._d = d
        self.rows_read: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._d, name)

    def fetchall(self, conn: Any, sql: str, params: dict[str, Any] | None = None) -> Any:
        if sql.lstrip().upper().startswith("SELECT") and "FOR UPDATE" not in sql.upper():
            explain = convert_placeholders("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            row = conn.execute(explain, params or {}).fetchone()
            value = next(iter(row.values())) if isinstance(row, dict) else row[0]
            plan = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]
            self.rows_read.append((sql, rows_read(plan)))
        return self._d.fetchall(conn, sql, params)


def test_a_seal_does_not_read_the_tenants_history(pg_url: str) -> None:
    history, unsealed, batch = 20000, 1000, 100  # serve seals in slices of 100
    d = PostgresDialect(pg_url)
    conn = connect(pg_url)
    try:
        now = time.time()
        for first, last in ((0, 30), (30, history)):
            with conn.cursor().copy(
                "COPY runs (id, tenant_id, kind, name, version, target, input, status, "
                "created_at, updated_at, available_at) FROM STDIN"
            ) as copy:
                for i in range(first, last):
                    copy.write_row((f"r{i:05d}", "t1", "workflow", "w", "1", "w@1", "{}",
                                    "completed", now, now, now))  # fmt: skip
            if first == 0:  # analyzed while small, as autovacuum left a young table
                conn.commit()
                conn.autocommit = True
                conn.execute("ANALYZE runs")
                conn.autocommit = False
        with conn.cursor().copy(
            "COPY events (run_id, seq, type, actor, at, data, tenant_id, hash) FROM STDIN"
        ) as copy:
            for i in range(history):  # the history's events: sealed (another chain's)
                copy.write_row((f"r{i:05d}", 1, "note", "test", now, "{}", "old", "x"))
            for i in range(history - unsealed, history):
                copy.write_row((f"r{i:05d}", 2, "note", "test", now, "{}", None, None))
        conn.commit()
        spy = _Explaining(d)
        assert service_audit.seal(Tx(spy, conn), batch) == batch  # type: ignore[arg-type]
        conn.commit()
        assert spy.rows_read
        for sql, read in spy.rows_read:
            # At worst the unsealed backlog (a bitmap scan of its index, when statistics
            # are stale), never the tenant's history.
            assert read <= 3 * unsealed, (read, sql)
        checked, broken = service_audit.verify_chain(Tx(d, conn), "t1")
        assert broken == [] and checked == batch
    finally:
        conn.rollback()
        conn.close()
