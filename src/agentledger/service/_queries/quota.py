"""Per-tenant quotas of the service, checked inside the transaction that accepts a run.

Two limits: runs started in the last 60 seconds, and runs in flight (not terminal). They
are exact across every ``serve`` process on one database because the check and the insert
it allows are one transaction that first takes the tenant's quota lock:

* PostgreSQL: a transaction-scoped advisory lock on (namespace, hash of the tenant id).
  Under READ COMMITTED each statement reads a fresh snapshot, so the counts read after
  the lock include every run another process accepted and committed before releasing
  it (at its COMMIT). Two tenants whose ids hash alike only share a lock (they wait on
  each other, they never count each other's runs).
* SQLite: ``BEGIN IMMEDIATE`` already makes every write transaction on the file the
  only one, across processes.

A group commit (see ``service/_accepts.py``) counts each tenant once, under its lock, and
keeps the tally for the rest of the group; the locks of a group are taken in tenant order
so that two processes' groups cannot deadlock on each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentledger._canonical import clean_text
from agentledger.errors import StoreError
from agentledger.store._dialect import Dialect
from agentledger.store._tx import Tx

WINDOW = 60.0  # seconds of the runs-per-minute limit
IN_FLIGHT_RETRY_AFTER = 5  # seconds a client refused for runs in flight is told to wait
# The first key of the (namespace, tenant) advisory locks: "alq" (agentledger quota). The
# two-key lock space does not overlap the one-key space the migration lock uses.
LOCK_NAMESPACE = 0x616C71
# The unfinished statuses, spelled as the predicate of the ``runs_live`` partial index
# (migration 60), so that a tenant's runs in flight are counted from that index: its
# size is the runs in flight, whereas the tenant's own index holds its whole history.
LIVE = "status IN ('queued', 'running', 'waiting')"


def in_flight_sql(d: Dialect) -> str:
    """The count of a tenant's runs in flight (``:t``), read from ``runs_live``.

    PostgreSQL's planner picks the partial index from its statistics; SQLite's (with no
    statistics, as agentledger's files have) would pick the tenant's index, so it is told.
    """
    hint = " INDEXED BY runs_live" if d.name == "sqlite" else ""
    return f"SELECT COUNT(*) AS n FROM runs{hint} WHERE {LIVE} AND tenant_id = :t"


class QuotaExceeded(StoreError):
    """The tenant's quota refuses a new run now; ``retry_after`` in seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class Quota:
    """A tenant's limits (None: unlimited)."""

    runs_per_minute: int | None = None
    max_in_flight: int | None = None

    @property
    def limited(self) -> bool:
        return self.runs_per_minute is not None or self.max_in_flight is not None


def tenant_quota(tx: Tx, tenant_id: str, default: Quota) -> Quota:
    """The tenant's own limits where set, else ``default``'s."""
    found = tx.fetchall(
        "SELECT runs_per_minute, max_in_flight FROM tenants WHERE id = :id",
        {"id": tenant_id},
    )
    if not found:
        return default
    row = found[0]
    own_rate, own_flight = row["runs_per_minute"], row["max_in_flight"]
    return Quota(
        runs_per_minute=own_rate if own_rate is not None else default.runs_per_minute,
        max_in_flight=own_flight if own_flight is not None else default.max_in_flight,
    )


def lock_tenant(tx: Tx, tenant_id: str) -> None:
    """Hold the tenant's quota lock until this transaction ends (see the module doc)."""
    if tx.dialect.name == "postgres":
        tx.fetchall(
            "SELECT pg_advisory_xact_lock(:space, hashtext(:t))",
            {"space": LOCK_NAMESPACE, "t": tenant_id},
        )


@dataclass
class _Tally:
    quota: Quota
    recent: int  # runs created in the last WINDOW seconds
    oldest: float | None  # the oldest of them (when the window frees a slot)
    in_flight: int


class QuotaBook:
    """The quota state of the tenants of ONE accepting transaction.

    :meth:`prepare` locks and counts each limited tenant once; :meth:`check` refuses a
    run the tally does not allow; :meth:`accepted` counts a run just inserted. A run
    rolled back under its savepoint is never passed to :meth:`accepted`.
    """

    def __init__(self, default: Quota, now: float) -> None:
        self.default = default
        self.now = now
        self._tallies: dict[str, _Tally | None] = {}  # None: the tenant has no limit

    def prepare(self, tx: Tx, tenant_ids: list[str]) -> None:
        """Lock and count the limited ones of ``tenant_ids``, in tenant order."""
        # Tallied by the tenant id as stored (text is written cleaned: a NUL or a lone
        # surrogate as U+FFFD), so two spellings of one stored tenant share one tally.
        quotas = {t: tenant_quota(tx, t, self.default) for t in {clean_text(t) for t in tenant_ids}}
        for tenant_id in sorted(quotas):
            if tenant_id in self._tallies:
                continue
            quota = quotas[tenant_id]
            if not quota.limited:
                self._tallies[tenant_id] = None
                continue
            lock_tenant(tx, tenant_id)
            self._tallies[tenant_id] = self._count(tx, tenant_id, quota)

    def _count(self, tx: Tx, tenant_id: str, quota: Quota) -> _Tally:
        recent, oldest, in_flight = 0, None, 0
        if quota.runs_per_minute is not None:
            found = tx.fetchall(
                "SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM runs "
                "WHERE tenant_id = :t AND created_at > :since",
                {"t": tenant_id, "since": self.now - WINDOW},
            )
            recent = int(found[0]["n"])
            oldest = float(found[0]["oldest"]) if found[0]["oldest"] is not None else None
        if quota.max_in_flight is not None:
            found = tx.fetchall(
                in_flight_sql(tx.dialect),
                {"t": tenant_id},
            )
            in_flight = int(found[0]["n"])
        return _Tally(quota, recent, oldest, in_flight)

    def check(self, tx: Tx, tenant_id: str) -> None:
        """Raise :class:`QuotaExceeded` when the tenant may not start a run now."""
        tenant_id = clean_text(tenant_id)
        if tenant_id not in self._tallies:
            self.prepare(tx, [tenant_id])
        tally = self._tallies[tenant_id]
        if tally is None:
            return
        limit = tally.quota.runs_per_minute
        if limit is not None and tally.recent >= limit:
            oldest = tally.oldest if tally.oldest is not None else self.now
            wait = max(1, int(oldest + WINDOW - self.now + 0.999))
            raise QuotaExceeded(
                f"tenant {tenant_id} started {tally.recent} runs in the last minute "
                f"(limit {limit})",
                wait,
            )
        limit = tally.quota.max_in_flight
        if limit is not None and tally.in_flight >= limit:
            raise QuotaExceeded(
                f"tenant {tenant_id} has {tally.in_flight} runs in flight (limit {limit})",
                IN_FLIGHT_RETRY_AFTER,
            )

    def accepted(self, tenant_id: str) -> None:
        """Count a run of ``tenant_id`` inserted in this transaction."""
        tally = self._tallies.get(clean_text(tenant_id))
        if tally is not None:
            tally.recent += 1
            tally.in_flight += 1
            if tally.oldest is None:
                tally.oldest = self.now
