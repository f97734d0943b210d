"""Mapping between database rows and records.

A record's fields are named after its table's columns; JSON columns are decoded.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from agentledger.records import (
    Approval,
    Effect,
    Event,
    OutboxItem,
    Run,
    Step,
    WorkerInfo,
    loads,
)

R = TypeVar("R")


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    """The field names of a record class, read once (``fields`` builds a tuple per call)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _record(cls: type[R], row: dict[str, Any], *json_columns: str) -> R:
    values = {name: row[name] for name in _names(cls) if name in row}
    for name in json_columns:
        values[name] = loads(values[name])
    return cls(**values)


def run_from(row: dict[str, Any]) -> Run:
    run = _record(Run, row, "input", "result", "principal")
    run.usage_simulated = bool(run.usage_simulated)
    return run


def step_from(row: dict[str, Any]) -> Step:
    return _record(Step, row, "input", "output")


def effect_from(row: dict[str, Any]) -> Effect:
    return _record(Effect, row, "result")


def outbox_from(row: dict[str, Any]) -> OutboxItem:
    item = _record(OutboxItem, row, "payload", "history")
    item.history = item.history or []
    return item


def approval_from(row: dict[str, Any]) -> Approval:
    approval = _record(Approval, row, "arguments", "approvers")
    approval.approvers = approval.approvers or []
    approval.not_requester = bool(approval.not_requester)
    approval.approvals_needed = int(approval.approvals_needed or 1)
    return approval


def event_from(row: dict[str, Any]) -> Event:
    return _record(Event, row, "data")


def worker_from(row: dict[str, Any]) -> WorkerInfo:
    info = _record(WorkerInfo, row, "targets")
    info.targets = info.targets or []
    info.draining = bool(info.draining)
    return info
