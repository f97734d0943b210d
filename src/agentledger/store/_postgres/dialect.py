"""The PostgreSQL backend: many stateless workers on many hosts.

One :class:`PostgresDialect` per store. The store's writer thread owns one
psycopg 3 connection (non-autocommit, READ COMMITTED, ``dict_row`` rows):

* every transaction is short, so the session runs with a ``statement_timeout``
  (30 s) and an ``idle_in_transaction_session_timeout`` (10 s) -- a stuck or
  forgotten transaction cannot pin row locks or hold back vacuum. A worker frozen
  inside a transaction (SIGSTOP, a stalled host) holds its runs' rows until the
  server ends its session: then the rows are free for another worker to take over
  once the leases expired, and the frozen worker, if it runs again, meets a lost
  connection (25P03) and finds its leases gone;
* ``synchronous_commit`` is never left ``off``: a step is acknowledged only after
  COMMIT returned, and that must mean durable (docs/architecture.md, "Claim, lease, fence");
* TCP keepalives let a half-open connection (a partitioned network) fail
  instead of hanging, so the store's reconnect loop can take over;
* the claim is one statement, ``FOR UPDATE SKIP LOCKED``: concurrent claimers
  never wait for each other and never claim the same run twice.

Wake-ups use LISTEN/NOTIFY on the channel
:data:`RUNS_CHANNEL`: :func:`notify_runs` inside a transaction that made a run
runnable, :class:`RunListener` in a worker. Notifications are only a hint --
workers keep polling as a fallback, because a notification sent while a
listener was reconnecting is lost.

Connection settings in the URL win over the defaults set here, e.g.
``postgresql://app@db/agentledger?application_name=eu-worker&connect_timeout=10``.
"""

from __future__ import annotations

from collections.abc import Callable, MutableSequence, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from agentledger.errors import StoreError, StoreUnavailable, UsageError
from agentledger.records import RunStatus
from agentledger.store._dialect import Dialect, clean_params
from agentledger.store._groupcommit import JournalCommitter
from agentledger.store._postgres.async_commit import AsyncBatchCommitter, connect_async
from agentledger.store._postgres.connection import (
    CONNECT_DEFAULTS,
    DISCONNECT_STATES,
    EVENTS_CHANNEL,
    MIGRATION_LOCK_KEY,
    NOW_SQL,
    RUNS_CHANNEL,
    connect,
    connect_error,
    convert_placeholders,
    lost_cause,
    one_line,
    parse_url,
    where_of,
)
from agentledger.store._queries.common import RUN_COLUMNS

# libpq's refusal of a statement with more bind parameters than its protocol carries.
TOO_MANY_PARAMETERS = "number of parameters must be between"


def _array_element(value: str | int | None) -> str:
    """One element of an array's text: an integer as it is, NULL, or text quoted with
    its backslashes and double quotes escaped (the array input syntax)."""
    if value is None:
        return "NULL"
    if type(value) is int:
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class PostgresDialect(Dialect):
    """PostgreSQL hooks (psycopg 3)."""

    name = "postgres"
    now_sql = NOW_SQL  # statement_timestamp(): the server's clock, one value per statement
    # A read waits mostly on the network: a few in flight at once (100 streams woken by
    # one commit read their pages), each connection opened only when the others are busy.
    read_connections = 4

    def __init__(self, url: str) -> None:
        super().__init__(url)
        try:
            self.params = parse_url(url)
        except StoreUnavailable:
            self.params = {}  # connect() raises it again, from store.open()
        self.where = where_of(self.params)
        # Until the first migration has run, write transactions take an advisory
        # lock so that processes opening a fresh database at once migrate one by
        # one (see begin_write / after_migrate).
        self._schema_ready = False

    # connections ----------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        conn = connect(self.url)
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        return conn

    def begin_write(self, conn: Any) -> None:
        # psycopg opens the transaction itself (BEGIN ISOLATION LEVEL READ
        # COMMITTED) before the first statement, and COMMIT/ROLLBACK end it, so
        # plain SAVEPOINT statements nest inside it as they should.
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            conn.rollback()
        if not self._schema_ready:
            # The first write on a store is queries.migrate(): serialize it with
            # every other process migrating the same database, and let a long
            # migration (an index on a big table) outlast the statement timeout.
            conn.execute("SET LOCAL statement_timeout = 0")
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))

    def after_migrate(self, conn: Any) -> None:
        self._schema_ready = True

    def commit(self, conn: Any) -> None:
        conn.commit()

    def rollback(self, conn: Any) -> None:
        if not conn.closed:
            conn.rollback()

    def close(self, conn: Any) -> None:
        if conn is not None:
            conn.close()

    # statements -------------------------------------------------------------

    def execute(self, conn: Any, sql: str, params: dict[str, Any] | None = None) -> int:
        cursor = conn.execute(convert_placeholders(sql), clean_params(params))
        return int(cursor.rowcount)

    def fetchall(
        self, conn: Any, sql: str, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        cursor = conn.execute(convert_placeholders(sql), clean_params(params))
        # No rows to read (a statement without RETURNING). Asked of ``rownumber``, not of
        # ``description``, which builds an object per column of every result: the dict
        # rows carry the column names already.
        if cursor.rownumber is None:
            return []
        return list(cursor.fetchall())

    def executemany(self, conn: Any, sql: str, rows: list[dict[str, Any]]) -> int:
        with conn.cursor() as cursor:
            cursor.executemany(convert_placeholders(sql), [clean_params(row) for row in rows])
            return int(cursor.rowcount)

    def lock_rows(self, alias: str) -> str:
        # The lock an UPDATE of non-key columns takes: FOR UPDATE would also wait for
        # (and block) the key-share locks of inserts referencing the row.
        return f" FOR NO KEY UPDATE OF {alias}"

    def id_epochs(self, pairs: list[tuple[str, int]]) -> tuple[str, dict[str, Any]]:
        table = "unnest(CAST(:ids AS TEXT[]), CAST(:epochs AS BIGINT[])) AS pairs(id, epoch)"
        ids, epochs = self.array([i for i, _ in pairs]), self.array([e for _, e in pairs])
        return table, {"ids": ids, "epochs": epochs}

    def among(
        self, column: str, ids: list[str] | list[int], sql_type: str = "TEXT"
    ) -> tuple[str, dict[str, Any]]:
        # An index scan of the array's elements, whether the plan is custom or generic.
        return f"{column} = ANY(CAST(:ids AS {sql_type}[]))", {"ids": self.array(ids)}

    def array(self, values: Sequence[str | int | None]) -> str:
        """``values`` as an array's text (``{1,2}``, ``{"a","b\\"c"}``, NULL for None):
        one text parameter, parsed by the server's cast. psycopg sends a Python list
        element by element, each through its dumper, which a seal of a few hundred
        records pays several times."""
        return "{" + ",".join(map(_array_element, values)) + "}"

    async def open_batch_committer(
        self, sizes: MutableSequence[int], translate: Callable[[BaseException], BaseException]
    ) -> JournalCommitter:
        """Plain batches (one statement each) are committed on the event loop; the
        others go to the writer thread."""
        params = parse_url(self.url)
        settings = {k: v for k, v in CONNECT_DEFAULTS.items() if k not in params}
        # The journal connection is named after the store's, so operators see both.
        base = params.get("application_name", CONNECT_DEFAULTS["application_name"])
        settings["application_name"] = f"{base}:journal"

        async def connect() -> Any:
            try:
                return await connect_async(self.url, settings)
            except psycopg.Error as exc:
                raise connect_error(exc, params) from exc

        committer = AsyncBatchCommitter(
            connect, self.is_disconnect, translate, sizes, is_transient=self.is_transient
        )
        await committer.open()
        return committer

    def submit_sql(self, insert_run: str, insert_event: str) -> str:
        # A data-modifying WITH runs whether or not it is read; the hint is sent once per
        # run returned, so a submit that inserted nothing (its request id used) sends none.
        return (
            f"WITH run AS ({insert_run}), submitted AS ({insert_event}) "
            f"SELECT run.*, pg_notify('{RUNS_CHANNEL}', '') AS hinted FROM run"
        )

    def notify_runnable(self, conn: Any) -> None:
        conn.execute(f"NOTIFY {RUNS_CHANNEL}")

    def listen(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        from agentledger.store._postgres.listen import RunListener

        listener = RunListener(self.url, lambda _payload: callback())
        listener.start()
        return listener.stop

    def listen_events(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        from agentledger.store._postgres.listen import RunListener

        listener = RunListener(
            self.url,
            lambda _payload: callback(),
            channel=EVENTS_CHANNEL,
            application_name="agentledger-events",
        )
        listener.start()
        return listener.stop

    def claim_sql(self, n_targets: int) -> str:
        returning = ", ".join(f"r.{c.strip()}" for c in RUN_COLUMNS.split(","))
        now = self.now_sql
        targets = ", ".join(f":t{i}" for i in range(n_targets))
        target_rows = ", ".join(f"(CAST(:t{i} AS TEXT))" for i in range(n_targets))
        queued = "status IN ('queued', 'waiting')"
        rank = "ROW_NUMBER() OVER (PARTITION BY tenant_id ORDER BY available_at) AS fair_rank"
        # Fair across tenants: each tenant's due runs are ranked by available_at and the
        # claim locks them in rank order (rank 1 of every tenant, then rank 2, ...),
        # skipping rows another claimer holds (SKIP LOCKED) and re-checking on the
        # locked row that it is still claimable. A window function cannot sit at the
        # level that says FOR UPDATE, hence the joins.
        #
        # ``probe`` is the oldest 10 x :limit due runs of the worker's targets, each
        # target's oldest read from the runs_claimable index (target, available_at) and
        # merged (a target named twice is read once, or its runs would count twice and a
        # run ranked twice would fill two places of the claim). When there are ``few``
        # (fewer than that), they are every due run: ``due`` is them, with the expired
        # leases (``expired``), and nothing else is read -- an idle or lightly loaded
        # queue costs a few index entries, however many tenants have runs parked or not
        # yet due.
        #
        # A tenant's oldest run in ``probe`` is that tenant's rank 1, and every tenant
        # absent from it has its rank 1 later than the probe's last run. When not
        # ``few``, ``spread`` takes those tenants' oldest runs (with the
        # expired leases up to the probe's last run, ranked with them), oldest first:
        # the fair order starts with exactly them. Many tenants with a few due runs each
        # are claimed from the probe alone, with no walk over the tenants (an index
        # seek per tenant); when ``spread`` comes short (one big tenant has the
        # oldest runs, or their tenants' oldest are held), the claim goes on below,
        # leaving out what ``spread`` took.
        #
        # Otherwise ``near`` ranks only each tenant's first 2 x :limit due runs:
        # ``tenants`` hops from tenant to tenant on the runs_fair index (tenant,
        # available_at, target; one seek each) and ``due`` reads each one's first runs
        # from the same index, with the expired leases. Without locks, ranks above
        # :limit are never taken; the other :limit rows of the window are for a
        # concurrent claimer holding a tenant's first rows. Only ranks up to 2 x :limit
        # are taken (unless ``few``): an expired lease younger than its tenant's window
        # ranks right after the window there, below its true rank, and would jump
        # another tenant's run of a lower rank just past that tenant's window; a tenant
        # with more is full, and ``mid`` ranks it deeper. A claim reads
        # O(tenants x limit) rows, not the backlog. (``k`` comes sorted in rank order,
        # so the locking join is a nested loop on the primary key that stops once
        # :limit rows are locked; joined unsorted, the planner, blind to how few rows
        # the recursive CTE yields, would hash-join against a scan of the whole table.)
        #
        # (``tenants`` ends with a NULL row, the hop that found no next tenant; it is
        # left out before the window is read: the planner may read the window from
        # runs_claimable, filtering on the tenant -- its choice when one tenant holds
        # most runs -- and would walk every due run for a tenant that matches none.)
        #
        # (``tenants`` orders by runs_fair's columns, tenant then available_at, so that
        # the hop is an index-only seek on it, never a walk through a tenant's finished
        # runs on the plain tenant index.)
        #
        # ``wide`` and ``mid`` are for concurrent claimers holding more than that (three
        # workers claiming from one big tenant at once hold its first 3 x :limit due
        # runs): when ``near`` came short AND some tenant had more due runs than its
        # window showed, the tenants whose window was full are read again 16 x :limit
        # deep and ranked the same way, ``near``'s rows left out. Their expired leases
        # are ranked with them, as in ``due``: left out, a tenant whose oldest run is an
        # expired lease another claimer holds would rank its later runs one too low and
        # take the others' turns. Only ranks up to 16 x :limit are taken: a run of a
        # higher rank (a tenant with expired leases) could jump another tenant's run of
        # a lower rank that lies past that tenant's wide window. ``far`` is what keeps
        # SKIP LOCKED exact when even that is held: when ``mid`` came short too AND some
        # tenant had more due runs than the wide window showed, or ranks ``mid`` left
        # out, the whole backlog is ranked (the rows ``near`` and ``mid`` took left out)
        # and locked in rank order; its cost grows with the backlog, so it is the last
        # resort.
        # Otherwise ``due`` held every claimable run, ``near`` tried them all, and
        # neither ``mid`` nor ``far`` is run (the outer LIMIT stops pulling once
        # ``near`` filled the claim; their conditions are one-time filters).
        return (
            "WITH RECURSIVE probe AS (SELECT p.id, p.tenant_id, p.available_at FROM "
            f"(SELECT DISTINCT t FROM (VALUES {target_rows}) v(t)) tg CROSS JOIN LATERAL "
            f"(SELECT id, tenant_id, available_at FROM runs WHERE {queued} AND target = tg.t "
            f"AND available_at <= {now} ORDER BY available_at LIMIT 10 * :limit) p "
            "ORDER BY p.available_at LIMIT 10 * :limit), "
            "few AS (SELECT COUNT(*) < 10 * :limit AS yes FROM probe), "
            "expired AS (SELECT id, tenant_id, available_at FROM runs WHERE status = 'running' "
            f"AND target IN ({targets}) AND lease_expires_at < {now}), "
            "spread AS (SELECT runs.id FROM (SELECT id, available_at FROM "
            f"(SELECT id, available_at, {rank} FROM (SELECT id, tenant_id, available_at "
            "FROM probe UNION ALL SELECT id, tenant_id, available_at FROM expired "
            "WHERE available_at <= (SELECT MAX(available_at) FROM probe)) cand) ranked "
            "WHERE fair_rank = 1 AND NOT (SELECT yes FROM few) ORDER BY available_at) k "
            "JOIN runs ON runs.id = k.id "
            f"WHERE {self.claimable(n_targets, 'runs')} "
            "ORDER BY k.available_at LIMIT :limit FOR UPDATE OF runs SKIP LOCKED), "
            "tenants(t) AS ("
            f"(SELECT tenant_id FROM runs WHERE {queued} ORDER BY tenant_id, available_at LIMIT 1) "
            f"UNION ALL SELECT (SELECT tenant_id FROM runs WHERE {queued} "
            "AND tenant_id > tenants.t ORDER BY tenant_id, available_at LIMIT 1) "
            "FROM tenants WHERE tenants.t IS NOT NULL), "
            "due AS (SELECT id, tenant_id, available_at FROM probe WHERE (SELECT yes FROM few) "
            "UNION ALL SELECT w.id, w.tenant_id, w.available_at FROM tenants CROSS JOIN LATERAL "
            f"(SELECT id, tenant_id, available_at FROM runs WHERE {queued} "
            f"AND tenant_id = tenants.t AND available_at <= {now} AND target IN ({targets}) "
            "ORDER BY available_at LIMIT 2 * :limit) w "
            "WHERE tenants.t IS NOT NULL AND NOT (SELECT yes FROM few) "
            "UNION ALL SELECT id, tenant_id, available_at FROM expired), "
            "near AS (SELECT runs.id FROM (SELECT id, available_at, fair_rank FROM "
            f"(SELECT id, available_at, {rank} FROM due) ranked "
            "WHERE fair_rank <= 2 * :limit OR (SELECT yes FROM few) "
            "ORDER BY fair_rank, available_at) k JOIN runs ON runs.id = k.id "
            f"WHERE {self.claimable(n_targets, 'runs')} AND runs.id NOT IN (SELECT id FROM spread) "
            "ORDER BY k.fair_rank, k.available_at LIMIT :limit FOR UPDATE OF runs SKIP LOCKED), "
            "full_tenants AS (SELECT tenant_id AS t FROM due WHERE NOT (SELECT yes FROM few) "
            "GROUP BY tenant_id HAVING COUNT(*) >= 2 * :limit), "
            "wide AS (SELECT w.id, w.tenant_id, w.available_at, 1 AS q FROM full_tenants "
            f"CROSS JOIN LATERAL (SELECT id, tenant_id, available_at FROM runs WHERE {queued} "
            f"AND tenant_id = full_tenants.t AND available_at <= {now} "
            f"AND target IN ({targets}) ORDER BY available_at LIMIT 16 * :limit) w "
            "UNION ALL SELECT id, tenant_id, available_at, 0 FROM expired "
            "WHERE tenant_id IN (SELECT t FROM full_tenants)), "
            "mid AS (SELECT runs.id FROM (SELECT id, available_at, fair_rank FROM "
            f"(SELECT id, available_at, {rank} FROM wide) ranked "
            "WHERE fair_rank <= 16 * :limit "
            "ORDER BY fair_rank, available_at) k JOIN runs ON runs.id = k.id "
            f"WHERE {self.claimable(n_targets, 'runs')} AND runs.id NOT IN (SELECT id FROM near) "
            "AND runs.id NOT IN (SELECT id FROM spread) "
            "ORDER BY k.fair_rank, k.available_at LIMIT :limit FOR UPDATE OF runs SKIP LOCKED), "
            "far AS (SELECT runs.id FROM runs JOIN "
            f"(SELECT id, available_at, {rank} FROM runs WHERE {self.claimable(n_targets)}) k "
            f"ON k.id = runs.id WHERE {self.claimable(n_targets, 'runs')} "
            "AND runs.id NOT IN (SELECT id FROM near) AND runs.id NOT IN (SELECT id FROM mid) "
            "AND runs.id NOT IN (SELECT id FROM spread) "
            "AND EXISTS (SELECT 1 FROM wide GROUP BY tenant_id "
            "HAVING SUM(q) >= 16 * :limit OR COUNT(*) > 16 * :limit) "
            "ORDER BY k.fair_rank, k.available_at LIMIT :limit FOR UPDATE OF runs SKIP LOCKED), "
            "c AS (SELECT id FROM spread UNION ALL SELECT id FROM near "
            "UNION ALL SELECT id FROM mid UNION ALL SELECT id FROM far LIMIT :limit) "
            f"UPDATE runs r SET status = '{RunStatus.RUNNING}', lease_owner = :owner, "
            f"write_token = :token, lease_epoch = r.lease_epoch + 1, "
            f"lease_expires_at = {now} + :lease, updated_at = {now}, "
            "event_seq = r.event_seq + 1, "
            f"resumes = r.resumes + (CASE WHEN r.status = '{RunStatus.RUNNING}' THEN 1 ELSE 0 END) "
            f"FROM c WHERE r.id = c.id RETURNING {returning}, r.event_seq"
        )

    # errors ---------------------------------------------------------------------

    skip_locked = " FOR UPDATE SKIP LOCKED"

    def is_transient(self, exc: BaseException) -> bool:
        # deadlock_detected, serialization_failure: PostgreSQL rolled the work back.
        return isinstance(exc, psycopg.Error) and exc.sqlstate in ("40P01", "40001")

    def is_disconnect(self, exc: BaseException) -> bool:
        if isinstance(exc, psycopg.InterfaceError):
            return True  # "the connection is closed" and friends
        if not isinstance(exc, psycopg.Error):
            return False
        state = exc.sqlstate
        if state is None:
            # Client-side failures (server closed the connection, consuming
            # input failed, connection refused) carry no SQLSTATE. So does a statement
            # libpq refuses to send, its connection intact: retrying it on a new
            # connection would fail the same way forever.
            if TOO_MANY_PARAMETERS in str(exc):
                return False
            return isinstance(exc, psycopg.OperationalError)
        return state.startswith("08") or state in DISCONNECT_STATES

    def lost_cause(self, conn: Any, exc: BaseException) -> str:
        return lost_cause(conn, exc)

    def translate(self, exc: BaseException) -> StoreError:
        if isinstance(exc, StoreError):
            return exc
        if isinstance(exc, UsageError):
            return StoreUnavailable(str(exc))
        text = one_line(str(exc))
        if self.is_disconnect(exc):
            return StoreUnavailable(
                f"lost the connection to PostgreSQL at {self.where} ({text}); "
                "is the server running? check --db"
            )
        failure = self._host_failure(exc, text)
        if failure is not None:
            return failure
        if isinstance(exc, (pg_errors.QueryCanceled, pg_errors.LockNotAvailable)):
            # The store's statements are short: one that runs out its statement (or
            # lock) timeout waited for a lock another session holds (an open
            # transaction, a VACUUM FULL, a migration), or was cancelled by an
            # operator. Not what the run wrote: retried, the run given back, and a
            # heartbeat meeting it does not stop the worker.
            return StoreUnavailable(
                f"database statement timed out: PostgreSQL at {self.where} ({text}); "
                "look for long transactions holding locks (pg_stat_activity)"
            )
        if isinstance(exc, pg_errors.UndefinedTable):
            return StoreError(
                f"PostgreSQL at {self.where} has no agentledger schema ({text}); "
                "open the store once to migrate it, or check --db"
            )
        return StoreError(f"PostgreSQL error at {self.where}: {text}")

    def _host_failure(self, exc: BaseException, text: str) -> StoreUnavailable | None:
        """The cause of a write the server refused for its own state (disk full, out of
        resources, I/O error, read-only), not for what was written; None otherwise."""
        state = exc.sqlstate if isinstance(exc, psycopg.Error) else None
        if state is None:
            return None
        where = f"PostgreSQL at {self.where}"
        if state == "53100":
            return StoreUnavailable(f"database disk full: {where} ({text}); free some space")
        if state.startswith("53"):
            return StoreUnavailable(f"database out of resources: {where} ({text})")
        if state.startswith("58"):
            return StoreUnavailable(f"database I/O error: {where} ({text}); check its disk")
        if state == "25006":
            return StoreUnavailable(
                f"database is read-only: {where} ({text}); is it a standby, or set "
                "read-only (default_transaction_read_only)?"
            )
        return None


__all__ = ["PostgresDialect"]
