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

# Full-text search is built differently on purpose, and only there (migration 0020):
# SQLite indexes doc_chunks in an FTS5 virtual table (plus the shadow tables FTS5 keeps:
# doc_chunks_fts_data, _idx, _docsize, _config); PostgreSQL derives a tsvector column
# doc_chunks.tsv under a GIN index. Each side's full-text structures are set aside by
# name before the comparison; every other table, column and index must still match.
SQLITE_FULL_TEXT_TABLES = {
    "doc_chunks_fts",
    "doc_chunks_fts_data",
    "doc_chunks_fts_idx",
    "doc_chunks_fts_docsize",
    "doc_chunks_fts_config",
}
POSTGRES_FULL_TEXT_COLUMNS = {("doc_chunks", "tsv")}
POSTGRES_FULL_TEXT_INDEXES = {"doc_chunks_tsv"}

_FAMILY = {
    "text": "text",
    "integer": "integer",
    "bigint": "integer",
    "smallint": "integer",
    "real": "real",
    "double precision": "real",
    "blob": "bytes",
    "bytea": "bytes",
}


def sqlite_schema(path: Path) -> Schema:
    conn = sqlite3.connect(path)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
            if r[0] not in SQLITE_FULL_TEXT_TABLES
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
            if (table, name) in POSTGRES_FULL_TEXT_COLUMNS:
                continue
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
            if name in POSTGRES_FULL_TEXT_INDEXES:
                continue
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


async def test_full_text_allowances_name_only_what_exists(pg_url: str, tmp_path: Path) -> None:
    """The set-aside names are real (a renamed full-text table would otherwise hide)."""
    path = tmp_path / "fts.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    await store.close()
    conn = sqlite3.connect(path)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    assert names >= SQLITE_FULL_TEXT_TABLES
    with psycopg.connect(pg_url) as pg:
        columns = set(
            pg.execute(
                "SELECT table_name, column_name FROM information_schema.columns "
                "WHERE table_schema = 'public' AND data_type = 'tsvector'"
            ).fetchall()
        )
        indexes = {r[0] for r in pg.execute("SELECT indexname FROM pg_indexes").fetchall()}
    assert columns == POSTGRES_FULL_TEXT_COLUMNS
    assert indexes >= POSTGRES_FULL_TEXT_INDEXES
