"""Mapping between database rows and records."""

from __future__ import annotations

from typing import Any

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


def run_from(row: dict[str, Any]) -> Run:
    return Run(
        id=row["id"],
        tenant_id=row["tenant_id"],
        user_id=row["user_id"],
        kind=row["kind"],
        name=row["name"],
        version=row["version"],
        input=loads(row["input"]),
        status=row["status"],
        step_count=row["step_count"],
        tokens=row["tokens"],
        cost_usd=row["cost_usd"],
        active_seconds=row["active_seconds"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        lease_owner=row["lease_owner"],
        lease_epoch=row["lease_epoch"],
        lease_expires_at=row["lease_expires_at"],
        available_at=row["available_at"],
        resumes=row["resumes"],
        result=loads(row["result"]),
        error=row["error"],
        handover_reason=row["handover_reason"],
    )


def step_from(row: dict[str, Any]) -> Step:
    return Step(
        run_id=row["run_id"],
        step_no=row["step_no"],
        kind=row["kind"],
        name=row["name"],
        status=row["status"],
        input=loads(row["input"]),
        input_hash=row["input_hash"],
        output=loads(row["output"]),
        attempts=row["attempts"],
        idempotency_key=row["idempotency_key"],
        started_at=row["started_at"],
        duration_ms=row["duration_ms"],
        tokens=row["tokens"],
        cost_usd=row["cost_usd"],
        error_class=row["error_class"],
        error=row["error"],
        lease_epoch=row["lease_epoch"],
    )


def effect_from(row: dict[str, Any]) -> Effect:
    return Effect(
        key=row["key"],
        run_id=row["run_id"],
        step_no=row["step_no"],
        status=row["status"],
        result=loads(row["result"]),
    )


def outbox_from(row: dict[str, Any]) -> OutboxItem:
    return OutboxItem(
        key=row["key"],
        run_id=row["run_id"],
        step_no=row["step_no"],
        tool=row["tool"],
        payload=loads(row["payload"]),
        attempts=row["attempts"],
        next_attempt_at=row["next_attempt_at"],
        status=row["status"],
        last_error=row["last_error"],
        history=loads(row["history"]) or [],
    )


def approval_from(row: dict[str, Any]) -> Approval:
    return Approval(
        id=row["id"],
        run_id=row["run_id"],
        step_no=row["step_no"],
        tool=row["tool"],
        arguments=loads(row["arguments"]),
        required_role=row["required_role"],
        requested_at=row["requested_at"],
        expires_at=row["expires_at"],
        default_decision=row["default_decision"],
        decision=row["decision"],
        decided_by=row["decided_by"],
        decided_at=row["decided_at"],
    )


def event_from(row: dict[str, Any]) -> Event:
    return Event(
        id=row["id"],
        run_id=row["run_id"],
        at=row["at"],
        type=row["type"],
        actor=row["actor"],
        data=loads(row["data"]),
    )


def worker_from(row: dict[str, Any]) -> WorkerInfo:
    return WorkerInfo(
        id=row["id"],
        host=row["host"],
        pid=row["pid"],
        targets=loads(row["targets"]) or [],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
    )
