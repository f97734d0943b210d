"""``agentledger docs`` and ``agentledger memory`` as a user types them, on both backends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from agentledger.cli._main import cli
from agentledger.memory import _queries as memory_facts
from agentledger.store import open_store
from agentledger_examples.stayhub.knowledge import POLICY_PATH
from tests.memory.runs import count


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_docs_add_list_search_remove(store_url: str, tmp_path: Path) -> None:
    page = tmp_path / "house.html"
    page.write_text("<h1>House rules</h1><p>Quiet hours start at 22:00.</p>")
    out = invoke("docs", "add", str(POLICY_PATH), str(page), "--tenant", "acme", "--db", store_url)
    assert out.count("indexed doc-") == 2
    assert "unchanged" in invoke("docs", "add", str(page), "--tenant", "acme", "--db", store_url)
    listed = json.loads(invoke("docs", "list", "--json", "--db", store_url))
    assert sorted(d["kind"] for d in listed) == ["html", "markdown"]
    hits = json.loads(
        invoke("docs", "search", "quiet hours", "--tenant", "acme", "--json", "--db", store_url)
    )
    assert hits[0]["title"] == "House rules"
    other = invoke("docs", "search", "quiet hours", "--tenant", "default", "--db", store_url)
    assert "tenant default has no documents (tenants with documents: acme)" in other
    assert "removed" in invoke("docs", "remove", str(page), "--tenant", "acme", "--db", store_url)
    assert count(store_url, "SELECT COUNT(*) FROM documents") == 1
    missing = CliRunner().invoke(cli, ["docs", "remove", "nope", "--db", store_url])
    assert missing.exit_code != 0 and "no document nope" in missing.output


def test_memory_list_and_forget(store_url: str) -> None:
    async def seed() -> None:
        store = open_store(store_url)
        await store.open()
        try:
            await store.transact(
                memory_facts.upsert_fact,
                "default",
                "g-1",
                "room",
                "prefers quiet rooms",
                "r1",
                "r1:2",
            )
            await store.transact(
                memory_facts.upsert_fact, "default", "g-1", "diet", "vegetarian", "r1", "r1:4"
            )
            await store.transact(
                memory_facts.upsert_fact, "acme", "g-1", "room", "likes views", "r2", "r2:2"
            )
        finally:
            await store.close()

    asyncio.run(seed())
    out = invoke("memory", "list", "--user", "g-1", "--db", store_url)
    assert "prefers quiet rooms" in out and "likes views" in out
    only = json.loads(
        invoke("memory", "list", "--user", "g-1", "--tenant", "acme", "--json", "--db", store_url)
    )
    assert [f["fact"] for f in only] == ["likes views"]
    out = invoke("memory", "forget", "--user", "g-1", "--key", "room", "--db", store_url)
    assert "1 deleted" in out
    sql = "SELECT COUNT(*) FROM memory_facts WHERE tenant_id = ? AND user_id = ?"
    assert count(store_url, sql, ("default", "g-1")) == 1
    assert "1 deleted" in invoke("memory", "forget", "--user", "g-1", "--db", store_url)
    assert count(store_url, sql, ("default", "g-1")) == 0
    assert count(store_url, sql, ("acme", "g-1")) == 1
    audited = "SELECT COUNT(*) FROM events WHERE type = 'memory.forgotten' AND run_id = ?"
    assert count(store_url, audited, ("memory/default/g-1",)) == 2
    assert "nothing is remembered" in invoke(
        "memory", "list", "--user", "g-1", "--tenant", "default", "--db", store_url
    )
