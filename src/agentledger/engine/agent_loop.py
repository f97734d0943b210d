"""The agent loop: model call -> tool calls -> model call ... until a final answer
or a stop condition.

On resume the conversation is rebuilt from the journal (each model step holds
the assistant message it produced, each tool step the result), and the model is
never called again for a journaled step.
"""

from __future__ import annotations

import json
from typing import Any

from agentledger.agent import Agent
from agentledger.engine.execution import Execution
from agentledger.engine.model_step import model_step
from agentledger.engine.signals import Handover, RunFailed
from agentledger.engine.tool_step import run_tool_step
from agentledger.models.base import Message
from agentledger.records import StepStatus

_DONE = {StepStatus.SUCCEEDED, StepStatus.FAILED}


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
    schemas = [t.schema() for t in agent.tools]
    step_no = 1
    invalid_streak = 0
    while True:
        prior = exe.journal.get(step_no)
        if prior is not None and prior.kind != "model":
            raise Handover("nondeterminism", f"step {step_no} should be a model call")
        if prior is not None and prior.status == StepStatus.SUCCEEDED:
            message = Message.from_dict(prior.output["message"])
        else:
            exe.between_steps()
            message = await model_step(exe, agent, step_no, messages, schemas)
        messages.append(message)
        step_no += 1
        if message.refusal is not None:
            raise RunFailed("refused", f"the model refused: {message.refusal}")
        if not message.tool_calls:
            return {"answer": message.content}
        for call in message.tool_calls:
            done = exe.journal.get(step_no)
            if done is None or done.status not in _DONE:
                exe.between_steps()
            outcome = await run_tool_step(exe, step_no, call.name, call.arguments)
            messages.append(
                Message("tool", outcome.for_model(), tool_call_id=call.id, name=call.name)
            )
            step_no += 1
            if not outcome.ok and outcome.error_class == "invalid_arguments":
                invalid_streak += 1
                if invalid_streak > agent.max_invalid_calls:
                    raise Handover(
                        "invalid_arguments",
                        f"the model kept sending invalid tool calls: {outcome.error}",
                    )
            else:
                invalid_streak = 0
