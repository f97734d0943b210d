"""A dead letter's retry whose COMMIT reached PostgreSQL but whose reply was lost: the
store runs it again on a new connection, and the second run must answer what the first
did (the letter was queued again, once), not "no dead letter" -- an operator told so
would look for a letter that a worker is already delivering, or retry it by hand."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentledger import open_store
from agentledger.observe._queries import resume as observe_resume
from agentledger.store._queries.common import new_token
from agentledger.store._tx import Tx
from tests.cli.helpers import run_cli
from tests.fast.lifecycle_harness import Harness
from tests.observe import test_resume_partial_compensation_attack as attack
from tests.store.pgproxy import COMMIT, LossyProxy


def _dead_letter(tx: Tx, run_id: str, key: str) -> None:
    tx.execute(
        "INSERT INTO outbox (key, run_id, step_no, tool, attempts, next_attempt_at, status, "
        "last_error, created_at, updated_at) VALUES (:k, :r, 1, 'email', 5, 0, 'dead', "
        "'smtp refused', 0, 0)",
        {"k": key, "r": run_id},
    )


async def _run_with_dead_letters(tmp_path: Path, pg_url: str, keys: list[str]) -> str:
    h = Harness(tmp_path, attack._app(), url=pg_url)
    async with h:
        run_id = await attack._compensated(h, {"refund_fee"})
        for key in keys:
            await h.store.transact(_dead_letter, run_id, key)
    return run_id


async def _after(proxy: LossyProxy, run_id: str, key: str) -> tuple[str, int]:
    store = open_store(proxy.url)
    await store.open()
    try:
        found = await store.read(
            lambda tx: tx.fetchall("SELECT status FROM outbox WHERE key = :k", {"k": key})
        )
        retried = [
            e
            for e in await store.list_events(run_id)
            if e.type == "outbox.retried" and e.data.get("key") == key
        ]
        return found[0]["status"], len(retried)
    finally:
        await store.close()


async def test_a_retry_whose_commit_reply_was_lost_answers_done_once(
    tmp_path: Path, pg_url: str, proxy: LossyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    run_id = await _run_with_dead_letters(tmp_path, pg_url, ["ob-1"])
    store = open_store(proxy.url)
    await store.open()
    try:
        proxy.arm(COMMIT)
        done = await store.transact(observe_resume.retry_outbox, "ob-1", "ops:amy", new_token())
        assert proxy.cut.is_set()  # the reply was lost: the store ran it again
        assert done is True
        # Another caller's retry (its own token) of the letter, now pending: not done.
        again = await store.transact(observe_resume.retry_outbox, "ob-1", "ops:bob", new_token())
        assert again is False
    finally:
        await store.close()
    assert await _after(proxy, run_id, "ob-1") == ("pending", 1)


async def test_the_cli_retry_whose_commit_reply_was_lost_says_queued(
    tmp_path: Path, pg_url: str, proxy: LossyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINE_LEDGER", str(tmp_path / "provider.db"))
    run_id = await _run_with_dead_letters(tmp_path, pg_url, ["ob-2"])
    proxy.arm(COMMIT, after=b"outbox.retried")  # the retry's COMMIT, not the opening's
    out = await asyncio.to_thread(run_cli, "outbox", "retry", "ob-2", "--db", proxy.url)
    assert proxy.cut.is_set()
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "ob-2 queued for delivery again" in out.stdout
    assert await _after(proxy, run_id, "ob-2") == ("pending", 1)
