"""The daily rollup: finished runs and delivered outbox rows folded into per-day sums
(migration 0180; docs/architecture.md, "The daily rollup").

A run is in exactly one place at any moment: folded (``runs.rolled = 1``, its figures
in ``rollup_runs``, ``rollup_durations`` and ``rollup_failing``) or not (``rolled = 0``,
read live through the partial index ``runs_unrolled``). Folding flips ``rolled`` and adds
the run's figures in one transaction, and the flip is guarded (``AND rolled = 0``), so a
run is added once whatever the number of folders, processes or crashes: two folders that
pick the same run serialize on its row, and the second finds it folded and skips it; a
fold killed before its commit leaves nothing. Deleting a folded run (a prune) leaves the
sums as they are.

What is folded by :func:`fold_pending`: every run in a terminal state and every
delivered outbox row; a prune folds what it removes and is not folded yet
(:func:`fold_runs`, in its transaction). A failed or ``needs_human`` run can still be
resumed or have a step settled: the transaction that does so unfolds it first
(:func:`unfold_run`: its figures, as they were folded, taken out), so it is read live
until it is folded again.

Durations (submit to last update) go into fixed log-spaced buckets: bucket 0 holds
under a millisecond, bucket ``i >= 1`` holds [1 ms * r^(i-1), 1 ms * r^i) with
r = 10^(1/20), so a percentile read from the buckets is the geometric middle of the
bucket the exact nearest-rank value is in: within 6 % of it (:data:`PRECISION`).
"""

from __future__ import annotations

import math
from typing import Any

from agentledger.records import RunStatus
from agentledger.store._queries.common import in_list
from agentledger.store._tx import Tx

#: The states a run is folded in: the terminal ones.
FINAL = tuple(sorted(RunStatus.TERMINAL))
#: The terminal states a run can leave (resume) or change in (a settled step).
_REOPENABLE = ("failed", "needs_human")
#: Outbox states folded by the background pass (a dropped row can be revived by a
#: resume).
OUTBOX_FINAL = ("delivered",)
#: Outbox states the settled history counts (the rest is the live backlog).
OUTBOX_SETTLED_NOT = ("pending", "dead")
#: Runs per fold transaction.
BATCH = 1000

_PER_DECADE = 20
_FLOOR = 1e-3  # seconds: the upper edge of bucket 0
#: The largest relative error of a percentile read from the buckets.
PRECISION = 10 ** (1 / (2 * _PER_DECADE)) - 1


def bucket_of(seconds: float) -> int:
    """The duration bucket of ``seconds``."""
    if not seconds >= _FLOOR:  # NaN and negatives too
        return 0
    i = math.floor(_PER_DECADE * math.log10(seconds / _FLOOR)) + 1
    # log10 may land a hair under an exact edge: the edges are the truth.
    while i > 1 and seconds < bucket_floor(i):
        i -= 1
    while seconds >= bucket_floor(i + 1):
        i += 1
    return i


def bucket_floor(i: int) -> float:
    """The lower edge of bucket ``i`` (0 for bucket 0)."""
    return 0.0 if i <= 0 else _FLOOR * 10 ** ((i - 1) / _PER_DECADE)


def bucket_value(i: int) -> float:
    """The figure a percentile in bucket ``i`` is reported as: its geometric middle
    (0 for bucket 0, under a millisecond)."""
    return 0.0 if i <= 0 else _FLOOR * 10 ** ((i - 0.5) / _PER_DECADE)


def unfolded(alias: str = "", states: tuple[str, ...] = tuple(RunStatus.ALL)) -> str:
    """The condition that reads the runs not folded (in ``states``) through the partial
    index ``runs_unrolled``: its leading column, the state, is named, so both planners
    range over the index's few rows instead of the tenant's whole history."""
    prefix = f"{alias}." if alias else ""
    return f"{prefix}rolled = 0 AND {prefix}status IN ({_quoted(states)})"


def day_sql(tx: Tx, column: str) -> str:
    """The UTC day number of a UNIX-seconds column, rounded down on both backends
    (PostgreSQL's CAST rounds)."""
    if tx.dialect.name == "sqlite":
        return f"CAST({column} / 86400 AS INTEGER)"
    return f"CAST(FLOOR({column} / 86400) AS INTEGER)"


def failing_sql(alias: str = "r") -> tuple[str, str]:
    """The failing step of a failed or ``needs_human`` run: (the JOIN to add after
    ``FROM runs {alias}``, the class expression). Its first failed or unsettled step
    (compensations and the compensation decision aside); a run without one failed
    outside any step (``s.name`` NULL). Its class: the step's error class, else why
    the run was handed over."""
    join = (
        f"LEFT JOIN steps s ON s.run_id = {alias}.id AND s.step_no = ("
        f"SELECT MIN(x.step_no) FROM steps x WHERE x.run_id = {alias}.id "
        "AND x.status IN ('failed', 'unknown', 'started', 'retrying') "
        "AND x.kind NOT IN ('compensation', 'decision'))"
    )
    return join, f"COALESCE(s.error_class, {alias}.handover_reason, '')"


_RETURNING = (
    "RETURNING id, tenant_id, name, version, status, usage_simulated, cost_usd, tokens, "
    "resumes, created_at, updated_at"
)


def _fold(tx: Tx, where: str, params: dict[str, Any]) -> int:
    """Fold the unfolded terminal runs ``where`` selects (a condition on ``runs``) and
    add their figures; how many. The flip comes first, guarded, and hands back exactly
    the rows it flipped."""
    flipped = tx.fetchall(
        f"UPDATE runs SET rolled = 1 WHERE rolled = 0 AND status IN ({_quoted(FINAL)}) "
        f"AND {where} {_RETURNING}",
        params,
    )
    _add(tx, flipped, 1)
    return len(flipped)


def unfold_run(tx: Tx, run_id: str, states: tuple[str, ...] = _REOPENABLE) -> bool:
    """Take a folded run's figures (a failed or ``needs_human`` one, or one in
    ``states``) back out of the rollup, before the transaction resumes it or settles one
    of its steps (the first write to its row): it is read live from then on, and folded
    again once it ends again."""
    if tx.dialect.name == "postgres":
        # The row is locked first, whatever its flag: a fold that flipped it and has not
        # committed is waited for, and its flip is then seen. Without the lock the
        # guarded unfold below would read the flag as last committed (still clear),
        # take nothing out, and the run would go back to work left folded. (SQLite: the
        # write transaction already holds the file, so no fold is under way.)
        tx.fetchall("SELECT id FROM runs WHERE id = :id FOR UPDATE", {"id": run_id})
    flipped = tx.fetchall(
        f"UPDATE runs SET rolled = 0 WHERE id = :id AND rolled = 1 "
        f"AND status IN ({_quoted(states)}) {_RETURNING}",
        {"id": run_id},
    )
    _add(tx, flipped, -1)
    return bool(flipped)


_GROUP = ("tenant_id", "name", "version", "day")
_RUN_KEY = (*_GROUP, "status", "simulated")


def _upsert(
    tx: Tx,
    table: str,
    keys: tuple[str, ...],
    key: tuple[Any, ...],
    sums: dict[str, float],
    sign: int,
) -> None:
    """Add ``sign`` times ``sums`` to ``table``'s row ``key``. The callers go through
    their rows sorted, so two folders take the rows' locks in one order. A row taken
    back to no runs goes (a float sum may keep a trace of what was taken out)."""
    params = {f"k{i}": v for i, v in enumerate(key)}
    params.update({f"s_{c}": sign * v for c, v in sums.items()})
    columns = (*keys, *sums)
    values = ", ".join([f":k{i}" for i in range(len(keys))] + [f":s_{c}" for c in sums])
    adds = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in sums)
    tx.execute(
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({values}) "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {adds}",
        params,
    )
    if sign < 0:
        where = " AND ".join(f"{c} = :k{i}" for i, c in enumerate(keys))
        count = "runs" if "runs" in sums else "n"
        tx.execute(f"DELETE FROM {table} WHERE {where} AND {count} = 0", params)


def _add(tx: Tx, flipped: list[dict[str, Any]], sign: int) -> None:
    """Add (``sign`` 1) or take out (-1) these runs' figures, read from their rows and
    their journals as they are now."""
    if not flipped:
        return
    runs: dict[tuple[Any, ...], list[float]] = {}
    durations: dict[tuple[Any, ...], int] = {}
    bad: list[str] = []
    day_of: dict[str, tuple[Any, ...]] = {}
    for r in flipped:
        day = math.floor(float(r["created_at"]) / 86400)
        seconds = float(r["updated_at"]) - float(r["created_at"])
        group = (r["tenant_id"], r["name"], r["version"], day)
        key = (*group, r["status"], 1 if r["usage_simulated"] else 0)
        acc = runs.setdefault(key, [0, 0.0, 0, 0, 0.0])
        acc[0] += 1
        acc[1] += float(r["cost_usd"] or 0)
        acc[2] += int(r["tokens"] or 0)
        acc[3] += int(r["resumes"] or 0)
        acc[4] += seconds
        if r["status"] == "completed":
            b = (*group, bucket_of(seconds))
            durations[b] = durations.get(b, 0) + 1
        elif r["status"] in ("failed", "needs_human"):
            bad.append(str(r["id"]))
            day_of[str(r["id"])] = group
    for key, (n, cost, tokens, resumes, secs) in sorted(runs.items()):
        _upsert(tx, "rollup_runs", _RUN_KEY, key,
                {"runs": n, "cost_usd": cost, "tokens": tokens, "resumes": resumes,
                 "seconds": secs}, sign)  # fmt: skip
    for key, n in sorted(durations.items()):
        _upsert(tx, "rollup_durations", (*_GROUP, "bucket"), key, {"runs": n}, sign)
    if bad:
        _add_failing(tx, bad, day_of, sign)


def _add_failing(tx: Tx, run_ids: list[str], day_of: dict[str, tuple[Any, ...]], sign: int) -> None:
    join, cls = failing_sql()
    failing: dict[tuple[Any, ...], list[float]] = {}
    for start in range(0, len(run_ids), 500):
        marks, params = in_list("f", run_ids[start : start + 500])
        for r in tx.fetchall(
            f"SELECT r.id, COALESCE(s.name, '(no step)') AS step, {cls} AS error_class, "
            f"r.cost_usd, r.updated_at - r.created_at AS secs FROM runs r {join} "
            f"WHERE r.id IN ({marks})",
            params,
        ):
            key = (*day_of[str(r["id"])], r["step"], r["error_class"] or "")
            acc = failing.setdefault(key, [0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += float(r["cost_usd"] or 0)
            acc[2] += float(r["secs"] or 0)
    for key, (n, cost, secs) in sorted(failing.items()):
        _upsert(tx, "rollup_failing", (*_GROUP, "step", "error_class"), key,
                {"runs": n, "cost_usd": cost, "seconds": secs}, sign)  # fmt: skip


def _fold_outbox(tx: Tx, where: str, params: dict[str, Any]) -> int:
    flipped = tx.fetchall(
        f"UPDATE outbox SET rolled = 1 WHERE rolled = 0 AND {where} RETURNING status", params
    )
    counts: dict[str, int] = {}
    for r in flipped:
        if r["status"] not in OUTBOX_SETTLED_NOT:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
    for status, n in sorted(counts.items()):
        _upsert(tx, "rollup_outbox", ("status",), (status,), {"n": n}, 1)
    return len(flipped)


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def has_pending(tx: Tx) -> bool:
    """Whether anything waits to be folded (a read, through the partial indexes)."""
    found = tx.fetchall(
        f"SELECT 1 AS x FROM runs WHERE {unfolded(states=FINAL)} UNION ALL "
        f"SELECT 1 FROM outbox WHERE rolled = 0 AND status IN ({_quoted(OUTBOX_FINAL)}) "
        "LIMIT 1"
    )
    return bool(found)


def fold_pending(tx: Tx, limit: int = BATCH) -> int:
    """One fold transaction: up to ``limit`` runs in a terminal state and up to
    ``limit`` delivered outbox rows not folded yet (found through the partial indexes
    ``runs_unrolled`` and ``outbox_unrolled``); how many of both were folded."""
    # The rows are locked as they are picked, and a row another transaction holds (a
    # resume or a settle under way) is skipped, not waited for: a fold never stalls, nor
    # holds a thousand runs' rows while it waits on one (SQLite: one writer at a time).
    lock = tx.dialect.skip_locked
    ids = [
        str(r["id"])
        for r in tx.fetchall(
            f"SELECT id FROM runs WHERE {unfolded(states=FINAL)} LIMIT :n{lock}",
            {"n": int(limit)},
        )
    ]
    keys = [
        str(r["key"])
        for r in tx.fetchall(
            "SELECT key FROM outbox WHERE rolled = 0 "
            f"AND status IN ({_quoted(OUTBOX_FINAL)}) LIMIT :n{lock}",
            {"n": int(limit)},
        )
    ]
    n = 0
    for start in range(0, len(ids), 500):
        marks, params = in_list("k", ids[start : start + 500])
        n += _fold(tx, f"id IN ({marks})", params)
    for start in range(0, len(keys), 500):
        marks, params = in_list("k", keys[start : start + 500])
        n += _fold_outbox(tx, f"key IN ({marks}) AND status IN ({_quoted(OUTBOX_FINAL)})", params)
    return n


def fold_runs(tx: Tx, run_ids: list[str], outbox_only: str = "") -> int:
    """Fold these runs, whatever their terminal state, with their outbox rows (those
    ``outbox_only``, a condition on ``outbox`` with ``{marks}`` for the ids, selects):
    what a prune calls in its transaction right before it deletes them."""
    folded = 0
    for start in range(0, len(run_ids), 500):
        marks, params = in_list("k", run_ids[start : start + 500])
        folded += _fold(tx, f"id IN ({marks})", params)
        _fold_outbox(tx, f"run_id IN ({marks}){outbox_only.format(marks=marks)}", params)
    return folded
