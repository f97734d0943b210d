"""The invariants ``agentledger chaos`` holds a run of the user's app to.

Each check reads what the command gathered (the runs at the end, their journals and
events, the side effects counted at the proxies and by the tools' hook) and returns the
violations it found, each naming the run, the step, the key and what happened.

- ``effects_per_key``: every side effect happens at most once per key at its provider.
- ``succeeded_step_executed_again``: no side effect for a step's key reaches a provider
  after the journal recorded that step succeeded.
- ``runs_settled``: every run ends terminal or waiting.
- ``stale_lease_writes``: no journal write of a worker that lost its lease is accepted (a
  run's ``step.*`` events are written by the worker whose claim came last; no step
  carries an epoch the run never had).
- ``no_stuck_runs``: no unfinished run is left without a live lease.
- ``spend_within_budget``: no step starts after its run's token or spend budget was used.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentledger._budget import Budget
from agentledger._chaos.counting import Effect, by_key
from agentledger.records import Event, Run, RunStatus, Step, StepStatus

INVARIANTS: tuple[str, ...] = (
    "effects_per_key",
    "succeeded_step_executed_again",
    "runs_settled",
    "stale_lease_writes",
    "no_stuck_runs",
    "spend_within_budget",
)
"""Every invariant, in report order."""


@dataclass(frozen=True)
class Violation:
    """One broken invariant: where, and what happened."""

    invariant: str
    what: str
    run: str | None = None
    step: int | None = None
    key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "run": self.run,
            "step": self.step,
            "key": self.key,
            "what": self.what,
        }


@dataclass(frozen=True)
class Evidence:
    """What the checks read."""

    runs: list[Run]
    journals: Mapping[str, list[Step]]
    events: Mapping[str, list[Event]]
    effects: list[Effect]
    budgets: Mapping[str, Budget]  # "name@version" -> its budget
    ended_at: float  # wall clock when the runs were read


@dataclass(frozen=True)
class _StepRef:
    run: str
    step: Step


def _steps_by_key(evidence: Evidence) -> dict[str, _StepRef]:
    found: dict[str, _StepRef] = {}
    for run_id, steps in evidence.journals.items():
        for step in steps:
            if step.idempotency_key:
                found[step.idempotency_key] = _StepRef(run_id, step)
    return found


def _sources(effects: list[Effect]) -> str:
    """Where effects were counted, e.g. ``proxy POST /charges -> 200 (x2); hook (x1)``."""
    counts = Counter(f"{e.source} {e.detail}".strip() for e in effects)
    return "; ".join(f"{what} (x{n})" for what, n in counts.items())


def _name(ref: _StepRef | None) -> str:
    return "" if ref is None else f" (run {ref.run} step {ref.step.step_no} {ref.step.name})"


def effects_per_key(evidence: Evidence) -> list[Violation]:
    steps = _steps_by_key(evidence)
    found = []
    for (provider, key), effects in sorted(by_key(evidence.effects).items()):
        if len(effects) <= 1:
            continue
        ref = steps.get(key)
        where = _sources(effects)
        found.append(
            Violation(
                "effects_per_key",
                f"key {key} took effect {len(effects)} times at {provider}{_name(ref)}: {where}",
                ref.run if ref else None,
                ref.step.step_no if ref else None,
                key,
            )
        )
    return found


def _succeeded_at(events: list[Event]) -> dict[int, float]:
    """Step number -> when the journal first recorded it succeeded."""
    first: dict[int, float] = {}
    for event in events:
        if event.type == f"step.{StepStatus.SUCCEEDED}" and isinstance(event.data, dict):
            first.setdefault(int(event.data.get("step_no", -1)), event.at)
    return first


def succeeded_step_executed_again(evidence: Evidence) -> list[Violation]:
    steps = _steps_by_key(evidence)
    succeeded = {run_id: _succeeded_at(events) for run_id, events in evidence.events.items()}
    found = []
    for (provider, key), effects in sorted(by_key(evidence.effects).items()):
        ref = steps.get(key)
        if ref is None:
            continue
        at = succeeded.get(ref.run, {}).get(ref.step.step_no)
        if at is None:
            continue
        again = [e for e in effects if e.at > at]
        if again:
            found.append(
                Violation(
                    "succeeded_step_executed_again",
                    f"run {ref.run} step {ref.step.step_no} ({ref.step.name}) was journaled "
                    f"succeeded, then its key {key} took effect {len(again)} more time(s) at "
                    f"{provider}, the first {again[0].at - at:.3f} s later: {_sources(again)}",
                    ref.run,
                    ref.step.step_no,
                    key,
                )
            )
    return found


def runs_settled(evidence: Evidence) -> list[Violation]:
    return [
        Violation(
            "runs_settled",
            f"run {run.id} is {run.status}, not terminal or waiting, at the end",
            run.id,
        )
        for run in evidence.runs
        if run.status not in RunStatus.TERMINAL and run.status != RunStatus.WAITING
    ]


def stale_lease_writes(evidence: Evidence) -> list[Violation]:
    found = []
    for run in evidence.runs:
        owner: str | None = None
        epochs: set[int] = set()
        for event in evidence.events.get(run.id, []):
            if event.type == "run.claimed":
                owner = event.actor
                if isinstance(event.data, dict):
                    epochs.add(int(event.data.get("epoch", 0)))
            elif event.type.startswith("step.") and event.actor != owner:
                step = event.data.get("step_no") if isinstance(event.data, dict) else None
                key = event.data.get("key") if isinstance(event.data, dict) else None
                found.append(
                    Violation(
                        "stale_lease_writes",
                        f"run {run.id}: the journal accepted {event.type} of step {step} from "
                        f"worker {event.actor} after worker {owner} claimed the run",
                        run.id,
                        step,
                        key,
                    )
                )
        for step in evidence.journals.get(run.id, []):
            if step.lease_epoch > run.lease_epoch or (epochs and step.lease_epoch not in epochs):
                found.append(
                    Violation(
                        "stale_lease_writes",
                        f"run {run.id} step {step.step_no} was written under lease epoch "
                        f"{step.lease_epoch}, which no claim of the run took (claims: "
                        f"{sorted(epochs)}, run at {run.lease_epoch})",
                        run.id,
                        step.step_no,
                        step.idempotency_key,
                    )
                )
    return found


def no_stuck_runs(evidence: Evidence) -> list[Violation]:
    found = []
    for run in evidence.runs:
        if run.status in RunStatus.TERMINAL or run.status == RunStatus.WAITING:
            continue
        live = run.lease_owner is not None and (run.lease_expires_at or 0) > evidence.ended_at
        if not live:
            found.append(
                Violation(
                    "no_stuck_runs",
                    f"run {run.id} is {run.status} with no live lease at the end "
                    f"(owner {run.lease_owner}, {run.resumes} resumes)",
                    run.id,
                )
            )
    return found


def spend_within_budget(evidence: Evidence) -> list[Violation]:
    found = []
    for run in evidence.runs:
        budget = evidence.budgets.get(f"{run.name}@{run.version}")
        if budget is None:
            continue
        tokens, spend = 0, 0.0
        for step in sorted(evidence.journals.get(run.id, []), key=lambda s: s.step_no):
            # Budgets are checked before each new step: a step may take a run past its
            # budget, but none may start once it is used up.
            if tokens >= budget.max_tokens or spend >= budget.max_spend_usd:
                found.append(
                    Violation(
                        "spend_within_budget",
                        f"run {run.id} step {step.step_no} ({step.name}) started after the "
                        f"run had used {tokens} tokens / ${spend:.4f} of its budget "
                        f"({budget.max_tokens} tokens / ${budget.max_spend_usd:.2f})",
                        run.id,
                        step.step_no,
                        step.idempotency_key,
                    )
                )
                break
            tokens += step.tokens
            spend += step.cost_usd
    return found


CHECKS: dict[str, Callable[[Evidence], list[Violation]]] = {
    "effects_per_key": effects_per_key,
    "succeeded_step_executed_again": succeeded_step_executed_again,
    "runs_settled": runs_settled,
    "stale_lease_writes": stale_lease_writes,
    "no_stuck_runs": no_stuck_runs,
    "spend_within_budget": spend_within_budget,
}


def check(evidence: Evidence) -> dict[str, list[Violation]]:
    """Every invariant's violations (an empty list: it holds)."""
    return {name: CHECKS[name](evidence) for name in INVARIANTS}
