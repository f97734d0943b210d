"""The per-database hooks a SQL backend provides.

Shared SQL is written once with ``:name`` placeholders; each dialect runs it on
its own driver. Everything that differs between SQLite and PostgreSQL -- how to
connect, how to begin a write transaction, the claim statement, and how driver
errors map to agentledger errors -- lives in a subclass of :class:`Dialect`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, MutableSequence, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from agentledger._canonical import clean_text
from agentledger._failures import cause_of
from agentledger.errors import StoreError

if TYPE_CHECKING:
    from agentledger.store._groupcommit import JournalCommitter


class WouldBlock(Exception):
    """A write transaction could not begin without waiting for another process's lock
    (raised only by a connection in no-wait mode, see :meth:`Dialect.set_nowait`)."""


class CleanParams(dict[str, Any]):
    """Statement parameters whose text is already sanitized (the journal's encoded
    batches): :func:`clean_params` passes them through without a look."""


def clean_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """Statement parameters with every text sanitized (NUL and lone surrogates ->
    U+FFFD): no driver can refuse a batch for its text, so none poisons a group.

    Returns ``params`` itself when nothing needed a change (the common case: the journal
    encodes its text clean), so a statement costs no copy of its parameters."""
    if type(params) is CleanParams:
        return params
    if not params:
        return {}
    out: dict[str, Any] | None = None
    for key, value in params.items():
        if isinstance(value, str):
            cleaned: Any = clean_text(value)
        elif isinstance(value, list):
            cleaned = [clean_text(v) if isinstance(v, str) else v for v in value]
            if cleaned == value:
                continue
        else:
            continue
        if cleaned is not value:
            if out is None:
                out = dict(params)
            out[key] = cleaned
    return params if out is None else out


class Dialect(ABC):
    """Hooks for one database engine."""

    name: str = "sql"
    skip_locked: str = ""  # appended to a row-locking subquery (" FOR UPDATE SKIP LOCKED")
    # The database's clock as UNIX seconds, in SQL. Every lease decision (claim, renew,
    # expiry, live owners, due runs and outbox rows) is judged by it, never by the
    # calling process's clock: a worker whose clock is off cannot steal or lose leases.
    now_sql: str = ":now"
    # A second connection sees the same database, so a store may serve its read-only
    # transactions on a read connection of their own (not so for an in-memory file).
    separate_reads: bool = True
    # One writer at a time whatever the connections (SQLite's database lock): a second
    # writing connection only queues behind the first, so work that could move to its
    # own connection (the service's sealer) stays on the store's.
    one_writer: bool = False
    # A journal write's fence hands back the run's event seq and cancel request itself
    # (``UPDATE ... RETURNING``): one round trip fewer where a statement is one. False:
    # they are read once for all the batches fenced together (journal.write_fenced).
    fence_returning: bool = True
    # Read connections a store may open while all it has are busy (each a thread).
    read_connections: int = 1
    # Set by Store.open(read_only=True): connections only read (SQLite opens the
    # file mode=ro, so a file this process may not write can still be read).
    read_only: bool = False

    def __init__(self, url: str) -> None:
        self.url = url

    @abstractmethod
    def connect(self) -> Any:
        """Open a new driver connection in autocommit-off-by-hand mode."""

    @abstractmethod
    def begin_write(self, conn: Any) -> None:
        """Begin a transaction that will write (SQLite: BEGIN IMMEDIATE)."""

    @abstractmethod
    def execute(self, conn: Any, sql: str, params: dict[str, Any] | None = None) -> int:
        """Run one statement; return the number of rows it changed."""

    @abstractmethod
    def fetchall(
        self, conn: Any, sql: str, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Run one statement and return its rows as dicts."""

    @abstractmethod
    def executemany(self, conn: Any, sql: str, rows: list[dict[str, Any]]) -> int:
        """Run one statement once per parameter set of ``rows`` (parsed once); return
        the number of rows they changed in all."""

    @abstractmethod
    def claim_sql(self, n_targets: int) -> str:
        """The single statement that claims runnable runs (placeholders t0..tN). It also
        takes each run's next event seq for its ``run.claimed`` event (``event_seq + 1``,
        returned as ``event_seq``), so the claim's events are one INSERT."""

    def claimable(self, n_targets: int, alias: str = "") -> str:
        """The claim condition, written once for every dialect: a run of one of the
        worker's targets (placeholders t0..tN) that is queued or waiting and due, or
        running under a lease that expired -- on the database's clock (``now_sql``)."""
        r = f"{alias}." if alias else ""
        targets = ", ".join(f":t{i}" for i in range(n_targets))
        now = self.now_sql
        return (
            f"{r}target IN ({targets}) AND (({r}status IN ('queued', 'waiting') "
            f"AND {r}available_at <= {now}) OR ({r}status = 'running' "
            f"AND {r}lease_expires_at < {now}))"
        )

    def lock_rows(self, alias: str) -> str:
        """Appended to a subquery: lock its rows of table ``alias`` for an UPDATE to
        follow, one by one in the subquery's order (nothing where a single writer
        holds the whole database)."""
        return ""

    @abstractmethod
    def id_epochs(self, pairs: list[tuple[str, int]]) -> tuple[str, dict[str, Any]]:
        """``pairs`` as a table of rows ``(id, epoch)`` to join, in SQL (the same text
        whatever their number, so a driver prepares it once) and its parameters. The ids
        are clean text and every epoch fits in 64 bits."""

    @abstractmethod
    def among(
        self, column: str, ids: list[str] | list[int], sql_type: str = "TEXT"
    ) -> tuple[str, dict[str, Any]]:
        """The condition "``column`` is one of ``ids``", in SQL (the same text whatever
        their number: no limit on bind parameters, one prepared statement) and its
        parameters. The ids are clean text, or integers (``sql_type`` ``BIGINT``)."""

    def array(self, values: Sequence[str | int | None]) -> Any:
        """``values`` as one statement parameter that the statement casts to an array
        (``CAST(:p AS TEXT[])``), on a dialect that has arrays."""
        raise NotImplementedError(f"{self.name} has no arrays")

    def is_transient(self, exc: BaseException) -> bool:
        """True for a failure that the same work may not meet again (a deadlock)."""
        return False

    def is_locked(self, exc: BaseException) -> bool:
        """True when another process holds a lock this work waited for past the
        busy timeout, or a deadlock rolled it back: the same work may succeed later."""
        return self.is_transient(exc)

    @abstractmethod
    def is_disconnect(self, exc: BaseException) -> bool:
        """True when the connection is gone and a reconnect may help."""

    def lost_cause(self, conn: Any, exc: BaseException) -> str:
        """Why ``conn`` was lost (``exc``, a disconnect), in one line for the log."""
        return cause_of(exc)

    @abstractmethod
    def translate(self, exc: BaseException) -> StoreError:
        """Map a driver error to the most specific agentledger error."""

    def commit(self, conn: Any) -> None:
        conn.commit()

    def rollback(self, conn: Any) -> None:
        conn.rollback()

    def close(self, conn: Any) -> None:
        conn.close()

    def submit_sql(self, insert_run: str, insert_event: str) -> str | None:
        """``insert_run`` (an INSERT of a run, RETURNING its row), ``insert_event`` (an
        INSERT ... SELECT of its first event FROM ``run``, the inserted row) and the hint
        to idle workers (:meth:`notify_runnable`) as ONE statement that returns the
        run's row, or nothing when no run was inserted; None where a statement cannot
        write through ``WITH`` (the caller runs them one by one)."""
        return None

    def notify_runnable(self, conn: Any) -> None:
        """Hint idle workers that runs became claimable (inside the transaction)."""

    def listen(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` on every hint; return a function that stops listening.

        None when the database has no notifications (workers then only poll).
        """
        return None

    def listen_events(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` when any process committed journal events; return a function
        that stops listening. None when the database has no notifications."""
        return None

    async def open_batch_committer(
        self, sizes: MutableSequence[int], translate: Callable[[BaseException], BaseException]
    ) -> JournalCommitter | None:
        """An opened :class:`~agentledger.store._groupcommit.JournalCommitter` that
        commits journal batches from the event loop, asked before the store's writer
        thread; None when the writer thread commits them all."""
        return None

    def set_nowait(self, conn: Any, nowait: bool) -> None:
        """No-wait mode: :meth:`begin_write` raises :class:`WouldBlock` instead of
        waiting for a lock another process holds (a connection used on an event loop)."""

    def after_migrate(self, conn: Any) -> None:
        """Hook run once the schema is current."""

    def migrations(self) -> list[tuple[int, str]]:
        """Numbered migration scripts for this dialect, in order."""
        return [(version, script) for version, _, script in self.migration_files()]

    def migration_files(self) -> list[tuple[int, str, str]]:
        """This dialect's migrations as ``(number, name, script)``, in order; the name
        is the file's, without its number and ``.sql``."""
        folder = resources.files("agentledger.store") / "migrations" / self.name
        found = []
        for entry in folder.iterdir():
            if entry.name.endswith(".sql"):
                number, _, name = entry.name.removesuffix(".sql").partition("_")
                found.append((int(number), name, entry.read_text()))
        return sorted(found)

    def split_script(self, script: str) -> list[str]:
        """Split a migration script into statements (no semicolons inside ours)."""
        lines = [ln for ln in script.splitlines() if not ln.strip().startswith("--")]
        return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
