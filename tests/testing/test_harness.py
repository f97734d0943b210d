"""agentledger.testing: an App run in process with providers of real semantics shows
what a tool's contract does under the faults that move money twice."""

from __future__ import annotations

from typing import Any

import pytest

from agentledger import (
    Agent,
    App,
    RequireApproval,
    ScriptedModel,
    Status,
    ToolContext,
    Turn,
)
from agentledger._policies import Allow, ProposedCall
from agentledger.testing import FakeProvider, Harness, KeyConflict


def payment_app(provider: FakeProvider, *, with_status_check: bool) -> App:
    app = App("pay")

    async def status(ctx: ToolContext, args: dict[str, Any]) -> Status:
        found = provider.status(ctx.idempotency_key)
        return Status.not_found() if found is None else Status.succeeded(found)

    contract: dict[str, Any] = {"effect": "money", "timeout": 5, "idempotency": "provider"}
    if with_status_check:
        contract["status_check"] = status

    @app.tool(**contract)
    async def charge(ctx: ToolContext, booking_id: str, amount: int) -> dict[str, Any]:
        return await provider.call(ctx.idempotency_key, {"booking": booking_id, "amount": amount})

    def policy(call: ProposedCall) -> Allow | RequireApproval:
        if call.arguments["amount"] > 10_000:
            return RequireApproval(role="manager")
        return Allow()

    for name, amount in (("small", 5_000), ("large", 20_000)):
        app.add_agent(
            Agent(
                name=name,
                version="1",
                model=ScriptedModel(
                    [
                        Turn(calls=[("charge", {"booking_id": "b-1", "amount": amount})]),
                        Turn(text="Paid."),
                    ]
                ),
                instructions="Charge the booking.",
                tools=[charge],
                policy=policy,
            )
        )
    return app


@pytest.mark.parametrize("fault", ["timeout_after_apply", "error_after_apply"])
async def test_a_fault_after_the_charge_charges_once_when_the_tool_checks_status(
    fault: str,
) -> None:
    payments = FakeProvider("payments")
    payments.fail_next(fault)
    async with Harness(payment_app(payments, with_status_check=True)) as h:
        run = await h.run_until_settled(await h.submit("small", {"message": "pay"}))
        journal = await h.journal(run.id)
    assert run.status == "completed", run
    assert payments.applied_count() == 1
    (effect,) = payments.ledger()
    # The status check answered: the charge was not sent again.
    assert payments.calls(effect.key) == 1
    assert [s.name for s in journal if s.kind == "tool"] == ["charge"]


async def test_a_provider_that_ignores_keys_shows_the_double_charge() -> None:
    """The contract says the provider dedupes keys; this one does not. Without a status
    check the engine resends with the same key, and the harness makes the second charge
    visible: the test a user writes to prove their contract is right."""
    payments = FakeProvider("payments", keys=False)
    payments.fail_next("error_after_apply")
    async with Harness(payment_app(payments, with_status_check=False)) as h:
        run = await h.run_until_settled(await h.submit("small", {"message": "pay"}))
    assert run.status == "completed", run
    assert payments.applied_count() == 2


async def test_an_approval_parks_the_run_until_decided() -> None:
    payments = FakeProvider("payments")
    async with Harness(payment_app(payments, with_status_check=True)) as h:
        run = await h.run_until_settled(await h.submit("large", {"message": "pay"}))
        assert run.status == "waiting"
        assert payments.applied_count() == 0
        (approval,) = await h.approvals(run.id)
        await h.approve(approval.id, by="manager")
        run = await h.run_until_settled(run.id)
    assert run.status == "completed", run
    assert [e.request["amount"] for e in payments.ledger()] == [20_000]


async def test_the_provider_refuses_a_reused_key_with_other_arguments() -> None:
    payments = FakeProvider("payments")
    first = await payments.call("k1", {"amount": 1})
    assert await payments.call("k1", {"amount": 1}) == first
    with pytest.raises(KeyConflict):
        await payments.call("k1", {"amount": 2})
    assert payments.applied_count("k1") == 1 and payments.calls("k1") == 3
    with pytest.raises(ValueError, match="unknown fault"):
        payments.fail_next("explode")
