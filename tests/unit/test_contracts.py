"""Tool contracts, the scripted model, retry delays and budgets, without a store."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentledger import (
    Budget,
    InvalidArguments,
    ModelRequest,
    RateLimited,
    ScriptedModel,
    ToolContext,
    Turn,
    UsageError,
    tool,
)
from agentledger.engine._retries import RetryState, next_delay
from agentledger.errors import BusinessError, ProviderError, ToolTimeout
from agentledger.models import Message
from agentledger.tools import RetryPolicy


async def _price(ctx: ToolContext, args: dict) -> int:
    return 12_000


@tool(effect="money", idempotency="provider", server_args={"amount": _price})
async def pay(ctx: ToolContext, booking_id: str, amount: int = 0) -> dict:
    """Charge a booking."""
    return {"booking_id": booking_id, "amount": amount}


def test_schema_hides_server_args_from_the_model() -> None:
    schema = pay.schema()
    assert schema.name == "pay"
    assert "booking_id" in schema.parameters["properties"]
    assert "amount" not in schema.parameters["properties"]
    assert schema.description == "Charge a booking."


def test_model_values_for_server_args_are_dropped_and_reported() -> None:
    args, ignored = pay.validate({"booking_id": "b1", "amount": 1})
    assert args == {"booking_id": "b1"}
    assert ignored == {"amount": 1}


def test_invalid_arguments_say_what_is_wrong() -> None:
    with pytest.raises(InvalidArguments, match="booking_id"):
        pay.validate({})
    with pytest.raises(InvalidArguments, match=r"(?i)extra"):
        pay.validate({"booking_id": "b1", "surprise": True})


def test_server_args_are_filled_by_the_server() -> None:
    ctx = ToolContext("r", 1, "r:1", 0.0, "default", None)
    filled = asyncio.run(pay.fill_server_args(ctx, {"booking_id": "b1"}))
    assert filled == {"booking_id": "b1", "amount": 12_000}


def test_writes_without_a_guard_use_the_effects_table() -> None:
    @tool(effect="write")
    async def poke(ctx: ToolContext) -> None:
        return None

    assert poke.idempotency == "effects"
    assert poke.writes


def test_tools_must_be_async_and_server_args_must_exist() -> None:
    with pytest.raises(UsageError):
        tool(lambda ctx: None)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="server_args"):

        @tool(server_args={"nope": _price})
        async def f(ctx: ToolContext, x: int) -> int:
            return x


def test_scripted_model_is_deterministic_and_counts_tokens() -> None:
    model = ScriptedModel([Turn(calls=[("pay", {"booking_id": "b1"})]), Turn(text="done")])
    request = ModelRequest(messages=[Message("user", "hi")], tools=[pay.schema()])
    first = asyncio.run(model.complete(request))
    again = asyncio.run(model.complete(request))
    assert first == again
    assert first.finish_reason == "tool_calls"
    assert json.loads(first.message.tool_calls[0].arguments) == {"booking_id": "b1"}
    assert first.usage.input_tokens > 0 and first.cost_usd > 0
    request.messages.append(first.message)
    assert asyncio.run(model.complete(request)).message.content == "done"


def test_scripted_misbehaviour() -> None:
    request = ModelRequest(messages=[Message("user", "hi")], tools=[])
    looping = ScriptedModel.looping("search", {"city": "x"})
    for _ in range(3):
        reply = asyncio.run(looping.complete(request))
        assert reply.message.tool_calls[0].name == "search"
        request.messages.append(reply.message)
    refusing = ScriptedModel([Turn(refusal="no")])
    refusal = asyncio.run(
        refusing.complete(ModelRequest(messages=[Message("user", "hi")], tools=[]))
    )
    assert (refusal.finish_reason, refusal.message.refusal) == ("refusal", "no")


@pytest.mark.parametrize(
    ("error", "limit"),
    [(RateLimited("slow down"), 3), (ProviderError("503"), 2), (ToolTimeout("t"), 1)],
)
def test_retry_limits_by_failure_class(error: Exception, limit: int) -> None:
    state = RetryState()
    delays = []
    while (d := next_delay(RetryPolicy(), state, error, is_read=True)) is not None:  # type: ignore[arg-type]
        delays.append(d)
    assert len(delays) == limit


def test_retry_after_is_honoured_and_business_errors_never_retry() -> None:
    state = RetryState()
    assert next_delay(RetryPolicy(), state, RateLimited(retry_after=7), is_read=True) >= 7  # type: ignore[operator]
    assert next_delay(RetryPolicy(), RetryState(), BusinessError("sold out"), is_read=True) is None
    assert next_delay(RetryPolicy(), RetryState(), ToolTimeout("t"), is_read=False) is None


def test_budget_names_the_limit_reached() -> None:
    budget = Budget()
    assert (budget.max_steps, budget.active_seconds, budget.max_tokens) == (20, 90.0, 60_000)
    assert budget.exceeded(1, 1.0, 10, 0.0) is None
    assert "step budget" in (budget.exceeded(20, 1.0, 10, 0.0) or "")
    assert "time budget" in (budget.exceeded(1, 91.0, 10, 0.0) or "")
    assert "token budget" in (budget.exceeded(1, 1.0, 60_000, 0.0) or "")
    assert "spend budget" in (budget.exceeded(1, 1.0, 10, 5.0) or "")
