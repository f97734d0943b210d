"""``/v1/runs``: submit (202), read, result long-poll, journal, list, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from agentledger._canonical import NotJournalable, journal_value
from agentledger._clock import Clock
from agentledger.errors import UnknownTargetError
from agentledger.observe._queries.resume import MAX_STEP_NO
from agentledger.service import _accepting as accepting
from agentledger.service import _resuming as resuming
from agentledger.service._auth import ADMIN, OPERATOR, Caller
from agentledger.service._cursors import make_cursor, parse_cursor
from agentledger.service._deps import run_or_404
from agentledger.service._egress import Refused
from agentledger.service._idempotency import fingerprint, parse_key
from agentledger.service._problems import PROBLEM_SCHEMA, Problem
from agentledger.service._routers.approvals import clock_of
from agentledger.service._views import RunView, run_view
from agentledger.service._webhooks import webhook_for
from agentledger.store import NewRun
from agentledger.store._queries import service_runs
from agentledger.store._queries.common import new_id

router = APIRouter(prefix="/v1/runs", tags=["runs"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: PROBLEM_SCHEMA for code in (400, 401, 403, 404, 409, 422, 429)
}


_ONE_TARGET = (
    "Name what to run in exactly one of agent, workflow or name; "
    "`agent` and `name` take either kind, `workflow` only a workflow."
)
_TARGET_FIELDS = ("agent", "workflow", "name")


class SubmitRun(BaseModel):
    """``POST /v1/runs``. What to run is named by exactly one of ``agent``,
    ``workflow`` or ``name``; the others stay unset. After validation ``agent`` holds
    the name whichever field carried it (``named_by`` says which), so a body's
    fingerprint (Idempotency-Key) is the same whichever field a retry uses."""

    model_config = ConfigDict(extra="forbid")

    agent: str | None = Field(
        default=None, min_length=1, max_length=200,
        description=f"An agent's (or workflow's) name. {_ONE_TARGET}",
    )  # fmt: skip
    workflow: str | None = Field(
        default=None, min_length=1, max_length=200, exclude=True,
        description=f"A workflow's name. {_ONE_TARGET}",
    )  # fmt: skip
    name: str | None = Field(
        default=None, min_length=1, max_length=200, exclude=True,
        description=f"An agent's or workflow's name. {_ONE_TARGET}",
    )  # fmt: skip
    version: str | None = Field(default=None, min_length=1, max_length=100)
    input: Any = Field(default_factory=dict, description="The run's input (JSON)")
    webhook: str | None = Field(
        default=None,
        max_length=2000,
        pattern=r"^https?://[^\s\x00-\x1f\x7f]+$",
        description="Webhook URL",
    )

    @model_validator(mode="after")
    def _one_target(self) -> SubmitRun:
        given = [f for f in _TARGET_FIELDS if getattr(self, f) is not None]
        if len(given) != 1:
            got = f"got {', '.join(given)}" if given else "got none"
            raise PydanticCustomError(
                "one_target",
                "send exactly one of agent, workflow or name ({got}): "
                "a workflow's name in workflow, an agent's in agent",
                {"got": got},
            )
        self.agent = getattr(self, given[0])
        return self

    @property
    def named_by(self) -> str:
        """The field the body named its target in."""
        return "workflow" if self.workflow is not None else "name" if self.name else "agent"

    @property
    def target(self) -> str:
        """The agent's or workflow's name, whichever field carried it."""
        return str(self.agent)


class CancelRun(BaseModel):
    """``POST /v1/runs/{id}/cancel``."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="cancelled through the API", max_length=1000)


class ResumeRun(BaseModel):
    """``POST /v1/runs/{id}/resume``. Strict JSON types: a ``"dry_run": "false"`` read
    as a bool would resume for real, a ``"from_step": true`` would run it all again."""

    model_config = ConfigDict(extra="forbid", strict=True)

    from_step: int | None = Field(
        default=None, ge=1, le=MAX_STEP_NO,
        description="Re-execute from this step on (default: the failed step).",
    )  # fmt: skip
    dry_run: bool = Field(default=False, description="Answer the plan; change nothing.")
    force: bool = Field(
        default=False,
        description="Re-execute the confirmed effects the plan lists (`needs_force`); needs "
        "a reason, recorded in the audit trail with who forced it and those effects.",
    )
    reason: str | None = Field(default=None, max_length=1000, description="Why (audited).")

    @model_validator(mode="after")
    def _force_has_reason(self) -> ResumeRun:
        if self.force and not self.dry_run and not (self.reason or "").strip():
            raise PydanticCustomError(
                "force_reason",
                "force needs a reason: it is recorded in the audit trail with who forced "
                "the resume and the confirmed effects it re-executes",
            )
        return self


def _validate_input(definition: Any, value: Any) -> None:
    """Check the input against the agent's declared schema (``input_model``), if any."""
    model = getattr(definition, "input_model", None)
    if model is None:
        return
    try:
        TypeAdapter(model).validate_python(value)
    except ValidationError as exc:
        errors = [
            {"loc": ["body", "input", *[str(p) for p in e["loc"]]], "msg": e["msg"]}
            for e in exc.errors()
        ]
        first = ".".join(errors[0]["loc"][1:]) if errors else "input"
        raise Problem(
            "validation-error", f"{first}: {errors[0]['msg'] if errors else 'invalid'}",
            errors=errors,
        ) from None  # fmt: skip


def _has_writes(definition: Any) -> bool:
    return any(getattr(t, "effect", "read") != "read" for t in getattr(definition, "tools", ()))


@router.post("", status_code=202, responses=ERRORS)
async def submit_run(
    body: SubmitRun,
    request: Request,
    principal: Caller,
) -> JSONResponse:
    """Queue a run; nothing executes in the request. Answers 202, ``Location`` and
    ``Retry-After``. Name what to run in exactly one of ``workflow`` (a workflow),
    ``agent`` (an agent, or any target as before) or ``name`` (either kind). With
    ``Idempotency-Key``, a retry gets the first answer again."""
    state = request.app.state
    if not principal.acts:
        raise Problem(
            "forbidden",
            f"a key with only the roles {', '.join(sorted(principal.roles))} cannot start "
            "runs; use a key with the role operator",
        )
    key = parse_key(request.headers.get("idempotency-key"))
    try:
        definition = state.agent_app.resolve(body.target, body.version)
    except UnknownTargetError as exc:
        raise Problem(
            "validation-error",
            f"{body.named_by}: {exc}",
            errors=[{"loc": ["body", body.named_by], "msg": str(exc)}],
        ) from None
    if body.named_by == "workflow" and definition.kind != "workflow":
        msg = f'{body.target} is an {definition.kind}, not a workflow: send {{"agent": ...}}'
        raise Problem(
            "validation-error",
            f"workflow: {msg}",
            errors=[{"loc": ["body", "workflow"], "msg": msg}],
        )
    _validate_input(definition, body.input)
    try:
        # What the store will journal: NaN, the infinities, nesting past the journal's
        # depth are refused here (422), not by the commit (which would be a 500).
        journal_value(body.input)
    except NotJournalable as exc:
        raise Problem(
            "validation-error",
            f"input: {exc}",
            errors=[{"loc": ["body", "input"], "msg": str(exc)}],
        ) from None
    if body.webhook is not None:
        try:
            await state.egress.check(body.webhook)
        except Refused as exc:
            raise Problem(
                "webhook-refused", str(exc), errors=[{"loc": ["body", "webhook"], "msg": str(exc)}]
            ) from None
    settings = state.settings
    if key is None and settings.require_idempotency_for_writes and _has_writes(definition):
        raise Problem(
            "idempotency-key-required",
            f"{definition.name} has side-effecting tools: send an Idempotency-Key header",
        )
    idem = None
    if key is not None:
        idem = accepting.IdempotencyRequest(
            key, fingerprint(body.model_dump(mode="json")), settings.idempotency_ttl
        )
    new = NewRun(
        kind=definition.kind,
        name=definition.name,
        version=definition.version,
        input=body.input,
        tenant_id=principal.tenant_id,
        user_id=principal.user_id,
        request_id=new_id("q"),
    )
    quota = accepting.Quota(settings.runs_per_minute, settings.max_in_flight)

    def respond(run: Any) -> dict[str, Any]:
        return run_view({"run": run, "principal": principal.as_dict()})

    submit_request = accepting.SubmitRequest(
        new, principal.as_dict(),
        webhook_for(definition, settings.agent_webhooks, body.webhook), idem, quota, respond,
        getattr(request.state, "request_id", None),
    )  # fmt: skip

    async def submit() -> accepting.Submitted:
        try:
            # Committed with the other accepts waiting now (one fsync).
            return await state.accepts.submit(submit_request)
        except accepting.IdempotencyMismatch as exc:
            raise Problem("idempotency-key-reused", str(exc)) from None
        except accepting.QuotaExceeded as exc:
            raise Problem(
                "quota-exceeded", str(exc), headers={"Retry-After": str(exc.retry_after)}
            ) from None

    if idem is None:
        done = await submit()
    else:
        async with state.in_flight.hold(principal.tenant_id, idem.key, settings.idempotency_wait):
            done = await submit()
    headers = {"Location": f"/v1/runs/{done.run.id}", "Retry-After": "1"}
    if done.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(done.response, status_code=202, headers=headers)


@router.get(
    "/{run_id}",
    # Published, not enforced per answer: run_view builds it (tests/service hold the
    # two to the same fields).
    response_model=None,
    responses={200: {"model": RunView, "description": "The run"}, **ERRORS},
)
async def get_run(run_id: str, request: Request, principal: Caller) -> dict[str, Any]:
    """Status, step count, result, tokens, cost (``usage_simulated``: a scripted model's,
    counted and billed by nobody), the pending approval, the handover reason."""
    return run_view(await run_or_404(request, run_id, principal.tenant_id))


@router.get("/{run_id}/result", responses={**ERRORS, 202: {"description": "Not finished yet"}})
async def get_result(
    run_id: str,
    request: Request,
    principal: Caller,
    wait: float = Query(0, ge=0, le=60, description="Seconds to wait for the end"),
) -> JSONResponse:
    """200 with the result once the run is terminal; otherwise waits up to ``wait`` s and
    answers 202 + ``Retry-After``. A run parked for an approval is answered at once
    (202 with ``pending_approval``) unless the approval expires within the wait: only
    a decision moves it on."""
    state = request.app.state
    deadline = time.monotonic() + min(wait, state.settings.max_wait)
    # Watch only a run we may see; one already answerable is answered without watching.
    row = await run_or_404(request, run_id, principal.tenant_id)
    clock = clock_of(request)
    answer = _result_answer(row, deadline, clock)
    if answer is not None:
        return answer
    async with state.hub.watch(run_id) as changed:
        while True:
            changed.clear()
            row = await run_or_404(request, run_id, principal.tenant_id)
            answer = _result_answer(row, deadline, clock)
            if answer is not None:
                return answer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=deadline - time.monotonic())


def _result_answer(row: dict[str, Any], deadline: float, clock: Clock) -> JSONResponse | None:
    """``result``'s answer for ``row`` now: 200 when terminal; 202 when out of time, or
    when parked for an approval that will not expire within the wait (only a person
    moves it on, so holding the request helps nobody); None to keep waiting (an approval
    expiring within the wait gets its default, and the run goes on)."""
    if row["run"].terminal:
        return JSONResponse(run_view(row), status_code=200)
    left = deadline - time.monotonic()
    pending = row.get("pending_approval")
    parked = pending is not None and pending.expires_at - clock.now() > left
    if parked or left <= 0:
        return JSONResponse(run_view(row), status_code=202, headers={"Retry-After": "1"})
    return None


@router.get("/{run_id}/steps", responses=ERRORS)
async def get_steps(run_id: str, request: Request, principal: Caller) -> dict[str, Any]:
    """The run's journal, one entry per step."""
    await run_or_404(request, run_id, principal.tenant_id)
    steps = await request.app.state.store.read(service_runs.run_steps, run_id)
    return {"run_id": run_id, "steps": steps}


Status = Literal[
    "queued", "running", "waiting", "completed", "failed", "cancelled", "expired", "needs_human"
]


@router.get("", responses=ERRORS)
async def list_runs(
    request: Request,
    principal: Caller,
    status: Status | None = None,
    agent: str | None = Query(None, max_length=200),
    version: str | None = Query(None, max_length=100),
    user: str | None = Query(None, max_length=200),
    created_after: float | None = Query(None, ge=0, le=1e11),
    created_before: float | None = Query(None, ge=0, le=1e11),
    waiting_approval: bool | None = None,
    needs_human: bool | None = None,
    cursor: str | None = Query(None, max_length=500),
    limit: int = Query(50, ge=1, le=500),
) -> dict[str, Any]:
    """The tenant's runs, newest first; pass ``next_cursor`` back as ``cursor``."""
    f = service_runs.RunFilter(
        tenant_id=principal.tenant_id,
        status=status,
        agent=agent,
        version=version,
        user=user,
        created_after=created_after,
        created_before=created_before,
        waiting_approval=waiting_approval,
        needs_human=needs_human,
        cursor=parse_cursor(cursor),
        limit=limit,
    )
    found = await request.app.state.store.read(service_runs.list_service_runs, f)
    nxt = None
    if len(found) == limit:
        last = found[-1]["run"]
        nxt = make_cursor(last.created_at, last.id)
    return {"runs": [run_view(r) for r in found], "next_cursor": nxt}


@router.post("/{run_id}/cancel", status_code=202, responses={**ERRORS, 200: {}})
async def cancel_run(
    run_id: str,
    request: Request,
    principal: Caller,
    body: CancelRun | None = None,
) -> JSONResponse:
    """Request the cancel (idempotent): 202, or 200 when the run is already terminal.
    The worker stops at the next step boundary and compensates."""
    row = await run_or_404(request, run_id, principal.tenant_id)
    own = row["run"].user_id == principal.user_id and principal.acts
    if not (principal.has(OPERATOR, ADMIN) or own):
        raise Problem("forbidden", "cancelling another user's run needs the role operator")
    if row["run"].terminal:
        return JSONResponse(run_view(row), status_code=200)
    reason = (body or CancelRun()).reason
    # The console calls this handler too, and says so (``request.state.via``).
    via = getattr(request.state, "via", None)
    actor = f"{principal.user_id} (key {principal.key_id}{f', {via}' if via else ''})"
    await request.app.state.store.cancel_run(run_id, reason, actor)
    row = await run_or_404(request, run_id, principal.tenant_id)
    return JSONResponse(run_view(row), status_code=202)


@router.post("/{run_id}/resume", responses=ERRORS)
async def resume_run(
    run_id: str, request: Request, principal: Caller, body: ResumeRun
) -> dict[str, Any]:
    """Continue a failed or ``needs_human`` run from a step (role operator), or with
    ``dry_run`` answer what it would do: every side effect from there on with its state,
    key and what the resume does with it. Refused (409) when it would call again a write
    whose outcome is unknown without a status check, and, without ``force`` and a
    ``reason``, when it would re-execute confirmed effects (``needs_force``)."""
    await run_or_404(request, run_id, principal.tenant_id)
    if not principal.has(OPERATOR, ADMIN):
        raise Problem("forbidden", "resuming a run needs the role operator")
    plan = await resuming.resume(
        request, principal, run_id, body.from_step, body.reason, body.force, body.dry_run
    )
    return plan.to_dict()
