"""The SQLite backend: the embedded default.

WAL mode with ``synchronous=FULL`` so every acknowledged step is fsynced;
``BEGIN IMMEDIATE`` takes the write lock up front so a fenced write never
upgrades a read lock mid-transaction; a busy timeout lets several worker
processes on one host share the file. ``?synchronous=normal`` in the URL is the
faster, weaker setting: a power loss may lose the last acknowledged steps.

Several worker processes on one host share the file. The journal connection used on
the event loop never waits for another process's write lock (busy timeout 0): when
the lock is held, the group is committed on a thread that waits with the busy timeout,
so heartbeats and other runs go on. A lock held past the busy timeout is
:class:`StoreUnavailable`, a transient error to retry.

Clock: every process on the host reads the same clock, so leases are judged by it,
read in SQL (``julianday('now')``) like PostgreSQL's server clock.
"""

from __future__ import annotations

import asyncio
import functools
import json
import operator
import os
import re
import resource
import sqlite3
import time
from collections.abc import Callable, Mapping, MutableSequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from agentledger.errors import StoreCorrupt, StoreError, StoreLocked, StoreUnavailable, UsageError
from agentledger.store._dialect import Dialect, WouldBlock, clean_params
from agentledger.store._groupcommit import InlineCommitter, JournalCommitter
from agentledger.store._placeholders import TOKENS
from agentledger.store._queries.common import RUN_COLUMNS
from agentledger.store._queries.migrations import MIGRATION_WAIT

_SYNC_MODES = {"full": "FULL", "normal": "NORMAL", "extra": "EXTRA"}


def sqlite_path(url: str) -> tuple[str, dict[str, str]]:
    """Parse ``sqlite:///rel.db``, ``sqlite:////abs.db`` or a bare path."""
    if "://" not in url:
        return url, {}
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise UsageError(f"not a SQLite URL: {url!r}; use sqlite:///path/to/file.db")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise UsageError(f"no file in {url!r}; use sqlite:///path/to/file.db")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return path, options


class _Connection(sqlite3.Connection):
    """A connection that remembers whether it may wait for locks (see set_nowait)."""

    nowait = False


# Primary result codes (sqlite3.h) of a lock another connection holds: the same work
# may succeed once it lets go. SQLITE_PROTOCOL ("locking protocol") is contention on
# the WAL index: SQLite retried taking its shared-memory locks and gave up.
_SQLITE_LOCK_ERRORS = {5, 6, 15}  # BUSY, LOCKED, PROTOCOL


def _is_busy(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in _SQLITE_LOCK_ERRORS:
        return True
    text = str(exc)
    return "locked" in text or "busy" in text or "locking protocol" in text


# Primary result codes (sqlite3.h) of failures of the host, not of what was written.
_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_FULL = 8, 10, 13
# Extended codes of an I/O error met growing a file (a write, a truncate that extends,
# the shared-memory index): what a write past the file size limit (EFBIG) is reported as.
_SQLITE_GROWTH_ERRORS = {10 | (3 << 8), 10 | (6 << 8), 10 | (19 << 8)}  # WRITE, TRUNCATE, SHMSIZE


def _at_size_limit(path: str, code: int) -> int | None:
    """The file size limit (``ulimit -f``) that refused growing one of the database's
    files, or None when the I/O error is not that. A write crossing the limit writes up
    to it, then fails with EFBIG: the file is then at least the limit long. SQLite
    reports EFBIG as a plain I/O error, so the sizes tell it from a failing disk."""
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit == resource.RLIM_INFINITY or code not in _SQLITE_GROWTH_ERRORS:
        return None
    for name in (path, f"{path}-wal", f"{path}-journal", f"{path}-shm"):
        try:
            if os.path.getsize(name) >= limit:
                return limit
        except OSError:
            continue  # that file does not exist (or cannot be seen): not it
    return None


def _host_failure(path: str, exc: BaseException) -> StoreUnavailable | None:
    """The one-line cause of a write the disk refused (full, I/O error, read-only), or
    None when SQLite refused it for what it is. A file size limit (``ulimit -f``) makes
    a growing file fail with EFBIG, which SQLite reports as an I/O error: named here as
    the full disk it is for this process, when a file of the database reached it."""
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int):
        return None
    primary, text = code & 0xFF, str(exc)
    if primary == _SQLITE_FULL:
        return StoreUnavailable(
            f"database disk full: {path} (no space left on its disk: {text}); free some space on it"
        )
    if primary == _SQLITE_IOERR:
        limit = _at_size_limit(path, code)
        if limit is not None:
            return StoreUnavailable(
                f"database disk full: {path} (this process may write files of at most "
                f"{limit} bytes: {text}); raise the file size limit (ulimit -f)"
            )
        name = getattr(exc, "sqlite_errorname", None) or text
        return StoreUnavailable(
            f"database I/O error: {path} ({text}, {name}); check the disk and its free space"
        )
    if primary == _SQLITE_READONLY:
        rights = "writable" if os.access(path, os.W_OK) else "not writable by this process"
        return StoreUnavailable(
            f"database is read-only: {path} ({text}; the file is {rights}); check the "
            "rights on the file, its folder and the mount"
        )
    return None


Values = Callable[[Mapping[str, Any]], tuple[Any, ...]]


def _no_values(params: Mapping[str, Any]) -> tuple[Any, ...]:
    return ()


@functools.lru_cache(maxsize=2048)
def numbered(sql: str) -> tuple[str, Values]:
    """``sql`` with its ``:name`` placeholders numbered (``?1``, ``?2``, ... in the order
    the names first appear; a name used twice is one number, one value, as it was), and
    the function that takes a statement's values out of its parameters, in that order.

    Made once per text: the driver binds a tuple by position, where for named
    parameters it makes each name's string anew and looks it up in the dict.
    Placeholders are found as for every dialect (:data:`TOKENS`)."""
    order: dict[str, str] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group("name")
        if name is None:
            return match.group(0)
        return order.setdefault(name, f"?{len(order) + 1}")

    text = TOKENS.sub(number, sql)
    names = tuple(order)
    if not names:
        return text, _no_values
    getter = operator.itemgetter(*names)
    if len(names) == 1:
        return text, lambda params: (getter(params),)
    return text, getter


def _take(values: Values, params: Mapping[str, Any]) -> tuple[Any, ...]:
    """``values(params)``, a name without a value failing as the driver fails it."""
    try:
        return values(params)
    except KeyError as exc:
        raise sqlite3.ProgrammingError(
            f"You did not supply a value for binding parameter :{exc.args[0]}."
        ) from None


class SQLiteDialect(Dialect):
    """SQLite hooks."""

    name = "sqlite"
    one_writer = True
    # RETURNING makes SQLite run an UPDATE as with a trigger (the whole wide run row
    # copied out, the result kept in a temporary table): the fence and a read of the
    # rows after it cost less, the more so for a group read once.
    fence_returning = False
    # SQLite serves one host: every process reads the same clock, the host's. It is
    # still read in SQL so that a store judges leases the same way on both backends.
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.path, options = sqlite_path(url)
        sync = options.get("synchronous", "full").lower()
        if sync not in _SYNC_MODES:
            raise UsageError(f"unknown synchronous={sync!r} in {url!r}; use full or normal")
        self.synchronous = _SYNC_MODES[sync]
        self.busy_timeout_ms = int(options.get("busy_timeout_ms", "10000"))
        self.separate_reads = self.path != ":memory:" and "mode=memory" not in url

    async def open_batch_committer(
        self, sizes: MutableSequence[int], translate: Callable[[BaseException], BaseException]
    ) -> JournalCommitter:
        """Every journal batch is committed on the event loop (:class:`InlineCommitter`)."""
        committer = InlineCommitter(self, sizes, translate)
        await asyncio.to_thread(committer.open)
        return committer

    def connect(self) -> sqlite3.Connection:
        if Path(self.path).is_dir():
            raise UsageError(
                f"{self.path} is a directory, not a database file; name a file in it, e.g. "
                f"--db sqlite:///{self.path.rstrip('/')}/agentledger.db"
            )
        parent = Path(self.path).resolve().parent
        if not parent.is_dir():
            raise UsageError(
                f"cannot create {self.path}: folder {parent} does not exist; create it first"
            )
        # Read-only (a store opened read_only, for commands that only read): the file is
        # opened mode=ro and left in its journal mode, so a file this process may not
        # write (or an immutable copy) can still be read.
        read_only = self.read_only and self.separate_reads  # never for an in-memory file
        target = f"file:{quote(str(Path(self.path).resolve()))}?mode=ro" if read_only else None
        conn = sqlite3.connect(
            target or self.path,
            uri=target is not None,
            isolation_level=None,
            check_same_thread=False,
            timeout=self.busy_timeout_ms / 1000,
            factory=_Connection,
        )
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            # Switching a new file to WAL does not wait on busy_timeout, and waits for
            # another process's first migration: as long as a migration may wait.
            deadline = time.monotonic() + max(self.busy_timeout_ms / 1000, MIGRATION_WAIT)
            while not read_only:
                try:
                    conn.execute("PRAGMA journal_mode = WAL")
                    break
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            # Deleted content is overwritten with zeros, not left in free pages: what
            # ``memory forget`` erases is gone from the file (docs/architecture.md).
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            conn.close()
            raise self.translate(exc) from exc
        return conn

    def begin_write(self, conn: Any) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if getattr(conn, "nowait", False) and _is_busy(exc):
                raise WouldBlock(str(exc)) from exc
            raise

    def set_nowait(self, conn: Any, nowait: bool) -> None:
        conn.nowait = nowait
        conn.execute(f"PRAGMA busy_timeout = {0 if nowait else self.busy_timeout_ms}")

    def execute(self, conn: Any, sql: str, params: dict[str, Any] | None = None) -> int:
        text, values = numbered(sql)
        cursor = conn.execute(text, _take(values, clean_params(params)))
        return int(cursor.rowcount)

    def fetchall(
        self, conn: Any, sql: str, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        text, values = numbered(sql)
        found = conn.execute(text, _take(values, clean_params(params))).fetchall()
        return [dict(row) for row in found]

    def executemany(self, conn: Any, sql: str, rows: list[dict[str, Any]]) -> int:
        text, values = numbered(sql)
        cursor = conn.executemany(text, [_take(values, clean_params(row)) for row in rows])
        return int(cursor.rowcount)

    def commit(self, conn: Any) -> None:
        if conn.in_transaction:
            conn.execute("COMMIT")

    def rollback(self, conn: Any) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def claim_sql(self, n_targets: int) -> str:
        now = self.now_sql
        targets = ", ".join(f":t{i}" for i in range(n_targets))
        return (
            # Fair across tenants: each tenant's due runs are ranked by available_at and
            # the claim takes rank 1 of every tenant, then rank 2, ... (round-robin), so
            # one tenant's backlog never starves another's runs.
            # Only ranks up to :limit can be taken, so only each tenant's first :limit
            # due runs are ranked: ``tenants`` hops from tenant to tenant on the
            # runs_fair index (one seek each), ``due`` reads each one's first :limit
            # runs in available_at order from the same index, and the expired leases
            # join them. A claim reads a few rows per tenant, not the whole backlog.
            # First ``probe``: the first 10 x :limit due runs of the worker's targets,
            # on the runs_claimable index (target, available_at). When there are
            # ``few`` (fewer than that), they are every due run and nothing else is
            # read: an idle queue costs a few index entries, however many tenants
            # have runs parked or not yet due (the tenant hop below visits those too).
            "WITH RECURSIVE probe AS (SELECT id, tenant_id, available_at FROM runs "
            "WHERE status IN ('queued', 'waiting') "
            f"AND target IN ({targets}) AND available_at <= {now} LIMIT 10 * :limit), "
            "few(yes) AS (SELECT COUNT(*) < 10 * :limit FROM probe), "
            "tenants(t) AS (SELECT MIN(tenant_id) FROM runs "
            "WHERE status IN ('queued', 'waiting') AND NOT (SELECT yes FROM few) UNION ALL "
            "SELECT (SELECT MIN(tenant_id) FROM runs WHERE status IN ('queued', 'waiting') "
            "AND tenant_id > tenants.t) FROM tenants WHERE t IS NOT NULL), "
            "due(id, tenant_id, available_at) AS ("
            "SELECT id, tenant_id, available_at FROM probe WHERE (SELECT yes FROM few) "
            "UNION ALL "
            "SELECT r.id, r.tenant_id, r.available_at FROM tenants JOIN runs r "
            "ON r.id IN (SELECT id FROM runs WHERE status IN ('queued', 'waiting') "
            f"AND tenant_id = tenants.t AND available_at <= {now} AND target IN ({targets}) "
            "ORDER BY available_at LIMIT :limit) "
            "UNION ALL SELECT id, tenant_id, available_at FROM runs "
            f"WHERE status = 'running' AND target IN ({targets}) AND lease_expires_at < {now}) "
            "UPDATE runs SET status = 'running', lease_owner = :owner, write_token = :token, "
            f"lease_epoch = lease_epoch + 1, lease_expires_at = {now} + :lease, "
            f"updated_at = {now}, event_seq = event_seq + 1, "
            "resumes = resumes + (CASE WHEN status = 'running' THEN 1 ELSE 0 END) "
            "WHERE id IN (SELECT id FROM (SELECT id, available_at, ROW_NUMBER() OVER "
            "(PARTITION BY tenant_id ORDER BY available_at) AS fair_rank FROM due) "
            "WHERE fair_rank <= :limit "
            f"ORDER BY fair_rank, available_at LIMIT :limit) RETURNING {RUN_COLUMNS}, event_seq"
        )

    def id_epochs(self, pairs: list[tuple[str, int]]) -> tuple[str, dict[str, Any]]:
        table = (
            "(SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS epoch "
            "FROM json_each(:pairs)) AS pairs"
        )
        return table, {"pairs": json.dumps(pairs, ensure_ascii=False)}

    def among(
        self, column: str, ids: list[str] | list[int], sql_type: str = "TEXT"
    ) -> tuple[str, dict[str, Any]]:
        condition = f"{column} IN (SELECT value FROM json_each(:ids))"
        return condition, {"ids": json.dumps(ids, ensure_ascii=False)}

    def is_locked(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and _is_busy(exc)

    def is_disconnect(self, exc: BaseException) -> bool:
        return False  # a file does not disconnect

    def translate(self, exc: BaseException) -> StoreError:
        if isinstance(exc, StoreError):
            return exc
        text = str(exc)
        if isinstance(exc, UsageError):
            return StoreUnavailable(text)
        if _is_busy(exc):
            return StoreLocked(
                f"{self.path} is locked by another process ({text}); retry, or stop the "
                "process holding it"
            )
        if "not a database" in text or "malformed" in text:
            return StoreCorrupt(
                f"{self.path} is not a usable agentledger database ({text}); point --db at "
                "another file or restore it from a backup"
            )
        failure = _host_failure(self.path, exc)
        if failure is not None:
            return failure
        if "readonly" in text:
            return StoreUnavailable(
                f"{self.path} is read-only ({text}); this command writes: give it write "
                "access to the file and its folder"
            )
        if "unable to open" in text:
            return StoreUnavailable(f"cannot open {self.path} ({text}); check the path and rights")
        return StoreError(f"SQLite error on {self.path}: {text}")
