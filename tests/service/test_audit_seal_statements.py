"""A seal's statements are the same text whatever the number of records it seals: the
driver parses (SQLite compiles, psycopg converts and prepares) each once, not once per
window size -- a seal runs every second on every worker, on the store's writer."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentledger.service._queries import audit as service_audit
from agentledger.store import Store, open_store
from agentledger.store._tx import Tx
from tests.service import service_app


def _recorded(statements: list[str], run: Callable[..., Any]) -> Callable[..., Any]:
    def recording(sql: str, *args: Any) -> Any:
        statements.append(sql)
        return run(sql, *args)

    return recording


def _seal_recording(statements: list[str]) -> Callable[[Tx], int]:
    def seal(tx: Tx) -> int:
        for name in ("execute", "fetchall", "executemany"):
            if hasattr(tx, name):
                setattr(tx, name, _recorded(statements, getattr(tx, name)))
        return service_audit.seal(tx)

    return seal


async def _events(store: Store, n: int) -> None:
    run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
    for i in range(n - 1):
        await store.append_event(run_id, "note", "test", {"n": i})


async def test_a_seal_says_the_same_statements_for_any_number_of_records(
    store_url: str,
) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        await _events(store, 1)  # the tenant's chain begins (its head row is made once)
        assert await store.transact(service_audit.seal) == 1
        await _events(store, 3)
        few: list[str] = []
        assert await store.transact(_seal_recording(few)) == 3
        await _events(store, 12)
        many: list[str] = []
        assert await store.transact(_seal_recording(many)) == 12
        assert set(many) == set(few)
        checked, broken = await store.read(service_audit.verify_chain)
        assert broken == [] and checked == 16
    finally:
        await store.close()


def _set_webhook(tx: Tx, run_id: str, url: str) -> None:
    tx.execute("UPDATE runs SET webhook = :u WHERE id = :id", {"u": url, "id": run_id})


def _deliveries(tx: Tx) -> list[dict[str, Any]]:
    return tx.fetchall("SELECT id, run_id, url, type, body FROM webhook_deliveries ORDER BY id")


async def test_a_seal_reads_the_runs_of_its_webhooks_once_and_enqueues_each(
    store_url: str,
) -> None:
    """The runs behind a seal's reported events are read in one statement, and every
    reported event of a run with a URL is enqueued with that run's body -- runs without
    one, and events not reported, enqueue nothing."""
    store = open_store(store_url)
    await store.open()
    try:
        await _events(store, 1)
        assert await store.transact(service_audit.seal) == 1
        hooked = []
        for i in range(4):
            run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
            if i != 2:  # one run without a URL
                await store.transact(_set_webhook, run_id, f"http://example.invalid/{i}")
                hooked.append((run_id, f"http://example.invalid/{i}"))
            await store.append_event(run_id, "note", "test", {"n": i})
            ended = {"run": {"status": "completed", "result": i}}
            await store.append_event(run_id, "run.completed", "test", ended)
        statements: list[str] = []
        assert await store.transact(_seal_recording(statements)) == 12
        webhook_reads = [s for s in statements if s.startswith("SELECT") and "webhook" in s]
        assert len(webhook_reads) == 1
        found = await store.read(_deliveries)
        assert sorted((d["run_id"], d["url"], d["type"]) for d in found) == sorted(
            (run_id, url, "run.completed") for run_id, url in hooked
        )
        for d in found:
            body = json.loads(d["body"])
            assert body["id"] == d["id"] and body["run_id"] == d["run_id"]
            assert body["agent"] == "echo" and body["tenant"] == "t1"
            assert body["run"]["status"] == "completed"
    finally:
        await store.close()
