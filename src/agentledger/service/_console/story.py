"""A run's story for its page: the waterfall (queue delay, execution per worker and
lease epoch, retry waits, approval waits, lease takeovers) and each step's contract and
outcome in words, read from the journal and the run's events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentledger._app import App
from agentledger.observe._queries.resume import confirmed_effect, effect_state, rechecked
from agentledger.records import Run, Step, StepStatus

WIDTH = 1000.0  # the waterfall's drawing width (SVG user units)


@dataclass
class Segment:
    """One bar of the waterfall's run lane."""

    kind: str  # queue | exec | approval | retry | wait | takeover
    label: str
    start: float
    end: float
    worker: str | None = None
    epoch: int | None = None
    x: float = 0.0
    width: float = 0.0


@dataclass
class StepView:
    """One journal entry as the page shows it."""

    step: Step
    outcome: str
    contract: dict[str, Any] | None
    x: float = 0.0
    width: float = 0.0
    statuses: list[str] = field(default_factory=list)


def _wait_kind(why: str) -> str:
    if why.startswith("approval"):
        return "approval"
    if "backing off" in why:  # engine/_steps.py and _model_step.py: a retry's backoff
        return "retry"
    return "wait"


_LABELS = {
    "queue": "queued",
    "exec": "executing",
    "approval": "waiting for approval",
    "retry": "retry wait",
    "wait": "waiting",
    "takeover": "lease taken over",
}


def segments(run: Run, events: list[dict[str, Any]], now: float) -> list[Segment]:
    """The run lane: what the run was doing from its submit to now (or its end)."""
    out: list[Segment] = []
    open_kind, open_at = "queue", run.created_at
    worker: str | None = None
    epoch: int | None = None

    def close(at: float) -> None:
        if open_kind:
            label = _LABELS[open_kind]
            ran = open_kind == "exec"  # only execution has a worker and a lease
            out.append(
                Segment(open_kind, label, open_at, max(at, open_at),
                        worker if ran else None, epoch if ran else None)
            )  # fmt: skip

    for e in events:
        at, kind = float(e["at"] or open_at), e["type"]
        data = e["data"] if isinstance(e["data"], dict) else {}
        if kind == "run.claimed":
            if open_kind == "exec":  # claimed again with no release: a takeover
                close(at)
                out.append(Segment("takeover", f"{e['actor']} took the lease over", at, at))
            else:
                close(at)
            open_kind, open_at = "exec", at
            worker, epoch = e["actor"], data.get("epoch")
        elif kind == "run.parked":
            close(at)
            open_kind, open_at = _wait_kind(str(data.get("why", ""))), at
        elif kind in ("run.released", "run.resumed"):
            close(at)
            open_kind, open_at = "queue", at
        elif kind in ("run.completed", "run.failed", "run.cancelled", "run.handover",
                      "run.expired", "run.needs_human"):  # fmt: skip
            close(at)
            open_kind = ""
    if open_kind:
        close(run.updated_at if run.terminal else now)
    return out


def step_views(
    app: App, run: Run, steps: list[Step], events: list[dict[str, Any]]
) -> list[StepView]:
    """Each step with its contract (the tool's declaration, when the app has the tool)
    and its outcome in words."""
    seen: dict[int, list[str]] = {}
    for e in events:
        data = e["data"] if isinstance(e["data"], dict) else {}
        if e["type"].startswith("step.") and isinstance(data.get("step_no"), int):
            seen.setdefault(data["step_no"], []).append(e["type"][5:])
    undone = {
        s.input["compensates"]: s
        for s in steps
        if s.kind == "compensation" and confirmed_effect(s) and isinstance(s.input, dict)
        and isinstance(s.input.get("compensates"), int)
    }  # fmt: skip
    out = []
    for s in steps:
        statuses = seen.get(s.step_no, [])
        out.append(StepView(s, _outcome(run, s, statuses, undone.get(s.step_no)),
                            _contract(app, s), statuses=statuses))  # fmt: skip
    return out


def _outcome(run: Run, s: Step, statuses: list[str], undone_by: Step | None) -> str:
    settled = s.input.get("settled") if isinstance(s.input, dict) else None
    state = effect_state(s)
    if undone_by is not None:
        return f"compensated by step {undone_by.step_no} ({undone_by.name})"
    if isinstance(settled, dict):
        verdict = "applied" if s.status == StepStatus.SUCCEEDED else "not applied"
        return f"settled by {settled.get('by', 'a person')}: {verdict}"
    if state == "executed":
        if StepStatus.UNKNOWN in statuses:
            return "unknown, then confirmed by a status check"
        return "confirmed"
    if state == "unknown":
        if run.status == "needs_human":
            return "outcome unknown: handed over to a person"
        return "outcome unknown: waiting for a status check"
    if state == "not_applied":
        return "not applied: will be sent again with its key"
    if s.status == StepStatus.WAITING:
        return "waiting for approval"
    if s.status == StepStatus.FAILED:
        return f"failed ({s.error_class})" if s.error_class else "failed"
    if s.status == StepStatus.RETRYING:
        return "retrying"
    return {"succeeded": "done", "started": "in flight"}.get(s.status, s.status)


def _contract(app: App, s: Step) -> dict[str, Any] | None:
    tool = app.tools.get(s.name) if s.kind in ("tool", "compensation") else None
    if tool is None:
        return None
    retry = tool.retry
    return {
        "effect": str(tool.effect),
        "timeout": tool.timeout,
        "idempotency": str(tool.idempotency),
        "retries": (
            f"rate limited {retry.rate_limited}, provider error {retry.provider_error}, "
            f"timeout {retry.timeout}"
        ),
        "status check": "yes" if tool.status_check is not None else "no",
        "delivery": str(tool.delivery),
    }


def scale(run: Run, lane: list[Segment], steps: list[StepView], now: float) -> float:
    """Lay the bars out on [0, WIDTH]; returns the seconds shown."""
    start = run.created_at
    end = max([run.updated_at, *(g.end for g in lane), start + 0.001])
    for v in steps:
        if v.step.started_at is not None:
            end = max(end, v.step.started_at + (v.step.duration_ms or 0) / 1000)
    if not run.terminal:
        end = max(end, now)
    span = end - start

    def place(a: float, b: float) -> tuple[float, float]:
        x = (a - start) / span * WIDTH
        return round(x, 1), round(max(2.0, (b - a) / span * WIDTH), 1)

    for g in lane:
        g.x, g.width = place(g.start, g.end)
    for v in steps:
        if v.step.started_at is not None:
            a = v.step.started_at
            v.x, v.width = place(a, a + (v.step.duration_ms or 0) / 1000)
    return span


def effect_words(step: Step, run_status: str) -> str:
    """What the journal says of one write, in words (the side effects ledger)."""
    state = effect_state(step)
    if state == "executed":
        return "confirmed"
    if state == "unknown":
        if run_status == "needs_human":
            return "outcome unknown: handed over to a person"
        return "outcome unknown: waiting for a status check"
    if state == "not_applied":
        return "not applied: will be sent again with its key"
    if step.status == StepStatus.WAITING:
        return "waiting for approval"
    if step.status == StepStatus.FAILED:
        if step.kind == "compensation" and rechecked(step):
            # The provider answered a failure, yet a compensation may have applied: a
            # resume asks its status check before calling it again.
            return "failed, may have applied: status-checked before it is called again"
        return "failed, applied nothing"
    return step.status or "new"
