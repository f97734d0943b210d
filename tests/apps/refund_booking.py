"""The booking the compensation-resume tests share: it charges once or more (each charge
compensated by its own refund), then its confirmation has a bug, so the run decides to
undo its charges and calls the refunds, last charge first.

Charges and refunds go to the external ledger of tests/apps/ledger.py. Each test module
gives what differs: the charges, the status check, and how its refunds behave (declined,
slow, lying, killed...), as a coroutine called with the refund's tool name.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentledger import App, ToolContext
from agentledger.tools._contract import Compensation, StatusCheck
from tests.apps import ledger

#: How one refund behaves: ``(refund tool name, ctx, effect_id, amount) -> result``.
Refund = Callable[[str, ToolContext, int, int], Awaitable[dict[str, Any]]]
#: The refund's arguments from the charge's arguments and result (its compensation).
RefundArgs = Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]]


def refund_args(refund: str, args: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """The refund of a charge: its effect and its amount."""
    return {"effect_id": out["effect_id"], "amount": args["amount"]}


def apply_refund(ctx: ToolContext, effect_id: int, amount: int, *, dedupe: bool) -> Any:
    """The provider refunds (``dedupe``: it honours the key, else every call refunds)."""
    payload = {"effect_id": effect_id, "amount": amount}
    return ledger.apply(ctx.idempotency_key, "refund", dedupe=dedupe, payload=payload)


def booking_app(
    name: str,
    charges: Sequence[tuple[str, str, int]],
    refund: Refund,
    *,
    status: StatusCheck,
    refund_status: StatusCheck | None = None,
    refund_timeout: float = 5,
    timeouts: Mapping[str, float] | None = None,
    args_of: RefundArgs = refund_args,
) -> App:
    """An app ``name`` whose workflow ``booking`` makes each charge ``(charge tool,
    refund tool, amount)`` in order, then fails to confirm. Charges dedupe their keys
    and have ``status`` as their status check; refunds have ``refund_status``, and time
    out after ``refund_timeout`` unless ``timeouts`` gives one its own."""
    app = App(name)
    for refund_name in dict.fromkeys(r for _, r, _ in charges):

        @app.tool(name=refund_name, effect="money", idempotency="provider",
                  status_check=refund_status,
                  timeout=(timeouts or {}).get(refund_name, refund_timeout))  # fmt: skip
        async def refund_tool(
            ctx: ToolContext, effect_id: int, amount: int, _name: str = refund_name
        ) -> dict[str, Any]:
            return await refund(_name, ctx, effect_id, amount)

    for charge_name, refund_name, _ in charges:
        undo = Compensation(refund_name, functools.partial(args_of, refund_name))

        @app.tool(name=charge_name, effect="money", idempotency="provider",
                  status_check=status, timeout=5, compensation=undo)  # fmt: skip
        async def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
            return ledger.apply(ctx.idempotency_key, "charge", dedupe=True, payload=amount)

    @app.workflow(name="booking")
    async def booking(ctx: Any, input: Any) -> Any:
        for charge_name, _, amount in charges:
            await ctx.tool(charge_name, amount=amount)

        def confirm() -> dict[str, Any]:
            raise RuntimeError("confirm: bug in the confirmation code")

        return await ctx.step("confirm", confirm)

    return app
