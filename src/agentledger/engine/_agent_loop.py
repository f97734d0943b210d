"""The agent loop: model call -> tool calls -> model call ... until a final answer
or a stop condition.

On resume the conversation is rebuilt from the journal (each model step holds
the assistant message it produced, each tool step the result), and the model is
never called again for a journaled step. The first pass builds the conversation
from the journal entries it has just written too, so the rebuilt conversation is
identical to the one before a crash, whatever the outcome of each step.

Budgets and cancel requests are checked only before a brand-new step: a step
found in flight on resume is resolved first.
"""

from __future__ import annotations

import json
from typing import Any

from agentledger._agent import Agent
from agentledger.engine import _hooks as hooks
from agentledger.engine._execution import Execution, carries_held
from agentledger.engine._model_step import model_step
from agentledger.engine._signals import Handover, HandoverReason, RunFailed
from agentledger.engine._tool_step import run_tool_step
from agentledger.engine._workflow_runner import hash_of, journaled_outcome
from agentledger.models._base import FinishReason, Message
from agentledger.records import StepStatus


def user_message(run_input: Any) -> str:
    """The first user message of a run, from its input."""
    if isinstance(run_input, str):
        return run_input
    if isinstance(run_input, dict) and isinstance(run_input.get("message"), str):
        return str(run_input["message"])
    return json.dumps(run_input)


async def run_agent(exe: Execution, agent: Agent) -> Any:
    """Drive the agent until it answers; return ``{"answer": text}``."""
    messages = [Message("system", agent.instructions), Message("user", user_message(exe.run.input))]
    if agent.memory:  # the user's facts, read for the run's own tenant and user only
        messages.insert(1, Message("system", await hooks.memory_note(exe.store, exe.run)))
    schemas = [t.schema() for t in agent.tools]
    step_no = 1
    invalid_streak = 0
    while True:
        prior = exe.journal.get(step_no)
        if prior is not None and prior.kind != "model":
            raise Handover(HandoverReason.NONDETERMINISM, f"step {step_no} should be a model call")
        if prior is not None and prior.status == StepStatus.FAILED:
            raise Handover(
                HandoverReason.MODEL_ERROR, f"model step {step_no} failed: {prior.error}"
            )
        if prior is None or prior.status != StepStatus.SUCCEEDED:
            if prior is None:
                await exe.before_step()
            with hooks.model_step_scope(step_no):  # spans (hooks.py): the chat spans
                await model_step(exe, agent, step_no, messages, schemas)
            entry = exe.journal[step_no]
            if entry.status != StepStatus.SUCCEEDED:
                raise Handover(
                    HandoverReason.MODEL_ERROR, f"model step {step_no} failed: {entry.error}"
                )
            prior = entry
        else:  # answered from the journal: a span marked replayed, its tokens not counted
            hooks.replayed_step(exe, prior)
        # The message as journaled, on the first pass as on replay.
        message = Message.from_dict(prior.output["message"])
        messages.append(message)
        step_no += 1
        if message.refusal is not None:
            raise RunFailed("refused", f"the model refused: {message.refusal}")
        if not message.tool_calls:
            # Cut at max_tokens: say so.
            if prior.output.get("finish_reason") == FinishReason.LENGTH:
                return {"answer": message.content, "finish_reason": FinishReason.LENGTH}
            return {"answer": message.content}
        for call in message.tool_calls:
            done = exe.prior(step_no, call.name, hash_of(call.arguments))
            if done is None:
                await exe.before_step(carries=carries_held(exe.tools.get(call.name)))
            key = done.idempotency_key if done is not None else None
            outcome = await run_tool_step(exe, step_no, call.name, call.arguments, key=key)
            outcome = journaled_outcome(exe, step_no, outcome)
            messages.append(
                Message("tool", outcome.for_model(), tool_call_id=call.id, name=call.name)
            )
            step_no += 1
            if not outcome.ok and outcome.error_class == "invalid_arguments":
                invalid_streak += 1
                if invalid_streak > agent.max_invalid_calls:
                    raise Handover(
                        HandoverReason.INVALID_ARGUMENTS,
                        f"the model kept sending invalid tool calls: {outcome.error}",
                    )
            else:
                invalid_streak = 0
