"""A key made under one ``AGENTLEDGER_KEY_PEPPER`` and used under another: ``serve``
says so at start and in the 401's log line (each key keeps a fingerprint of the pepper
it was made under, never the pepper), on SQLite and PostgreSQL."""

from __future__ import annotations

import logging

import pytest

from agentledger.service._auth import create_key, pepper_fingerprint
from tests.service.conftest import PEPPER, in_process, settings_for
from tests.service.test_runs_api import assert_problem

OTHER = b"another-pepper-of-another-deploy"


async def test_keys_of_another_pepper_are_named_at_start_and_at_their_401(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with in_process(settings_for(store_url, pepper=OTHER)) as before:
        stale, _ = await create_key(before.store, OTHER, "t1", "ann", ["operator"], 3600)
    caplog.set_level(logging.INFO, logger="agentledger")
    async with in_process(settings_for(store_url)) as api:
        started = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        said = [m for m in started if "AGENTLEDGER_KEY_PEPPER" in m]
        assert len(said) == 1, started
        assert "1 of 1 API key" in said[0] and pepper_fingerprint(OTHER) in said[0]
        assert pepper_fingerprint(PEPPER) in said[0]
        assert OTHER.decode() not in said[0] and PEPPER.decode() not in said[0]
        fresh = await api.key()  # made under this process's pepper: works, nothing said
        assert (await api.client.get("/v1/runs", headers=fresh)).status_code == 200
        caplog.clear()
        r = await api.client.get("/v1/runs", headers={"Authorization": f"Bearer {stale}"})
        assert_problem(r, 401, "unauthenticated")
        assert r.json()["detail"] == "unknown API key"
        lines = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
        key_id = stale.split("_")[1]
        assert any(key_id in m and "another AGENTLEDGER_KEY_PEPPER" in m for m in lines), lines
        # A forged secret under the right pepper is just unknown: no pepper talk.
        caplog.clear()
        forged = fresh["Authorization"][:-4] + "AAAA"
        r = await api.client.get("/v1/runs", headers={"Authorization": forged})
        assert_problem(r, 401, "unauthenticated")
        assert not any("PEPPER" in rec.getMessage() for rec in caplog.records)
    rows = await _fingerprints(store_url)
    assert sorted(rows) == sorted([pepper_fingerprint(OTHER), pepper_fingerprint(PEPPER)])


async def _fingerprints(url: str) -> list[str]:
    from agentledger.store import open_store

    store = open_store(url)
    await store.open()
    try:
        rows = await store.read(lambda tx: tx.fetchall("SELECT pepper_id FROM api_keys", {}))
    finally:
        await store.close()
    return [r["pepper_id"] for r in rows]


def test_the_fingerprint_is_not_the_pepper_and_differs_between_peppers() -> None:
    a, b = pepper_fingerprint(PEPPER), pepper_fingerprint(OTHER)
    assert a != b and len(a) == 16 and PEPPER.hex() not in a
    assert pepper_fingerprint(PEPPER) == a
