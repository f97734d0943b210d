"""The audit chain: sealed per tenant, tamper-evident, readable through the API and CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from agentledger.cli.main import cli
from tests.service.conftest import Api, in_process, settings_for
from tests.service.test_runs_api import assert_problem


def audit_cli(*args: str) -> object:
    return CliRunner().invoke(cli, ["audit", *args])


async def test_editing_one_record_makes_verify_fail_and_name_it(store_url: str) -> None:
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
    assert "intact" in ok.output  # type: ignore[attr-defined]
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
            lambda d, c: d.execute(
                c, "UPDATE events SET actor = 'mallory' WHERE id = :id", {"id": victim["id"]}
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
        await api.store.transact(lambda d, c: d.execute(c, "DELETE FROM events WHERE chain_no = 2"))
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
