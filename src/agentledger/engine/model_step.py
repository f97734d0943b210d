"""One model step: call the model with the conversation so far; journal only the
new assistant message (the delta), its usage and cost -- never the history."""

from __future__ import annotations

from typing import Any

from agentledger.agent import Agent
from agentledger.canonical import input_hash
from agentledger.engine.execution import Execution
from agentledger.engine.retries import RetryState, as_tool_error, call_with_timeout, next_delay
from agentledger.engine.signals import Handover
from agentledger.engine.steps import close_duration, new_step, wait_or_park
from agentledger.models.base import Message, ModelRequest, ModelResponse, ToolSchema
from agentledger.records import StepStatus
from agentledger.store.base import NewEvent
from agentledger.tools.contract import RetryPolicy

MODEL_TIMEOUT = 60.0
_MODEL_RETRY = RetryPolicy()


async def model_step(
    exe: Execution, agent: Agent, step_no: int, messages: list[Message], tools: list[ToolSchema]
) -> Message:
    """Ask the model for the next turn, retrying by failure class, and journal it."""
    prior = exe.journal.get(step_no)
    step = prior or new_step(exe, step_no, "model", agent.model.name, status=StepStatus.NEW)
    retry = step.output.get("retry") if isinstance(step.output, dict) else None
    state = RetryState.from_dict(retry)
    while True:
        state.attempts += 1
        timeout = min(MODEL_TIMEOUT, exe.time_left())
        request = ModelRequest(
            messages=list(messages),
            tools=tools,
            timeout=timeout,
            metadata={"run_id": exe.run.id, "input": exe.run.input},
        )
        try:
            response: Any = await call_with_timeout(lambda: agent.model.complete(request), timeout)
        except Exception as exc:
            error = as_tool_error(exc)
            delay = next_delay(_MODEL_RETRY, state, error, is_read=True)
            if delay is None:
                raise Handover("model_error", f"model {agent.model.name} failed: {error}") from None
            await wait_or_park(exe, step, state, delay, error)
            continue
        break
    if not isinstance(response, ModelResponse) or not isinstance(response.message, Message):
        raise Handover(
            "model_error",
            f"model {agent.model.name} returned {type(response).__name__}, not a ModelResponse",
        )
    message = response.message
    message.role = "assistant"
    step.status, step.attempts = StepStatus.SUCCEEDED, state.attempts
    step.input = {"history": len(messages)}
    step.input_hash = input_hash(step.input)
    step.output = {
        "message": message.to_dict(),
        "finish_reason": response.finish_reason,
        "model": response.model,
    }
    step.tokens, step.cost_usd = response.usage.total, response.cost_usd
    step.error_class = step.error = None
    close_duration(step)
    proposed = [{"tool": c.name, "arguments": c.arguments} for c in message.tool_calls]
    await exe.record(
        step,
        events=[
            NewEvent(
                "model.proposed",
                agent.model.name,
                {
                    "step_no": step_no,
                    "tool_calls": proposed,
                    "text": message.content,
                    "refusal": message.refusal,
                    "tokens": step.tokens,
                    "cost_usd": step.cost_usd,
                },
            )
        ],
    )
    return message
