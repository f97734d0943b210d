"""The audit chain: sealed per tenant, tamper-evident, readable through the API and CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentledger.cli._main import cli
from tests.service.conftest import Api, in_process, settings_for, until
from tests.service.test_runs_api import assert_problem


def audit_cli(*args: str) -> object:
    return CliRunner().invoke(cli, ["audit", *args])


async def test_editing_one_record_makes_verify_fail_and_name_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service, its workers and the verify command all sign and check under one key.
    monkeypatch.setenv("AGENTLEDGER_AUDIT_KEY", "k" * 32)
    async with in_process(settings_for(store_url, workers_inline=1)) as api:
        a = await api.key("t1", "alice", ("admin",))
        b = await api.key("t2", "bob", ("operator",))
        ids = []
        for h in (a, b, a):
            body = {"agent": "echo", "input": {"text": "x", "steps": 2}}
            ids.append((await api.client.post("/v1/runs", json=body, headers=h)).json()["id"])
        for run_id, h in zip(ids, (a, b, a), strict=True):
            r = await api.client.get(f"/v1/runs/{run_id}/result?wait=30", headers=h)
            assert r.json()["status"] == "completed"
    ok = await asyncio.to_thread(audit_cli, "verify", "--db", store_url)
    assert ok.exit_code == 0, ok.output  # type: ignore[attr-defined]
    assert "intact" in ok.output and "signatures verified" in ok.output  # type: ignore[attr-defined]
    async with in_process(settings_for(store_url)) as api:
        a = await api.key("t1", "alice", ("admin",))
        records = (await api.client.get(f"/v1/runs/{ids[0]}/audit", headers=a)).json()["records"]
        types = [r["type"] for r in records]
        assert types[:2] == ["run.submitted", "run.accepted"] and types[-1] == "run.completed"
        accepted = records[1]["data"]
        assert accepted["key_id"] and accepted["request_id"]
        chain = (await api.client.get("/v1/audit?limit=3", headers=a)).json()
        assert [r["chain_no"] for r in chain["records"]] == [1, 2, 3]
        more = (await api.client.get(f"/v1/audit?cursor={chain['next_cursor']}", headers=a)).json()
        assert more["records"][0]["chain_no"] == 4
        assert all(r["run_id"] != ids[1] for r in chain["records"] + more["records"])
        viewer = await api.key("t1", "vic", ("viewer",))
        assert_problem(await api.client.get("/v1/audit", headers=viewer), 403, "forbidden")
        victim = records[3]
        await api.store.transact(
            lambda tx: tx.execute(
                "UPDATE events SET actor = 'mallory' WHERE id = :id", {"id": victim["id"]}
            )
        )
    bad = await asyncio.to_thread(audit_cli, "verify", "--db", store_url)
    assert bad.exit_code == 1  # type: ignore[attr-defined]
    out = bad.output  # type: ignore[attr-defined]
    assert f"event {victim['id']}" in out and ids[0] in out and "tenant t1" in out
    assert "t2" not in out  # the other tenant's chain is intact


async def test_deleting_a_record_is_detected(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'del.db'}"
    async with in_process(settings_for(url)) as api:
        h = await api.key("t1", "alice", ("admin",))
        for _ in range(3):
            await api.client.post("/v1/runs", json={"agent": "free"}, headers=h)
        sealed = await asyncio.to_thread(audit_cli, "verify", "--db", url)
        assert sealed.exit_code == 0  # type: ignore[attr-defined]
        await api.store.transact(lambda tx: tx.execute("DELETE FROM events WHERE chain_no = 2"))
    bad = await asyncio.to_thread(audit_cli, "verify", "--db", url)
    assert bad.exit_code == 1 and "record 2 is missing" in bad.output  # type: ignore[attr-defined]
    shown = await asyncio.to_thread(audit_cli, "r-missing", "--db", url)
    assert shown.exit_code != 0  # type: ignore[attr-defined]


async def test_audit_of_a_run_in_the_cli(sqlite_api: Api) -> None:
    h = await sqlite_api.key()
    run = (await sqlite_api.client.post("/v1/runs", json={"agent": "free"}, headers=h)).json()
    url = sqlite_api.app.state.settings.db_url
    shown = await asyncio.to_thread(audit_cli, run["id"], "--db", url)
    assert shown.exit_code == 0 and "run.accepted" in shown.output  # type: ignore[attr-defined]


async def test_the_audit_trail_names_who_started_proposed_decided_and_ran_what(
    tmp_path: Path,
) -> None:
    """An approved payment's records, through the API: the starter (key, user, request,
    Idempotency-Key), the policy's decision, the proposed call with its arguments, the
    approver with their key and request, the call executed; all of it sealed."""
    url = f"sqlite:///{tmp_path / 'trail.db'}"
    async with in_process(settings_for(url, workers_inline=1, audit_seal_every=0.05)) as api:
        gina = await api.key("t1", "gina", ("guest",))
        mona = await api.key("t1", "mona", ("manager",))
        body = {"agent": "payout", "input": {"amount": 120, "approval": {"role": "manager"}}}
        started = await api.client.post(
            "/v1/runs", json=body, headers={**gina, "Idempotency-Key": "pay-120",
                                            "X-Request-Id": "req-start-1"},
        )  # fmt: skip
        run_id = started.json()["id"]
        starter_key = started.json()["principal"]["key_id"]

        async def listed() -> bool:
            return bool((await api.client.get("/v1/approvals", headers=mona)).json()["approvals"])

        await until(listed)
        (a,) = (await api.client.get("/v1/approvals", headers=mona)).json()["approvals"]
        decided = await api.client.post(
            f"/v1/approvals/{a['id']}/decision",
            json={"decision": "approve", "arguments_hash": a["arguments_hash"], "reason": "ok"},
            headers={**mona, "X-Request-Id": "req-approve-1"},
        )
        assert decided.status_code == 200
        done = await api.client.get(f"/v1/runs/{run_id}/result?wait=30", headers=gina)
        assert done.json()["status"] == "completed"

        async def all_sealed() -> bool:
            got = (await api.client.get(f"/v1/runs/{run_id}/audit", headers=gina)).json()
            return all(r["hash"] for r in got["records"])

        await until(all_sealed)
        records = (await api.client.get(f"/v1/runs/{run_id}/audit", headers=gina)).json()
        by_type: dict[str, list[dict[str, Any]]] = {}
        for r in records["records"]:
            by_type.setdefault(r["type"], []).append(r)
        (accepted,) = by_type["run.accepted"]
        assert accepted["actor"] == "gina" and accepted["data"]["key_id"] == starter_key
        assert accepted["data"]["request_id"] == "req-start-1"
        assert accepted["data"]["idempotency_key"] == "pay-120"
        (policy,) = by_type["policy.decision"]
        assert policy["data"]["decision"] == "RequireApproval" and policy["data"]["tool"] == "pay"
        (requested,) = by_type["approval.requested"]
        assert requested["data"]["arguments"] == {"amount": 120}
        (decision,) = by_type["approval.decided"]
        assert (decision["actor"], decision["data"]["decision"]) == ("mona", "approve")
        (context,) = by_type["approval.decision_context"]
        assert context["data"]["key_id"] == mona["Authorization"].split("_")[1] != starter_key
        assert context["data"]["request_id"] == "req-approve-1"
        assert context["data"]["arguments_hash"] == a["arguments_hash"]
        executed = [r for r in by_type["step.succeeded"] if r["data"]["name"] == "pay"]
        assert len(executed) == 1
        # What executed with which key, under which policy decision: in the sealed record.
        steps = (await api.client.get(f"/v1/runs/{run_id}/steps", headers=gina)).json()
        (pay_step,) = [s for s in steps["steps"] if s["name"] == "pay" and s["kind"] == "tool"]
        assert executed[0]["data"]["key"] == pay_step["idempotency_key"] is not None
        assert executed[0]["data"]["policy"] == "requireapproval"
        # What it cost (a workflow without a model: nothing, said so in the record);
        # model steps' costs: tests/fast/test_audit_records.py.
        run = (await api.client.get(f"/v1/runs/{run_id}", headers=gina)).json()
        (completed,) = by_type["run.completed"]
        assert completed["data"]["cost_usd"] == run["cost_usd"]
        assert completed["data"]["tokens"] == run["tokens"]


async def test_nothing_in_the_api_edits_or_deletes_audit_records(api: Api) -> None:
    """Every route that reads the audit trail is a GET, and no route changes events."""
    spec = (await api.client.get("/openapi.json")).json()
    audit_routes = {p: set(m) for p, m in spec["paths"].items() if "audit" in p}
    assert audit_routes == {"/v1/runs/{run_id}/audit": {"get"}, "/v1/audit": {"get"}}
    admin = await api.key("t1", "ada", ("admin",))
    for method in ("PUT", "PATCH", "DELETE", "POST"):
        r = await api.client.request(method, "/v1/audit", headers=admin)
        assert_problem(r, 405, "method-not-allowed")


async def test_readyz_is_503_while_migrations_are_pending(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ready.db'}"
    async with in_process(settings_for(url)) as api:
        assert (await api.client.get("/readyz")).status_code == 200
        await api.store.transact(
            lambda tx: tx.execute(
                "DELETE FROM schema_migrations WHERE version = "
                "(SELECT MAX(version) FROM schema_migrations)",
            )
        )  # fmt: skip
        r = await api.client.get("/readyz")
        body = assert_problem(r, 503, "unavailable")
        assert "agentledger migrate" in body["detail"]
        assert (await api.client.get("/healthz")).json() == {"status": "ok"}
