"""A compensation is called and status-checked with the key it was journaled with.

A compensation's key is fixed when it is first journaled (as a forward write's is,
tests/fast/test_replay.py): a run journaled by another version of the code may carry
a key in another format. The provider knows the refund by that key: asked about, or
called again with, any other key, it answers "not found" and refunds a second time.

The provider is the external ledger of tests/apps/ledger.py; its refund does NOT
dedupe keys, so a refund called under a second key refunds twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentledger import App, Status, ToolContext
from agentledger.errors import BusinessError
from agentledger.observe._queries import resume as observe_resume
from agentledger.records import RunStatus, StepStatus
from agentledger.store._tx import Tx
from tests.apps import ledger
from tests.apps.refund_booking import apply_refund, booking_app
from tests.fast.lifecycle_harness import KILLED, Harness, Killed

REFUND = 4  # 1 charge, 2 confirm (fails), 3 decision, 4 refund
LEGACY = "legacy-refund-key"

#: The refund is declined (applies nothing).
DECLINE: set[str] = set()
#: The worker dies right after the refund applied, before its result is journaled.
KILL_AFTER_APPLY: set[str] = set()


async def _status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    found = ledger.status(ctx.idempotency_key)
    return Status.succeeded(found) if found else Status.not_found()


async def _refund(name: str, ctx: ToolContext, effect_id: int, amount: int) -> dict[str, Any]:
    if DECLINE:
        ledger.record_call(ctx.idempotency_key, "refund")
        raise BusinessError("refund: declined by the provider")
    done = apply_refund(ctx, effect_id, amount, dedupe=False)
    if KILL_AFTER_APPLY:
        KILL_AFTER_APPLY.clear()
        raise Killed("the worker died after the refund applied")
    return dict(done)


def _app() -> App:
    DECLINE.clear()
    KILL_AFTER_APPLY.clear()
    charges = [("charge", "refund", 100)]
    return booking_app("compkey", charges, _refund, status=_status, refund_status=_status)


@pytest.fixture
def harness(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    return Harness(tmp_path, _app(), url=store_url)


def _journal_key(tx: Tx, run_id: str, step_no: int, key: str) -> None:
    """A run journaled by another version of the code: its refund's key in another format."""
    tx.execute(
        "UPDATE steps SET idempotency_key = :k WHERE run_id = :id AND step_no = :n",
        {"k": key, "id": run_id, "n": step_no},
    )


def _provider_key(old: str, new: str) -> None:
    """What the provider holds under ``old`` it holds under ``new`` (the key it was sent)."""
    conn = ledger._tx()
    try:
        conn.execute("UPDATE calls SET key = ? WHERE key = ?", (new, old))
        conn.execute(
            "UPDATE effects SET key = ?, result = json_set(result, '$.key', ?) WHERE key = ?",
            (new, new, old),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_a_refund_in_flight_is_checked_with_its_journaled_key(harness: Harness) -> None:
    """The refund applied under its journaled key and the worker died before recording
    it: the next owner asks the provider about that key (applied: recorded done), never
    about another one, which the provider does not know (and would refund again)."""
    async with harness as h:
        run_id = await h.submit("booking")
        KILL_AFTER_APPLY.add("on")
        assert await h.execute(run_id) == KILLED
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert step.kind == "compensation" and step.status == StepStatus.STARTED
        assert step.idempotency_key is not None
        _provider_key(step.idempotency_key, LEGACY)
        await h.store.transact(_journal_key, run_id, REFUND, LEGACY)
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.effect_counts(kind="refund") == {LEGACY: 1}  # refunded once
        assert ledger.call_counts(kind="refund") == {LEGACY: 1}
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert (step.status, step.idempotency_key) == (StepStatus.SUCCEEDED, LEGACY)


async def test_a_rechecked_refund_is_called_again_with_the_key_it_was_asked_about(
    harness: Harness,
) -> None:
    """Declined, then resumed: the provider is asked about the journaled key (not
    applied), and the refund is called again with that key -- the one the resume's plan
    names -- not with another."""
    async with harness as h:
        run_id = await h.submit("booking")
        DECLINE.add("on")
        assert (await h.drive(run_id)).status == RunStatus.NEEDS_HUMAN
        DECLINE.clear()
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert step.status == StepStatus.FAILED and step.idempotency_key is not None
        _provider_key(step.idempotency_key, LEGACY)
        await h.store.transact(_journal_key, run_id, REFUND, LEGACY)
        plan = await h.store.transact(observe_resume.resume_run, run_id, None, "ops:amy", "go")
        assert [(e["step_no"], e["key"]) for e in plan.effects] == [(REFUND, LEGACY)]
        run = await h.drive(run_id)
        assert run.status == RunStatus.FAILED, run
        assert ledger.call_counts(kind="refund") == {LEGACY: 2}  # declined, then applied
        assert ledger.effect_counts(kind="refund") == {LEGACY: 1}
        step = {s.step_no: s for s in await h.journal(run_id)}[REFUND]
        assert (step.status, step.idempotency_key) == (StepStatus.SUCCEEDED, LEGACY)
