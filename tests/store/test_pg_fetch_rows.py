"""PostgreSQL: a statement's rows are read without building its column descriptions
(psycopg makes one object per column, per statement, for ``cursor.description``): the
dict rows already carry the names. A statement without rows still reads as none."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from agentledger.store._postgres import PostgresDialect, connect

pytestmark = pytest.mark.postgres


class _Counting(psycopg.Cursor[Any]):
    described = 0

    @property
    def description(self) -> Any:
        _Counting.described += 1
        return super().description


def test_rows_are_read_without_column_descriptions(pg_url: str) -> None:
    dialect = PostgresDialect(pg_url)
    conn = connect(pg_url)
    conn.cursor_factory = _Counting
    try:
        assert dialect.fetchall(conn, "SELECT 1 AS a, 'x' AS b") == [{"a": 1, "b": "x"}]
        assert dialect.fetchall(conn, "SELECT 1 AS a WHERE false") == []
        assert dialect.fetchall(conn, "CREATE TEMP TABLE t (a int)") == []
        assert dialect.fetchall(conn, "INSERT INTO t VALUES (:a)", {"a": 2}) == []
        assert dialect.fetchall(conn, "INSERT INTO t VALUES (3) RETURNING a") == [{"a": 3}]
        assert _Counting.described == 0
    finally:
        conn.close()
