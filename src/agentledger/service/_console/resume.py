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
from agentledger.service._queries import console as queries
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


# Bulk: one group of the needs-a-human page ---------------------------------------

BULK_LIMIT = 100  # runs one bulk resume takes at most (the rest: another round)
bulk = APIRouter(prefix="/ui/attention", include_in_schema=False)


async def _bulk_plans(request: Request, p: Principal, status: str, cause: str) -> list[Any]:
    if status not in store_resume.RESUMABLE:
        raise PageError(400, "Bad request", "Only failed and needs_human runs are resumed.")
    if not p.has(OPERATOR, ADMIN):
        raise PageError(403, "Not allowed", "Resuming runs needs the role operator.")
    store = request.app.state.store
    ids = await store.read(queries.group_runs, p.tenant_id, status, cause, BULK_LIMIT)
    plans: list[Any] = []
    for run_id in ids:
        try:
            plans.append((run_id, await store.read(store_resume.plan_resume, run_id, None), None))
        except store_resume.ResumeRefused as exc:
            plans.append((run_id, None, str(exc)))
    return plans


def _counts(plans: list[Any]) -> dict[str, int]:
    """What the dry runs add up to: runs resumed or refused, effects by state."""
    out = {"resumable": 0, "refused": 0}
    for _, plan, refusal in plans:
        if plan is None or plan.refused or refusal:
            out["refused"] += 1
            continue
        out["resumable"] += 1
        for e in plan.effects:
            out[e["state"]] = out.get(e["state"], 0) + 1
    return out


@bulk.get("/resume")
async def bulk_dry_run(request: Request, status: str = "", cause: str = "") -> HTMLResponse:
    session = await signed_in(request)
    plans = await _bulk_plans(request, session.principal, status, cause)
    ready = [rid for rid, plan, why in plans if plan is not None and not plan.refused and not why]
    return render.page(
        request, "bulk_resume.html", title="Resume runs", run_status=status, cause=cause,
        plans=plans, counts=_counts(plans), ready=ready, done=None,
    )  # fmt: skip


@bulk.post("/resume")
async def bulk_resume(request: Request) -> HTMLResponse:
    session, fields = await checked_form(request)
    p = session.principal
    status, cause = fields.get("status", ""), fields.get("cause", "")
    plans = await _bulk_plans(request, p, status, cause)
    shown = [r for r in fields.get("runs", "").split(",") if r]
    ready = [rid for rid, plan, why in plans if plan is not None and not plan.refused and not why]
    if sorted(shown) != sorted(ready):
        raise PageError(
            409, "Not resumed",
            "The runs changed since you looked (some were resumed, handed over or refused "
            "meanwhile); nothing was changed. Look at the dry run again.",
        )  # fmt: skip
    reason = (fields.get("reason") or "").strip()[:900] or None
    actor = f"{p.user_id} (key {p.key_id}, console)"
    store = request.app.state.store
    done: list[tuple[str, str]] = []
    # Each run in its own transaction, as `runs resume --status` does: one refusal or
    # error leaves the others resumed and says which.
    for run_id, plan, _ in plans:
        if run_id not in ready:
            continue
        try:
            await store.transact(_as_shown, run_id, plan.from_step, actor, reason)
            done.append((run_id, "resumed"))
        except store_resume.ResumeRefused as exc:
            done.append((run_id, f"not resumed: {exc}"))
    return render.page(
        request, "bulk_resume.html", title="Resume runs", run_status=status, cause=cause,
        plans=[], counts={}, ready=[], done=done,
    )  # fmt: skip
