"""The store under growth: ``agentledger bench --growth N [--db URL] [--json]``.

In a database of its own (PostgreSQL: a new database on the server ``--db`` names,
created after the schema's ``migrate`` and dropped at the end; SQLite: a new file), the
benchmark

1. executes one real template run (``bench_payload``: 10 steps of 400-character
   messages, run by an in-process worker, its events sealed into the audit chain) and
   submits ``queued`` runs spread over 10 tenants (never executed: the claim's backlog);
2. times the hot queries (``before``);
3. fills the tables with ``N`` finished steps in server-side ``INSERT ... SELECT`` over
   a series (``generate_series`` on PostgreSQL, a recursive CTE on SQLite): copies of
   the template run with its journal rows and events (ids, tenants, chain numbers and
   times rewritten), completed, failed or cancelled, over a year of ``created_at``,
   and one delivered outbox row per run; folds them into the daily rollup as the
   workers' background pass would have as they finished (timed: ``fold_seconds``);
   then ``VACUUM ANALYZE`` (SQLite: ``ANALYZE``);
4. times the same queries again (``after``) and reads the table and index sizes.

Timed, interleaved (one of each per round, so the noise of a shared machine hits them
alike), through the store's own operations:

- ``claim``: ``claim_runs`` of 50 runs from the queued backlog (then put back queued);
- ``stuck``: the stuck-run query a worker's detector and ``/metrics`` run;
- ``metrics_live``: what every ``/metrics`` scrape reads (the live part);
- ``metrics_history``: the settled history a process reads on its first scrape and
  then once a minute in the background (fewer rounds: it was a scan of the history;
  it reads the daily rollup and the runs not folded);
- ``journal``: a random finished run's journal and events (``runs show``);
- ``runs_list`` / ``runs_list_failed`` / ``runs_list_needs_human``: ``runs list``'s first
  page: all runs, ``--status failed`` (5 % of the history) and ``--status needs_human``
  (none in the history: the state an operator lists, rare by design).

Figures: p50 / p95 / p99 / max in milliseconds per query and phase, and the sizes.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentledger import _rollup as rollup
from agentledger import _sealer as sealer
from agentledger.observe._queries.metrics import snapshot
from agentledger.observe._stuck import StuckPolicy
from agentledger.records import RunStatus
from agentledger.store import Store, open_store
from agentledger.store._queries.events import list_events
from agentledger.store._queries.journal import load_journal
from agentledger.store._tx import Tx
from agentledger_bench.apps import app as bench_app
from agentledger_bench.engine_runs import execute
from agentledger_bench.stats import percentile

TEMPLATE_STEPS = 10
PAYLOAD = 400  # characters of each step's output
QUEUED_RUNS = 300
TENANTS = 20
YEAR = 365 * 86400.0
CHUNK_RUNS = 20_000  # runs per INSERT statement (one transaction each)
CHAIN_BASE = 10**12  # chain numbers of the copies, past any real chain's
CLAIM_LIMIT = 50
QUERIES = (
    "claim",
    "stuck",
    "metrics_live",
    "metrics_history",
    "journal",
    "runs_list",
    "runs_list_failed",
    "runs_list_needs_human",
)
Say = Callable[[str], None]


# the database ------------------------------------------------------------------------


def _is_postgres(url: str | None) -> bool:
    return bool(url) and str(url).startswith(("postgresql://", "postgres://"))


def _create_pg(server_url: str) -> str:
    """A new empty database on ``server_url``'s server; returns its URL."""
    import psycopg

    name = f"agentledger_growth_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def _drop_pg(server_url: str, url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# the fill ----------------------------------------------------------------------------


def _columns(store: Store, conn: Any, table: str) -> list[str]:
    d = store.dialect
    if d.name == "postgres":
        rows = d.fetchall(
            conn,
            "SELECT column_name AS name FROM information_schema.columns WHERE table_name = "
            ":table AND table_schema = current_schema() ORDER BY ordinal_position",
            {"table": table},
        )
    else:
        rows = d.fetchall(conn, f"PRAGMA table_info({table})")
    d.commit(conn)
    return [str(r["name"]) for r in rows]


def _series(store: Store) -> tuple[str, str]:
    """(prefix, source) of the row series ``g(i)`` from :a to :b."""
    if store.dialect.name == "postgres":
        return "", "generate_series(CAST(:a AS BIGINT), CAST(:b AS BIGINT)) AS g(i)"
    return "WITH RECURSIVE g(i) AS (SELECT :a UNION ALL SELECT i + 1 FROM g WHERE i < :b) ", "g"


def _copy_sql(store: Store, conn: Any, table: str, alias: str, overrides: dict[str, str]) -> str:
    """INSERT of ``table``'s template rows once per series value, with ``overrides``."""
    columns = [c for c in _columns(store, conn, table) if overrides.get(c) != "-"]
    picks = ", ".join(overrides.get(c, f"{alias}.{c}") for c in columns)
    prefix, source = _series(store)
    where = "id" if table == "runs" else "run_id"
    return (
        f"{prefix}INSERT INTO {table} ({', '.join(columns)}) SELECT {picks} "
        f"FROM {source} CROSS JOIN {table} {alias} WHERE {alias}.{where} = :tmpl"
    )


_RUN_ID = "('h' || CAST(10000000000 + g.i AS TEXT))"
_TENANT = f"('t' || CAST(g.i % {TENANTS} AS TEXT))"
_CREATED = "(:t0 + g.i * :dt)"
_STATUS = (
    f"CASE WHEN g.i % 20 = 7 THEN '{RunStatus.FAILED}' "
    f"WHEN g.i % 50 = 3 THEN '{RunStatus.CANCELLED}' ELSE '{RunStatus.COMPLETED}' END"
)


def _fill_statements(store: Store, conn: Any) -> list[str]:
    shift = "(:t0 + g.i * :dt - :tc + {col})"
    runs = _copy_sql(
        store, conn, "runs", "r",
        {
            "id": _RUN_ID, "tenant_id": _TENANT, "status": _STATUS,
            "request_id": "('hq' || CAST(g.i AS TEXT))", "idempotency_key": "NULL",
            "created_at": _CREATED, "updated_at": shift.format(col="r.updated_at"),
            "available_at": shift.format(col="r.available_at"),
            "error": "CASE WHEN g.i % 20 = 7 THEN "
            "'{\"class\": \"ToolError\", \"message\": \"the provider said no\"}' "
            "ELSE NULL END",
            "result": "CASE WHEN g.i % 20 = 7 OR g.i % 50 = 3 THEN NULL ELSE r.result END",
            "lease_owner": "NULL", "lease_expires_at": "NULL", "write_token": "NULL",
            "stuck_mark": "NULL", "rolled": "0",
        },
    )  # fmt: skip
    steps = _copy_sql(
        store, conn, "steps", "s",
        {
            "run_id": _RUN_ID, "started_at": shift.format(col="s.started_at"),
            "idempotency_key": "CASE WHEN s.idempotency_key IS NULL THEN NULL "
            f"ELSE s.idempotency_key || {_RUN_ID} END",
        },
    )  # fmt: skip
    events = _copy_sql(
        store, conn, "events", "e",
        {
            "id": "-", "run_id": _RUN_ID, "tenant_id": _TENANT,
            "at": shift.format(col="e.at"),
            "chain_no": f"CASE WHEN e.chain_no IS NULL THEN NULL "
            f"ELSE {CHAIN_BASE} + g.i * 1000 + e.seq END",
        },
    )  # fmt: skip
    prefix, source = _series(store)
    outbox = (
        f"{prefix}INSERT INTO outbox (key, run_id, step_no, tool, payload, attempts, "
        "next_attempt_at, status, history, created_at, updated_at) SELECT "
        f"('hk' || CAST(g.i AS TEXT)), {_RUN_ID}, 1, 'email', :payload, 1, {_CREATED}, "
        f"'delivered', '[]', {_CREATED}, {_CREATED} + 2 FROM {source}"
    )
    return [runs, steps, events, outbox]


def _fill(store: Store, template: str, created_at: float, n_runs: int, say: Say) -> float:
    """Copy the template run ``n_runs`` times; returns the seconds it took."""
    d = store.dialect
    conn = d.connect()
    start = time.perf_counter()
    try:
        if d.name == "postgres":  # the store's session timeout is for its own statements
            d.execute(conn, "SET statement_timeout = 0")
            d.commit(conn)
        statements = _fill_statements(store, conn)
        params = {
            "tmpl": template,
            "tc": created_at,
            "t0": time.time() - YEAR - 86400,
            "dt": YEAR / max(n_runs, 1),
            "payload": '{"to": "guest@example.com", "template": "booking_confirmed", '
            '"booking": "' + "b" * 120 + '"}',
        }
        d.commit(conn)
        for a in range(0, n_runs, CHUNK_RUNS):
            b = min(n_runs, a + CHUNK_RUNS) - 1
            d.begin_write(conn)
            for sql in statements:
                d.execute(conn, sql, {**params, "a": a, "b": b})
            d.commit(conn)
            done = b + 1
            rate = done * TEMPLATE_STEPS / (time.perf_counter() - start)
            say(f"filled {done:,}/{n_runs:,} runs ({done * TEMPLATE_STEPS:,} steps, "
                f"{rate:,.0f} steps/s)")  # fmt: skip
    finally:
        d.close(conn)
    return time.perf_counter() - start


def _analyze(store: Store, say: Say) -> None:
    d = store.dialect
    conn = d.connect()
    try:
        say("VACUUM ANALYZE" if d.name == "postgres" else "ANALYZE")
        d.commit(conn)
        if d.name == "postgres":
            conn.autocommit = True  # VACUUM runs outside a transaction
            conn.execute("VACUUM ANALYZE")
            conn.autocommit = False
        else:
            conn.execute("ANALYZE")
    finally:
        d.close(conn)


# sizes -------------------------------------------------------------------------------

TABLES = ("runs", "steps", "events", "outbox")


def _sizes(store: Store) -> dict[str, Any]:
    d = store.dialect
    conn = d.connect()
    out: dict[str, Any] = {}
    try:
        if d.name == "postgres":
            d.execute(conn, "SET statement_timeout = 0")  # COUNT(*) of the filled tables
            for table in TABLES:
                (row,) = d.fetchall(
                    conn,
                    f"SELECT (SELECT COUNT(*) FROM {table}) AS n, pg_relation_size(:t) AS tb, "
                    "pg_indexes_size(:t) AS ib, pg_total_relation_size(:t) AS total",
                    {"t": table},
                )
                indexes = d.fetchall(
                    conn,
                    "SELECT indexrelname AS name, pg_relation_size(indexrelid) AS size "
                    "FROM pg_stat_user_indexes WHERE relname = :t ORDER BY 2 DESC",
                    {"t": table},
                )
                out[table] = {
                    "rows": int(row["n"]), "table_bytes": int(row["tb"]),
                    "index_bytes": int(row["ib"]), "total_bytes": int(row["total"]),
                    "indexes": {r["name"]: int(r["size"]) for r in indexes},
                }  # fmt: skip
            (row,) = d.fetchall(conn, "SELECT pg_database_size(current_database()) AS size")
            out["database_bytes"] = int(row["size"])
        else:
            for table in TABLES:
                n = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                out[table] = {"rows": int(n)}
            try:
                found = conn.execute(
                    "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"
                ).fetchall()
                by_name = {name: int(size) for name, size in found}
                for table in TABLES:
                    out[table]["total_bytes"] = sum(
                        s for n, s in by_name.items() if n == table or n.startswith(table)
                    )
            except sqlite3.Error:
                pass
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            size = conn.execute("PRAGMA page_size").fetchone()[0]
            out["database_bytes"] = int(pages * size)
        d.commit(conn)
    finally:
        d.close(conn)
    return out


# the queries -------------------------------------------------------------------------


def _requeue(tx: Tx, ids: list[str]) -> None:
    """Put claimed runs back as they were: queued, no lease."""
    params: dict[str, Any] = {f"i{n}": run_id for n, run_id in enumerate(ids)}
    marks = ", ".join(f":i{n}" for n in range(len(ids)))
    tx.execute(
        "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
        f"write_token = NULL WHERE id IN ({marks})",
        params,
    )


def _journal(tx: Tx, run_id: str) -> int:
    return len(load_journal(tx, run_id)) + len(list_events(tx, run_id))


def _percentiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(percentile(ordered, q), 3)

    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 3),
        "p95_ms": at(0.95),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1], 3),
    }


async def _measure(
    store: Store, target: str, finished: Callable[[], str], rounds: int, history_rounds: int
) -> dict[str, Any]:
    policy = StuckPolicy(after=3600)

    async def claim() -> None:
        got = await store.claim_runs("bench-growth", [target], CLAIM_LIMIT, 600.0)
        ms = (time.perf_counter() - started) * 1000
        times["claim"].append(ms)
        if got:
            await store.transact(_requeue, [r.id for r in got])
        claimed.append(len(got))

    ops: dict[str, Callable[[], Awaitable[Any]]] = {
        "stuck": lambda: policy.find(store),
        "metrics_live": lambda: store.read(snapshot, live=True, settled=False),
        "metrics_history": lambda: store.read(snapshot, live=False, settled=True),
        "runs_list": lambda: store.list_runs(limit=50),
        "runs_list_failed": lambda: store.list_runs(status=RunStatus.FAILED, limit=50),
        "runs_list_needs_human": lambda: store.list_runs(status=RunStatus.NEEDS_HUMAN, limit=50),
    }
    times: dict[str, list[float]] = {q: [] for q in QUERIES}
    claimed: list[int] = []
    for i in range(rounds + 1):  # round 0 warms the caches and is not counted
        started = time.perf_counter()
        await claim()
        for name, op in ops.items():
            if name == "metrics_history" and i % max(1, rounds // history_rounds):
                continue
            started = time.perf_counter()
            await op()
            times[name].append((time.perf_counter() - started) * 1000)
        run_id = finished()
        started = time.perf_counter()
        await store.read(_journal, run_id)
        times["journal"].append((time.perf_counter() - started) * 1000)
        if i == 0:
            for values in times.values():
                values.clear()
    out: dict[str, Any] = {q: _percentiles(times[q]) for q in QUERIES}
    out["claimed_per_claim"] = min(claimed) if claimed else 0
    return out


# the benchmark -----------------------------------------------------------------------


async def _prepare(store: Store, say: Say) -> tuple[str, str]:
    """The template run (executed, sealed) and the queued backlog; (template id, target)."""
    await execute(store, "bench_payload", [{"steps": TEMPLATE_STEPS, "size": PAYLOAD}], 1)
    while await sealer.seal_once(store):
        pass
    (template,) = await store.list_runs(name="bench_payload", limit=1)
    queued = []
    for i in range(QUEUED_RUNS):
        queued.append(
            await bench_app.submit(store, "bench_step", {"steps": 1}, tenant_id=f"q{i % 10}")
        )
    run = await store.get_run(queued[0])
    assert run is not None
    say(f"template run {template.id} executed; {QUEUED_RUNS} queued runs submitted")
    return template.id, run.target


async def run_growth(
    db: str | None, steps: int, rounds: int = 200, keep: bool = False, say: Say | None = None
) -> dict[str, Any]:
    """The whole benchmark; returns the JSON-able report."""
    say = say or (lambda _msg: None)
    n_runs = max(1, steps // TEMPLATE_STEPS)
    postgres = _is_postgres(db)
    tmp = None
    if postgres:
        assert db is not None
        url = await asyncio.to_thread(_create_pg, db)
    elif db:
        url = db
    else:
        tmp = tempfile.TemporaryDirectory(prefix=".agentledger-growth-", dir=".")
        url = f"sqlite:///{Path(tmp.name) / 'growth.db'}"
    say(f"database {url}")
    report: dict[str, Any] = {
        "backend": "postgresql" if postgres else "sqlite",
        "steps": n_runs * TEMPLATE_STEPS,
        "runs": n_runs,
        "queued_runs": QUEUED_RUNS,
        "rounds": rounds,
        "payload_chars": PAYLOAD,
        "cpus": os.cpu_count(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "database": urlsplit(url).path.lstrip("/") if postgres else "a temporary SQLite file",
    }
    store = open_store(url)
    try:
        await store.open()
        try:
            template, target = await _prepare(store, say)
            history_rounds = max(3, rounds // 20)
            say("timing the queries before the fill")
            report["before"] = await _measure(
                store, target, lambda: template, rounds, history_rounds
            )
            report["sizes_before"] = await asyncio.to_thread(_sizes, store)
            say(f"filling {n_runs:,} runs x {TEMPLATE_STEPS} steps")
            made = await store.get_run(template)
            assert made is not None
            fill = await asyncio.to_thread(_fill, store, template, made.created_at, n_runs, say)
            report["fill_seconds"] = round(fill, 1)
            # The copies arrive finished and not folded; in production the workers'
            # background pass folds runs as they finish (agentledger/_rollup.py): that
            # pass, timed, over the whole fill.
            # Statistics first, as autovacuum keeps them for a production store: planned
            # for the empty tables, the fold's statements would scan what they fold.
            await asyncio.to_thread(_analyze, store, say)
            say("folding the rollup")
            began = time.perf_counter()
            report["folded"] = await rollup.fold_once(store, max_batches=None)
            report["fold_seconds"] = round(time.perf_counter() - began, 1)
            await asyncio.to_thread(_analyze, store, say)
            rng = random.Random(5)

            def finished() -> str:
                return f"h{10_000_000_000 + rng.randrange(n_runs)}"

            say("timing the queries after the fill")
            report["after"] = await _measure(store, target, finished, rounds, history_rounds)
            report["sizes_after"] = await asyncio.to_thread(_sizes, store)
        finally:
            await store.close()
    finally:
        report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        if keep:
            report["kept"] = url
        elif postgres:
            assert db is not None
            await asyncio.to_thread(_drop_pg, db, url)
        if tmp is not None and not keep:
            tmp.cleanup()
    return report
