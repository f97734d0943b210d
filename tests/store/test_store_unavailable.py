"""What a store error says failed: the host (disk full, I/O error: StoreUnavailable,
retried and the run given back) or the written value (a plain StoreError). Real SQLite
files, real errors, a real file size limit on this process."""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from agentledger.errors import StoreUnavailable
from agentledger.store._postgres.connection import connect
from agentledger.store._postgres.dialect import PostgresDialect
from agentledger.store._sqlite import SQLiteDialect


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """This process may write files of at most ``limit`` bytes (``ulimit -f``); a write
    past it fails with EFBIG instead of killing the process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def _wal_database(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (x BLOB)")
    for _ in range(20):
        conn.execute("INSERT INTO t VALUES (randomblob(10000))")
    return conn


def _error(conn: sqlite3.Connection, sql: str) -> sqlite3.Error:
    try:
        conn.execute(sql).fetchall()
    except sqlite3.Error as exc:
        return exc
    raise AssertionError(f"{sql} did not fail")


def test_a_write_past_the_file_size_limit_is_a_full_disk(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    conn = _wal_database(path)
    limit = os.path.getsize(f"{path}-wal")
    with file_size_limit(limit):
        exc = _error(conn, "INSERT INTO t VALUES (randomblob(200000))")
        failure = SQLiteDialect(f"sqlite:///{path}").translate(exc)
    conn.close()
    assert isinstance(failure, StoreUnavailable)
    assert str(failure).startswith(f"database disk full: {path} "), failure
    assert "ulimit -f" in str(failure), failure


def test_an_io_error_under_a_file_size_limit_it_did_not_reach_is_no_full_disk(
    tmp_path: Path,
) -> None:
    # A real I/O error (the write-ahead log lost its tail under the database) in a
    # process that may write files of 1 GiB: nothing came near the limit, the disk is
    # not full, and the message must not send the operator to free space.
    path = tmp_path / "b.db"
    writer = _wal_database(path)
    os.truncate(f"{path}-wal", 4096)
    reader = sqlite3.connect(path, isolation_level=None)
    with file_size_limit(1 << 30):
        exc = _error(reader, "SELECT count(*), sum(length(x)) FROM t")
        failure = SQLiteDialect(f"sqlite:///{path}").translate(exc)
    reader.close()
    writer.close()
    assert isinstance(failure, StoreUnavailable)
    assert str(failure).startswith(f"database I/O error: {path} "), failure
    assert "disk full" not in str(failure) and "ulimit" not in str(failure), failure


def _lock_wait_error(pg_url: str, setting: str) -> psycopg.Error:
    """A real error of a statement that waited, past ``setting``, for a row lock
    another session holds (an operator's open transaction, a stuck process)."""
    holder = connect(pg_url)
    waiter = connect(pg_url, autocommit=True)
    try:
        holder.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")  # say, a VACUUM FULL
        waiter.execute(f"SET {setting} = '50ms'")
        try:
            waiter.execute("UPDATE runs SET updated_at = updated_at")
        except psycopg.Error as exc:
            return exc
        raise AssertionError("the statement did not wait")
    finally:
        holder.rollback()
        holder.close()
        waiter.close()


@pytest.mark.postgres
@pytest.mark.parametrize("setting", ["statement_timeout", "lock_timeout"])
def test_a_postgres_statement_that_waited_out_another_sessions_lock_is_retried(
    pg_url: str, setting: str
) -> None:
    # Nothing the run wrote: another session holds a lock the write waits for. Taken
    # for the run's error, the run would be left to its lease (and count a resume
    # each time), and a heartbeat meeting it would stop the whole worker.
    exc = _lock_wait_error(pg_url, setting)
    failure = PostgresDialect(pg_url).translate(exc)
    assert isinstance(failure, StoreUnavailable), failure
    assert "locks" in str(failure), failure
