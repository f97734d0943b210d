"""The dry run of `runs resume` names every call the resumed run then makes at the
provider, with its key: a write that failed (it applied nothing) and is run again is a
call too (issue 19, second review, point 7).

The provider is the external ledger of tests/apps/ledger.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentledger import App, ToolContext
from agentledger.cli._main import cli
from agentledger.errors import BusinessError
from agentledger.observe._queries import resume as observe_resume
from agentledger.records import RunStatus
from tests.apps import ledger
from tests.fast.lifecycle_harness import Harness

DECLINE: dict[str, bool] = {}


def _app() -> App:
    app = App("dryrun")

    @app.tool(effect="write", idempotency="provider", timeout=5)
    async def reserve(ctx: ToolContext, room: str) -> dict[str, Any]:
        if DECLINE.get("reserve"):
            ledger.record_call(ctx.idempotency_key, "reserve")  # answered: nothing applied
            raise BusinessError("no room left")
        return ledger.apply(ctx.idempotency_key, "reserve", dedupe=True, payload=room)

    @app.tool(effect="write", idempotency="effects", timeout=5)
    async def gift(ctx: ToolContext, guest: str) -> dict[str, Any]:
        return ledger.apply(ctx.idempotency_key, "gift", dedupe=False, payload=guest)

    @app.workflow(name="stay")
    async def stay(ctx: Any, input: Any) -> Any:
        await ctx.step("prep", lambda: "ready")
        room = await ctx.tool("reserve", room="101")
        given = await ctx.tool("gift", guest="ann")
        return {"room": room["effect_id"], "gift": given["effect_id"]}

    return app


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    DECLINE.clear()
    return Harness(tmp_path, _app(), url=store_url)


@pytest.mark.parametrize("from_step", [None, 1, 2])
async def test_the_dry_run_lists_every_call_the_resume_makes(
    harness: Harness, from_step: int | None
) -> None:
    async with harness as h:
        DECLINE["reserve"] = True
        run_id = await h.submit("stay")
        assert (await h.drive(run_id)).status == RunStatus.FAILED
        DECLINE.clear()  # the hotel has a room again
        plan = await h.store.read(observe_resume.plan_resume, run_id, from_step)
        listed = [(e["step_no"], e["state"], e["key"]) for e in plan.effects]
        (failed,) = [s for s in await h.journal(run_id) if s.name == "reserve"]
        assert listed == [(2, "failed", failed.idempotency_key)], plan
        before = len(ledger.calls())
        await h.store.transact(
            observe_resume.resume_run, run_id, from_step, "ops:amy", "rooms again"
        )
        run = await h.drive(run_id)
        assert run.status == RunStatus.COMPLETED, run
        sent = [c[0] for c in ledger.calls()[before:]]
        # The listed call, then step 3's first call (a step never journaled: its key is
        # the run's, the step's, the tool's and its arguments').
        assert sent[0] == failed.idempotency_key and len(sent) == 2, sent
        (gift,) = [s for s in await h.journal(run_id) if s.name == "gift"]
        assert sent[1] == gift.idempotency_key


def test_the_cli_dry_run_prints_the_key_of_a_failed_write_called_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    DECLINE.clear()
    h = Harness(tmp_path, _app())

    async def seed() -> tuple[str, str]:
        async with h:
            DECLINE["reserve"] = True
            run_id = await h.submit("stay")
            await h.drive(run_id)
            (step,) = [s for s in await h.journal(run_id) if s.name == "reserve"]
            assert step.idempotency_key
            return run_id, step.idempotency_key

    run_id, key = asyncio.run(seed())
    out = CliRunner().invoke(cli, ["runs", "resume", run_id, "--dry-run", "--db",
                                   f"sqlite:///{h.path}"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert f"2 reserve: failed (applied nothing), key {key} -> called again" in out.output
