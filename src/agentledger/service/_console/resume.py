"""``/ui/runs/{id}/resume``: continue a failed or ``needs_human`` run, for operators.
The page first shows the dry run -- the steps that run again and every side effect
from there on with its state, key and what the resume does with it -- and the button
resumes exactly that plan (the service's resume, ``service/_resuming.py``: the store's
one resume, as the API's and ``agentledger runs resume``): a plan that changed
meanwhile is refused, and so is any resume that would call again a write whose outcome
is unknown and cannot be checked. A plan that re-executes confirmed effects (executed
writes or compensations) goes ahead only when the person ticks the force option and
gives a reason; the ``run.resumed`` audit event records who, why and those effects."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from agentledger.observe._queries import resume as store_resume
from agentledger.service import _resuming as resuming
from agentledger.service._auth import ADMIN, OPERATOR, Principal
from agentledger.service._console import render
from agentledger.service._console.errors import PageError, not_found
from agentledger.service._console.signin import checked_form, signed_in
from agentledger.service._problems import Problem
from agentledger.service._queries import console as queries
from agentledger.store._queries import service_runs

router = APIRouter(prefix="/ui/runs", include_in_schema=False)
_FORCE_HOW = (
    "To re-execute them anyway, tick the force option and give a reason: it is recorded "
    "in the audit trail with your name and those effects."
)


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


def _steps(text: str) -> list[int]:
    """Step numbers a form carried (``"2,5"``); malformed ones read as none."""
    try:
        return sorted(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        return [-1]


def as_shown(from_step: int, forced: list[int] | None) -> resuming.Check:
    """A check of the plan the store is about to carry out against the dry run the
    person saw: the same first step, and (when forced) the same confirmed effects."""

    def check(plan: store_resume.ResumePlan) -> None:
        if plan.from_step != from_step:
            raise store_resume.ResumeRefused(
                f"the run changed since you looked: it would now resume from step "
                f"{plan.from_step}, not {from_step}"
            )
        if forced is not None and sorted(e["step_no"] for e in plan.forced) != forced:
            raise store_resume.ResumeRefused(
                "the run changed since you looked: the confirmed effects a forced resume "
                "re-executes are not the ones you were shown"
            )

    return check


def _force_fields(fields: dict[str, str]) -> tuple[bool, str | None]:
    """The form's force option and reason; a force without a reason is refused here."""
    force = fields.get("force") == "yes"
    reason = (fields.get("reason") or "").strip()[:900] or None
    if force and reason is None:
        raise PageError(
            400, "Not resumed",
            "A forced resume needs a reason: it is recorded in the audit trail with your "
            "name and the confirmed effects it re-executes. Nothing was changed.",
        )  # fmt: skip
    return force, reason


def _page_error(exc: Problem) -> PageError:
    detail = f"Nothing was changed. {exc.detail}"
    if exc.kind == "resume-needs-force":
        detail = f"{detail} {_FORCE_HOW}"
    return PageError(exc.status, "Not resumed", detail)


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
    force, reason = _force_fields(fields)
    forced = _steps(fields.get("forced", "")) if force else None
    request.state.via = "console"
    try:
        await resuming.resume(
            request, p, run_id, None, reason, force, check=as_shown(shown, forced)
        )
    except Problem as exc:
        raise _page_error(exc) from None
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


def _sorted(plans: list[Any]) -> tuple[list[str], list[str]]:
    """The runs that resume as they are, and those that resume only forced."""
    ready: list[str] = []
    forced: list[str] = []
    for run_id, plan, why in plans:
        if plan is None or plan.refused or why:
            continue
        (forced if plan.needs_force else ready).append(run_id)
    return ready, forced


def _counts(plans: list[Any]) -> dict[str, int]:
    """What the dry runs add up to: runs resumed, resumed only forced, refused; the
    effects by state; the confirmed effects a force would re-execute."""
    out = {"resumable": 0, "needs_force": 0, "refused": 0, "forced_effects": 0}
    for _, plan, refusal in plans:
        if plan is None or plan.refused or refusal:
            out["refused"] += 1
            continue
        if plan.needs_force:
            out["needs_force"] += 1
            out["forced_effects"] += len(plan.forced)
        else:
            out["resumable"] += 1
        for e in plan.effects:
            out[e["state"]] = out.get(e["state"], 0) + 1
    return out


def _forced_mark(plans: list[Any]) -> str:
    """Which confirmed effects a bulk force re-executes (each run's, by step and key), as
    a short digest the form carries: the same runs and the same count may still be other
    effects, if the runs changed between the dry run and the POST."""
    forced = sorted(
        [run_id, e["step_no"], e["key"]]
        for run_id, plan, why in plans
        if plan is not None and not plan.refused and not why and plan.needs_force
        for e in plan.forced
    )
    return hashlib.sha256(json.dumps(forced).encode()).hexdigest()[:32]


def _bulk_page(
    request: Request, status: str, cause: str, plans: list[Any], done: Any
) -> HTMLResponse:
    ready, forced = _sorted(plans)
    return render.page(
        request, "bulk_resume.html", title="Resume runs", run_status=status, cause=cause,
        plans=plans, counts=_counts(plans), ready=ready, forced=forced, done=done,
        forced_mark=_forced_mark(plans),
    )  # fmt: skip


@bulk.get("/resume")
async def bulk_dry_run(request: Request, status: str = "", cause: str = "") -> HTMLResponse:
    session = await signed_in(request)
    plans = await _bulk_plans(request, session.principal, status, cause)
    return _bulk_page(request, status, cause, plans, None)


@bulk.post("/resume")
async def bulk_resume(request: Request) -> HTMLResponse:
    session, fields = await checked_form(request)
    p = session.principal
    status, cause = fields.get("status", ""), fields.get("cause", "")
    plans = await _bulk_plans(request, p, status, cause)
    ready, needs_force = _sorted(plans)
    shown = sorted(r for r in fields.get("runs", "").split(",") if r)
    shown_forced = sorted(r for r in fields.get("forced_runs", "").split(",") if r)
    force, reason = _force_fields(fields)
    # The confirmed effects a force re-executes, the very ones the dry run listed.
    if (
        shown != sorted(ready)
        or shown_forced != sorted(needs_force)
        or (force and needs_force and fields.get("forced_effects") != _forced_mark(plans))
    ):
        raise PageError(
            409, "Not resumed",
            "The runs changed since you looked (some were resumed, handed over or refused, "
            "or their confirmed effects changed meanwhile); nothing was changed. Look at the "
            "dry run again.",
        )  # fmt: skip
    request.state.via = "console"
    done: list[tuple[str, str]] = []
    # Each run in its own transaction, as `runs resume --status` does: one refusal or
    # error leaves the others resumed and says which.
    for run_id, plan, _ in plans:
        if run_id in needs_force and not force:
            done.append((run_id, "not resumed: it would re-execute confirmed effects, and "
                                 "the force option was not ticked"))  # fmt: skip
            continue
        if run_id not in ready and run_id not in needs_force:
            continue
        forced = sorted(e["step_no"] for e in plan.forced) if run_id in needs_force else None
        try:
            await resuming.resume(
                request, p, run_id, None, reason, force and forced is not None,
                check=as_shown(plan.from_step, forced),
            )  # fmt: skip
            done.append((run_id, "resumed, forced" if forced is not None else "resumed"))
        except Problem as exc:
            done.append((run_id, exc.detail))
    return _bulk_page(request, status, cause, [], done)
