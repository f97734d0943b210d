"""Retention: finished runs removed with their journal, events, outbox rows and effects,
the front of the tenant's audit chain replaced by a signed summary (docs/architecture.md,
"Retention").

What is never removed: a run that is not in a terminal state of the policy; a run with
an outcome not settled (a step ``started`` or ``unknown``, an effect claimed without a
result), an outbox row or webhook delivery not delivered or dead, an approval not
decided, or an event not sealed yet; and any audit record the chain still needs.

The audit chain is per tenant and runs interleave in it, so pruning a run wherever its
records are would cut holes in the middle of the chain. Only a *prefix* of a tenant's
chain is pruned: records 1..K, where every record belongs to a prunable run (or is a
tenant record under no run -- a document or memory change -- older than the cutoff),
and every run with a record in 1..K has all its records in 1..K. Those records are
replaced by one row of ``audit_pruned``: K, record K's hash (record K+1's
``prev_hash``), how many of each type, a digest folded over their hashes in order, and
a signature under ``AGENTLEDGER_AUDIT_KEY``. ``audit verify`` starts the chain from that
summary instead of GENESIS. A prunable run after a record that is not prunable waits
until the prefix reaches it.

The work is done in small transactions (:func:`prune_batch`, ``limit`` records each),
each under the tenant's head lock (the lock sealers take), each re-checking what it
removes: a run that left its terminal state meanwhile (``runs resume``) ends the batch
before its first record. A kill between two batches leaves a consistent state: the
summary covers exactly the records removed, and a run's row goes with its last record,
so a run may have its older records summarized and the rest still present until the
next prune reaches them: such a run is in ``runs_pruning`` meanwhile, and `runs resume`
refuses it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from agentledger import _auditchain as auditchain
from agentledger._auditkey import AuditKey
from agentledger.errors import UsageError
from agentledger.records import RunStatus
from agentledger.store._queries import rollup
from agentledger.store._queries.common import in_list
from agentledger.store._tx import Tx

log = logging.getLogger(__name__)

DEFAULT_STATUSES = ("completed", "failed", "cancelled")
BATCH = 500  # records per prune transaction (and run ids per IN list)

# Tables holding a run's rows by ``run_id``, deleted with its ``runs`` row (effects and
# outbox before steps: which of their rows go is read from the steps).
_RUN_TABLES = ("effects", "outbox", "steps", "approvals", "idempotency_keys", "webhook_deliveries")
# Only the effects and outbox rows keyed by the run's own steps go: a key shared across
# runs (a tool's ``effect_key``, one gift per guest; its ``outbox_key``, one message per
# booking) is the at-most-once ledger of every later run that uses it, and stays.
_ONLY = {
    "effects": " AND key IN (SELECT idempotency_key FROM steps WHERE run_id IN ({marks}))",
    "outbox": " AND EXISTS (SELECT 1 FROM steps s WHERE s.run_id = outbox.run_id "
    "AND outbox.key = s.idempotency_key || ':' || outbox.tool)",
}

# A run whose rows can go: every outcome settled, nothing left to deliver or decide,
# every record sealed (``:cutoff``, ``:t`` and the statuses' and ids' placeholders).
# "Every record sealed" counts the run's events with a hash among all its events, not
# NOT EXISTS an event with ``hash IS NULL``: that condition lets a planner read the
# sealer's backlog (``events_unsealed``, every unsealed event of the store), once per run
# on a large history, where the count can only find the run's own events by
# ``events_run_seq``: the rows a prune of the run deletes anyway. Exact whatever order
# sealers chain a run's events in (a seal may chain a later event of a run before an
# earlier one committed late), so no "last event sealed" shortcut.
_PRUNABLE = (
    "SELECT r.id FROM runs r WHERE r.id IN ({ids}) AND r.tenant_id = :t "
    "AND r.status IN ({statuses}) AND r.updated_at < :cutoff "
    "AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.id "
    "AND s.status IN ('started', 'unknown')) "
    "AND NOT EXISTS (SELECT 1 FROM effects f WHERE f.run_id = r.id AND f.status <> 'done') "
    "AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.run_id = r.id "
    "AND o.status NOT IN ('delivered', 'dead')) "
    "AND NOT EXISTS (SELECT 1 FROM webhook_deliveries w WHERE w.run_id = r.id "
    "AND w.status NOT IN ('delivered', 'dead')) "
    "AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = r.id AND a.decision IS NULL) "
    "AND (SELECT COUNT(*) - COUNT(e.hash) FROM events e WHERE e.run_id = r.id) = 0"
)


@dataclass(frozen=True)
class Policy:
    """What a prune removes of a tenant: runs in ``statuses`` (terminal ones only) last
    changed more than ``older_than`` seconds ago."""

    tenant_id: str
    older_than: float
    statuses: tuple[str, ...] = DEFAULT_STATUSES

    def __post_init__(self) -> None:
        if not (self.older_than >= 0):  # NaN too
            raise UsageError(f"retention of tenant {self.tenant_id}: give an age of 0 or more")
        wrong = [s for s in self.statuses if s not in RunStatus.TERMINAL]
        if wrong or not self.statuses:
            raise UsageError(
                f"--status {','.join(self.statuses)}: only finished runs are pruned; give some "
                f"of {', '.join(sorted(RunStatus.TERMINAL))}"
            )


@dataclass
class Removed:
    """What a prune removed (or, dry, would remove) of one tenant."""

    tenant_id: str
    records: int = 0
    runs: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None  # why it stopped before the planned end, if it did
    broken: bool = False  # it stopped on a record, summary or key that does not verify


def _statuses(policy: Policy) -> tuple[str, dict[str, Any]]:
    return in_list("st", list(policy.statuses))


def prunable_runs(tx: Tx, policy: Policy, cutoff: float, run_ids: list[str]) -> set[str]:
    """Which of ``run_ids`` a prune under ``policy`` may remove now."""
    out: set[str] = set()
    marks_st, params_st = _statuses(policy)
    for start in range(0, len(run_ids), BATCH):
        marks, params = in_list("r", run_ids[start : start + BATCH])
        sql = _PRUNABLE.format(ids=marks, statuses=marks_st)
        found = tx.fetchall(sql, {**params, **params_st, "t": policy.tenant_id, "cutoff": cutoff})
        out.update(str(r["id"]) for r in found)
    return out


def _runless(run_id: str, existing: set[str]) -> bool:
    """A tenant's record under no run: a document or memory change."""
    return run_id not in existing and run_id.startswith(("docs/", "memory/"))


@dataclass
class Link:
    chain_no: int
    run_id: str
    prunable: bool
    last: int  # the last chain position of its run (its own for a record under no run)


def _links(tx: Tx, policy: Policy, cutoff: float, rows: list[dict[str, Any]]) -> list[Link]:
    """Each record of ``rows`` (chain_no, run_id, at): prunable or not, and where its
    run's records end."""
    run_ids = sorted({str(r["run_id"]) for r in rows})
    existing: set[str] = set()
    lasts: dict[str, int] = {}
    for start in range(0, len(run_ids), BATCH):
        marks, params = in_list("r", run_ids[start : start + BATCH])
        existing.update(
            str(r["id"]) for r in tx.fetchall(f"SELECT id FROM runs WHERE id IN ({marks})", params)
        )
        for r in tx.fetchall(
            "SELECT run_id, MAX(chain_no) AS last FROM events "
            f"WHERE run_id IN ({marks}) GROUP BY run_id",
            params,
        ):
            lasts[str(r["run_id"])] = int(r["last"] or 0)
    ok = prunable_runs(tx, policy, cutoff, sorted(existing))
    out = []
    for r in rows:
        run_id, no = str(r["run_id"]), int(r["chain_no"])
        if _runless(run_id, existing):
            out.append(Link(no, run_id, float(r["at"]) < cutoff, no))
        else:
            out.append(Link(no, run_id, run_id in ok, lasts.get(run_id, no)))
    return out


def plan(tx: Tx, policy: Policy, cutoff: float, after: int, limit: int) -> list[Link]:
    """One page of the read-only walk that finds how far a tenant's chain can be pruned:
    the links of up to ``limit`` records after position ``after``."""
    rows = tx.fetchall(
        "SELECT chain_no, run_id, at FROM events WHERE tenant_id = :t AND chain_no > :after "
        "ORDER BY chain_no LIMIT :limit",
        {"t": policy.tenant_id, "after": after, "limit": limit},
    )
    return _links(tx, policy, cutoff, rows)


def pruned_through(tx: Tx, tenant_id: str) -> int:
    """The last chain position already pruned of the tenant (0: none)."""
    chain = auditchain.required("a prune", "removed")
    s = chain.pruned_summary(tx, tenant_id)
    return int(s["last_chain_no"]) if s is not None else 0


class Walk:
    """Where a tenant's prunable prefix ends, fed the links of the chain page by page:
    the last position up to which every record is prunable and every run seen so far
    has all its records (``end``)."""

    def __init__(self, start: int) -> None:
        self.end = start
        self._need = start
        self.done = False

    def feed(self, links: list[Link]) -> None:
        for link in links:
            if not link.prunable:
                self.done = True
                return
            self._need = max(self._need, link.last)
            if self._need <= link.chain_no:
                self.end = link.chain_no


def _lock_head(tx: Tx, tenant_id: str, lock: bool) -> dict[str, Any] | None:
    """The tenant's head, its row locked (PostgreSQL; SQLite's writer is alone) when
    ``lock``: sealers skip the tenant while a batch removes the front of its chain."""
    lock_sql = " FOR UPDATE" if lock and tx.dialect.name == "postgres" else ""
    found = tx.fetchall(
        f"SELECT chain_no, hash, sig FROM audit_heads WHERE tenant_id = :t{lock_sql}",
        {"t": tenant_id},
    )  # fmt: skip
    return found[0] if found else None


def prune_batch(
    tx: Tx,
    policy: Policy,
    cutoff: float,
    end: int,
    key: AuditKey | None,
    limit: int = BATCH,
    dry: bool = False,
    after: int | None = None,
) -> Removed:
    """Remove up to ``limit`` records of the tenant's chain after its pruned span, up to
    position ``end`` (from :class:`Walk`), with the runs whose last record they hold,
    and extend the tenant's summary over them: one transaction. Every record removed is
    verified first (a record that fails is never summarized: the batch stops before it
    and :attr:`Removed.stopped` says why). ``dry``: compute, change nothing, starting
    after position ``after`` (the batches before it, computed but not done)."""
    chain = auditchain.required("a prune", "removed")
    t = policy.tenant_id
    out = Removed(t)
    head = _lock_head(tx, t, lock=not dry)
    if head is None:
        return out
    if not chain.may_extend(t, head, key):
        out.stopped = "the chain is signed under another key, or not signed under this one"
        out.broken = True
        return out
    s = chain.pruned_summary(tx, t)
    if s is not None:
        why = chain.summary_problem(key, t, s)
        if why is not None:
            out.stopped, out.broken = why, True
            return out
    start = int(s["last_chain_no"]) if s else 0
    prev = str(s["last_hash"]) if s else chain.genesis
    signed_at = start if (s is not None and s["sig"] is not None) else None
    if after is not None and after > start:
        at = tx.fetchall(
            "SELECT hash, sig FROM events WHERE tenant_id = :t AND chain_no = :n",
            {"t": t, "n": after},
        )  # fmt: skip
        if not at:
            return out
        start, prev = after, str(at[0]["hash"])
        signed_at = after if at[0]["sig"] is not None else None
    rows = tx.fetchall(
        "SELECT id, run_id, seq, type, actor, at, data, data_digest, redaction_sig, "
        "chain_no, prev_hash, hash, sig, hash_v FROM events WHERE tenant_id = :t "
        "AND chain_no > :start AND chain_no <= :end ORDER BY chain_no LIMIT :limit",
        {"t": t, "start": start, "end": end, "limit": limit},
    )
    run_ids = sorted({str(r["run_id"]) for r in rows})
    if tx.dialect.name == "postgres" and run_ids and not dry:
        # Hold the runs still while they are re-checked and removed (a `runs resume`
        # waits, then finds no run).
        marks, params = in_list("r", run_ids)
        tx.fetchall(f"SELECT id FROM runs WHERE id IN ({marks}) FOR UPDATE", params)
    links = {link.chain_no: link for link in _links(tx, policy, cutoff, rows)}
    taken: list[dict[str, Any]] = []
    expected = start + 1
    for row in rows:
        link = links[int(row["chain_no"])]
        if not link.prunable:
            out.stopped = f"record {link.chain_no} (run {link.run_id}) is no longer prunable"
            break
        problem = chain.check_record(key, t, row, prev, expected, signed_at)
        if problem is not None:
            out.stopped = (
                f"record {problem[0]} does not verify ({problem[1]}); nothing from "
                "it on is pruned: see `agentledger audit verify`"
            )
            out.broken = True
            break
        if signed_at is None and row["sig"] is not None:
            signed_at = expected
        taken.append(row)
        prev = str(row["hash"])
        expected += 1
    if not taken:
        return out
    last_no = int(taken[-1]["chain_no"])
    # The runs whose last record is in this batch go with it (a record under no run has
    # no row: ``_existing`` leaves it out).
    done_runs = sorted(
        {links[int(r["chain_no"])].run_id for r in taken}
        & {link.run_id for link in links.values() if link.last <= last_no}
    )
    existing = _existing(tx, sorted({links[int(r["chain_no"])].run_id for r in taken}))
    # Runs whose first records go now and the rest with a later batch: marked, so that a
    # `runs resume` in between never puts a run back to work without its history.
    split = sorted(existing.difference(done_runs))
    done_runs = [r for r in done_runs if r in existing]
    out.records = len(taken)
    out.runs = len(done_runs)
    out.rows = _count_rows(tx, done_runs)
    out.rows["events"] = len(taken)
    if dry:
        return out
    ids = [int(r["id"]) for r in taken]
    for chunk in range(0, len(ids), BATCH):
        marks, params = in_list("e", ids[chunk : chunk + BATCH])
        tx.execute(f"DELETE FROM events WHERE id IN ({marks})", params)
    # Folded into the rollup first, in this transaction: the numbers over any window
    # stay what they were once the runs are gone.
    rollup.fold_runs(tx, done_runs, _ONLY["outbox"])
    for chunk in range(0, len(done_runs), BATCH):
        marks, params = in_list("r", done_runs[chunk : chunk + BATCH])
        for table in _RUN_TABLES:
            only = _ONLY.get(table, "").format(marks=marks)
            tx.execute(f"DELETE FROM {table} WHERE run_id IN ({marks}){only}", params)
        tx.execute(f"DELETE FROM runs WHERE id IN ({marks})", params)
        tx.execute(f"DELETE FROM runs_pruning WHERE run_id IN ({marks})", params)
    for run_id in split:
        tx.execute(
            "INSERT INTO runs_pruning (run_id, pruned_at) VALUES (:r, :now) "
            "ON CONFLICT (run_id) DO NOTHING",
            {"r": run_id, "now": time.time()},
        )
    chain.extend_pruned(tx, t, s, taken, len(done_runs), key)
    return out


def _existing(tx: Tx, run_ids: list[str]) -> set[str]:
    found: set[str] = set()
    for chunk in range(0, len(run_ids), BATCH):
        marks, params = in_list("r", run_ids[chunk : chunk + BATCH])
        found.update(
            str(r["id"]) for r in tx.fetchall(f"SELECT id FROM runs WHERE id IN ({marks})", params)
        )
    return found


def _count_rows(tx: Tx, run_ids: list[str]) -> dict[str, int]:
    """How many rows each table holds of ``run_ids`` (``runs`` included)."""
    counts = {table: 0 for table in ("runs", *_RUN_TABLES)}
    for chunk in range(0, len(run_ids), BATCH):
        marks, params = in_list("r", run_ids[chunk : chunk + BATCH])
        for table in _RUN_TABLES:
            only = _ONLY.get(table, "").format(marks=marks)
            n = tx.fetchall(
                f"SELECT COUNT(*) AS n FROM {table} WHERE run_id IN ({marks}){only}", params
            )[0]["n"]
            counts[table] += int(n)
        counts["runs"] += len(run_ids[chunk : chunk + BATCH])
    return counts


def chained_tenants(tx: Tx) -> list[str]:
    """Tenants with an audit chain (every tenant with runs has one once sealed)."""
    return [
        str(r["tenant_id"])
        for r in tx.fetchall("SELECT tenant_id FROM audit_heads ORDER BY tenant_id")
    ]


def policies(tx: Tx) -> list[Policy]:
    """Every tenant's configured retention; a row that is not one (written by hand: a
    status not finished, an age below 0) is skipped with a warning, never the others --
    nor a worker's ``--prune-every``, which would stop on it."""
    out = []
    for r in tx.fetchall(
        "SELECT tenant_id, older_than, statuses FROM retention ORDER BY tenant_id"
    ):
        try:
            statuses = tuple(str(r["statuses"]).split(","))
            out.append(Policy(str(r["tenant_id"]), float(r["older_than"]), statuses))
        except (UsageError, TypeError, ValueError) as exc:
            log.warning(
                "retention of tenant %s skipped: %s; fix it with `agentledger prune "
                "--set-retention`", r["tenant_id"], exc,
            )  # fmt: skip
    return out


def set_policy(tx: Tx, policy: Policy) -> None:
    """Configure (or replace) a tenant's retention."""
    tx.execute(
        "INSERT INTO retention (tenant_id, older_than, statuses, updated_at) "
        "VALUES (:t, :o, :s, :now) ON CONFLICT (tenant_id) DO UPDATE SET "
        "older_than = excluded.older_than, statuses = excluded.statuses, "
        "updated_at = excluded.updated_at",
        {"t": policy.tenant_id, "o": policy.older_than, "s": ",".join(policy.statuses),
         "now": time.time()},
    )  # fmt: skip


def unset_policy(tx: Tx, tenant_id: str) -> bool:
    """Remove a tenant's retention; False when it had none."""
    return tx.execute("DELETE FROM retention WHERE tenant_id = :t", {"t": tenant_id}) > 0


def claim_round(tx: Tx, period: float) -> bool:
    """Claim the next scheduled prune round for ``period`` seconds: True for the one
    worker whose claim lands (one guarded UPDATE of the single ``prune_rounds`` row),
    False while another worker's round is claimed. A transaction-scoped advisory lock
    would end with each batch's transaction, and a session lock would stay with
    whichever pooled connection took it; the row works on both backends."""
    now = time.time()
    return (
        tx.execute(
            "UPDATE prune_rounds SET claimed_until = :until WHERE id = 1 AND claimed_until <= :now",
            {"until": now + period, "now": now},
        )
        == 1
    )
