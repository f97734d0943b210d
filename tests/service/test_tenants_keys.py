"""Tenants, API keys (CLI and HTTP), roles, quotas, isolation over every route."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentledger.cli._main import cli
from agentledger.service._queries import keys as service_keys
from tests.service.conftest import PEPPER, Api, in_process, settings_for
from tests.service.test_runs_api import assert_problem


def keys_cli(*args: str) -> Any:
    runner = CliRunner()
    return runner.invoke(cli, ["keys", *args], env={"AGENTLEDGER_KEY_PEPPER": PEPPER.decode()})


async def test_keys_cli_create_list_revoke(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    made = await asyncio.to_thread(
        keys_cli, "create", "--tenant", "acme", "--user", "ann", "--roles", "approver,manager",
        "--expires-in", "30d", "--db", url,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    key = made.stdout.strip().splitlines()[0]
    match = re.fullmatch(r"al_([0-9a-f]{12})_(\S+)", key)
    assert match, key
    key_id, secret = match.groups()
    listed = await asyncio.to_thread(keys_cli, "list", "--db", url, "--json")
    assert key_id in listed.stdout and secret not in listed.stdout
    assert f'"last4": "{secret[-4:]}"' in listed.stdout
    async with in_process(settings_for(url)) as api:
        h = {"Authorization": f"Bearer {key}"}
        assert (await api.client.get("/v1/runs", headers=h)).status_code == 200
        row = await api.store.transact(service_keys.get_key, key_id)
        assert row is not None and secret not in str(row)  # only the HMAC is stored
        revoked = await asyncio.to_thread(keys_cli, "revoke", key_id, "--db", url)
        assert revoked.exit_code == 0, revoked.output

        async def refused() -> bool:
            r = await api.client.get("/v1/runs", headers=h)
            return r.status_code == 401

        # Revoke takes effect within the key cache's lifetime (0.2 s in tests).
        deadline = asyncio.get_running_loop().time() + 0.2 + 2.0
        while not await refused():
            assert asyncio.get_running_loop().time() < deadline, "revoke not effective"
            await asyncio.sleep(0.05)
    bad = await asyncio.to_thread(
        keys_cli, "create", "--tenant", "a", "--user", "u", "--roles", "Bad Role", "--db", url
    )
    assert bad.exit_code != 0 and "role" in str(bad.exception)
    no_expiry = await asyncio.to_thread(
        keys_cli, "create", "--tenant", "a", "--user", "u", "--roles", "viewer",
        "--expires-in", "forever", "--db", url,
    )  # fmt: skip
    assert no_expiry.exit_code != 0 and "expires-in" in str(no_expiry.exception)


async def test_runs_per_minute_quota_is_429_with_retry_after(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    async with in_process(settings_for(url, runs_per_minute=2)) as api:
        h = await api.key("t1")
        other = await api.key("t2", "bob")
        for _ in range(2):
            r = await api.client.post("/v1/runs", json={"agent": "free"}, headers=h)
            assert r.status_code == 202
        r = await api.client.post("/v1/runs", json={"agent": "free"}, headers=h)
        assert_problem(r, 429, "quota-exceeded")
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        # Another tenant has its own quota.
        r = await api.client.post("/v1/runs", json={"agent": "free"}, headers=other)
        assert r.status_code == 202
        # A tenant's own limit overrides the default.
        await api.store.transact(service_keys.set_tenant, "t1", 10, None)
        r = await api.client.post("/v1/runs", json={"agent": "free"}, headers=h)
        assert r.status_code == 202


async def test_runs_in_flight_quota(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    async with in_process(settings_for(url, max_in_flight=1)) as api:
        h = await api.key("t1")
        first = await api.client.post("/v1/runs", json={"agent": "free"}, headers=h)
        assert first.status_code == 202
        assert_problem(
            await api.client.post("/v1/runs", json={"agent": "free"}, headers=h),
            429, "quota-exceeded",
        )  # fmt: skip
        await api.client.post(f"/v1/runs/{first.json()['id']}/cancel", headers=h)
        again = await api.client.post("/v1/runs", json={"agent": "free"}, headers=h)
        assert again.status_code == 202


def _fill(path: str, ids: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: ids.get(m.group(1), "x"), path)


async def test_tenant_isolation_over_every_route(api: Api) -> None:
    """Table-driven over the OpenAPI paths: anything with an id of tenant A is 404 for
    tenant B's admin; listings of B never show A's objects."""
    mine = await api.key("ta", "alice", ("admin",))
    theirs = await api.key("tb", "bob", ("admin",))
    run = await api.client.post("/v1/runs", json={"agent": "free"}, headers=mine)
    ids = {"run_id": run.json()["id"], "approval_id": "ap-none"}
    spec = (await api.client.get("/openapi.json")).json()
    checked = 0
    for path, methods in spec["paths"].items():
        for method in methods:
            if "{" not in path:
                if method == "get" and path.startswith("/v1/"):
                    r = await api.client.get(path, headers=theirs)
                    assert ids["run_id"] not in r.text, path
                continue
            r = await api.client.request(method.upper(), _fill(path, ids), headers=theirs, json={})
            assert r.status_code in (404, 422), (method, path, r.status_code, r.text)
            if r.status_code == 404:
                assert_problem(r, 404, "not-found")
            checked += 1
            r = await api.client.request(method.upper(), _fill(path, ids), json={})
            assert_problem(r, 401, "unauthenticated")
    assert checked >= 5


@pytest.mark.parametrize("header", ["Basic abc", "Bearer", "Bearer al_0123456789ab_short"])
async def test_malformed_authorization_is_401(sqlite_api: Api, header: str) -> None:
    r = await sqlite_api.client.get("/v1/runs", headers={"Authorization": header})
    assert_problem(r, 401, "unauthenticated")
