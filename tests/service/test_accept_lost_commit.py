"""PostgreSQL: a group of accepts whose COMMIT reply is lost (the server committed) is
retried by the store and answers every submit with the run it made -- one run each,
each with one ``run.accepted`` event and its Idempotency-Key row."""

from __future__ import annotations

from typing import Any

import pytest

from agentledger.service import _accepting as accepting
from agentledger.store import NewRun, open_store
from agentledger.store._tx import Tx
from tests.store.pgproxy import COMMIT, LossyProxy

pytestmark = pytest.mark.postgres


def _request(i: int) -> accepting.SubmitRequest:
    new = NewRun(
        kind="workflow", name="free", version="1", input={"i": i}, tenant_id="t1",
        user_id="alice", request_id=f"q_lost_commit_{i}",
    )  # fmt: skip
    # Every other submit has an Idempotency-Key (its row must not answer it as a replay).
    idem = accepting.IdempotencyRequest(f"key-{i}", f"fp-{i}", 3600.0) if i % 2 else None
    return accepting.SubmitRequest(
        new, {"user_id": "alice", "key_id": "k"}, None, idem, accepting.Quota(),
        lambda run: {"id": run.id}, f"req-{i}",
    )  # fmt: skip


async def test_a_group_whose_commit_reply_is_lost_makes_one_run_per_submit(
    proxy: LossyProxy,
) -> None:
    store = open_store(proxy.url)
    await store.open()
    try:
        requests = [_request(i) for i in range(5)]
        proxy.arm(COMMIT)
        outcomes = await store.transact(accepting.accept, requests)
        assert proxy.cut.is_set()  # the reply really was lost, after the server committed
        assert all(isinstance(o, accepting.Submitted) for o in outcomes), outcomes
        answered = [o.run.id for o in outcomes if isinstance(o, accepting.Submitted)]
        assert not any(isinstance(o, accepting.Submitted) and o.replayed for o in outcomes)

        def stored(tx: Tx) -> dict[str, Any]:
            return {
                "runs": tx.fetchall("SELECT id, request_id FROM runs ORDER BY id"),
                "accepted": tx.fetchall(
                    "SELECT run_id, seq FROM events WHERE type = 'run.accepted'"
                ),
                "keys": tx.fetchall("SELECT key, run_id FROM idempotency_keys"),
            }

        found = await store.read(stored)
        assert sorted(answered) == [r["id"] for r in found["runs"]]
        assert {r["request_id"] for r in found["runs"]} == {r.new.request_id for r in requests}
        assert sorted(e["run_id"] for e in found["accepted"]) == sorted(answered)
        assert {e["seq"] for e in found["accepted"]} == {2}  # after run.submitted
        keyed = [o.run.id for o, r in zip(outcomes, requests, strict=True) if r.idem]  # type: ignore[union-attr]
        assert sorted(k["run_id"] for k in found["keys"]) == sorted(keyed)
    finally:
        await store.close()
