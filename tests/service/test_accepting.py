"""Accepting a run through ``POST /v1/runs``, pinned end to end on each backend: what a
submit answers and leaves in the database -- the run, its two audit records, the
Idempotency-Key row -- for a new run, a replay, a key reused with another body and a
quota refusal; and the accept's audit records sealed into the tenant's chain by the
sealer, as every other event."""

from __future__ import annotations

import json
from typing import Any

from agentledger import _sealer as sealer
from agentledger.service._queries import audit as service_audit
from tests.service.conftest import in_process, settings_for
from tests.service.test_runs_api import assert_problem

BODY = {"agent": "free", "input": {"n": 1}}


async def rows(api: Any, sql: str) -> list[dict[str, Any]]:
    return await api.store.read(lambda tx: tx.fetchall(sql))


async def test_new_replayed_reused_and_refused_submits(store_url: str) -> None:
    async with in_process(settings_for(store_url, runs_per_minute=2)) as api:
        h = await api.key("t1", "alice")
        first = await api.client.post(
            "/v1/runs", json=BODY,
            headers={**h, "Idempotency-Key": "k-1", "X-Request-Id": "req-1"},
        )  # fmt: skip
        assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
        run_id = first.json()["id"]
        assert first.headers["Location"] == f"/v1/runs/{run_id}"
        assert first.json()["status"] == "queued"

        # The same key and body: the first answer again, byte for byte; no new run.
        again = await api.client.post(
            "/v1/runs", json=BODY, headers={**h, "Idempotency-Key": "k-1"}
        )
        assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
        assert again.content == first.content
        # The same key with another body: refused, nothing written.
        other = {"agent": "free", "input": {"n": 2}}
        reused = await api.client.post(
            "/v1/runs", json=other, headers={**h, "Idempotency-Key": "k-1"}
        )
        assert_problem(reused, 422, "idempotency-key-reused")

        second = await api.client.post("/v1/runs", json=other, headers=h)
        assert second.status_code == 202
        # The third run of the minute: refused by the quota, with when to retry; a
        # replay still answers (it starts no run).
        refused = await api.client.post(
            "/v1/runs", json=BODY, headers={**h, "Idempotency-Key": "k-2"}
        )
        assert_problem(refused, 429, "quota-exceeded")
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        replay = await api.client.post(
            "/v1/runs", json=BODY, headers={**h, "Idempotency-Key": "k-1"}
        )
        assert replay.status_code == 202 and replay.json()["id"] == run_id

        runs = await rows(
            api,
            "SELECT id, tenant_id, user_id, status, idempotency_key, event_seq, principal "
            "FROM runs ORDER BY created_at, id",
        )
        assert [(r["id"], r["idempotency_key"]) for r in runs] == [
            (run_id, "k-1"), (second.json()["id"], None),
        ]  # fmt: skip
        assert {(r["tenant_id"], r["user_id"], r["status"], r["event_seq"]) for r in runs} == {
            ("t1", "alice", "queued", 2)
        }
        assert json.loads(runs[0]["principal"])["user_id"] == "alice"
        keys = await rows(api, "SELECT tenant_id, key, run_id, status_code, response "
                               "FROM idempotency_keys")  # fmt: skip
        assert [(k["tenant_id"], k["key"], k["run_id"], k["status_code"]) for k in keys] == [
            ("t1", "k-1", run_id, 202)
        ]
        assert json.loads(keys[0]["response"]) == first.json()
        events = await rows(
            api, f"SELECT seq, type, actor, data FROM events WHERE run_id = '{run_id}' "
                 "ORDER BY seq",
        )  # fmt: skip
        assert [(e["seq"], e["type"], e["actor"]) for e in events] == [
            (1, "run.submitted", "alice"), (2, "run.accepted", "alice"),
        ]  # fmt: skip
        assert json.loads(events[0]["data"]) == {"input": {"n": 1}}
        accepted = json.loads(events[1]["data"])
        assert accepted["request_id"] == "req-1" and accepted["idempotency_key"] == "k-1"
        assert accepted["key_id"] == first.json()["principal"]["key_id"]
        assert accepted["roles"] == ["operator"] and accepted["webhook"] is None
        assert len(await rows(api, "SELECT id FROM events")) == 4  # two runs, two each


async def test_accepts_are_sealed_by_the_sealer_into_one_chain(store_url: str) -> None:
    """The accept writes its records unsealed, on every backend; the sealer chains them
    after the tenant's other records, in order, and the chain verifies."""
    settings = settings_for(store_url, audit_seal_every=3600)  # no seal in the test's way
    async with in_process(settings) as api:
        h = await api.key("t1", "alice")
        ids = []
        for i in range(3):
            done = await api.client.post(
                "/v1/runs", json={"agent": "free", "input": {"i": i}},
                headers={**h, "Idempotency-Key": f"seal-{i}"},
            )  # fmt: skip
            ids.append(done.json()["id"])
        unsealed = await rows(api, "SELECT id FROM events WHERE hash IS NULL")
        assert len(unsealed) == 6
        assert await sealer.seal_once(api.store) == 6
        chain = await rows(api, "SELECT run_id, seq, chain_no FROM events WHERE "
                                "tenant_id = 't1' ORDER BY chain_no")  # fmt: skip
        assert [(c["run_id"], c["seq"], c["chain_no"]) for c in chain] == [
            (run, seq, 2 * i + seq) for i, run in enumerate(ids) for seq in (1, 2)
        ]
        checked, broken = await api.store.read(lambda tx: service_audit.verify_chain(tx))
        assert (checked, broken) == (6, [])
