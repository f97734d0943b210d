"""``/ui/effects``: the side effects ledger across the tenant's runs -- every write with
its key, state and tool (the provider it calls); writes whose outcome is open are listed
first. "Check now" (operators) asks the tool's status check about an open write's key,
from this process (it serves the app, so it has the tool), and shows the provider's
answer beside the journal's; the journal is left as it is: the run's worker settles it
by the same check when the run goes on.

A check is audited and rate-limited per write: the ask is recorded in the run's audit
trail (``effect.check_asked``: who, which write) before the provider is called, in a
transaction that refuses it when anyone asked about the same write within
``CHECK_EVERY`` seconds (the run row locked, so concurrent asks take turns); the answer
follows (``effect.checked``: what the provider said and what the journal says)."""

from __future__ import annotations

import hashlib
import json
import reprlib
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from agentledger.engine._retries import ask_status
from agentledger.observe._queries.resume import effect_state
from agentledger.service._auth import ADMIN, OPERATOR
from agentledger.service._console import render, story
from agentledger.service._console.errors import PageError, not_found
from agentledger.service._console.signin import checked_form, signed_in
from agentledger.service._cursors import make_cursor, parse_cursor
from agentledger.service._problems import Problem
from agentledger.service._queries import console as queries
from agentledger.store._queries import service_runs
from agentledger.tools._context import Principal, ToolContext
from agentledger.tools._status import Status

router = APIRouter(prefix="/ui/effects", include_in_schema=False)
CHECK_EVERY = 30.0  # seconds: a write's provider is asked at most this often
_PROVIDER_WORDS = {
    "succeeded": "succeeded: it happened",
    "not_found": "not found: it did not happen",
    "pending": "pending: ask again later",
    "failed": "failed",
}


@router.get("")
async def effects_page(request: Request, cursor: str | None = None) -> HTMLResponse:
    session = await signed_in(request)
    try:
        after = parse_cursor(cursor) if cursor and len(cursor) <= 400 else None
    except Problem:
        after = None
    found = await request.app.state.store.read(queries.ledger, session.principal.tenant_id, after)
    may_check = session.principal.has(OPERATOR, ADMIN)
    for group in ("open", "writes"):
        for row in found[group]:
            row["words"] = story.effect_words(row["step"], row["run_status"])
            row["checkable"] = may_check and _checkable(request, row["step"]) is not None
    nxt = make_cursor(*found["next"]) if found["next"] else None
    return render.page(
        request, "effects.html", title="Side effects", open=found["open"],
        writes=found["writes"], next_cursor=nxt, check_every=int(CHECK_EVERY),
    )  # fmt: skip


_RECORD_LIMIT = 8000  # characters of a provider's result the audit trail keeps
_SHORT = reprlib.Repr()  # what JSON cannot hold is kept as a bounded text instead
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 6, _RECORD_LIMIT, 200
_SHORT.maxdict = _SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = 100


def _recorded(result: Any) -> Any:
    """The provider's result (or error) as the audit trail keeps it: JSON, cut to
    ``_RECORD_LIMIT`` characters with its full digest; what JSON cannot hold (a cycle,
    keys that are not text) as a bounded text of it."""
    try:
        text = json.dumps(result, default=str, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return {"not_json": _SHORT.repr(result)}
    if len(text) <= _RECORD_LIMIT:
        return json.loads(text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return {"cut_to": _RECORD_LIMIT, "sha256": digest, "text": text[:_RECORD_LIMIT]}


def _answer_of(answer: Any, history: list[str]) -> Status:
    """The status check's answer, or ``pending`` with ``history`` saying why when it is
    not a status this console knows (a check returns whatever its code returns)."""
    if isinstance(answer, Status) and answer.state in _PROVIDER_WORDS:
        return answer
    history.append("status_check:not_a_status")
    return Status.pending()


def _checkable(request: Request, step: Any) -> Any:
    """The tool whose status check can say what became of this write (open outcomes
    only), or None."""
    if effect_state(step) != "unknown" or not step.idempotency_key:
        return None
    tool = request.app.state.agent_app.tools.get(step.name)
    return tool if tool is not None and tool.status_check is not None else None


@router.post("/check")
async def check_now(request: Request) -> HTMLResponse:
    session, fields = await checked_form(request)
    p = session.principal
    run_id = fields.get("run_id", "")[:200]
    try:
        step_no = int(fields.get("step_no", ""))
    except ValueError:
        raise PageError(400, "Bad request", "The form lacks the step to check.") from None
    if not 0 <= step_no < 2**31:  # a step number the store can hold (SQLite: 64 bits)
        raise not_found(f"step {str(step_no)[:20]}")
    store = request.app.state.store
    row = await store.read(service_runs.service_run, run_id, p.tenant_id)
    if row is None:
        raise not_found(f"run {run_id}")
    if not p.has(OPERATOR, ADMIN):
        raise PageError(403, "Not allowed", "Asking a provider needs the role operator.")
    run = row["run"]
    step = await store.read(queries.one_step, run_id, step_no)
    if step is None:
        raise not_found(f"step {step_no} of run {run_id}")
    tool = _checkable(request, step)
    if tool is None:
        raise PageError(
            409, "Nothing to check",
            "This write's outcome is not open, or its tool has no status check.",
        )  # fmt: skip
    actor = f"{p.user_id} (key {p.key_id}, console)"
    journal = story.effect_words(step, run.status)
    earlier = await store.transact(
        queries.claim_status_check, run.id, step.step_no, step.idempotency_key, step.name,
        actor, CHECK_EVERY,
    )  # fmt: skip
    if earlier is not None:
        wait = max(1, int(earlier["at"] + CHECK_EVERY - time.time() + 0.999))
        raise PageError(
            429, "Asked a moment ago",
            f"The provider was asked about {step.idempotency_key} by {earlier['actor']} "
            f"{max(0, int(time.time() - earlier['at']))} s ago; a write's provider is asked "
            f"at most once every {int(CHECK_EVERY)} s. Ask again in {wait} s.",
        )  # fmt: skip
    app = request.app.state.agent_app
    ctx = ToolContext(
        run_id=run.id, step_no=step.step_no, idempotency_key=step.idempotency_key,
        deadline=time.monotonic() + tool.timeout, tenant_id=run.tenant_id,
        user_id=run.user_id, attempt=max(1, step.attempts), run_input=run.input,
        resources=app.resources,
        principal=Principal.of_run(run.tenant_id, run.user_id, run.principal),
    )  # fmt: skip
    args = step.input.get("args", {}) if isinstance(step.input, dict) else {}
    history: list[str] = []
    answer = _answer_of(await ask_status(tool, ctx, args, history), history)
    result, error = _recorded(answer.result), _recorded(answer.error)
    provider = (
        f"could not ask ({', '.join(history)}): no answer"
        if history
        else _PROVIDER_WORDS.get(answer.state, str(answer.state))
    )
    await store.transact(
        queries.record_status_check, run.id, actor,
        {"step_no": step.step_no, "key": step.idempotency_key, "tool": step.name,
         "journal": journal, "provider": provider, "provider_state": str(answer.state),
         "result": result, "error": error,
         "could_not_ask": history},
    )  # fmt: skip
    return render.page(
        request, "check.html", title=f"Status check of {step.idempotency_key}", run=run,
        step=step, journal=journal, provider=provider, result=result, error=error,
        check_every=int(CHECK_EVERY),
    )  # fmt: skip
