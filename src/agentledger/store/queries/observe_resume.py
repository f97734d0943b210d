"""Resume a failed or ``needs_human`` run from its failed step, and redeliver dead letters.

A resume is one transaction:

1. The run must be ``failed`` or ``needs_human``.
2. The first step to re-execute, N: ``from_step`` if given; else the first failed step
   (not a compensation); else the step after the first one still in flight (that one
   is kept: the resumed engine resolves it by its status check, never by a blind call);
   else the compensation decision; else after the last step.
3. Journal rows from N on are archived into the ``run.resumed`` audit event and
   deleted, with their approvals, so replay stops at N and the engine runs N again with
   the code the worker has now. Refused when one of them is a confirmed side effect (a
   succeeded write or compensation: it has an idempotency key) unless ``force`` with a
   reason, which the event records.
   When the compensation decision is among them, the outbox rows it dropped are owed
   again: a kept step's row goes back to ``pending``, a re-executed step's row is
   removed (that step enqueues it afresh).
4. The run goes back to ``queued`` by an UPDATE guarded on ``failed``/``needs_human``
   (row count checked): its lease, result, error and handover reason are cleared, its
   step count is the rows kept; its tokens and cost stay (they were spent).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agentledger.canonical import clean_text
from agentledger.errors import StoreError
from agentledger.records import Step, StepStatus, dumps, loads
from agentledger.store import rows
from agentledger.store.dialect import Dialect
from agentledger.store.queries.events import insert_event
from agentledger.store.queries.runs import get_run

RESUMABLE = ("failed", "needs_human")
_IN_FLIGHT = (StepStatus.STARTED, StepStatus.UNKNOWN, StepStatus.RETRYING)
_EFFECT_KINDS = ("tool", "compensation")
DECISION_KIND = "decision"  # engine/compensation.py: the journaled compensation decision


class ResumeRefused(StoreError):
    """A resume that would re-execute a confirmed side effect, or a run not resumable."""


@dataclass
class ResumePlan:
    """What a resume does (or would do, for a dry run)."""

    run_id: str
    status: str
    from_step: int
    reexecute: list[dict[str, Any]] = field(default_factory=list)
    confirmed: list[dict[str, Any]] = field(default_factory=list)  # confirmed side effects
    kept_in_flight: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def confirmed_effect(step: Step) -> bool:
    """A step whose side effect is known to have happened (a succeeded write)."""
    return (
        step.kind in _EFFECT_KINDS
        and step.status == StepStatus.SUCCEEDED
        and step.idempotency_key is not None
    )


def first_step(journal: list[Step]) -> tuple[int, list[int]]:
    """The default step to resume from, and the in-flight steps kept before it."""
    for step in journal:
        if step.status == StepStatus.FAILED and step.kind != "compensation":
            return step.step_no, []
    for step in journal:
        if step.status in _IN_FLIGHT and step.kind in _EFFECT_KINDS:
            return step.step_no + 1, [step.step_no]
    for step in journal:
        if step.kind == "decision":
            return step.step_no, []
    return (journal[-1].step_no + 1 if journal else 1), []


def _brief(step: Step) -> dict[str, Any]:
    return {
        "step_no": step.step_no,
        "kind": step.kind,
        "name": step.name,
        "status": step.status,
        "idempotency_key": step.idempotency_key,
    }


def plan_resume(d: Dialect, conn: Any, run_id: str, from_step: int | None) -> ResumePlan:
    """What resuming ``run_id`` would do; raises ResumeRefused when it is not resumable."""
    run = get_run(d, conn, run_id)
    if run is None:
        raise ResumeRefused(f"no run {clean_text(run_id)!r}")
    if run.status not in RESUMABLE:
        raise ResumeRefused(
            f"run {run_id} is {run.status}; only failed and needs_human runs are resumed"
        )
    found = d.fetchall(
        conn, "SELECT * FROM steps WHERE run_id = :id ORDER BY step_no", {"id": run_id}
    )
    journal = [rows.step_from(r) for r in found]
    start, kept = first_step(journal)
    if from_step is not None:
        if from_step < 1:
            raise ResumeRefused(f"--from-step must be 1 or more (got {from_step})")
        start, kept = from_step, []
    later = [s for s in journal if s.step_no >= start]
    return ResumePlan(
        run_id=run_id,
        status=run.status,
        from_step=start,
        reexecute=[_brief(s) for s in later],
        confirmed=[_brief(s) for s in later if confirmed_effect(s)],
        kept_in_flight=kept,
    )


def resume_run(
    d: Dialect,
    conn: Any,
    run_id: str,
    from_step: int | None,
    actor: str,
    reason: str | None,
    force: bool,
) -> ResumePlan:
    """Resume ``run_id`` (see the module docstring); returns the plan carried out."""
    plan = plan_resume(d, conn, run_id, from_step)
    if plan.confirmed and not (force and reason):
        names = ", ".join(f"{c['step_no']} ({c['name']})" for c in plan.confirmed)
        raise ResumeRefused(
            f"step(s) {names} of run {run_id} have a confirmed side effect and would be "
            "executed again; resume from a later step, or pass --force with --reason"
        )
    params = {"id": run_id, "n": plan.from_step}
    archived = d.fetchall(
        conn, "SELECT * FROM steps WHERE run_id = :id AND step_no >= :n ORDER BY step_no", params
    )
    approvals = d.fetchall(
        conn, "SELECT * FROM approvals WHERE run_id = :id AND step_no >= :n", params
    )
    kept = d.fetchall(
        conn, "SELECT COUNT(*) AS n FROM steps WHERE run_id = :id AND step_no < :n", params
    )[0]["n"]
    now = d.now_sql
    moved = d.execute(
        conn,
        "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
        f"available_at = {now}, updated_at = {now}, result = NULL, error = NULL, "
        "handover_reason = NULL, cancel_requested = NULL, resumes = 0, stuck_mark = NULL, "
        "step_count = :kept WHERE id = :id AND status IN ('failed', 'needs_human')",
        {"id": run_id, "kept": int(kept)},
    )
    if moved != 1:
        raise ResumeRefused(f"run {run_id} changed state meanwhile; look again")
    d.execute(conn, "DELETE FROM approvals WHERE run_id = :id AND step_no >= :n", params)
    d.execute(conn, "DELETE FROM steps WHERE run_id = :id AND step_no >= :n", params)
    outbox: dict[str, list[str]] = {"revived": [], "removed": []}
    if any(s["kind"] == DECISION_KIND for s in archived):
        outbox = _undrop_outbox(d, conn, run_id, plan.from_step)
    insert_event(
        d,
        conn,
        run_id,
        "run.resumed",
        actor,
        {
            "from_step": plan.from_step,
            "previous_status": plan.status,
            "reason": reason,
            "forced": bool(plan.confirmed),
            "confirmed_reexecuted": plan.confirmed,
            "kept_in_flight": plan.kept_in_flight,
            "archived_steps": archived,
            "archived_approvals": approvals,
            "outbox_revived": outbox["revived"],
            "outbox_removed": outbox["removed"],
        },
    )
    d.notify_runnable(conn)
    return plan


def _undrop_outbox(d: Dialect, conn: Any, run_id: str, from_step: int) -> dict[str, list[str]]:
    """The compensation decision is undone: what it dropped is owed again. A kept step's
    row goes back to ``pending`` (its step is replayed, never enqueued again); a row of a
    step run again is removed, so that step enqueues afresh (a same-run insert of a key
    is a no-op: the dropped row would swallow it)."""
    found = d.fetchall(
        conn,
        "SELECT key, step_no, history FROM outbox WHERE run_id = :id AND status = 'dropped' "
        "ORDER BY key",
        {"id": run_id},
    )
    out: dict[str, list[str]] = {"revived": [], "removed": []}
    for r in found:
        if int(r["step_no"]) >= from_step:
            d.execute(conn, "DELETE FROM outbox WHERE key = :k AND status = 'dropped'",
                      {"k": r["key"]})  # fmt: skip
            out["removed"].append(r["key"])
            continue
        history = loads(r["history"]) or []
        history.append({"at": time.time(), "revived": "run resumed"})
        d.execute(
            conn,
            f"UPDATE outbox SET status = 'pending', next_attempt_at = {d.now_sql}, "
            f"history = :history, updated_at = {d.now_sql} "
            "WHERE key = :k AND status = 'dropped'",
            {"k": r["key"], "history": dumps(history)},
        )
        out["revived"].append(r["key"])
    return out


def candidates(d: Dialect, conn: Any, status: str, agent: str | None, limit: int) -> list[str]:
    """Run ids a bulk resume would take: ``status`` (failed or needs_human), oldest first."""
    if status not in RESUMABLE:
        raise ResumeRefused(f"--status must be one of {', '.join(RESUMABLE)}")
    sql = "SELECT id FROM runs WHERE status = :s"
    params: dict[str, Any] = {"s": status, "limit": limit}
    if agent is not None:
        sql += " AND name = :agent"
        params["agent"] = agent
    found = d.fetchall(conn, sql + " ORDER BY created_at LIMIT :limit", params)
    return [r["id"] for r in found]


def retry_outbox(d: Dialect, conn: Any, key: str, actor: str) -> bool:
    """Redeliver a dead letter: ``dead`` -> ``pending``, due now, with a fresh set of
    attempts; its history is kept and the retry is audited on its run."""
    found = d.fetchall(conn, "SELECT run_id FROM outbox WHERE key = :k AND status = 'dead'",
                       {"k": key})  # fmt: skip
    if not found:
        return False
    changed = d.execute(
        conn,
        f"UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = {d.now_sql}, "
        f"lease_owner = NULL, lease_expires_at = NULL, updated_at = {d.now_sql} "
        "WHERE key = :k AND status = 'dead'",
        {"k": key},
    )
    if changed:
        insert_event(d, conn, found[0]["run_id"], "outbox.retried", actor, {"key": key})
    return changed > 0
