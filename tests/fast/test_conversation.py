"""The conversation rebuilt on resume is the one the model saw before the crash, for
every outcome kind of a tool step (issue item 17)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import Agent, App, RunStatus, ScriptedModel, Status, ToolContext, Turn
from agentledger._policies import Allow, Deny, ProposedCall
from agentledger.errors import BusinessError
from agentledger.models._base import Message, ModelRequest, ModelResponse
from tests.fast.lifecycle_harness import KILLED, Harness, Killed


class CrashingModel(ScriptedModel):
    """Records what it is shown; the worker dies the first time it is asked turn 2."""

    def __init__(self, script: list[Turn]) -> None:
        super().__init__(script)
        self.seen: list[list[Message]] = []
        self.killed = False

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if sum(1 for m in request.messages if m.role == "assistant") == 1:
            self.seen.append([Message.from_dict(m.to_dict()) for m in request.messages])
            if not self.killed:
                self.killed = True
                raise Killed()
        return await super().complete(request)


CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "success": ("lookup", {"q": "rome"}),
    "business_error": ("sold_out", {"q": "rome"}),
    "deny": ("forbidden", {"q": "rome"}),
    "invalid_args": ("lookup", {"nope": 1}),
    "approval_rejected": ("needs_ok", {"q": "rome"}),
    "unknown_resolved": ("flaky_write", {"q": "rome"}),
}


def make_app(case: str, provider: dict[str, Any]) -> tuple[App, CrashingModel]:
    app = App("conv")

    @app.tool(effect="read")
    async def lookup(ctx: ToolContext, q: str) -> dict[str, Any]:
        return {"q": q, "hotels": [("h1", 3)], "note": "caf\udce9"}

    @app.tool(effect="read")
    async def sold_out(ctx: ToolContext, q: str) -> dict[str, Any]:
        raise BusinessError("sold out", data={"q": q})

    @app.tool(effect="read")
    async def forbidden(ctx: ToolContext, q: str) -> dict[str, Any]:
        raise AssertionError("a denied tool is never called")

    @app.tool(effect="write", idempotency="provider", approval="guest")
    async def needs_ok(ctx: ToolContext, q: str) -> dict[str, Any]:
        raise AssertionError("a rejected tool is never called")

    async def status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        return Status.succeeded(provider[ctx.idempotency_key])

    @app.tool(effect="write", idempotency="provider", status_check=status)
    async def flaky_write(ctx: ToolContext, q: str) -> dict[str, Any]:
        provider[ctx.idempotency_key] = {"written": q, "at": ("t", 1)}
        raise ConnectionResetError("reset after the provider applied it")

    def policy(call: ProposedCall) -> Any:
        return Deny("not for this guest") if call.tool == "forbidden" else Allow()

    tool, args = CASES[case]
    model = CrashingModel([Turn(calls=[(tool, args)]), Turn(text="here you go")])
    app.add_agent(
        Agent(
            name="concierge",
            model=model,
            instructions="help",
            tools=[lookup, sold_out, forbidden, needs_ok, flaky_write],
            policy=policy,
        )
    )
    return app, model


@pytest.mark.parametrize("case", list(CASES))
async def test_the_rebuilt_conversation_is_the_one_before_the_crash(
    tmp_path: Path, case: str
) -> None:
    provider: dict[str, Any] = {}
    app, model = make_app(case, provider)
    async with Harness(tmp_path, app) as h:
        run_id = await h.submit("concierge", {"message": "find me a room"})
        outcome = await h.execute(run_id)
        if case == "approval_rejected":
            assert outcome == RunStatus.WAITING
            (approval,) = await h.store.get_approvals(run_id)
            await h.store.decide_approval(approval.id, "reject", "guest:ann", h.clock)
            outcome = await h.execute(run_id)
        assert outcome == KILLED
        run = await h.drive(run_id)
    assert run.status == RunStatus.COMPLETED
    before, after = model.seen
    assert [m.to_dict() for m in after] == [m.to_dict() for m in before]
    assert before[-1].role == "tool"
    if case == "deny":
        assert '"error": "not_allowed"' in (before[-1].content or "")
