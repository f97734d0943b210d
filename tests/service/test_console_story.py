"""A run's waterfall as the console draws it, from the events a run records."""

from __future__ import annotations

from typing import Any

from agentledger.records import Run
from agentledger.service._console import story


def _event(at: float, type: str, actor: str = "w1", **data: Any) -> dict[str, Any]:
    return {"at": at, "type": type, "actor": actor, "data": data or None}


def test_queue_execution_waits_and_takeovers_are_told_apart() -> None:
    run = Run("r1", "t1", "u", "agent", "a", "1", {}, "completed", created_at=100.0,
              updated_at=130.0)  # fmt: skip
    events = [
        _event(100.0, "run.submitted", "u"),
        _event(102.0, "run.claimed", "w1", epoch=1),
        _event(103.0, "run.parked", "w1", why="pay backing off 5.0 s", until=108.0),
        _event(108.5, "run.claimed", "w1", epoch=2),
        _event(109.0, "run.parked", "w1", why="approval a1 by manager", until=999.0),
        _event(120.0, "run.claimed", "w1", epoch=3),
        # w1 dies holding the lease; w2 claims it after the lease expired: a takeover.
        _event(125.0, "run.claimed", "w2", epoch=4),
        _event(130.0, "run.completed", "w2"),
    ]
    lane = story.segments(run, events, now=200.0)
    kinds = [(g.kind, g.start, g.end, g.worker, g.epoch) for g in lane]
    assert kinds == [
        ("queue", 100.0, 102.0, None, None),
        ("exec", 102.0, 103.0, "w1", 1),
        ("retry", 103.0, 108.5, None, None),
        ("exec", 108.5, 109.0, "w1", 2),
        ("approval", 109.0, 120.0, None, None),
        ("exec", 120.0, 125.0, "w1", 3),
        ("takeover", 125.0, 125.0, None, None),
        ("exec", 125.0, 130.0, "w2", 4),
    ]
    span = story.scale(run, lane, [], now=200.0)
    assert span == 30.0 and lane[0].x == 0 and lane[-1].x + lane[-1].width == 1000.0
