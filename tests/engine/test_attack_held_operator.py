"""What an operator sees and can do while a run holds a write's outcome: the run is
``running`` with no result (its write ``started`` until the run's next write or the
event loop's next turn); ``runs settle`` and ``runs resume`` (also as a dry run) are
refused; a tool with neither a status check nor provider keys is never held."""

from __future__ import annotations

import pytest

from agentledger.engine._tool_step import run_tool_step
from agentledger.observe._queries import resume
from agentledger.observe._queries.resume import ResumeRefused
from agentledger.records import RunStatus, StepStatus
from tests.fast.writes_harness import Provider, World, make_tool, world

__all__ = ["world"]


async def test_a_run_holding_an_outcome_is_running_and_not_settled_or_resumed(
    world: World,
) -> None:
    pay = Provider()
    world.add(make_tool(pay, "pay"))
    exe = await world.new_execution()
    assert (await run_tool_step(exe, 1, "pay", {"item": "a"})).ok
    assert exe._held is not None
    run = await world.store.get_run(exe.run.id)
    assert run is not None and run.status == RunStatus.RUNNING and run.result is None
    # (the event loop's next turn commits it on its own: the run waits on nothing here)
    run_id, store = exe.run.id, world.store
    with pytest.raises(ResumeRefused):
        await store.transact(resume.settle_step, run_id, 1, True, {"id": "x"}, "cli:ann", "seen")
    with pytest.raises(ResumeRefused):
        await store.read(resume.plan_resume, run_id, None)
    with pytest.raises(ResumeRefused):
        await store.transact(resume.resume_run, run_id, None, "cli:ann", "again")
    await exe.settle_held()
    assert (await world.step(exe.run.id, 1)).status == StepStatus.SUCCEEDED
    assert len(pay.calls) == 1


@pytest.mark.parametrize(
    ("idempotency", "checked", "held"),
    [("effects", False, False), ("provider", False, True), ("provider", True, True)],
)
async def test_only_a_write_resume_can_settle_is_held(
    world: World, idempotency: str, checked: bool, held: bool
) -> None:
    provider = Provider(keyed=idempotency == "provider")
    world.add(make_tool(provider, "w", idempotency=idempotency, checked=checked))
    read = Provider()
    world.add(make_tool(read, "r", effect="read"))
    exe = await world.new_execution()
    assert (await run_tool_step(exe, 1, "w", {"item": "a"})).ok
    assert (exe._held is not None) == held
    if not held:
        assert (await world.step(exe.run.id, 1)).status == StepStatus.SUCCEEDED
    # A read is never held, and commits what was held before it runs.
    assert (await run_tool_step(exe, 2, "r", {"item": "b"})).ok
    assert exe._held is None
    assert [s.status for s in await world.store.load_journal(exe.run.id)] == [
        StepStatus.SUCCEEDED
    ] * 2
