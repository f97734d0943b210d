"""The one status-check call shared by direct writes and outbox deliveries."""

from __future__ import annotations

import asyncio
from typing import Any

from agentledger.engine._retries import ask_status
from agentledger.tools._context import ToolContext
from agentledger.tools._contract import Tool
from agentledger.tools._status import Status


def _ctx() -> ToolContext:
    return ToolContext(
        run_id="r", step_no=1, idempotency_key="r:1", deadline=0.0, tenant_id="t", user_id=None
    )


async def _call(ctx: ToolContext, args: dict[str, Any]) -> Any:
    return None


def _tool(check: Any, timeout: float = 1.0) -> Tool:
    return Tool(name="pay", fn=_call, description="", timeout=timeout, status_check=check)


def test_the_answer_of_a_status_check_is_returned() -> None:
    async def check(ctx: ToolContext, args: dict[str, Any]) -> Status:
        assert ctx.idempotency_key == "r:1" and args == {"a": 1}
        return Status.succeeded({"id": 7})

    history: list[str] = []
    status = asyncio.run(ask_status(_tool(check), _ctx(), {"a": 1}, history))
    assert (status.state, status.result, history) == ("succeeded", {"id": 7}, [])


def test_a_check_that_could_not_ask_answers_pending_and_says_why() -> None:
    async def broken(ctx: ToolContext, args: dict[str, Any]) -> Status:
        raise ConnectionError("down")

    async def hangs(ctx: ToolContext, args: dict[str, Any]) -> Status:
        await asyncio.sleep(10)
        raise AssertionError("not reached")

    history: list[str] = []
    assert asyncio.run(ask_status(_tool(broken), _ctx(), {}, history)).state == "pending"
    assert asyncio.run(ask_status(_tool(hangs, 0.05), _ctx(), {}, history)).state == "pending"
    assert history == ["status_check:tool_error", "status_check:timeout"]
