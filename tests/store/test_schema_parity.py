"""SQLite and PostgreSQL migrations define the same schema: the same tables, columns
(type family, NOT NULL), unique keys and indexes. Both real databases are introspected
after a fresh install."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentledger.store import open_store

pytestmark = pytest.mark.postgres

Schema = dict[str, Any]

_FAMILY = {
    "text": "text",
    "integer": "integer",
    "bigint": "integer",
    "smallint": "integer",
    "real": "real",
    "double precision": "real",
}


def sqlite_schema(path: Path) -> Schema:
    conn = sqlite3.connect(path)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        columns, uniques, indexes = {}, {}, {}
        for table in tables:
            info = conn.execute(f"PRAGMA table_info({table})").fetchall()
            # (cid, name, type, notnull, default, pk); a primary key is never null.
            columns[table] = {
                (name, _FAMILY[kind.lower()], bool(notnull or pk))
                for _, name, kind, notnull, _, pk in info
            }
            keys = {tuple(c[1] for c in sorted(info, key=lambda c: c[5]) if c[5])}
            for _, name, unique, origin, partial in conn.execute(f"PRAGMA index_list({table})"):
                cols = tuple(r[2] for r in conn.execute(f"PRAGMA index_info({name})"))
                if origin in ("pk", "u"):
                    keys.add(cols)
                else:
                    indexes[name] = (table, cols, bool(unique), bool(partial))
            uniques[table] = keys
    finally:
        conn.close()
    return {"columns": columns, "uniques": uniques, "indexes": indexes}


def postgres_schema(url: str) -> Schema:
    with psycopg.connect(url) as conn:
        columns: dict[str, set[tuple[str, str, bool]]] = {}
        for table, name, kind, nullable in conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable "
            "FROM information_schema.columns WHERE table_schema = 'public'"
        ):
            columns.setdefault(table, set()).add((name, _FAMILY[kind], nullable == "NO"))
        uniques: dict[str, set[tuple[str, ...]]] = {t: set() for t in columns}
        indexes = {}
        found = conn.execute(
            "SELECT t.relname, i.relname, x.indisunique, x.indpred IS NOT NULL, "
            "EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid), "
            "ARRAY(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY k(n, o) "
            "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.n ORDER BY k.o) "
            "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_class t ON t.oid = x.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
            "WHERE n.nspname = 'public'"
        ).fetchall()
        for table, name, unique, partial, constraint, cols in found:
            if constraint:
                uniques[table].add(tuple(cols))
            else:
                indexes[name] = (table, tuple(cols), unique, partial)
    return {"columns": columns, "uniques": uniques, "indexes": indexes}


async def test_sqlite_and_postgres_define_the_same_schema(pg_url: str, tmp_path: Path) -> None:
    path = tmp_path / "parity.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    await store.close()
    lite, pg = sqlite_schema(path), postgres_schema(pg_url)
    assert sorted(lite["columns"]) == sorted(pg["columns"])  # the same tables
    for table in lite["columns"]:
        assert lite["columns"][table] == pg["columns"][table], table
        assert lite["uniques"][table] == pg["uniques"][table], table
    assert lite["indexes"] == pg["indexes"]
