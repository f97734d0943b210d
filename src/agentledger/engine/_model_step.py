"""One model step: the gateway's call protocol.

The journal keeps only the new assistant message (the delta), never the history, plus
which provider and model answered, every attempt with its failure class, tokens
(input, output, cached), latency and cost, and the price source.

1. Replay: a succeeded model step is never sent again (the agent loop reads it back).
2. The engine is the only retry loop (the SDKs run with ``max_retries=0``): each model
   of the chain (``primary -> fallback ...``) is tried with :func:`run_attempts`,
   retrying by failure class; ``Retry-After`` is honoured up to
   :data:`MODEL_RETRY` ``.max_retry_after``, short waits in the worker, long ones park.
3. Fallback: the next model is tried after a class in
   :data:`~agentledger.models._errors.FALLBACK_CLASSES` (retries used up, context window,
   unusable answer); a rejected request fails at once (handover with the reason), a
   refusal or content filter fails the run; a model in cooldown is skipped.
4. Spend reserved before the call: for a priced model, the worst case (estimated input +
   ``max_tokens``) is checked against the run's budget (over: handover, not sent) and the
   tenant's period budget (over: park until the next period, not sent), then journaled
   (``started`` with the reserved cost and tokens) before the request leaves; the answer
   settles it to the real cost. The tenant's reservation is one guarded update of its
   period row in the store (taken only if it fits, row count checked), so workers
   running at once cannot overshoot the period's limit together. An attempt that may
   have reached the provider and reported no usage (worker killed, timeout, connection
   lost after sending, a stream cut short) stays counted at its reservation: the
   provider may have billed it. Only an attempt that provably cost nothing (never sent,
   or answered with an error status) settles to 0
   (:func:`~agentledger.models._errors.unbilled`).
5. Whole answers only: the adapters return a response only when the provider said the
   answer was finished (a stream that stops early is
   :class:`~agentledger.models._errors.IncompleteAnswer`: retried, then the fallback),
   and count missing usage by the gateway's estimate. Every attempt records its
   ``usage_source``: "reported", "estimated" (the gateway's count or the reservation),
   or "none" (cost nothing).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from agentledger._agent import Agent
from agentledger._canonical import input_hash
from agentledger.engine import _hooks as hooks
from agentledger.engine._execution import Execution
from agentledger.engine._hooks import TenantReservation
from agentledger.engine._retries import Attempts, RetryState, call_with_timeout, run_attempts
from agentledger.engine._signals import Handover, HandoverReason, Park, RunFailed
from agentledger.engine._steps import close_duration, new_step, take_events
from agentledger.errors import RateLimited, Refused, ToolError
from agentledger.models._base import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolSchema,
    UsageSource,
)
from agentledger.models._errors import FALLBACK_CLASSES, unbilled
from agentledger.models._fallback import chain_of
from agentledger.models._provider import ProviderModel
from agentledger.records import StepStatus
from agentledger.store._base import NewEvent
from agentledger.tools._contract import RetryPolicy

log = logging.getLogger(__name__)

MODEL_TIMEOUT = 60.0
#: Retries of one model by class; a Retry-After beyond 60 s falls back (or parks).
MODEL_RETRY = RetryPolicy(max_retry_after=60.0)
#: The longest a run parks for a rate limit when no fallback is left.
MAX_RATE_LIMIT_PARK = 3600.0


class ModelAttempts(Attempts["ModelResponse | ToolError"]):
    """The attempts of one model of the chain within one model step."""

    def __init__(self, call: ModelCall, model: Model) -> None:
        self.c, self.model = call, model
        self.policy = MODEL_RETRY
        self.state = call.state
        self.reserved: tuple[int, float] | None = None

    async def before_call(self) -> bool:
        if isinstance(self.model, ProviderModel):
            self.reserved = await self.c.reserve(self.model)
        return True

    async def call(self) -> Any:
        c = self.c
        timeout = min(getattr(self.model, "timeout", MODEL_TIMEOUT), c.exe.time_left())
        request = c.request(timeout, self.model)
        started = time.perf_counter()
        try:
            with hooks.model_attempt(c.exe, self.model) as traced:  # spans (hooks.py)
                response = await call_with_timeout(lambda: self.model.complete(request), timeout)
                traced.response = response if isinstance(response, ModelResponse) else None
        except Exception as exc:
            c.settle_failure(self.model, exc, self.reserved, started)
            await c.settle_tenant()
            raise
        if not isinstance(response, ModelResponse) or not isinstance(response.message, Message):
            raise Handover(
                HandoverReason.MODEL_ERROR,
                f"model {self.model.name} returned {type(response).__name__}, not a ModelResponse",
            )
        c.settle_success(self.model, response, started)
        await c.settle_tenant()
        return response

    async def succeeded(self, result: Any, how: str) -> ModelResponse | ToolError:
        response: ModelResponse = result
        return response

    async def failed(self, error: ToolError) -> ModelResponse | ToolError:
        return error

    async def give_up(self, why: str) -> ModelResponse | ToolError:  # a read always settles
        raise AssertionError(f"a model call cannot have an unknown outcome ({why})")

    async def wait(
        self, delay: float, error: ToolError, *, checking: bool
    ) -> ModelResponse | ToolError | None:
        await self.c.wait_or_park(delay, error)
        return None


class ModelCall:
    """One model step in progress: its journal entry, attempts and spend."""

    def __init__(
        self,
        exe: Execution,
        agent: Agent,
        step_no: int,
        messages: list[Message],
        tools: list[ToolSchema],
    ) -> None:
        self.exe, self.agent, self.step_no = exe, agent, step_no
        self.messages, self.tools = messages, tools
        prior = exe.journal.get(step_no)
        self.step = prior or new_step(
            exe, step_no, "model", agent.model.name, status=StepStatus.NEW
        )
        out = self.step.output if isinstance(self.step.output, dict) else {}
        self.state = RetryState.from_dict(out.get("retry"))
        self.index = int(out.get("chain_index", 0))
        self.attempts: list[dict[str, Any]] = [dict(a) for a in out.get("attempts", [])]
        if self.attempts and self.attempts[-1].get("inflight"):
            # The worker died during this call: its answer is lost, its spend is not.
            lost = self.attempts[-1]
            lost.pop("inflight")
            lost["error_class"] = "lost"
            lost["error"] = "no answer journaled (the worker stopped during the call)"
            lost["usage_source"] = UsageSource.ESTIMATED  # counted at its reservation

    # the journal entry ----------------------------------------------------------

    def _spent(self) -> tuple[int, float]:
        """Tokens and USD of the attempts so far (an unanswered call at its reservation)."""
        tokens = sum(int(a.get("tokens", 0)) for a in self.attempts)
        cost = sum(float(a.get("cost_usd", 0.0)) for a in self.attempts)
        return tokens, round(cost, 10)

    def _output(self, **extra: Any) -> dict[str, Any]:
        return {
            "retry": self.state.to_dict(),
            "chain_index": self.index,
            "attempts": self.attempts,
            **extra,
        }

    async def _journal(self, status: str, *, error: ToolError | None = None, **extra: Any) -> None:
        # A fresh copy per write: the run's totals move by the difference between this
        # entry and the one journaled before (a reservation settled to the real cost).
        step = self.step = dataclasses.replace(self.step)
        step.status, step.attempts = status, len(self.attempts)
        step.output = self._output(**extra)
        step.tokens, step.cost_usd = self._spent()
        step.error_class = error.error_class if error is not None else None
        step.error = str(error) if error is not None else None
        await self.exe.record(step, events=take_events(self.exe))

    # spend -----------------------------------------------------------------------

    async def reserve(self, model: ProviderModel) -> tuple[int, float]:
        """Check the worst case against the run's and the tenant's budgets, then journal
        it before the request leaves. Over a budget: not sent (handover or park)."""
        exe = self.exe
        tokens, usd = model.worst_case(self.request(None, model))
        budget = exe.budget
        if exe.cost_usd + usd > budget.max_spend_usd or exe.tokens + tokens > budget.max_tokens:
            reason = (
                f"the next call to {model.name} could cost up to ${usd:.4f} / {tokens} tokens; "
                f"the run has used ${exe.cost_usd:.4f} of ${budget.max_spend_usd:.2f} and "
                f"{exe.tokens} of {budget.max_tokens} tokens: not sent"
            )
            await self._journal(StepStatus.FAILED, error=_budget_error(reason))
            raise Handover(HandoverReason.BUDGET, reason)
        usage = await self._reserve_tenant(usd, tokens)
        attempt: dict[str, Any] = {
            "provider": model.provider,
            "model": model.model,
            "inflight": True,
            "reserved_tokens": tokens,
            "reserved_usd": usd,
            "tokens": tokens,
            "cost_usd": usd,
        }
        if usage is not None:  # taken from the tenant's period row: settled after the call
            attempt["tenant_period"] = usage.period_start
        self.attempts.append(attempt)
        await self._journal(StepStatus.STARTED)
        return tokens, usd

    async def _reserve_tenant(self, usd: float, tokens: int) -> TenantReservation | None:
        """Reserve against the tenant's period budget and take one request of its rate
        (``agentledger.gateway``, through the engine's hook); over the rate, wait a short
        while in the worker (then try again) or park; over the budget, park until the
        next period."""
        exe = self.exe
        while True:
            got = await hooks.reserve_tenant(
                exe.store, exe.run.tenant_id, exe.clock.now(), usd, tokens
            )
            if got is None or got.taken:
                return got
            if got.refused == "rate":
                delay, rps = got.retry_in, got.max_rps or 0.0
                reason = (
                    f"tenant {exe.run.tenant_id} request rate limit ({rps:g}/s): "
                    f"next model call in {delay:.3f} s"
                )
                if delay <= exe.park_threshold:
                    await exe.clock.sleep(delay)
                    continue
                await self._journal(StepStatus.RETRYING, error=_budget_error(reason, "rate"))
                raise Park(exe.clock.now() + delay, f"{reason}; not sent")
            refusal = got.reason or "tenant limit for the period"
            await self._journal(StepStatus.RETRYING, error=_budget_error(refusal))
            raise Park(got.period_end, f"{refusal}; not sent until the next period")

    def settle_failure(
        self,
        model: Model,
        exc: BaseException,
        reserved: tuple[int, float] | None,
        started: float,
    ) -> None:
        """Record a failed attempt: at the usage the provider reported for it (an empty
        or filtered answer); else, if it may have reached the provider, at its
        reservation; else (provably cost nothing) at 0."""
        error_class = getattr(exc, "error_class", "tool_error")
        attempt = self._current(model)
        attempt.pop("inflight", None)
        reported = getattr(exc, "reported_usage", None)
        if reported is not None:
            (tokens, cost), source = reported, UsageSource.REPORTED
        elif reserved is not None and not unbilled(exc):
            (tokens, cost), source = reserved, UsageSource.ESTIMATED
        else:
            tokens, cost, source = 0, 0.0, UsageSource.NONE
        attempt.update(
            error_class=error_class,
            error=str(exc)[:300],
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            tokens=tokens,
            cost_usd=cost,
            usage_source=source,
        )
        self._cooldown(model, error_class)

    def settle_success(self, model: Model, response: ModelResponse, started: float) -> None:
        """Record the answering attempt at its real tokens and cost."""
        attempt = self._current(model)
        attempt.pop("inflight", None)
        latency = response.latency_ms
        if latency is None:
            latency = round((time.perf_counter() - started) * 1000, 3)
        attempt.update(
            error_class=None,
            latency_ms=latency,
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
            cached_tokens=response.usage.cached_tokens,
            tokens=response.usage.total,
            cost_usd=response.cost_usd,
            usage_source=response.usage_source,
        )
        self._cooldown(model, None)

    async def settle_tenant(self) -> None:
        """Move the tenant's period row from the reservation to the settled attempt's
        spend (at once, before the journal: the row says what the provider billed)."""
        attempt = self.attempts[-1] if self.attempts else {}
        period = attempt.pop("tenant_period", None)
        if period is None:
            return
        usd = float(attempt.get("cost_usd", 0.0)) - float(attempt.get("reserved_usd", 0.0))
        tokens = int(attempt.get("tokens", 0)) - int(attempt.get("reserved_tokens", 0))
        if not (usd or tokens):
            return
        try:
            await hooks.settle_tenant(self.exe.store, self.exe.run.tenant_id, period, usd, tokens)
        except Exception as exc:
            # The provider has answered (or failed) and may have billed: that outcome is
            # the step's, not this bookkeeping's. A settle that fails leaves the row at
            # the reservation, which over-counts the tenant but never under-counts it.
            log.warning(
                "run %s: tenant %s period usage not settled (%s: %s); it stays at the "
                "call's reservation",
                self.exe.run.id,
                self.exe.run.tenant_id,
                type(exc).__name__,
                exc,
            )

    def _current(self, model: Model) -> dict[str, Any]:
        if self.attempts and self.attempts[-1].get("inflight"):
            return self.attempts[-1]
        attempt: dict[str, Any] = {
            "provider": getattr(model, "provider", "") or model.name,
            "model": getattr(model, "model", "") or model.name,
        }
        self.attempts.append(attempt)
        return attempt

    def _cooldown(self, model: Model, error_class: str | None) -> None:
        now = self.exe.clock.monotonic()
        until = hooks.model_call_ended(model.name, now, error_class)
        if until is not None:
            # Said as what it changes: a chain's last model is never skipped, so a run
            # with no fallback (this one, maybe) is not waiting for the cooldown.
            last = self.index >= len(chain_of(self.agent.model)) - 1
            log.warning(
                "model %s cooled down: for %.0f s this worker's runs skip it where a "
                "fallback model follows%s",
                model.name,
                until - now,
                f"; run {self.exe.run.id} had none" if last else "",
            )
            self.exe.pending_events.append(
                NewEvent(
                    "model.cooldown",
                    model.name,
                    {"step_no": self.step_no, "seconds": round(until - now, 3)},
                )
            )

    # the call --------------------------------------------------------------------

    def request(self, timeout: float | None, model: Model) -> ModelRequest:
        run_id, step_no = self.exe.run.id, self.step_no
        # The attempt this request is (a reserved one is already in the list): a listener
        # drops the deltas of an earlier attempt when a later one's arrive.
        inflight = bool(self.attempts) and bool(self.attempts[-1].get("inflight"))
        attempt = len(self.attempts) + (0 if inflight else 1)

        def delta(text: str) -> None:  # also to other processes
            try:
                hooks.model_delta(self.exe.store, run_id, step_no, text, attempt)
            except Exception:
                # Live tokens are best effort: raised into the adapter, a listener's
                # failure would cut a paid answer short and send the call again.
                log.debug("live tokens of run %s: a listener failed", run_id, exc_info=True)

        return ModelRequest(
            messages=list(self.messages),
            tools=self.tools,
            timeout=timeout,
            metadata={"run_id": run_id, "input": self.exe.run.input},
            on_delta=delta,
        )

    async def wait_or_park(self, delay: float, error: ToolError) -> None:
        """Sleep a short backoff in the worker; journal and park the run for a long one."""
        if delay <= self.exe.park_threshold:
            if delay > 0:
                await self.exe.clock.sleep(delay)
            return
        await self._journal(StepStatus.RETRYING, error=error)
        raise Park(self.exe.clock.now() + delay, f"{self.step.name} backing off {delay:.1f} s")

    async def run(self) -> Message:
        """Walk the chain from where the step stands; journal the answer or the failure."""
        chain = chain_of(self.agent.model)
        last: ToolError | None = None
        while self.index < len(chain):
            model = chain[self.index]
            cooled = hooks.model_cooled_until(model.name, self.exe.clock.monotonic())
            if cooled is not None and self.index < len(chain) - 1:
                self.attempts.append(
                    {
                        "provider": getattr(model, "provider", ""),
                        "model": model.name,
                        "skipped": "cooldown",
                        "tokens": 0,
                        "cost_usd": 0.0,
                    }
                )
                self.index += 1
                continue
            result = await run_attempts(ModelAttempts(self, model))
            if isinstance(result, ModelResponse):
                return await self._succeeded(model, result)
            last = result
            if result.error_class not in FALLBACK_CLASSES:
                break
            if self.index == len(chain) - 1:
                await self._maybe_park_rate_limit(result)
                break
            self.index += 1
            self.state = RetryState()
        assert last is not None
        return await self._failed(last, chain[min(self.index, len(chain) - 1)])

    async def _maybe_park_rate_limit(self, error: ToolError) -> None:
        """A Retry-After beyond what a worker waits, with no fallback left: park the run
        for it (bounded; the rate-limit retries keep counting across parks)."""
        if not isinstance(error, RateLimited) or error.retry_after is None:
            return
        if self.state.rate_limited > MODEL_RETRY.rate_limited:
            return  # the class's retries are used up
        if not error.retry_after <= MAX_RATE_LIMIT_PARK:  # also inf / NaN
            return
        await self._journal(StepStatus.RETRYING, error=error)
        raise Park(self.exe.clock.now() + error.retry_after, f"{self.step.name}: {error}")

    async def _succeeded(self, model: Model, response: ModelResponse) -> Message:
        message = response.message
        message.role = "assistant"
        step = self.step
        step.input = {"history": len(self.messages)}
        step.input_hash = input_hash(step.input)
        answering = self.attempts[-1] if self.attempts else {}
        close_duration(step)
        tokens, cost = self._spent()
        self.exe.pending_events.append(
            NewEvent(
                "model.proposed",
                model.name,
                {
                    "step_no": self.step_no,
                    "tool_calls": [
                        {"tool": c.name, "arguments": c.arguments} for c in message.tool_calls
                    ],
                    "text": message.content,
                    "refusal": message.refusal,
                    "finish_reason": response.finish_reason,
                    "tokens": tokens,
                    "cost_usd": cost,
                    "attempts": len(self.attempts),
                },
            )
        )
        await self._journal(
            StepStatus.SUCCEEDED,
            message=message.to_dict(),
            finish_reason=response.finish_reason,
            model=response.model,
            provider=response.provider or answering.get("provider", ""),
            usage={
                "input_tokens": response.usage.input_tokens,
                "output_tokens": response.usage.output_tokens,
                "cached_tokens": response.usage.cached_tokens,
                "source": response.usage_source,
                "simulated": response.usage_source == UsageSource.SIMULATED,
            },
            prices=response.price_source,
        )
        return message

    async def _failed(self, error: ToolError, model: Model) -> Message:
        await self._journal(StepStatus.FAILED, error=error)
        # Provider errors start with the model's name (models/_provider.py): said once.
        text = str(error).removeprefix(f"{model.name}: ")
        reason = f"model {model.name} failed: {text}"
        if isinstance(error, Refused):
            raise RunFailed("refused", reason)
        raise Handover(HandoverReason.MODEL_ERROR, reason)


def _budget_error(reason: str, error_class: str = "budget") -> ToolError:
    error = ToolError(reason)
    error.error_class = error_class
    return error


async def model_step(
    exe: Execution, agent: Agent, step_no: int, messages: list[Message], tools: list[ToolSchema]
) -> Message:
    """Ask the model (chain) for the next turn, retrying by failure class, and journal it."""
    return await ModelCall(exe, agent, step_no, messages, tools).run()
