"""A database locked past its busy timeout answers 503 + Retry-After (problem+json), not
500; nothing was committed, and the same request sent again is accepted once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.service.conftest import in_process, settings_for


async def test_a_locked_database_is_503_with_retry_after_and_the_retry_is_accepted_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "busy.db"
    url = f"sqlite:///{path}?busy_timeout_ms=100"
    async with in_process(settings_for(url)) as api:
        key = await api.key("t1", "ann", ("operator",))
        headers = {**key, "Idempotency-Key": "order-7"}
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        try:
            busy = await api.client.post("/v1/runs", json={"agent": "free"}, headers=headers)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert busy.status_code == 503, busy.text
        assert busy.headers["content-type"].startswith("application/problem+json")
        assert busy.headers["Retry-After"] == "1"
        assert "retry" in busy.json()["detail"]
        again = await api.client.post("/v1/runs", json={"agent": "free"}, headers=headers)
        assert again.status_code == 202, again.text
        assert "Idempotent-Replayed" not in again.headers  # the first one never committed
        listed = await api.client.get("/v1/runs", headers=key)
        assert [r["id"] for r in listed.json()["runs"]] == [again.json()["id"]]
