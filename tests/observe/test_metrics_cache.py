"""``/metrics`` at volume: a scrape reads the live part, the settled history is cached.

Real stores on each backend (``store``). The settled history (finished runs, audit
counts) is read by a process's first scrape, then again in the background once older
than the refresh interval; a counter never goes backwards meanwhile.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentledger.observe._metrics import REFRESH_ENV, figures_of, refresh_seconds, render_metrics
from agentledger.observe._queries import metrics as observe_metrics
from agentledger.observe._stuck import StuckPolicy
from agentledger.records import Run, RunStatus
from agentledger.store import Batch, NewRun, RunUpdate, Store
from agentledger_bench.metrics_scrape import measure
from tests.observe.test_stuck_metrics import samples, value

TARGET = "agent@1"
POLICY = StuckPolicy(after=3600)


class CountingStore:
    """The real store, counting the reads of its settled history."""

    def __init__(self, store: Store) -> None:
        self.store, self.history_reads = store, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def read(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        if op is observe_metrics.snapshot:
            self.history_reads += kwargs.get("settled", True)
        return await self.store.read(op, *args, **kwargs)


async def _running(store: Store, tokens: int) -> Run:
    await store.create_run(NewRun(kind="agent", name="agent", version="1", input={}))
    (run,) = await store.claim_runs("w1", [TARGET], 1, 60.0)
    await store.commit(Batch(run.id, run.lease_epoch, "w1", run=RunUpdate(tokens=tokens)))
    return run


async def _finish(store: Store, run: Run) -> None:
    done = RunUpdate(status=RunStatus.COMPLETED, result={"ok": True})
    await store.commit(Batch(run.id, run.lease_epoch, "w1", run=done))


async def _scrape(store: Any) -> dict[Any, float]:
    return samples(await render_metrics(store, POLICY, process=False))


async def test_scrapes_read_the_history_once_per_refresh(store: Store) -> None:
    counting = CountingStore(store)
    figures = figures_of(counting)  # type: ignore[arg-type]
    figures.refresh = 3600
    first = await _running(store, tokens=10)
    await _finish(store, first)
    found = await _scrape(counting)
    completed = dict(status="completed", agent="agent", version="1", tenant="default")
    assert value(found, "agentledger_runs", **completed) == 1
    running = dict(completed, status="running")
    second = await _running(store, tokens=5)
    for _ in range(3):  # the live part moves on every scrape, the history is not read
        found = await _scrape(counting)
        assert value(found, "agentledger_runs", **running) == 1
    assert counting.history_reads == 1
    # Once the history is older than the refresh interval, a scrape starts reading it
    # again in the background (and does not wait for it); the next one shows it.
    await _finish(store, second)
    figures.refresh = 0.001
    await asyncio.sleep(0.01)
    await _scrape(counting)
    assert figures._reading is not None
    await figures._reading
    found = await _scrape(counting)
    assert value(found, "agentledger_runs", **completed) == 2
    assert value(found, "agentledger_run_tokens_total", agent="agent", usage="reported") == 15


async def test_a_counter_never_goes_backwards_while_the_history_is_cached(
    store: Store,
) -> None:
    """A run's tokens move from the live part to a history not read again yet: the
    counter is held at its last value, then goes on from the history."""
    figures_of(store).refresh = 3600
    run = await _running(store, tokens=40)
    found = await _scrape(store)
    assert value(found, "agentledger_run_tokens_total", agent="agent", usage="reported") == 40
    await _finish(store, run)
    found = await _scrape(store)
    assert value(found, "agentledger_runs", status="running", agent="agent", version="1",
                 tenant="default") == 0  # fmt: skip
    assert value(found, "agentledger_run_tokens_total", agent="agent", usage="reported") == 40
    figures_of(store).refresh = 0
    found = await _scrape(store)
    assert value(found, "agentledger_run_tokens_total", agent="agent", usage="reported") == 40


def test_the_refresh_interval_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REFRESH_ENV, "15")
    assert refresh_seconds() == 15
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(REFRESH_ENV, bad)
        with pytest.raises(Exception, match=REFRESH_ENV):
            refresh_seconds()


async def test_the_scrape_benchmark_runs_and_reports_both_conditions(tmp_path: Path) -> None:
    report = await measure(f"sqlite:///{tmp_path / 'bench.db'}", runs=300, scrapes=2)
    assert report["runs"] == 300 and report["first_ms"] > 0
    for condition in ("every_scrape", "cached"):
        assert report[condition]["median_ms"] > 0
