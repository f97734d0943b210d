"""The app the engine tests' worker subprocesses load.

Every side effect goes to the external ledger (:mod:`tests.apps.ledger`), keyed by
the step's idempotency key. The run input chooses the behaviour, so one app
serves many tests (``{"hold": {"item": "i3", "phase": "after_effect", "flag": F}}``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from agentledger import (
    Agent,
    Allow,
    App,
    Budget,
    Deny,
    ModelRequest,
    ModelResponse,
    ProposedCall,
    RequireApproval,
    ScriptedModel,
    ToolContext,
    Turn,
    WorkflowContext,
)
from agentledger.errors import BusinessError, ProviderError, RateLimited, Refused, ToolTimeout
from agentledger.tools._status import Status
from tests.apps import ledger

app = App("engine-tests")

HOLD_LIMIT = 120.0  # a hold never outlives a test


async def hold(flag: str, once: bool = False) -> None:
    """Block while ``flag`` exists; ``flag.holding`` tells the test we are here.

    ``once``: only the first process to get here holds (it creates ``flag.holding``
    exclusively); a later one -- the worker that took the run over -- passes.
    """
    try:
        fd = os.open(flag + ".holding", os.O_WRONLY | os.O_CREAT | (os.O_EXCL if once else 0))
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    until = time.monotonic() + HOLD_LIMIT
    while os.path.exists(flag) and time.monotonic() < until:
        await asyncio.sleep(0.02)


def hold_spec(ctx_input: Any, item: str, phase: str) -> tuple[str, bool] | None:
    """The flag to hold on when the run input asks to hold ``item`` at ``phase``.

    ``input["hold"]`` is one ``{"item", "phase", "flag"}`` (plus ``"once": true``,
    see :func:`hold`) or a list of them (one worker held at one point, its
    successor at another); a hold whose flag is gone is passed through.
    """
    spec = ctx_input.get("hold") if isinstance(ctx_input, dict) else None
    specs = spec if isinstance(spec, list) else [spec]
    for one in specs:
        if isinstance(one, dict) and one.get("item") == item and one.get("phase") == phase:
            flag = str(one["flag"])
            if os.path.exists(flag):
                return flag, bool(one.get("once"))
    return None


async def ledger_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    found = ledger.status(ctx.idempotency_key)
    return Status.not_found() if found is None else Status.succeeded(found)


# tools ------------------------------------------------------------------------


@app.tool(effect="read", timeout=5)
async def read_tool(ctx: ToolContext, x: str) -> dict[str, Any]:
    """Read something (recorded as a call)."""
    ledger.record_call(ctx.idempotency_key, "read")
    return {"x": x, "read": True}


@app.tool(effect="write", timeout=30, idempotency="provider", status_check=ledger_status)
async def keyed_write(ctx: ToolContext, item: str) -> dict[str, Any]:
    """A write to a provider that honours keys and answers status checks."""
    spec = hold_spec(ctx.run_input, item, "after_started")
    if spec:
        await hold(*spec)
    result = ledger.apply(ctx.idempotency_key, "keyed", dedupe=True, payload=item)
    spec = hold_spec(ctx.run_input, item, "after_effect")
    if spec:
        await hold(*spec)
    return result


@app.tool(effect="write", timeout=0.5, idempotency="provider")
async def keyed_nocheck(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Provider keys but no status check; the first call times out after its effect."""
    result = ledger.apply(ctx.idempotency_key, "nocheck", dedupe=True, payload=item)
    if ledger.bump(f"nocheck:{ctx.idempotency_key}") == 1:
        await asyncio.sleep(3)
    return result


@app.tool(effect="write", timeout=0.5)
async def guarded_write(ctx: ToolContext, item: str, sleep_after: float = 0.0) -> dict[str, Any]:
    """No provider keys, no status check: guarded by the effects table."""
    result = ledger.apply(ctx.idempotency_key, "guarded", dedupe=False, payload=item)
    if sleep_after:
        await asyncio.sleep(sleep_after)
    return result


@app.tool(
    effect="write",
    timeout=10,
    idempotency="effects",
    effect_key=lambda args, ctx: f"gift:{args['guest']}",
)
async def send_gift(ctx: ToolContext, guest: str, flag: str = "") -> dict[str, Any]:
    """One gift per guest whatever the run: a key shared across runs in the effects table.

    ``flag``: hold while that file exists (see :func:`hold`)."""
    if flag:
        await hold(flag)
    return ledger.apply(f"gift:{guest}:{ctx.idempotency_key}", "gift", dedupe=False, payload=guest)


@app.tool(effect="write", timeout=0.5, idempotency="provider", status_check=ledger_status)
async def timeout_write(ctx: ToolContext, item: str, phase: str) -> dict[str, Any]:
    """First call times out: ``after`` its effect was applied, or ``before`` it."""
    first = ledger.bump(f"tw:{ctx.idempotency_key}") == 1
    if first and phase == "before":
        await asyncio.sleep(3)  # cancelled by the timeout: nothing applied
    result = ledger.apply(ctx.idempotency_key, "tw", dedupe=True, payload=item)
    if first and phase == "after":
        await asyncio.sleep(3)
    return result


def _fail(mode: str, retry_after: float) -> Exception:
    errors: dict[str, Exception] = {
        "rate_limited": RateLimited("429 slow down", retry_after=retry_after or None),
        "provider_error": ProviderError("503 upstream unavailable"),
        "refused": Refused("the provider refused this request"),
        "business_error": BusinessError("no rooms left on that date"),
    }
    return errors[mode]


@app.tool(effect="write", timeout=5, idempotency="provider", status_check=ledger_status)
async def flaky_write(
    ctx: ToolContext, item: str, mode: str, fail_first: int, retry_after: float = 0.0
) -> dict[str, Any]:
    """Fails with ``mode`` for the first ``fail_first`` calls of its key, then applies."""
    if ledger.bump(f"flaky:{ctx.idempotency_key}") <= fail_first:
        ledger.record_call(ctx.idempotency_key, "flaky")
        raise _fail(mode, retry_after)
    return ledger.apply(ctx.idempotency_key, "flaky", dedupe=True, payload=item)


@app.tool(effect="read", timeout=0.3)
async def flaky_read(ctx: ToolContext, item: str, fail_first: int) -> dict[str, Any]:
    """Times out (no answer within its 0.3 s timeout) for the first ``fail_first`` calls."""
    ledger.record_call(ctx.idempotency_key, "flaky_read")
    if ledger.bump(f"flaky_read:{ctx.idempotency_key}") <= fail_first:
        await asyncio.sleep(2)
        raise ToolTimeout("unreachable")
    return {"item": item}


@app.tool(effect="read", timeout=10)
async def slow_read(ctx: ToolContext, seconds: float) -> dict[str, Any]:
    """A slow read."""
    ledger.record_call(ctx.idempotency_key, "slow")
    await asyncio.sleep(seconds)
    return {"slept": seconds}


async def price_of_order(ctx: ToolContext, args: dict[str, Any]) -> int:
    return 4200


@app.tool(
    effect="money",
    timeout=5,
    idempotency="provider",
    status_check=ledger_status,
    server_args={"amount": price_of_order},
)
async def charge(ctx: ToolContext, order: str, amount: int = 0) -> dict[str, Any]:
    """Charge an order; the server computes the amount."""
    return ledger.apply(
        ctx.idempotency_key, "charge", dedupe=True, payload={"order": order, "amount": amount}
    )


@app.tool(effect="notify", delivery="outbox", timeout=5)
async def notify(ctx: ToolContext, msg: str) -> dict[str, Any]:
    """Send a message later, through the outbox."""
    return ledger.apply(ctx.idempotency_key, "notify", dedupe=False, payload=msg)


@app.tool(
    effect="notify", delivery="outbox", timeout=5, outbox_key=lambda args, ctx: f"note:{args['to']}"
)
async def notify_once(ctx: ToolContext, to: str) -> dict[str, Any]:
    """One message per recipient whatever the run: an outbox key shared across runs."""
    return ledger.apply(f"note:{to}:{ctx.idempotency_key}", "note", dedupe=False, payload=to)


# workflows ----------------------------------------------------------------------


async def gate(run_input: Any, item: str, phase: str) -> str:
    spec = hold_spec(run_input, item, phase)
    if spec:
        await hold(*spec)
    return f"{item}:{phase}"


@app.workflow(name="five_writes", version="1")
async def five_writes(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """Five keyed writes, each between a local step before and after it."""
    done = []
    for i in range(1, 6):
        item = f"i{i}"
        await ctx.step(f"pre_{item}", gate, input, item, "before_started")
        result = await ctx.tool("keyed_write", item=item)
        await ctx.step(f"post_{item}", gate, input, item, "after_outcome")
        done.append(result["effect_id"])
    return {"effects": done}


@app.workflow(name="write_chain", version="1")
async def write_chain(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    """Keyed writes back to back (each one's ``started`` carries the outcome before it).

    ``die_after``: ``{"item", "flag"}``: right after that write returns, while its outcome
    is held for the next write, the process kills itself (once: it removes the flag)."""
    done = []
    die = input.get("die_after") or {}
    for i in range(1, int(input.get("writes", 3)) + 1):
        item = f"c{i}"
        result = await ctx.tool("keyed_write", item=item)
        done.append(result["effect_id"])
        if die.get("item") == item and os.path.exists(die["flag"]):
            os.unlink(die["flag"])
            os.kill(os.getpid(), signal.SIGKILL)  # no await in between: nothing more committed
    return {"effects": done}


@app.workflow(name="one_call", version="1")
async def one_call(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """Call ``input["tool"]`` with ``input["args"]`` and return its result."""
    return await ctx.tool(input["tool"], **input["args"])


@app.workflow(name="slow_writes", version="1")
async def slow_writes(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    for i in range(int(input.get("n", 4))):
        await ctx.tool("keyed_write", item=f"{input['tag']}-{i}")
        await ctx.step(f"pause_{i}", asyncio.sleep, float(input.get("pause", 0.3)))
    return {"ok": True}


@app.workflow(name="note_flow", version="1")
async def note_flow(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return await ctx.tool("notify_once", to=input["to"])


@app.workflow(name="gift_flow", version="1")
async def gift_flow(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return await ctx.tool("send_gift", guest=input["guest"], flag=str(input.get("flag", "")))


@app.workflow(name="quick", version="1")
async def quick(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    await ctx.tool("read_tool", x=str(input["n"]))
    await ctx.tool("keyed_write", item=f"q{input['n']}")
    return {"n": input["n"]}


@app.workflow(name="versioned", version="1")
async def versioned_v1(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    await ctx.tool("keyed_write", item="v1")
    return {"version": "1"}


@app.workflow(name="notify_flow", version="1")
async def notify_flow(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    queued = await ctx.tool("notify", msg=str(input.get("msg", "hello")))
    return {"queued": queued}


# agents -------------------------------------------------------------------------


def scripted_turn(request: ModelRequest) -> Turn:
    """The next turn, from the run input: ``{"turns": [...]}`` or ``{"loop": [tool, args]}``.

    A turn is ``{"calls": [[tool, args-or-raw-json]], "text": ..., "refusal": ...}``;
    the text ``"$echo"`` answers with the content of the last tool message.
    """
    run_input = request.metadata.get("input") or {}
    if "loop" in run_input:
        tool_name, args = run_input["loop"]
        return Turn(calls=[(tool_name, args)])
    index = sum(1 for m in request.messages if m.role == "assistant")
    turns = run_input.get("turns", [])
    if index >= len(turns):
        return Turn(text="Done.")
    spec = turns[index]
    text = spec.get("text")
    if text == "$echo":
        tool_messages = [m for m in request.messages if m.role == "tool"]
        text = "saw: " + (tool_messages[-1].content or "" if tool_messages else "")
    return Turn(
        text=text, calls=[(c[0], c[1]) for c in spec.get("calls", [])], refusal=spec.get("refusal")
    )


class CountingModel(ScriptedModel):
    """A scripted model that records every call in the external ledger."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        index = sum(1 for m in request.messages if m.role == "assistant")
        ledger.record_call(f"{request.metadata.get('run_id')}:turn{index}", "model")
        return await super().complete(request)


def input_policy(call: ProposedCall) -> Any:
    run_input = call.run_input if isinstance(call.run_input, dict) else {}
    if call.tool in run_input.get("deny", []):
        return Deny(f"{call.tool} is not allowed for this user")
    if call.tool in run_input.get("approve", []):
        return RequireApproval(role="manager")
    return Allow()


TOOLS = [
    read_tool,
    keyed_write,
    guarded_write,
    timeout_write,
    flaky_write,
    flaky_read,
    slow_read,
    charge,
]

for agent_name, budget in (
    ("scripted", Budget()),
    ("budget_steps", Budget(max_steps=6)),
    ("budget_time", Budget(active_seconds=1.0)),
    ("budget_tokens", Budget(max_tokens=20)),
    ("budget_spend", Budget(max_spend_usd=0.0000001)),
):
    app.add_agent(
        Agent(
            name=agent_name,
            model=CountingModel(scripted_turn),
            instructions="You are a test agent.",
            tools=list(TOOLS),
            policy=input_policy,
            budget=budget,
            input_model={"type": "object"},  # the scripted turns come in the input
        )
    )
