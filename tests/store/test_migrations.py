"""Schema migrations: first open installs, later opens are no-ops, and replaying the
migrations one by one (an upgrade path) yields the same schema as a fresh install."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import psycopg
import pytest

from agentledger.store import open_store
from agentledger.store._dialect import Dialect
from agentledger.store._postgres import PostgresDialect
from agentledger.store._queries import migrations
from agentledger.store._sqlite import SQLiteDialect, sqlite_path
from agentledger.store._tx import Tx
from tests import dbutil

Schema = list[tuple[Any, ...]]


def dialect_for(url: str) -> Dialect:
    return PostgresDialect(url) if url.startswith("postgresql") else SQLiteDialect(url)


def schema_of(url: str) -> Schema:
    """Tables, columns and indexes, in a form comparable between two databases."""
    if url.startswith("postgresql"):
        with psycopg.connect(url) as conn:
            columns = conn.execute(
                "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, "
                "column_default FROM information_schema.columns WHERE table_schema = 'public' "
                "ORDER BY table_name, ordinal_position"
            ).fetchall()
            indexes = conn.execute(
                "SELECT tablename, indexname, indexdef FROM pg_indexes "
                "WHERE schemaname = 'public' ORDER BY tablename, indexname"
            ).fetchall()
        return [("column", *c) for c in columns] + [("index", *i) for i in indexes]
    path, _ = sqlite_path(url)
    conn = sqlite3.connect(path)
    try:
        objects = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master "
            "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
        columns = []
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            for col in conn.execute(f"PRAGMA table_info({table})"):
                columns.append(("column", table, *col))
    finally:
        conn.close()
    return [("object", *o) for o in objects] + sorted(columns)


def empty_public_schema(url: str) -> None:
    """Drop everything the migrations made in the PostgreSQL database at ``url``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
        left = conn.execute(
            "SELECT extname FROM pg_extension WHERE extname <> 'plpgsql'"
        ).fetchall()
    assert left == [], left  # as empty as a new database


def applied_versions(url: str) -> list[int]:
    d = dialect_for(url)
    conn = d.connect()
    try:
        rows = d.fetchall(conn, "SELECT version FROM schema_migrations ORDER BY version")
        d.commit(conn)
    finally:
        d.close(conn)
    return [int(r["version"]) for r in rows]


def all_versions() -> list[int]:
    return [v for v, _ in SQLiteDialect("sqlite:///x.db").migrations()]


async def test_first_open_migrates_and_second_open_is_a_noop(empty_url: str) -> None:
    store = open_store(empty_url)
    await store.open()
    try:
        assert await store.migrate() == []  # open() already applied everything
    finally:
        await store.close()
    assert applied_versions(empty_url) == all_versions()
    before = schema_of(empty_url)
    again = open_store(empty_url)
    await again.open()
    try:
        assert await again.migrate() == []
        assert await again.count_runs() == {}
    finally:
        await again.close()
    assert schema_of(empty_url) == before
    assert applied_versions(empty_url) == all_versions()


async def test_stores_opening_an_empty_database_at_once_migrate_once(empty_url: str) -> None:
    stores = [open_store(empty_url) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        for s in stores:
            assert await s.migrate() == []
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    assert applied_versions(empty_url) == all_versions()


@pytest.mark.long
def test_replayed_migrations_give_the_fresh_schema(
    empty_url: str, tmp_path: Any, backend: str, request: Any
) -> None:
    # Fresh install: every migration in one go.
    fresh = dialect_for(empty_url)
    conn = fresh.connect()
    try:
        assert migrations.migrate(Tx(fresh, conn)) == all_versions()
    finally:
        fresh.close(conn)
    expected = schema_of(empty_url)
    assert any(row[0] == "index" or row[1] == "index" for row in expected)

    # Upgrade path: stop after k migrations, then apply the rest later. On PostgreSQL one
    # database serves every k, emptied in between: the migrations make objects of the
    # public schema only (the extension included), so a public schema made again is an
    # empty database to them, without a CREATE and a DROP DATABASE (each a checkpoint of
    # the shared server) per k.
    replay_pg = None if backend == "sqlite" else dbutil.make_pg_database(migrated=False)
    if replay_pg is not None:
        request.addfinalizer(lambda u=replay_pg: dbutil.drop_pg_database(u))
    for k in range(len(all_versions())):
        if replay_pg is None:
            url = f"sqlite:///{tmp_path / f'replay{k}.db'}"
        else:
            url = replay_pg
            empty_public_schema(url)
        partial = dialect_for(url)
        first_k = partial.migrations()[:k]
        partial.migrations = lambda first_k=first_k: first_k  # type: ignore[method-assign]
        conn = partial.connect()
        try:
            assert migrations.migrate(Tx(partial, conn)) == all_versions()[:k]
        finally:
            partial.close(conn)
        rest = dialect_for(url)
        conn = rest.connect()
        try:
            assert migrations.migrate(Tx(rest, conn)) == all_versions()[k:]
            assert migrations.migrate(Tx(rest, conn)) == []  # replaying again changes nothing
        finally:
            rest.close(conn)
        assert schema_of(url) == expected
