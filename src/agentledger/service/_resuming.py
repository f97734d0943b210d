"""Resuming a run for a caller of the service (the API's ``POST /v1/runs/{id}/resume``
and the console's resume pages): the store's one resume (``observe/_queries/resume.py``,
as ``agentledger runs resume``) under the caller's name, its refusals as problems in
words. A force and its reason go to the store, which records them in ``run.resumed``."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from agentledger.observe._queries import resume as store_resume
from agentledger.service._auth import Principal
from agentledger.service._problems import Problem
from agentledger.store._queries.common import new_token
from agentledger.store._tx import Tx

Check = Any  # (plan) -> None, raising ResumeRefused: what the caller was shown


def actor_of(request: Request, principal: Principal) -> str:
    """Who resumes, as the audit trail names the API's and the console's callers."""
    via = getattr(request.state, "via", None)
    return f"{principal.user_id} (key {principal.key_id}{f', {via}' if via else ''})"


def _resume(
    tx: Tx,
    run_id: str,
    from_step: int | None,
    actor: str,
    reason: str | None,
    force: bool,
    check: Check,
    token: str,
) -> store_resume.ResumePlan:
    plan = store_resume.resume_run(tx, run_id, from_step, actor, reason, force, token)
    if check is not None:
        check(plan)  # raises: the transaction rolls back, nothing was resumed
    return plan


async def resume(
    request: Request,
    principal: Principal,
    run_id: str,
    from_step: int | None,
    reason: str | None,
    force: bool,
    dry_run: bool = False,
    check: Check = None,
) -> store_resume.ResumePlan:
    """The plan (``dry_run``) or the resume carried out; a refusal is a 409 problem
    naming why (``resume-needs-force`` when only a force with a reason is missing)."""
    store = request.app.state.store
    reason = (reason or "").strip() or None
    try:
        if dry_run:
            plan: store_resume.ResumePlan = await store.read(
                store_resume.plan_resume, run_id, from_step
            )
            return plan
        # The token is fixed before the first attempt: a resume committed before its
        # reply was lost answers its plan when the store runs it again.
        return await store.transact(
            _resume,
            run_id,
            from_step,
            actor_of(request, principal),
            reason,
            force,
            check,
            new_token(),
        )
    except store_resume.ResumeNeedsForce as exc:
        raise Problem("resume-needs-force", f"Not resumed: {exc}.") from None
    except store_resume.ResumeRefused as exc:
        raise Problem("resume-refused", f"Not resumed: {exc}.") from None
