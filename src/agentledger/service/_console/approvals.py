"""``/ui/approvals``: the inbox (what the person may decide, oldest first) and the
decision form, answered by the API's own listing and decision handlers, so the rules
(role, tenant, four eyes, expiry, the arguments' hash) and the audit record are theirs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from agentledger.service._console import render
from agentledger.service._console.errors import PageError
from agentledger.service._console.signin import checked_form, signed_in
from agentledger.service._problems import Problem
from agentledger.service._routers import approvals as api

router = APIRouter(prefix="/ui/approvals", include_in_schema=False)
_SHOWN = 100

# The API's refusals of a decision, in words (the API's kinds: service/_problems.py).
_WORDS = {
    "arguments-changed": (
        "The arguments changed, look again: the proposal is not the one you were shown. "
        "Nothing was decided."
    ),
    "expired": "This approval expired before your decision reached it; nothing was decided.",
    "forbidden": "You may not decide this approval",
    "not-found": "There is no such approval here.",
}


def _in_words(exc: Problem) -> str:
    if exc.kind == "already-decided":
        who, what = exc.extra.get("decided_by"), exc.extra.get("decision")
        verb = "approved" if what == "approve" else "rejected"
        return f"Already decided: {who} {verb} it. Nothing was changed."
    if exc.kind == "expired" and "; " in exc.detail:  # "... expired; the default (x) was applied"
        return f"This approval expired; {exc.detail.split('; ', 1)[1]}. Nothing was decided."
    words = _WORDS.get(exc.kind)
    if exc.kind == "forbidden":
        return f"{words}: {exc.detail}."
    return words or exc.detail


async def _inbox(request: Request, **context: Any) -> dict[str, Any]:
    session = request.state.console_session
    listed = await api.list_approvals(request, session.principal, "pending", _SHOWN, None)
    return {"approvals": listed["approvals"], "more": listed["next_cursor"] is not None,
            "now": api.clock_of(request).now(), **context}  # fmt: skip


@router.get("")
async def inbox(request: Request, done: str | None = None) -> HTMLResponse:
    await signed_in(request)
    notice = None
    if done in ("approve", "reject"):
        notice = "Approved: the run goes on." if done == "approve" else "Rejected."
    return render.page(
        request, "approvals.html", title="Approvals", **await _inbox(request, notice=notice,
                                                                     refusal=None),
    )  # fmt: skip


@router.post("/{approval_id}/decision")
async def decision_form(request: Request, approval_id: str) -> Response:
    session, fields = await checked_form(request)
    decision = fields.get("decision")
    if decision != "approve" and decision != "reject":
        raise PageError(400, "Bad request", "Choose approve or reject.")
    reason = (fields.get("reason") or "").strip()[:2000] or None
    request.state.via = "console"
    try:
        body = api.ApprovalDecisionBody(
            decision="approve" if decision == "approve" else "reject",
            arguments_hash=fields.get("arguments_hash", ""),
            reason=reason,
        )
    except ValueError:
        raise PageError(400, "Bad request", "The form lacks the arguments it was shown.") from None
    try:
        await api.decide(approval_id, body, request, session.principal)
    except Problem as exc:
        context = await _inbox(request, notice=None, refusal=_in_words(exc))
        return render.page(request, "approvals.html", status=exc.status, title="Approvals",
                           **context)  # fmt: skip
    return RedirectResponse(f"/ui/approvals?done={decision}", status_code=303)
