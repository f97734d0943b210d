"""A resume whose COMMIT reached PostgreSQL but whose reply was lost: the store runs it
again on a new connection, and the second run must answer what the first did (the run
was resumed, once), not refuse it as "queued" -- an operator told "not resumed" while
the run goes on would resume it again, or not look (issue 22, review)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentledger import open_store
from agentledger.observe._queries import resume as observe_resume
from agentledger.records import RunStatus
from agentledger.store._queries.common import new_token
from tests.fast.lifecycle_harness import Harness
from tests.observe.test_resume_partial_compensation_attack import (
    _app,
    _compensated,
)
from tests.store.pgproxy import COMMIT, LossyProxy


async def test_a_resume_whose_commit_reply_was_lost_answers_resumed_once(
    tmp_path: Path, pg_url: str, proxy: LossyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    h = Harness(tmp_path, _app(), url=pg_url)
    async with h:
        run_id = await _compensated(h, {"refund_fee"})
        key = {s.step_no: s.idempotency_key for s in await h.journal(run_id)}[5]
    store = open_store(proxy.url)
    await store.open()
    try:
        proxy.arm(COMMIT)
        plan = await store.transact(
            observe_resume.resume_run, run_id, None, "ops:amy", "retry", False, new_token()
        )
        assert proxy.cut.is_set()  # the reply was lost: the store ran it again
        assert plan.compensations_checked == [5] and plan.from_step == 7, plan
        assert [e["key"] for e in plan.effects] == [key]
        run = await store.get_run(run_id)
        assert run is not None and run.status == RunStatus.QUEUED
        resumed = [e for e in await store.list_events(run_id) if e.type == "run.resumed"]
        assert len(resumed) == 1
        assert resumed[0].data["compensations_checked"] == [5]
    finally:
        await store.close()
