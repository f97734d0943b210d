"""`agentledger backup` and `agentledger restore` (docs/architecture.md, "Backup and restore").

A SQLite store is copied while its workers run: ``VACUUM INTO`` reads one consistent
snapshot under a read transaction (WAL mode: writers go on). A PostgreSQL store is
copied with ``pg_dump -Fc`` and brought back with ``pg_restore``; ``restore --db URL``
(without ``--from``) then marks the restored database.

A restore refuses while a worker may still be writing to the store it replaces (it would
go on calling providers for runs the restored store also resumes). It replaces nothing
it cannot give back: the SQLite file it replaces is kept beside it. Every run not yet
terminal is marked restored (store/_queries/restore.py), so its writes are status-checked
before they are sent (engine/_unknown.py).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time

import click

from agentledger.cli._common import db_option, fail, run_async, with_store
from agentledger.cli._routing import LIVE_WITHIN
from agentledger.errors import UsageError
from agentledger.records import WorkerInfo
from agentledger.store import Store
from agentledger.store._sqlite import sqlite_path
from agentledger.worker._liveness import is_dead_local_owner, me, parse_owner

ACTOR = "restore"


def _is_sqlite(url: str) -> bool:
    return url.startswith("sqlite:")


def _check_backup_file(path: str) -> int:
    """The number of runs in a SQLite backup; refuses a file that is not one."""
    if not os.path.isfile(path):
        raise UsageError(f"no backup at {path}; give the file `agentledger backup --to` wrote")
    try:
        conn = sqlite3.connect(f"file:{_uri_path(path)}?mode=ro", uri=True)
        try:
            conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
            (runs,) = conn.execute("SELECT count(*) FROM runs").fetchone()
            (check,) = conn.execute("PRAGMA quick_check").fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise UsageError(
            f"{path} is not an agentledger backup ({exc}); give the file "
            "`agentledger backup --to` wrote"
        ) from None
    if check != "ok":
        raise UsageError(f"{path} is damaged (SQLite quick_check: {check}); use another backup")
    return int(runs)


def _uri_path(path: str) -> str:
    # A file: URI: '?' and '#' in a file name must not start its query or fragment.
    return os.path.abspath(path).replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@click.command("backup")
@click.option(
    "--to",
    "target",
    required=True,
    type=click.Path(dir_okay=False),
    help="The file to write (a new one: a backup never overwrites a file).",
)
@db_option
def backup(target: str, db: str) -> None:
    """Copy a live SQLite store to FILE while its workers go on (one consistent snapshot).

    For PostgreSQL use `pg_dump -Fc` (see the README). Bring a copy back with
    `agentledger restore --from FILE`.
    """
    if not _is_sqlite(db):
        raise UsageError(
            "backup copies a SQLite store; for PostgreSQL run `pg_dump -Fc -f FILE URL`, "
            "restore it with `pg_restore -d NEWURL FILE`, then `agentledger restore --db NEWURL`"
        )
    path = sqlite_path(db)[0]
    if path == ":memory:" or not os.path.isfile(path):
        raise UsageError(f"no database at {path}; check --db")
    if not target.strip() or target.endswith(("/", os.sep)):
        raise UsageError(f"--to {target!r} is not a file name; give the file to write")
    if os.path.lexists(target):
        raise UsageError(f"{target} exists; give a new file (a backup never overwrites one)")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise UsageError(f"no folder {folder} for {target}; create it first")
    partial = os.path.join(folder, f".{os.path.basename(target)}.partial-{os.getpid()}")
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        # One read transaction: a consistent snapshot, taken while workers write (WAL).
        conn.execute("VACUUM INTO ?", (partial,))
    except sqlite3.DatabaseError as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        fail(f"backup of {path} failed: {exc}", code=1)
    finally:
        conn.close()
    try:
        runs = _check_backup_file(partial)
        _fsync(partial)
        os.link(partial, target)  # never over a file that appeared meanwhile
        _fsync(folder)
    except FileExistsError:
        raise UsageError(
            f"{target} exists; give a new file (a backup never overwrites one)"
        ) from None
    except OSError as exc:
        fail(f"backup to {target} failed: {exc}", code=1)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(partial)
    click.echo(f"backed up {path} to {target} ({runs} runs)")


@click.command("restore")
@click.option(
    "--from",
    "source",
    default=None,
    type=click.Path(dir_okay=False),
    help="The SQLite backup to bring back (not for PostgreSQL: use pg_restore first).",
)
@db_option
@run_async
async def restore(source: str | None, db: str) -> None:
    """Bring back a backup, then mark its unfinished runs restored.

    SQLite: --from FILE replaces the store at --db (kept beside it as
    FILE.before-restore-TIME). PostgreSQL: restore the dump with pg_restore into a new
    database, then run this with --db pointing at it and no --from. Refused while a worker
    may still be running on the store. Restored runs resume when workers start; each
    write they make is status-checked at its provider before it is sent, and a write with
    neither provider keys nor a status check goes to a person (`runs settle`).
    """
    if _is_sqlite(db):
        if source is None:
            raise UsageError("give --from FILE: the backup to bring back")
        await _restore_sqlite(source, db)
        return
    if source is not None:
        raise UsageError(
            "--from is for SQLite; for PostgreSQL run `pg_restore -d NEWURL FILE` into a new "
            "database, then `agentledger restore --db NEWURL`"
        )
    marked = await with_store(db, lambda s: _mark(s, "pg_restore", check=True), create=True)
    click.echo(f"restored store marked: {marked} unfinished runs will resume, status-checked")


async def _restore_sqlite(source: str, db: str) -> None:
    path = sqlite_path(db)[0]
    if path == ":memory:":
        raise UsageError("an in-memory database cannot be restored; give a file in --db")
    _check_backup_file(source)
    if os.path.exists(path):
        await with_store(db, _refuse_live_workers, read_only=True)
    folder = os.path.dirname(os.path.abspath(path))
    staging = os.path.join(folder, f".{os.path.basename(path)}.restoring-{os.getpid()}")
    for leftover in (staging, staging + "-wal", staging + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)
    try:
        src = sqlite3.connect(f"file:{_uri_path(source)}?mode=ro", uri=True)
        dst = sqlite3.connect(staging)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
        # Upgrade an older backup's schema, then mark it (one transaction).
        marked = await with_store(
            f"sqlite:///{staging}",
            lambda s: _mark(s, os.path.basename(source), check=False),
            create=True,
        )
        conn = sqlite3.connect(staging, isolation_level=None)
        try:  # one file, no WAL beside it: what is renamed is the whole store
            conn.execute("PRAGMA journal_mode=DELETE")
        finally:
            conn.close()
        _fsync(staging)
        kept = _set_aside(path)
        os.replace(staging, path)  # atomic: the path always names a whole store
        _fsync(folder)
    except OSError as exc:
        fail(f"restore of {path} failed: {exc}; the store in place is unchanged", code=1)
    finally:
        for leftover in (staging, staging + "-wal", staging + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
    click.echo(f"restored {path} from {source}: {marked} unfinished runs will resume, "
               "status-checked")  # fmt: skip
    if kept:
        click.echo(f"the store it replaced is kept as {kept}")


def _set_aside(path: str) -> str | None:
    """Keep the store being replaced under a new name; that name.

    The main file is hard-linked (the path goes on naming it until the restored file
    replaces it atomically), then its WAL files are moved beside the link: an old WAL
    must never sit next to the restored file, which SQLite would read it into."""
    if not os.path.exists(path):
        return None
    kept = f"{path}.before-restore-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    os.link(path, kept)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.rename(path + suffix, kept + suffix)
    return kept


async def _mark(store: Store, source: str, *, check: bool) -> int:
    """Mark the restored store. ``check``: its worker rows are the only sign of workers
    still running on it (PostgreSQL: the dump's rows name the workers of the database it
    was taken from); a SQLite restore checked the store it replaces instead."""
    if check:
        await _refuse_live_workers(store)
    return await store.mark_restored(source, ACTOR)


async def _refuse_live_workers(store: Store) -> None:
    """Refuse while a worker registered on this store may still be running: one on this
    machine whose process is not provably gone, or one elsewhere that heartbeat lately."""
    recent = {w.id for w in await store.list_workers(live_within=LIVE_WITHIN)}
    alive = [w for w in await store.list_workers() if _may_be_alive(w, recent)]
    if alive:
        names = ", ".join(f"pid {w.pid} on {w.host}" for w in alive[:5])
        more = f" and {len(alive) - 5} more" if len(alive) > 5 else ""
        raise UsageError(
            f"{len(alive)} worker(s) may still be running on this store ({names}{more}); "
            f"stop them first (SIGTERM), or wait {LIVE_WITHIN:.0f} s after a worker on "
            "another host is gone, then restore again"
        )


def _may_be_alive(worker: WorkerInfo, recent: set[str]) -> bool:
    mine = me()
    if is_dead_local_owner(worker.id, mine):
        return False
    owner = parse_owner(worker.id)
    local = owner is not None and (owner.boot_id, owner.pid_ns) == (mine.boot_id, mine.pid_ns)
    # A process on this machine that still exists may be frozen (SIGSTOP), its heartbeat
    # old: it is alive all the same. Elsewhere only a recent heartbeat tells.
    return local or worker.id in recent
