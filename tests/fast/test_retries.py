"""Retry by failure class: the decision table, Retry-After, HTTP mapping, reads."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
import pytest

from agentledger.engine._retries import (
    CHECK,
    FAIL,
    GIVE_UP,
    RETRY,
    RetryState,
    after_failure,
    as_tool_error,
    backoff,
    call_with_timeout,
    next_delay,
)
from agentledger.engine._signals import Park
from agentledger.engine._steps import wait_or_park
from agentledger.engine._tool_step import run_tool_step
from agentledger.errors import (
    BusinessError,
    DeadlineReached,
    InProgress,
    InvalidArguments,
    NotSent,
    ProviderError,
    RateLimited,
    Refused,
    ToolError,
    ToolTimeout,
)
from agentledger.records import StepStatus
from agentledger.tools._contract import RetryPolicy
from agentledger.tools._http import call_provider, raise_for_provider, retry_after_seconds
from tests.fast.writes_harness import Fault, Provider, World, make_tool, world

__all__ = ["world"]

POLICY = RetryPolicy()


# Retry-After -----------------------------------------------------------------------------


@pytest.mark.parametrize("retry_after", [math.inf, 1e9, 300.5])
def test_a_retry_after_past_the_cap_is_no_delay_at_all(retry_after: float) -> None:
    assert backoff(POLICY, 1, retry_after) is None
    state = RetryState()
    decision = after_failure(POLICY, state, RateLimited(retry_after=retry_after), write=False)
    assert decision.action == FAIL


def test_a_retry_after_within_the_cap_is_honoured() -> None:
    assert backoff(POLICY, 1, 299.0) == 299.0
    assert backoff(RetryPolicy(max_retry_after=10), 1, 11.0) is None
    delay = backoff(POLICY, 1, math.nan)  # meaningless: the plain backoff
    assert delay is not None and math.isfinite(delay)


def test_retry_after_parsing_keeps_infinity_for_the_cap_and_drops_nan() -> None:
    assert retry_after_seconds("inf") == math.inf
    assert retry_after_seconds("nan") is None
    assert retry_after_seconds("12") == 12.0
    assert retry_after_seconds("-3") == 0.0
    assert retry_after_seconds("garbage") is None
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


# the decision table ------------------------------------------------------------------------


@pytest.mark.parametrize("error", [BusinessError("x"), Refused("x"), InvalidArguments("x")])
def test_answers_are_final_for_reads_and_writes(error: ToolError) -> None:
    for write in (False, True):
        assert after_failure(POLICY, RetryState(), error, write=write).action == FAIL


def test_a_reads_classes() -> None:
    state = RetryState()
    assert [
        after_failure(POLICY, state, ProviderError("5xx"), write=False).action for _ in range(3)
    ] == [
        RETRY,
        RETRY,
        FAIL,
    ]
    state = RetryState()
    assert [
        after_failure(POLICY, state, ToolTimeout("t"), write=False).action for _ in range(2)
    ] == [
        RETRY,
        FAIL,
    ]
    state = RetryState()
    actions = [
        after_failure(POLICY, state, InProgress("409"), write=False).action for _ in range(6)
    ]
    assert actions == [RETRY] * 5 + [FAIL]
    assert after_failure(POLICY, RetryState(), ToolError("bug"), write=False).action == FAIL
    assert after_failure(POLICY, RetryState(), DeadlineReached("x"), write=False).action == FAIL
    assert next_delay(POLICY, RetryState(), ProviderError("5xx"), is_read=True) is not None
    assert next_delay(POLICY, RetryState(), BusinessError("no"), is_read=True) is None


def test_a_writes_5xx_is_unknown_never_safe_to_resend_blind() -> None:
    state = RetryState()
    assert (
        after_failure(POLICY, state, ProviderError("500"), write=True, checkable=True).action
        == CHECK
    )
    assert state.maybe_applied and state.doubt == "provider_error"
    keyed = after_failure(POLICY, RetryState(), ProviderError("500"), write=True, keyed=True)
    assert keyed.action == RETRY  # the same key: the provider dedupes it
    assert after_failure(POLICY, RetryState(), ProviderError("500"), write=True).action == GIVE_UP


def test_not_sent_and_429_are_safe_to_resend_unless_an_earlier_attempt_is_in_doubt() -> None:
    state = RetryState()
    for error in (NotSent("refused"), RateLimited()):
        assert after_failure(POLICY, state, error, write=True).action == RETRY
    doubt = RetryState(maybe_applied=True, provider_error=2)
    assert after_failure(POLICY, doubt, NotSent("refused"), write=True).action == GIVE_UP
    doubt = RetryState(maybe_applied=True, rate_limited=3)
    assert after_failure(POLICY, doubt, RateLimited(), write=True, checkable=True).action == CHECK


def test_a_deadline_is_not_applied_unless_an_earlier_attempt_is_in_doubt() -> None:
    assert after_failure(POLICY, RetryState(), DeadlineReached("x"), write=True).action == FAIL
    doubt = RetryState(maybe_applied=True)
    assert after_failure(POLICY, doubt, DeadlineReached("x"), write=True).action == GIVE_UP


# calls -------------------------------------------------------------------------------------


async def test_no_time_left_means_not_called() -> None:
    called: list[int] = []

    async def fn() -> int:
        called.append(1)
        return 1

    for left in (0.0, -1.0, math.nan):
        with pytest.raises(DeadlineReached):
            await call_with_timeout(fn, left)
    assert called == []
    with pytest.raises(ToolTimeout):
        await call_with_timeout(lambda: asyncio.sleep(1), 0.01)


def test_unexpected_exceptions_become_classes() -> None:
    assert as_tool_error(TimeoutError()).error_class == "timeout"
    assert as_tool_error(KeyError("x")).error_class == "tool_error"


async def test_wait_or_park_refuses_a_non_finite_delay(world: World) -> None:
    exe = await world.new_execution()
    from agentledger.engine._steps import new_step

    step = new_step(exe, 1, "tool", "x", status="")
    with pytest.raises(ValueError):
        await wait_or_park(exe, step, RetryState(), math.inf, ToolError("x"))
    with pytest.raises(Park):
        await wait_or_park(exe, step, RetryState(), 100.0, ToolError("x"))


# HTTP mapping --------------------------------------------------------------------------------


def _response(status: int, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def test_409_request_in_progress_is_in_progress_not_a_business_error() -> None:
    with pytest.raises(InProgress):
        raise_for_provider(_response(409, {"error": "request_in_progress"}))
    with pytest.raises(InProgress):  # Stripe's shape
        raise_for_provider(_response(409, {"error": {"code": "request_in_progress"}}))
    with pytest.raises(BusinessError):
        raise_for_provider(_response(409, {"error": "sold_out"}))


def test_http_answers_map_to_classes() -> None:
    with pytest.raises(RateLimited) as limited:
        raise_for_provider(_response(429, {"error": "slow"}, {"Retry-After": "inf"}))
    assert limited.value.retry_after == math.inf
    for status in (500, 502, 503, 504):
        with pytest.raises(ProviderError) as answered:
            raise_for_provider(_response(status, {"error": "x"}))
        assert not answered.value.not_sent
    with pytest.raises(InvalidArguments):
        raise_for_provider(_response(422, {"error": "validation_error"}))
    with pytest.raises(Refused):
        raise_for_provider(_response(403, {"error": "no"}))
    raise_for_provider(_response(200, {}))


async def test_transport_failures_map_to_not_sent_or_unknown() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def lose(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("lost", request=request)

    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("reset", request=request)

    for handler, error in ((refuse, NotSent), (lose, ToolTimeout), (reset, ToolTimeout)):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            with pytest.raises(error):
                await call_provider(client, "POST", "http://provider/pay")
    ok = httpx.MockTransport(lambda request: httpx.Response(200, json={"ok": True}))
    async with httpx.AsyncClient(transport=ok) as client:
        response = await call_provider(client, "GET", "http://provider/x")
    assert response.json() == {"ok": True}


# reads through the same loop -------------------------------------------------------------------


async def test_a_read_retries_5xx_twice_and_a_timeout_once(world: World) -> None:
    search = Provider().fail("5xx_before", "5xx_before", "timeout_before")
    world.add(make_tool(search, "search", effect="read"))
    exe = await world.new_execution()
    outcome = await run_tool_step(exe, 1, "search", {"item": "x"})
    assert outcome.ok and len(search.calls) == 4 and search.checks == 0


async def test_a_read_parked_by_a_long_retry_after_resumes(world: World) -> None:
    search = Provider().fail(Fault("429", retry_after=60.0))
    world.add(make_tool(search, "search", effect="read"))
    exe = await world.new_execution()
    with pytest.raises(Park):
        await run_tool_step(exe, 1, "search", {"item": "x"})
    assert (await world.step(exe.run.id, 1)).status == StepStatus.RETRYING
    exe2 = await world.reclaim(exe.run.id)
    outcome = await run_tool_step(exe2, 1, "search", {"item": "x"})
    assert outcome.ok and len(search.calls) == 2
