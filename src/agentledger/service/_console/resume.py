"""``/ui/runs/{id}/resume``: continue a failed or ``needs_human`` run, for operators.
The page first shows the dry run -- the steps that run again and every side effect
from there on with its state, key and what the resume does with it -- and the button
resumes exactly that plan (the store's resume, as ``agentledger runs resume``): a plan
that changed meanwhile is refused, and so is any resume that would repeat a confirmed
effect or call again a write whose outcome is unknown and cannot be checked."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from agentledger.observe._queries import resume as store_resume
from agentledger.service._auth import ADMIN, OPERATOR, Principal
from agentledger.service._console import render
from agentledger.service._console.errors import PageError, not_found
from agentledger.service._console.signin import checked_form, signed_in
from agentledger.store._queries import service_runs
from agentledger.store._tx import Tx

router = APIRouter(prefix="/ui/runs", include_in_schema=False)


async def _resumable(request: Request, run_id: str, principal: Principal) -> Any:
    """The run in the caller's tenant (404 page otherwise), for an operator (403)."""
    if len(run_id) > 200:
        raise not_found("such run")
    row = await request.app.state.store.read(service_runs.service_run, run_id, principal.tenant_id)
    if row is None:
        raise not_found(f"run {run_id}")
    if not principal.has(OPERATOR, ADMIN):
        raise PageError(403, "Not allowed", "Resuming a run needs the role operator.")
    return row["run"]


def _as_shown(tx: Tx, run_id: str, shown: int, actor: str, reason: str | None) -> Any:
    """Resume, and undo it (the transaction rolls back) unless it started where the
    dry run the person saw said it would."""
    plan = store_resume.resume_run(tx, run_id, None, actor, reason)
    if plan.from_step != shown:
        raise store_resume.ResumeRefused(
            f"the run changed since you looked: it would now resume from step "
            f"{plan.from_step}, not {shown}"
        )
    return plan


@router.get("/{run_id}/resume")
async def resume_dry_run(request: Request, run_id: str) -> HTMLResponse:
    session = await signed_in(request)
    run = await _resumable(request, run_id, session.principal)
    plan, refusal = None, None
    try:
        plan = await request.app.state.store.read(store_resume.plan_resume, run_id, None)
    except store_resume.ResumeRefused as exc:
        refusal = str(exc)
    return render.page(
        request, "resume.html", title=f"Resume {run_id}", run=run, plan=plan, refusal=refusal
    )


@router.post("/{run_id}/resume")
async def resume_as_shown(request: Request, run_id: str) -> Response:
    session, fields = await checked_form(request)
    p = session.principal
    await _resumable(request, run_id, p)
    try:
        shown = int(fields.get("from_step", ""))
    except ValueError:
        raise PageError(400, "Bad request", "The form lacks the step it was shown.") from None
    reason = (fields.get("reason") or "").strip()[:900] or None
    actor = f"{p.user_id} (key {p.key_id}, console)"
    try:
        await request.app.state.store.transact(_as_shown, run_id, shown, actor, reason)
    except store_resume.ResumeRefused as exc:
        raise PageError(409, "Not resumed", f"Nothing was changed: {exc}.") from None
    return RedirectResponse(f"/ui/runs/{run_id}", status_code=303)
