"""The console's runs list on each backend: filters from the URL, keyset pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.service.conftest import Api
from tests.service.test_console_http import browser

_ROW = re.compile(r'<tr data-run="([^"]+)">')
_NEXT = re.compile(r'<a href="(/ui/runs\?[^"]*cursor=[^"]+)">Older runs</a>')


def _ids(html: str) -> list[str]:
    return _ROW.findall(html)


async def test_filters_live_in_the_url_and_pages_hold_every_run_once(api: Api) -> None:
    alice = await api.key("t1", "alice", ("operator",))
    bob = await api.key("t1", "bob", ("operator",))
    other = await api.key("t2", "alice", ("operator",))
    made: dict[str, list[str]] = {"alice": [], "bob": []}
    key_of: dict[str, str] = {}
    for i in range(120):
        who, key = ("alice", alice) if i % 3 else ("bob", bob)
        headers = {**key, "Idempotency-Key": f"order-{i}"}
        r = await api.client.post("/v1/runs", json={"agent": "echo", "input": {"text": str(i)}},
                                  headers=headers)  # fmt: skip
        made[who].append(r.json()["id"])
        key_of[r.json()["id"]] = f"order-{i}"
    foreign = await api.client.post("/v1/runs", json={"agent": "free"}, headers=other)
    costly, retried = made["alice"][5], made["bob"][7]
    await api.store.transact(
        lambda tx: tx.execute(
            "UPDATE runs SET cost_usd = 2.5, status = 'failed', handover_reason = 'rate_limited' "
            "WHERE id = :id", {"id": costly},
        )
    )  # fmt: skip
    await api.store.transact(
        lambda tx: tx.execute(
            "INSERT INTO steps (run_id, step_no, kind, name, status, attempts, lease_epoch, "
            "error_class) VALUES (:id, 1, 'tool', 'pay', 'retrying', 4, 1, 'provider_error')",
            {"id": retried},
        )
    )  # fmt: skip
    async with browser(api, alice) as client:
        seen: list[str] = []
        url = "/ui/runs"
        while url:
            page = await client.get(url.replace("&amp;", "&"))
            assert page.status_code == 200
            seen += _ids(page.text)
            found = _NEXT.search(page.text)
            url = found.group(1) if found else ""
        assert sorted(seen) == sorted(made["alice"] + made["bob"])  # all, once, this tenant
        assert foreign.json()["id"] not in seen

        async def shown(query: str) -> list[str]:
            r = await client.get(f"/ui/runs?{query}")
            assert r.status_code == 200, r.text
            return _ids(r.text)

        assert await shown("user=bob&status=queued") == list(reversed(made["bob"]))[:50]
        assert await shown("cost_min=1&cost_max=3") == [costly]
        assert await shown("error_class=rate_limited") == [costly]
        assert await shown("error_class=provider_error") == [retried]
        assert await shown("min_retries=3") == [retried]
        assert await shown("status=retrying") == [retried]
        assert await shown(f"idempotency_key={key_of[retried]}") == [retried]
        assert await shown("status=failed&agent=echo&version=1") == [costly]
        assert await shown("to=2000-01-01T00:00") == []
        # A filter that is not one is said in words and left out.
        r = await client.get("/ui/runs?status=bogus&cost_min=lots&user=bob")
        assert "status: &#39;bogus&#39; is not a status" in r.text
        assert "cost min: &#39;lots&#39; is not a number" in r.text
        assert len(_ids(r.text)) == 40


async def test_the_page_timing_benchmark_runs(tmp_path: Path) -> None:
    bench = pytest.importorskip("agentledger_bench.console_pages")
    out = await bench.measure(f"sqlite:///{tmp_path / 'bench.db'}", runs=1200, repeat=1)
    assert out["runs"] == 1200 and out["run_page"]["median_ms"] > 0


async def test_the_live_lists_question_is_the_lists_own_filter_by_id(api: Api) -> None:
    """``runs_matching`` (which of a batch of runs a live page could take in) answers as
    the page's own filter would, within the page's cursor and above a full page's last
    row, and never with another tenant's run."""
    from agentledger.service._queries.console import ConsoleFilter, list_runs, runs_matching

    alice = await api.key("t1", "alice", ("operator",))
    other = await api.key("t2", "alice", ("operator",))
    ids = []
    for i in range(6):
        r = await api.client.post("/v1/runs", json={"agent": "echo", "input": {"text": str(i)}},
                                  headers=alice)  # fmt: skip
        ids.append(r.json()["id"])
    foreign = (await api.client.post("/v1/runs", json={"agent": "free"}, headers=other)).json()
    await api.store.transact(
        lambda tx: tx.execute(
            "UPDATE runs SET status = 'failed' WHERE id IN (:a, :b)", {"a": ids[1], "b": ids[4]}
        )
    )
    every = [*ids, foreign["id"], "no-such-run"]
    for f in (ConsoleFilter("t1"), ConsoleFilter("t1", status="failed"),
              ConsoleFilter("t1", user="bob"), ConsoleFilter("t1", limit=2)):  # fmt: skip
        page = await api.store.read(list_runs, ConsoleFilter(**{**f.__dict__, "limit": 1000}))
        expected = {r["run"].id for r in page}
        assert set(await api.store.read(runs_matching, f, every, None)) == expected
    # Within a cursor and above a floor: only the runs between them.
    newest = await api.store.read(list_runs, ConsoleFilter("t1", limit=1000))
    order = [r["run"] for r in newest]  # newest first
    cursor = (order[1].created_at, order[1].id)
    floor = (order[4].created_at, order[4].id)
    inside = await api.store.read(runs_matching, ConsoleFilter("t1", cursor=cursor), every, floor)
    assert set(inside) == {r.id for r in order[2:5]}
