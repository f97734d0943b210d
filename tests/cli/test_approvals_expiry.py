"""`agentledger approvals approve|reject` after expiry: one line on stderr, a non-zero
exit, and nothing recorded (judged on the CLI's clock in the store's UPDATE)."""

from __future__ import annotations

import time
from pathlib import Path

from agentledger.store import open_store
from tests.cli.helpers import cli_here
from tests.store.test_approval_expiry import parked


async def test_a_decision_after_expiry_fails_in_one_line_and_records_nothing(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = open_store(url)
    await store.open()
    try:
        await parked(store, "a-late", expires=time.time() - 1)
        await parked(store, "a-open", expires=time.time() + 3600)
    finally:
        await store.close()

    for verb in ("approve", "reject"):
        late = cli_here("approvals", verb, "a-late", "--by", "mona", "--db", url)
        assert late.returncode != 0, late
        lines = [line for line in late.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: approval a-late expired"), lines
        assert "not recorded" in lines[0] and "Traceback" not in late.stderr
    ok = cli_here("approvals", "approve", "a-open", "--by", "mona", "--db", url)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("a-open approve by mona")

    store = open_store(url)
    await store.open()
    try:
        decided = {a.id: (a.decision, a.decided_by) for a in await store.get_approvals()}
    finally:
        await store.close()
    assert decided == {"a-late": (None, None), "a-open": ("approve", "mona")}
