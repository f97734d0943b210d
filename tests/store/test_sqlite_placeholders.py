"""SQLite binds a shared statement's ``:name`` placeholders by position (numbered once
per text): every name gets its own value, a name used twice one value, and nothing
inside quotes, comments or a ``::`` cast is taken for a placeholder -- the same rule
as PostgreSQL's conversion, since both dialects run the same statement texts."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from agentledger.store._postgres import convert_placeholders
from agentledger.store._sqlite import SQLiteDialect, numbered


@pytest.fixture
def sqlite() -> Iterator[tuple[SQLiteDialect, Any]]:
    dialect = SQLiteDialect(":memory:")
    conn = dialect.connect()
    yield dialect, conn
    conn.close()


def test_each_name_is_one_number_in_order_of_first_use() -> None:
    text, values = numbered("SELECT :b, :a, :b, :a10, :a1 FROM t WHERE x = :a")
    assert text == "SELECT ?1, ?2, ?1, ?3, ?4 FROM t WHERE x = ?2"
    assert values({"a": 1, "b": 2, "a1": 3, "a10": 4, "extra": 5}) == (2, 1, 4, 3)


def test_quotes_comments_and_casts_hold_no_placeholder() -> None:
    sql = "SELECT ':x', 'it''s :y', \"c:z\", a::text, /* :w\n :v */ :p -- :q\n, :r||:s"
    text, values = numbered(sql)
    assert text == ("SELECT ':x', 'it''s :y', \"c:z\", a::text, /* :w\n :v */ ?1 -- :q\n, ?2||?3")
    assert values({"p": 1, "r": 2, "s": 3}) == (1, 2, 3)
    # The same placeholders for PostgreSQL.
    assert convert_placeholders(sql) == (
        "SELECT ':x', 'it''s :y', \"c:z\", a::text, /* :w\n :v */ %(p)s -- :q\n, %(r)s||%(s)s"
    )


def test_values_reach_their_placeholders(sqlite: tuple[SQLiteDialect, Any]) -> None:
    dialect, conn = sqlite
    found = dialect.fetchall(
        conn,
        "SELECT :a AS a, :b AS b, :a||:b AS ab, ':a' AS quoted, :t10 AS t10, :t1 AS t1, "
        ":n AS n /* :b */",
        {"b": "B", "a": "A", "t1": 1, "t10": 10, "n": None, "unused": 0},
    )
    assert found == [
        {"a": "A", "b": "B", "ab": "AB", "quoted": ":a", "t10": 10, "t1": 1, "n": None}
    ]
    assert dialect.fetchall(conn, "SELECT :only AS v", {"only": "x"}) == [{"v": "x"}]
    assert dialect.fetchall(conn, "SELECT ':no' AS v") == [{"v": ":no"}]


def test_executemany_binds_each_row(sqlite: tuple[SQLiteDialect, Any]) -> None:
    dialect, conn = sqlite
    dialect.execute(conn, "CREATE TABLE t (k TEXT, v INTEGER, w INTEGER)")
    changed = dialect.executemany(
        conn,
        "INSERT INTO t (k, v, w) VALUES (:k, :v, :v + :w)",
        [{"k": "a", "v": 1, "w": 10}, {"w": 20, "v": 2, "k": "b"}],
    )
    assert changed == 2
    rows = dialect.fetchall(conn, "SELECT k, v, w FROM t ORDER BY k")
    assert rows == [{"k": "a", "v": 1, "w": 11}, {"k": "b", "v": 2, "w": 22}]


def test_a_name_without_a_value_fails_as_the_driver_fails_it(
    sqlite: tuple[SQLiteDialect, Any],
) -> None:
    dialect, conn = sqlite
    with pytest.raises(sqlite3.ProgrammingError, match=":b"):
        dialect.fetchall(conn, "SELECT :a, :b", {"a": 1})
    with pytest.raises(sqlite3.ProgrammingError, match=":a"):
        dialect.execute(conn, "SELECT :a")
