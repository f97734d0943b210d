"""The stuck-run alarm: workers look for stuck runs now and then and report each
episode once (a ``run.stuck`` event, which the webhook layer forwards, and the
``agentledger_stuck_reported`` counter); ``/metrics`` shows the stuck runs now.

What "stuck" means is in :mod:`agentledger.observe._queries.stuck` (the SQL, on the
database's clock). The threshold is per agent: an agent or workflow definition may carry
``stuck_after`` (seconds); otherwise ``AGENTLEDGER_STUCK_AFTER`` (default 900 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from agentledger import _envsettings as envsettings
from agentledger.observe import _instruments as instruments
from agentledger.observe._queries import stuck as observe_stuck
from agentledger.observe._queries.stuck import STUCK_EVENT, StuckRun
from agentledger.store._sqlstore import Store
from agentledger.worker._companions import Companion
from agentledger.worker._liveness import LIVE_WITHIN

log = logging.getLogger(__name__)

DEFAULT_AFTER: float = envsettings.default("stuck_after")
DEFAULT_TAKEOVERS: int = envsettings.default("stuck_takeovers")
DEFAULT_CHECK = 60.0

__all__ = ["STUCK_EVENT", "StuckDetector", "StuckPolicy", "StuckRun"]


@dataclass
class StuckPolicy:
    """When a run counts as stuck, and how often workers look."""

    after: float = DEFAULT_AFTER
    per_agent: dict[str, float] = field(default_factory=dict)
    takeovers: int = DEFAULT_TAKEOVERS
    live_within: float = LIVE_WITHIN
    check_seconds: float = DEFAULT_CHECK

    @classmethod
    def from_env(cls, app: Any = None) -> StuckPolicy:
        """From ``AGENTLEDGER_STUCK_AFTER``, ``AGENTLEDGER_STUCK_TAKEOVERS``,
        ``AGENTLEDGER_STUCK_CHECK`` and, with an app, its definitions' ``stuck_after``."""
        env = envsettings.current()
        after = env.stuck_after
        check = env.stuck_check
        policy = cls(
            after=after,
            takeovers=env.stuck_takeovers,
            check_seconds=min(DEFAULT_CHECK, after / 3) if check is None else check,
        )
        for definition in _definitions(app):
            seconds = getattr(definition, "stuck_after", None)
            if isinstance(seconds, int | float) and seconds > 0:
                policy.per_agent[definition.name] = float(seconds)
        return policy

    async def find(self, store: Store) -> list[StuckRun]:
        """The stuck runs now."""
        return await store.read(
            observe_stuck.find_stuck, self.after, self.per_agent, self.takeovers, self.live_within
        )


def _definitions(app: Any) -> list[Any]:
    if app is None:
        return []
    found = getattr(app, "definitions", None)
    if callable(found):
        found = found()
    if isinstance(found, dict):
        return list(found.values())
    return list(found or [])


class StuckDetector:
    """The periodic check a worker runs (cheap: one indexed query on the database clock)."""

    def __init__(self, store: Store, policy: StuckPolicy, actor: str) -> None:
        self.store, self.policy, self.actor = store, policy, actor

    async def check_once(self) -> list[StuckRun]:
        """Report every stuck episode not reported yet; return those this call reported."""
        reported = []
        for run in await self.policy.find(self.store):
            if run.reported:
                continue
            if await self.store.transact(observe_stuck.mark_stuck, run, self.actor):
                instruments.STUCK_REPORTED.labels(run.reason).inc()
                log.warning(
                    "run %s (%s@%s) is stuck: %s for %.0f s",
                    run.run_id, run.name, run.version, run.reason, run.idle_seconds,
                )  # fmt: skip
                reported.append(run)
        return reported

    async def run(self, stopping: asyncio.Event) -> None:
        """Check every ``check_seconds`` until ``stopping``."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.policy.check_seconds)
            if stopping.is_set():
                return
            await self.check_once()


async def stuck_runs(store: Store, name: str | None = None, limit: int = 100) -> list[Any]:
    """The stuck runs now as run records (``runs list --stuck``), newest first."""
    found = [s for s in await StuckPolicy.from_env().find(store) if name in (None, s.name)]
    runs = [await store.get_run(s.run_id) for s in found]
    live = [r for r in runs if r is not None]
    return sorted(live, key=lambda r: r.created_at, reverse=True)[:limit]


def companion() -> Companion:
    """The detector as a worker's side task (:class:`~agentledger.worker._companions.Companion`):
    reports stuck runs now and then (one query, the database's clock)."""

    def loop(worker: Any) -> Any:
        detector = StuckDetector(worker.store, StuckPolicy.from_env(worker.app), worker.owner)
        return lambda: detector.run(worker.stopping)

    return Companion("stuck", loop)
