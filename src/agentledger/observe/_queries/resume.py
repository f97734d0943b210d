"""Resume a failed or ``needs_human`` run from its failed step; settle a write whose
outcome is unknown; redeliver dead letters.

A resume is one transaction:

1. The run must be ``failed`` or ``needs_human``.
2. The first step to re-execute, N: ``from_step`` if given; else, when the run is
   compensating (:func:`finishing_compensation`: a compensation in flight, some applied
   and others failed, or all settled applied, or one failed whose tool has a status check:
   it may have applied), after the last step: nothing is archived but the failed
   compensations with no status check (:func:`failed_compensations`, called again with
   their keys; those with one are kept and marked, and the engine asks the provider
   before calling them: :func:`rechecked`), the engine finishes the compensation and ends the run
   as decided (a ``from_step`` that would archive such a decision is refused); else the
   first failed step
   (not a compensation); else the step after the first one still in flight (that one
   is kept: the resumed engine resolves it by its status check, never by a blind call);
   else the compensation decision; else after the last step.
3. Every side effect from N on is judged first (:func:`effect_state`), and the resume is
   refused, whatever the operator asks, when it would call again a write whose outcome
   is unknown and whose tool has no status check (it is settled first:
   :func:`settle_step`, ``agentledger runs settle``). It is refused too, unless forced,
   when it would re-execute a confirmed effect: an executed write or compensation (a
   compensated run's forward writes were undone at the provider, and a run completed on
   them would rest on money given back). A force names who and why: the person takes
   responsibility for each confirmed effect the plan lists (``needs_force``), and the
   ``run.resumed`` audit event records them with the reason (``forced``). The journal
   rows go into that event as every archived row does, so nothing that happened is lost.
   A write still in flight (unknown with a status check, or settled "not applied") is
   kept in the journal: the engine status-checks it, or sends it again with its key.
4. The other journal rows from N on are archived into the ``run.resumed`` audit event
   and deleted, with their approvals, so replay stops at N and the engine runs N again
   with the code the worker has now. When the compensation decision is among them (its
   compensations all failed: nothing was undone), the outbox rows it dropped are owed
   again: a kept step's row goes back to ``pending``, a re-executed step's row is removed
   (that step enqueues it afresh).
5. The run goes back to ``queued`` by an UPDATE guarded on ``failed``/``needs_human``
   (row count checked): its lease, result, error and handover reason are cleared, its
   step count is the rows kept; its tokens and cost stay (they were spent).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agentledger._canonical import clean_text
from agentledger.engine._execution import step_key
from agentledger.errors import StoreError
from agentledger.records import Step, StepStatus, dumps, loads
from agentledger.store import _rows as rows
from agentledger.store._queries import rollup
from agentledger.store._queries.events import event_data, insert_event
from agentledger.store._queries.runs import get_run
from agentledger.store._tx import Tx

RESUMABLE = ("failed", "needs_human")
_IN_FLIGHT = (StepStatus.STARTED, StepStatus.UNKNOWN, StepStatus.RETRYING)
_EFFECT_KINDS = ("tool", "compensation")
DECISION_KIND = "decision"  # engine/_compensation.py: the journaled compensation decision
#: The largest step number a journal can hold (PostgreSQL's ``steps.step_no INTEGER``);
#: a larger one from an operator is refused before it reaches a store that cannot bind it.
MAX_STEP_NO = 2**31 - 1


class ResumeRefused(StoreError):
    """A resume (or settle) refused: it would call an unknown write again, re-execute a
    confirmed effect without a force, or the run or step is not in a state it applies
    to."""


class ResumeNeedsForce(ResumeRefused):
    """A resume refused only because it would re-execute confirmed effects: a force
    with a reason would let it go ahead."""


@dataclass
class ResumePlan:
    """What a resume does (or would do, for a dry run).

    ``effects``: every side effect from the first re-executed step on (and every write
    kept in flight), each with its ``state`` (:func:`effect_state`, or ``failed``: a
    write that applied nothing and is called again when its step re-executes), the
    ``key`` it has and will use, and ``action``: what the resume does with it.
    ``refused``: why the resume cannot go ahead, forced or not (empty: it can).
    ``needs_force``: why it goes ahead only when forced (it re-executes confirmed
    effects; ``forced`` lists them).
    ``compensations_again``: failed compensations that a resume finishing the
    compensation archives, so the engine calls them again with their keys (no status
    check: their tool had none, or a person settled them not applied).
    ``compensations_checked``: failed compensations whose tool has a status check: the
    resume keeps and marks them, and the engine asks the provider first (applied:
    recorded done, not called; not applied: called again with the key; no answer: not
    called, the run goes back to a person).
    """

    run_id: str
    status: str
    from_step: int
    reexecute: list[dict[str, Any]] = field(default_factory=list)
    confirmed: list[dict[str, Any]] = field(default_factory=list)  # executed effects
    kept_in_flight: list[int] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    needs_force: list[str] = field(default_factory=list)
    forced: list[dict[str, Any]] = field(default_factory=list)
    compensations_again: list[int] = field(default_factory=list)
    compensations_checked: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def confirmed_effect(step: Step) -> bool:
    """A step whose side effect is known to have happened: a succeeded write or
    compensation, or one that took effect but whose result could not be journaled."""
    if step.kind not in _EFFECT_KINDS or step.idempotency_key is None:
        return False
    return step.took_effect()


def effect_state(step: Step) -> str | None:
    """What the journal says of a step's side effect.

    ``executed`` (it happened), ``unknown`` (in flight: it may or may not have
    happened), ``not_applied`` (in flight, proven or settled to have applied nothing:
    it may be sent again with its key), None (no side effect, or one that failed).
    """
    if step.kind not in _EFFECT_KINDS:
        return None
    if confirmed_effect(step):
        return "executed"
    if step.outcome_unknown():
        return "unknown"
    if step.status == StepStatus.RETRYING:
        return "not_applied"
    return None


def _status_checked(step: Step) -> bool:
    """Whether the step's tool had a status check when it was journaled
    (engine/_unknown.py writes it with ``started``; older entries say nothing: no)."""
    return isinstance(step.input, dict) and step.input.get("status_check") is True


def settle_command(run_id: str, step_no: int) -> str:
    """The command that settles an unknown step, for messages."""
    return (
        f"agentledger runs settle {run_id} {step_no} --applied --result JSON --reason R "
        "(or --not-applied --reason R)"
    )


def finishing_compensation(journal: list[Step], status: str) -> Step | None:
    """The compensation decision a resume must finish rather than undo, if any.

    A decision whose compensations are in flight (a refund that timed out: it may have
    happened), partly executed (one refund happened, another failed: the failed ones are
    called again) or, for a ``needs_human`` run, all executed (settled applied) stands:
    the resumed run goes back to compensating and ends as decided (a failed run whose
    compensations all took effect already ended so, and is refused as compensated).
    Going forward instead would complete the run on a charge the provider may show
    refunded, and leave the compensation in the journal at a step number the forward
    steps then reach.
    """
    decision = next((s for s in journal if s.kind == DECISION_KIND), None)
    if decision is None or not isinstance(decision.output, dict):
        return None
    by_no = {s.step_no: s for s in journal}
    # [[target step, compensation step], ...] as engine/_compensation.py journals it; a
    # row of any other shape (an older or damaged journal) counts as not settled.
    states = [
        effect_state(by_no[p[1]])
        if isinstance(p, list) and len(p) == 2 and isinstance(p[1], int) and p[1] in by_no
        else None
        for p in _plan_of(decision)
    ]  # fmt: skip
    if any(s in ("unknown", "not_applied") for s in states):
        return decision
    if any(
        by_no[c].status == StepStatus.FAILED and rechecked(by_no[c])
        for c in _comp_nos(decision, by_no)
    ):
        # A failed compensation the provider can be asked about may have applied (its
        # answer came after applying, or the provider does not dedupe keys): it stands
        # unsettled until the engine's status check or a person settles it.
        return decision
    if "executed" in states and not all(s == "executed" for s in states):
        # Partly undone: a refund happened, another failed (it applied nothing). Going
        # forward would rest on the refund; the failed one is called again instead.
        return decision
    if status == "needs_human" and states and all(s == "executed" for s in states):
        return decision
    return None


def _comp_nos(decision: Step, by_no: dict[int, Step]) -> list[int]:
    """The compensation steps of a decision's plan that the journal holds."""
    return [
        p[1]
        for p in _plan_of(decision)
        if isinstance(p, list) and len(p) == 2 and type(p[1]) is int and p[1] in by_no
        and by_no[p[1]].kind == "compensation"
    ]  # fmt: skip


def _plan_of(decision: Step) -> list[Any]:
    """The entries of a compensation decision's plan, as journaled (each checked by its
    reader: a damaged plan is read, never trusted)."""
    plan = decision.output.get("plan") if isinstance(decision.output, dict) else None
    return plan if isinstance(plan, list) else []


def failed_compensations(journal: list[Step], decision: Step) -> list[Step]:
    """The decision's compensations that failed applying nothing: a resume finishing the
    compensation archives them, so the engine calls each again with its own key (the
    step number, hence the key, is the plan's)."""
    by_no = {s.step_no: s for s in journal}
    found: dict[int, Step] = {}
    for p in _plan_of(decision):
        ok = isinstance(p, list) and len(p) == 2 and isinstance(p[1], int)
        step = by_no.get(p[1]) if ok else None
        if (
            step is not None
            and step.step_no not in found  # a plan naming it twice: it is called once
            and step.kind == "compensation"
            and step.status == StepStatus.FAILED
            and not confirmed_effect(step)
        ):
            found[step.step_no] = step
    return sorted(found.values(), key=lambda s: s.step_no)


def rechecked(step: Step) -> bool:
    """Whether a failed compensation is status-checked before it is called again: it was
    called (it has a key), its tool had a status check then (the journal says so), and no
    person settled it not applied since (they looked at the provider: it is called)."""
    return (
        step.idempotency_key is not None
        and _status_checked(step)
        and not _settled_not_applied(step)
    )


def _settled_not_applied(step: Step) -> str:
    """Who settled a failed compensation "not applied", as the dry run says it ('' when
    nobody did)."""
    settled = step.input.get("settled") if isinstance(step.input, dict) else None
    if isinstance(settled, dict) and settled.get("applied") is False:
        return f"{clean_text(str(settled.get('by')))} settled it not applied"
    return ""


def unjournaled_compensations(journal: list[Step], decision: Step) -> list[tuple[Step, int]]:
    """The decision's compensations with no journal row, each with the write it undoes:
    a resume that keeps the decision has the engine call each (when its tool declares a
    compensation) at the plan's step number, hence with that key. Only an entry as
    engine/_compensation.py journals it counts (the i-th names a write of the journal
    and compensates at the decision's step + 1 + i): a damaged or hostile plan never
    makes the dry run list a call at a step number it chose."""
    by_no = {s.step_no: s for s in journal}
    found: list[tuple[Step, int]] = []
    for i, p in enumerate(_plan_of(decision)):
        if not (isinstance(p, list) and len(p) == 2 and type(p[0]) is int and type(p[1]) is int):
            continue
        target, comp_no = by_no.get(p[0]), p[1]
        if (
            target is not None
            and target.kind == "tool"
            and target.step_no < decision.step_no
            and comp_no == decision.step_no + 1 + i
            and comp_no not in by_no
        ):
            found.append((target, comp_no))
    return found


def first_step(journal: list[Step], status: str) -> tuple[int, list[int]]:
    """The default step to resume from, and the in-flight steps kept before it."""
    if finishing_compensation(journal, status) is not None:
        # Nothing is archived: the engine replays to the decision and compensates on.
        return journal[-1].step_no + 1, []
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


def plan_resume(tx: Tx, run_id: str, from_step: int | None) -> ResumePlan:
    """What resuming ``run_id`` would do; raises ResumeRefused when it is not resumable."""
    run = get_run(tx, run_id)
    if run is None:
        raise ResumeRefused(f"no run {clean_text(run_id)!r}")
    if run.status not in RESUMABLE:
        raise ResumeRefused(
            f"run {run_id} is {run.status}; only failed and needs_human runs are resumed"
        )
    if tx.fetchall("SELECT 1 FROM runs_pruning WHERE run_id = :id", {"id": run_id}):
        # A prune removed its first records (retention.prune_batch): resumed, it would
        # go on without its history. Read after resume_run's lock on the row, so a batch
        # that held the row before it is seen.
        raise ResumeRefused(
            f"run {run_id} is being pruned (`agentledger prune` removed its first audit "
            "records); run `agentledger prune` again to finish, or submit a new run"
        )
    found = tx.fetchall("SELECT * FROM steps WHERE run_id = :id ORDER BY step_no", {"id": run_id})
    journal = [rows.step_from(r) for r in found]
    start, kept = first_step(journal, run.status)
    if from_step is not None:
        if not 1 <= from_step <= MAX_STEP_NO:
            raise ResumeRefused(f"--from-step must be 1 to {MAX_STEP_NO} (got {from_step})")
        start, kept = from_step, []
    plan = ResumePlan(run_id=run_id, status=run.status, from_step=start)
    decision = finishing_compensation(journal, run.status)
    if decision is not None and decision.step_no >= start:
        failed = "".join(
            f"; step {s.step_no} ({s.name}) failed, applying nothing: that resume calls it "
            "again with its key"
            for s in failed_compensations(journal, decision)
        )
        plan.refused.append(
            f"run {run_id} is compensating (step {decision.step_no} decided to undo its "
            f"effects, and a compensation is unsettled or done): resuming it from step "
            f"{start} would go forward on effects the provider may show undone; resume it "
            f"without --from-step to finish the compensation (`agentledger runs resume "
            f"{run_id}`), then submit a new run to do the work again{failed}"
        )
    standing = next((s for s in journal if s.kind == DECISION_KIND), None)
    if standing is not None and standing.step_no < start:
        # The decision stays: the engine replays to it and calls each of its failed
        # compensations that the journal no longer holds again, with its key. Finishing
        # it, those before N are archived too; the ones from N on are archived by the
        # range (the loop below lists them only as steps re-executed).
        for step in failed_compensations(journal, standing):
            checked = rechecked(step)
            if step.step_no < start or (checked and decision is not None):
                if decision is None:
                    continue  # not finishing: it stays failed, the run is handed over
                if checked:
                    plan.compensations_checked.append(step.step_no)
                else:
                    plan.compensations_again.append(step.step_no)
                    plan.reexecute.append(_brief(step))
            target = step.input.get("compensates") if isinstance(step.input, dict) else None
            why = " ".join((step.error or "failed").split())[:300]
            key = step.idempotency_key or step_key(run_id, step.step_no)
            if checked:
                action = (
                    f"status-checked with this key first, to finish the compensation of step "
                    f"{target} (it failed: {why}): applied -> recorded done, not called; not "
                    "applied -> called again with this key; no answer -> not called, the run "
                    "goes back to a person"
                )
            elif step.idempotency_key is None:
                action = (
                    f"called with this key to finish the compensation of step {target} (it "
                    f"was never called: {why})"
                )
            else:
                settled = _settled_not_applied(step)
                action = (
                    f"called again with this key to finish the compensation of step {target} "
                    f"(it failed: {why}), "
                    + (
                        f"without a status check: {settled}"
                        if settled
                        else "WITHOUT a status check (its tool has none): if the provider "
                        "may have applied it although it answered a failure, look there first "
                        f"and `agentledger runs settle {run_id} {step.step_no} --applied "
                        "--result JSON --reason R`"
                    )
                )
            # A rechecked compensation failed by the provider's answer, yet the point of
            # the check is that it may have applied: it is not labelled "applied nothing".
            label = "failed_checked" if checked else "failed"
            plan.effects.append({**_brief(step), "state": label, "key": key, "action": action})
        # A compensation the plan names and the journal never held (the worker
        # stopped before it, or its tool lacked the compensation then): the engine
        # calls it, with the plan's key, when its tool declares one now.
        for target, comp_no in unjournaled_compensations(journal, standing):
            plan.effects.append(
                {
                    "step_no": comp_no,
                    "kind": "compensation",
                    "name": f"compensation of {target.name}",
                    "status": None,
                    "idempotency_key": None,
                    "state": "not_called",
                    "key": step_key(run_id, comp_no),
                    "action": f"called with this key to compensate step {target.step_no} "
                    "(never called before; if its tool declares no compensation, the run "
                    "is handed over again)",
                }
            )
    undone = _compensated(journal)
    for step in journal:
        if step.step_no in plan.compensations_checked:
            continue  # kept, marked and listed above: never archived
        state = effect_state(step)
        in_flight = state in ("unknown", "not_applied")
        # A write in flight before N is kept too, and the engine resolves it when it
        # replays there: it is judged (and listed) like one from N on.
        if step.step_no < start and step.step_no not in kept and not in_flight:
            continue
        if in_flight:
            plan.kept_in_flight.append(step.step_no)  # never deleted, never sent fresh
        else:
            plan.reexecute.append(_brief(step))
        if state is None:
            if (
                _failed_compensation(step)
                and step.step_no not in plan.compensations_again
                and not rechecked(step)
            ):
                # Archived with its decision (nothing was undone): called again, with
                # this key, only if the run fails again; no status check is asked.
                plan.effects.append(
                    {
                        **_brief(step),
                        "state": "failed",
                        "key": step.idempotency_key,
                        "action": "called again with this key if the run fails again, "
                        "WITHOUT a status check (its tool has none, or a person settled it "
                        "not applied): if the provider may have applied it, look there first "
                        f"and `agentledger runs settle {plan.run_id} {step.step_no} --applied "
                        "--result JSON --reason R`",
                    }
                )
            elif _called_again(step):
                # Not an effect yet, but a call the provider sees once the step runs.
                plan.effects.append(
                    {
                        **_brief(step),
                        "state": "failed",
                        "key": step.idempotency_key,
                        "action": "called again when its step re-executes, with this key "
                        "if its arguments are unchanged (it applied nothing)",
                    }
                )
            continue
        entry = {**_brief(step), "state": state, "key": step.idempotency_key}
        entry["action"] = _judge(plan, step, state, undone.get(step.step_no))
        if state == "executed":
            plan.confirmed.append(_brief(step))
        plan.effects.append(entry)
    plan.kept_in_flight.sort()
    return plan


def _called_again(step: Step) -> bool:
    """A write (it has a key) that failed applying nothing: re-executing its step calls
    the provider again (a failed compensation is called again when its decision stays:
    :func:`plan_resume` lists those; else only if the run fails again)."""
    return (
        step.kind == "tool"
        and step.idempotency_key is not None
        and step.status == StepStatus.FAILED
        and not confirmed_effect(step)
    )


def _compensated(journal: list[Step]) -> dict[int, Step]:
    """Forward steps undone by a compensation that took effect, by step number."""
    out: dict[int, Step] = {}
    for step in journal:
        target = step.input.get("compensates") if isinstance(step.input, dict) else None
        if step.kind == "compensation" and confirmed_effect(step) and isinstance(target, int):
            out[target] = step
    return out


def _judge(plan: ResumePlan, step: Step, state: str, undone_by: Step | None) -> str:
    """What the resume does with one effect; a refusal is added to ``plan.refused``."""
    where = f"step {step.step_no} ({step.name}, key {step.idempotency_key})"
    if state == "not_applied":
        return "sent again with the same key (it applied nothing)"
    if state == "unknown":
        if _status_checked(step):
            return "status-checked with the same key first (never sent fresh)"
        plan.refused.append(
            f"{where}: its outcome is unknown and it has no status check, so it is never "
            f"called again before it is settled: look at the provider, then "
            f"`{settle_command(plan.run_id, step.step_no)}`"
        )
        return "refused until settled"
    if step.kind == "compensation" or undone_by is not None:
        if step.kind == "compensation":
            target = step.input.get("compensates") if isinstance(step.input, dict) else None
            what = f"{where} undid step {target}"
        else:
            assert undone_by is not None
            what = (
                f"{where} was undone by step {undone_by.step_no} ({undone_by.name}, key "
                f"{undone_by.idempotency_key})"
            )
        plan.forced.append(_forced(step, "compensated"))
        if not any("was compensated" in r for r in plan.needs_force):
            plan.needs_force.append(
                f"run {plan.run_id} was compensated ({what}): resuming it from step "
                f"{plan.from_step} re-executes an executed compensation and may complete the "
                "run on an effect the provider shows undone. To do the work again, submit a "
                "new run (`agentledger submit NAME --input ...`): it takes new effects with "
                "new keys; or force the resume with a reason"
            )
        return "confirmed and compensated: re-executed only if forced"
    plan.forced.append(_forced(step, "confirmed"))
    plan.needs_force.append(
        f"{where} was executed: resuming from step {plan.from_step} would call it again; "
        f"resume from a later step (--from-step {step.step_no + 1}), submit a new run, or "
        "force the resume with a reason"
    )
    return "confirmed: called again with its key only if forced"


def _forced(step: Step, state: str) -> dict[str, Any]:
    """A confirmed effect a forced resume re-executes, as the audit records it."""
    return {**_brief(step), "state": state, "key": step.idempotency_key}


def resume_run(
    tx: Tx,
    run_id: str,
    from_step: int | None,
    actor: str,
    reason: str | None = None,
    force: bool = False,
    token: str | None = None,
) -> ResumePlan:
    """Resume ``run_id`` (see the module docstring); returns the plan carried out.

    ``force``: re-execute the confirmed effects the plan lists (``needs_force``); it
    needs a ``reason``, and the ``run.resumed`` event records the actor, the reason and
    those effects. Without it such a resume raises :class:`ResumeNeedsForce`.
    ``token`` (one per resume the caller asks for, the same when the store runs this
    again after a lost connection): marks its ``run.resumed`` event, so a resume that
    committed before its reply was lost answers the plan it carried out instead of
    refusing the run it queued."""
    if token is not None:
        done = _resumed_with(tx, run_id, token)
        if done is not None:
            return done
    if force and not (reason or "").strip():
        raise ResumeRefused(
            "a forced resume needs a reason (--reason R): it is recorded in the audit trail "
            "with who forced it and the confirmed effects it re-executes"
        )
    # The run row is locked before the journal is read: the plan judges the journal this
    # transaction deletes from, not one read before another resume and its execution
    # (PostgreSQL reads each statement's own snapshot under READ COMMITTED).
    locked = _lock_resumable(tx, run_id)
    plan = plan_resume(tx, run_id, from_step)
    if locked != 1:
        raise ResumeRefused(f"run {run_id} changed state meanwhile; look again")
    if plan.refused:
        raise ResumeRefused("; ".join(plan.refused))
    if plan.needs_force and not force:
        raise ResumeNeedsForce(
            f"it would re-execute {len(plan.forced)} confirmed effect(s) "
            f"({', '.join(str(e['key']) for e in plan.forced)}): " + "; ".join(plan.needs_force)
        )
    params = {"id": run_id, "n": plan.from_step}
    # Writes kept in flight stay in the journal (by number: at most a run's steps), and
    # so do the failed compensations the engine status-checks before calling again.
    keep = "".join(
        f" AND step_no <> {int(n)}" for n in [*plan.kept_in_flight, *plan.compensations_checked]
    )
    archived = tx.fetchall(
        f"SELECT * FROM steps WHERE run_id = :id AND step_no >= :n{keep} ORDER BY step_no",
        params,
    )
    approvals = tx.fetchall(
        f"SELECT * FROM approvals WHERE run_id = :id AND step_no >= :n{keep}", params
    )
    # Failed compensations called again (a run finishing its compensation), by number.
    again = " OR ".join(f"step_no = {int(n)}" for n in plan.compensations_again) or "1 = 0"
    if plan.compensations_again:
        archived += tx.fetchall(
            f"SELECT * FROM steps WHERE run_id = :id AND ({again}) ORDER BY step_no",
            {"id": run_id},
        )
        approvals += tx.fetchall(
            f"SELECT * FROM approvals WHERE run_id = :id AND ({again})", {"id": run_id}
        )
    kept = tx.fetchall("SELECT COUNT(*) AS n FROM steps WHERE run_id = :id", params)[0]["n"]
    kept = int(kept) - len(archived)
    now = tx.now
    moved = tx.execute(
        "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
        f"available_at = {now}, updated_at = {now}, result = NULL, error = NULL, "
        "handover_reason = NULL, cancel_requested = NULL, resumes = 0, stuck_mark = NULL, "
        "step_count = :kept WHERE id = :id AND status IN ('failed', 'needs_human')",
        {"id": run_id, "kept": int(kept)},
    )
    if moved != 1:
        raise ResumeRefused(f"run {run_id} changed state meanwhile; look again")
    tx.execute(f"DELETE FROM approvals WHERE run_id = :id AND step_no >= :n{keep}", params)
    tx.execute(f"DELETE FROM steps WHERE run_id = :id AND step_no >= :n{keep}", params)
    if plan.compensations_again:
        tx.execute(f"DELETE FROM approvals WHERE run_id = :id AND ({again})", {"id": run_id})
        tx.execute(f"DELETE FROM steps WHERE run_id = :id AND ({again})", {"id": run_id})
    for n in plan.compensations_checked:
        _mark_recheck(tx, run_id, n, actor)
    outbox: dict[str, list[str]] = {"revived": [], "removed": []}
    if any(s["kind"] == DECISION_KIND for s in archived):
        outbox = _undrop_outbox(tx, run_id, plan.from_step)
    insert_event(
        tx,
        run_id,
        "run.resumed",
        actor,
        {
            "from_step": plan.from_step,
            "previous_status": plan.status,
            "reason": reason,
            # Who forced it is the event's actor; the confirmed effects it re-executes:
            "forced": plan.forced if plan.needs_force else None,
            "effects": plan.effects,
            "kept_in_flight": plan.kept_in_flight,
            "archived_steps": archived,
            "archived_approvals": approvals,
            "outbox_revived": outbox["revived"],
            "outbox_removed": outbox["removed"],
            "compensations_again": plan.compensations_again,
            "compensations_checked": plan.compensations_checked,
        },
        token=token,
    )
    tx.dialect.notify_runnable(tx.conn)
    return plan


def _resumed_with(tx: Tx, run_id: str, token: str) -> ResumePlan | None:
    """The plan a resume marked ``token`` carried out, as its ``run.resumed`` event
    records it; None when it has not committed."""
    data = event_data(tx, run_id, token, "run.resumed")
    if data is None:
        return None
    forced = data.get("forced") or []
    return ResumePlan(
        run_id=run_id,
        status=str(data.get("previous_status")),
        from_step=int(data.get("from_step") or 0),
        reexecute=[
            {k: s.get(k) for k in ("step_no", "kind", "name", "status", "idempotency_key")}
            for s in data.get("archived_steps") or []
            if isinstance(s, dict)
        ],
        kept_in_flight=list(data.get("kept_in_flight") or []),
        effects=list(data.get("effects") or []),
        needs_force=["forced: see the run.resumed event"] if forced else [],
        forced=list(forced),
        compensations_again=list(data.get("compensations_again") or []),
        compensations_checked=list(data.get("compensations_checked") or []),
    )


def _mark_recheck(tx: Tx, run_id: str, step_no: int, actor: str) -> None:
    """Mark a failed compensation to be status-checked before it is called again
    (engine/_compensation.py ``owes_recheck``; its first answer spends the mark). The
    run row is locked: nothing else writes the step meanwhile."""
    step = _step_at(tx, run_id, step_no)
    if step is None or step.status != StepStatus.FAILED:
        raise ResumeRefused(f"step {step_no} of run {run_id} changed meanwhile; look again")
    given = step.input if isinstance(step.input, dict) else {}
    marked = {**given, "recheck": {"by": actor, "at": time.time()}}
    tx.execute(
        "UPDATE steps SET input = :input WHERE run_id = :id AND step_no = :n AND status = 'failed'",
        {"input": dumps(marked), "id": run_id, "n": step_no},
    )


def _step_at(tx: Tx, run_id: str, step_no: int) -> Step | None:
    """The journal entry at ``step_no`` of ``run_id``, if there is one."""
    found = tx.fetchall(
        "SELECT * FROM steps WHERE run_id = :id AND step_no = :n", {"id": run_id, "n": step_no}
    )
    return rows.step_from(found[0]) if found else None


def _lock_resumable(tx: Tx, run_id: str) -> int:
    """Lock a failed or ``needs_human`` run's row for this transaction (1: locked; 0:
    no such run in such a state): a resume, a settle and a claim of it take turns. The
    run leaves the daily rollup first, its figures as they were folded (it is read live
    until it ends again): the first write to its row, before anything of it changes."""
    rollup.unfold_run(tx, run_id)
    return tx.execute(
        f"UPDATE runs SET updated_at = {tx.now} "
        "WHERE id = :id AND status IN ('failed', 'needs_human')",
        {"id": run_id},
    )


def settle_step(
    tx: Tx,
    run_id: str,
    step_no: int,
    applied: bool,
    result: Any,
    actor: str,
    reason: str,
) -> Step:
    """A person's decision on a write whose outcome is unknown, or on a compensation that
    failed after it was called (``applied``: it is counted done and never called again;
    not applied: it stays failed, and the next resume calls it without a status check),
    in one transaction.

    ``applied``: the provider shows it happened; the step becomes ``succeeded`` with
    ``result`` (what later steps and its compensation read). Not applied: the step is
    owed a resend with its own key (``retrying``, nothing applied). Either way the
    decision (who, why, when, the status it had) is written into the step's input
    (``settled``) and a ``step.settled`` event. Only a failed or ``needs_human`` run's
    step in flight with an unknown outcome is settled: the run row is locked first, so
    a resume or a worker cannot move it meanwhile.
    """
    if not reason.strip():
        raise ResumeRefused("settling needs a reason (--reason R): it is recorded in the audit")
    run = get_run(tx, run_id)
    if run is None:
        raise ResumeRefused(f"no run {clean_text(run_id)!r}")
    if _lock_resumable(tx, run_id) != 1:
        raise ResumeRefused(
            f"run {run_id} is {run.status}; a step is settled only while its run is failed "
            "or needs_human (a running run's worker resolves it)"
        )
    step = _step_at(tx, run_id, step_no) if 1 <= step_no <= MAX_STEP_NO else None
    if step is None:
        raise ResumeRefused(f"run {run_id} has no step {step_no}; see `agentledger runs show`")
    failed_comp = _failed_compensation(step)
    if effect_state(step) != "unknown" and not failed_comp:
        if _already_settled(step, applied, result, actor, reason):
            return step  # this very decision, retried after a lost reply: already done
        never = (
            " (it was never called: its arguments could not be built)"
            if step.kind == "compensation" and step.status == StepStatus.FAILED
            else ""
        )
        raise ResumeRefused(
            f"step {step_no} ({step.name}, {step.kind}) of run {run_id} is {step.status}"
            f"{never}, not in flight with an unknown outcome nor a failed compensation that "
            f"was called: there is nothing to settle; see `agentledger runs show "
            f"{run_id}`, or continue it with `agentledger runs resume {run_id}`"
        )
    if failed_comp and _already_settled(step, applied, result, actor, reason):
        return step
    was, failure = step.status, (step.error_class, step.error)
    decision = {"applied": applied, "by": actor, "reason": reason, "at": time.time(), "was": was}
    step.input = {**(step.input if isinstance(step.input, dict) else {}), "settled": decision}
    step.error_class = step.error = None
    if failed_comp:
        # Its earlier mark for a status check is spent: a person looked at the provider.
        step.input.pop("recheck", None)
    if applied:
        step.status, step.output = StepStatus.SUCCEEDED, result
    elif failed_comp:
        # Stays failed, error and all: the next resume calls it again with its key,
        # without a status check (rechecked() reads this decision).
        step.error_class, step.error = failure
    else:
        retry = step.output.get("retry") if isinstance(step.output, dict) else None
        state = dict(retry) if isinstance(retry, dict) else {}
        state["maybe_applied"] = False  # a person said so: the engine may resend the key
        step.status, step.output = StepStatus.RETRYING, {"retry": state}
    changed = tx.execute(
        "UPDATE steps SET status = :status, input = :input, output = :output, "
        "error_class = :error_class, error = :error "
        "WHERE run_id = :id AND step_no = :n AND status = :was",
        {
            "status": step.status,
            "input": dumps(step.input),
            "output": dumps(step.output),
            "error_class": step.error_class,
            "error": step.error,
            "id": run_id,
            "n": step_no,
            "was": was,
        },
    )
    if changed != 1:
        raise ResumeRefused(f"step {step_no} of run {run_id} changed meanwhile; look again")
    if applied:
        # An effects-table guard claimed by this step holds the result too, so nothing
        # ever takes the claim for an effect without one.
        # A failed compensation's guard was released (``failed``): it holds it too.
        tx.execute(
            f"UPDATE effects SET status = 'done', result = :result, updated_at = {tx.now} "
            "WHERE run_id = :id AND step_no = :n AND status IN ('claimed', 'failed')",
            {"result": dumps(result), "id": run_id, "n": step_no},
        )
    insert_event(
        tx,
        run_id,
        "step.settled",
        actor,
        {
            "step_no": step_no,
            "tool": step.name,
            "key": step.idempotency_key,
            "applied": applied,
            "result": result if applied else None,
            "reason": reason,
            "was": was,
        },
    )
    return step


def _already_settled(step: Step, applied: bool, result: Any, actor: str, reason: str) -> bool:
    """Whether the step stands exactly as this decision left it. A step found unknown
    again (settled "not applied", sent again, no answer) is never taken for one: the
    same words then settle it anew."""
    earlier = step.input.get("settled") if isinstance(step.input, dict) else None
    if not isinstance(earlier, dict):
        return False
    if (earlier.get("applied"), earlier.get("by"), earlier.get("reason")) != (
        applied,
        actor,
        reason,
    ):
        return False
    if applied:
        return step.status == StepStatus.SUCCEEDED and step.output == result
    if step.kind == "compensation" and step.status == StepStatus.FAILED:
        return True  # settled not applied, not called since (a new call has no decision)
    return effect_state(step) == "not_applied"


def _failed_compensation(step: Step) -> bool:
    """A compensation that failed after it was called (it has a key): the provider may
    show it applied all the same, and a person may settle it so."""
    return (
        step.kind == "compensation"
        and step.status == StepStatus.FAILED
        and step.idempotency_key is not None
    )


def _undrop_outbox(tx: Tx, run_id: str, from_step: int) -> dict[str, list[str]]:
    """The compensation decision is undone: what it dropped is owed again. A kept step's
    row goes back to ``pending`` (its step is replayed, never enqueued again); a row of a
    step run again is removed, so that step enqueues afresh (a same-run insert of a key
    is a no-op: the dropped row would swallow it)."""
    found = tx.fetchall(
        "SELECT key, step_no, history FROM outbox WHERE run_id = :id AND status = 'dropped' "
        "ORDER BY key",
        {"id": run_id},
    )
    out: dict[str, list[str]] = {"revived": [], "removed": []}
    for r in found:
        if int(r["step_no"]) >= from_step:
            tx.execute(
                "DELETE FROM outbox WHERE key = :k AND status = 'dropped'",
                      {"k": r["key"]})  # fmt: skip
            out["removed"].append(r["key"])
            continue
        history = loads(r["history"]) or []
        history.append({"at": time.time(), "revived": "run resumed"})
        tx.execute(
            f"UPDATE outbox SET status = 'pending', next_attempt_at = {tx.now}, "
            f"history = :history, updated_at = {tx.now} "
            "WHERE key = :k AND status = 'dropped'",
            {"k": r["key"], "history": dumps(history)},
        )
        out["revived"].append(r["key"])
    return out


def candidates(tx: Tx, status: str, agent: str | None, limit: int) -> list[str]:
    """Run ids a bulk resume would take: ``status`` (failed or needs_human), oldest first."""
    if status not in RESUMABLE:
        raise ResumeRefused(f"--status must be one of {', '.join(RESUMABLE)}")
    sql = "SELECT id FROM runs WHERE status = :s"
    params: dict[str, Any] = {"s": status, "limit": limit}
    if agent is not None:
        sql += " AND name = :agent"
        params["agent"] = agent
    found = tx.fetchall(sql + " ORDER BY created_at LIMIT :limit", params)
    return [r["id"] for r in found]


def retry_outbox(tx: Tx, key: str, actor: str, token: str | None = None) -> bool:
    """Redeliver a dead letter: ``dead`` -> ``pending``, due now, with a fresh set of
    attempts; its history is kept and the retry is audited on its run.

    ``token`` (one per retry the caller asks for, the same when the store runs this
    again after a lost connection): marks its ``outbox.retried`` event, so a retry that
    committed before its reply was lost answers True (done) instead of finding no dead
    letter -- and never retries the letter a second time."""
    found = tx.fetchall("SELECT run_id, status FROM outbox WHERE key = :k", {"k": key})
    if not found:
        return False
    run_id = found[0]["run_id"]
    if token is not None and _retried_with(tx, run_id, key, token):
        return True
    if found[0]["status"] != "dead":
        return False
    changed = tx.execute(
        f"UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = {tx.now}, "
        f"lease_owner = NULL, lease_expires_at = NULL, updated_at = {tx.now} "
        "WHERE key = :k AND status = 'dead'",
        {"k": key},
    )
    if changed:
        insert_event(tx, run_id, "outbox.retried", actor, {"key": key}, token=token)
    return changed > 0


def _retried_with(tx: Tx, run_id: str, key: str, token: str) -> bool:
    """Whether a retry marked ``token`` of the letter ``key`` committed."""
    data = event_data(tx, run_id, token, "outbox.retried")
    return data is not None and data.get("key") == key
