"""Stuck runs (reported once per episode by a metric and a run.stuck event) and the
Prometheus text of /metrics, parsed with the client's parser (issue 11, items 2 and 4)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentledger._clock import FakeClock
from agentledger.observe._metrics import REFRESH_ENV, render_metrics
from agentledger.observe._queries import stuck as observe_stuck
from agentledger.observe._stuck import StuckDetector, StuckPolicy, StuckRun
from agentledger.records import RunStatus
from tests.fast.lifecycle_harness import KILLED, Harness
from tests.observe.apps import Payments, booking_app


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text, by name and sorted labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


async def _until_reported(detector: StuckDetector, deadline: float = 10.0) -> list[StuckRun]:
    """Check until a stuck run is reported (the threshold passes on the database clock)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        reported = await detector.check_once()
        if reported:
            return reported
        await asyncio.sleep(0.05)
    raise AssertionError("no stuck run reported")


async def test_a_killed_worker_leaves_a_run_reported_stuck_once(tmp_path: Path) -> None:
    payments = Payments(kill_after_apply=True)
    async with Harness(tmp_path, booking_app(payments)) as h:
        run_id = await h.submit("booking")
        assert await h.execute(run_id) == KILLED  # mid-payment, no replacement worker
        policy = StuckPolicy(after=0.3, check_seconds=0.05)
        before = samples(await render_metrics(h.store, StuckPolicy(after=3600)))
        assert value(before, "agentledger_stuck_runs", agent="booking", reason="no_progress") == 0
        detector = StuckDetector(h.store, policy, "w-check")
        reported = await _until_reported(detector)
        assert [(r.run_id, r.reason, r.status) for r in reported] == [
            (run_id, "no_progress", RunStatus.RUNNING)
        ]
        assert await detector.check_once() == []  # once per episode
        # Another worker that found the same episode before the mark was written: its
        # guarded UPDATE changes nothing, so it appends no second event.
        assert not await h.store.transact(observe_stuck.mark_stuck, reported[0], "w-other")
        events = [e for e in await h.events(run_id) if e.type == "run.stuck"]
        assert len(events) == 1 and events[0].data["reason"] == "no_progress"
        after = samples(await render_metrics(h.store, policy))
        assert value(after, "agentledger_stuck_runs", agent="booking", reason="no_progress") == 1
        assert value(after, "agentledger_stuck_reported_total", reason="no_progress") >= 1
        # Progress ends the episode: resumed and finished, the run is no longer stuck.
        run = await h.drive(run_id)
        assert run.status == RunStatus.COMPLETED and len(payments.charges) == 1
        assert await policy.find(h.store) == []


async def test_a_run_waiting_for_an_unexpired_approval_is_not_stuck(tmp_path: Path) -> None:
    async with Harness(tmp_path, booking_app(Payments(), approval=True)) as h:
        h.clock = FakeClock(start=time.time())  # the approval expires a day from now
        run_id = await h.submit("booking")
        await h.execute(run_id)
        assert (await h.run(run_id)).status == RunStatus.WAITING
        policy = StuckPolicy(after=0.01)
        # Time passes: long past the threshold (its claim and park are the last progress).
        waited = time.monotonic()
        while time.monotonic() - waited < 0.1:
            await asyncio.sleep(0.02)
        assert await policy.find(h.store) == []
        # Whereas a run queued with no live worker for its version is.
        other = await h.submit("booking")
        end = time.monotonic() + 10
        while not (found := await policy.find(h.store)) and time.monotonic() < end:
            await asyncio.sleep(0.02)
        assert [(s.run_id, s.reason) for s in found] == [(other, "no_worker")]


async def test_metrics_move_as_runs_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every scrape reads the settled history too (see test_metrics_cache.py for the
    # cached history a scrape reads by default).
    monkeypatch.setenv(REFRESH_ENV, "0")
    async with Harness(tmp_path, booking_app(Payments())) as h:
        policy = StuckPolicy(after=3600)
        first = await h.submit("booking")
        second = await h.submit("booking")
        text = await render_metrics(h.store, policy)
        found = samples(text)
        queued = dict(status="queued", agent="booking", version="1", tenant="default")
        assert value(found, "agentledger_runs", **queued) == 2
        assert value(found, "agentledger_queued_runs", agent="booking", version="1") == 2
        steps_before = value(
            found,
            "agentledger_step_duration_seconds_count",
            tool="pay",
            effect="write",
            outcome="ok",
        )
        await h.store.cancel_run(second, "not this one", "test")  # the harness claims all
        await h.drive(first)
        await h.submit("booking")
        found = samples(await render_metrics(h.store, policy))
        assert value(found, "agentledger_runs", **queued) == 1
        done = dict(queued, status="completed")
        assert value(found, "agentledger_runs", **done) == 1
        assert value(found, "agentledger_runs", **dict(queued, status="cancelled")) == 1
        assert value(found, "agentledger_queued_runs", agent="booking", version="1") == 1
        assert (
            value(
                found,
                "agentledger_step_duration_seconds_count",
                tool="pay",
                effect="write",
                outcome="ok",
            )
            == steps_before + 1
        )
        assert value(found, "agentledger_outbox_dead_letters") == 0
