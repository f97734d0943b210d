"""`agentledger approvals approve|reject`: who may decide, and what a vote prints.

``--by`` names a person: the ``system:`` namespace (the expiry default's and cancel's)
is exempt from the expiry rule and the policy's conditions, so the command refuses it
and records nothing. A vote on an approval needing several approvers says it was
recorded and how many are still needed, not that a decision re-queued the run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentledger.store import open_store
from tests.cli.helpers import cli_here
from tests.store.test_approval_expiry import parked


async def test_a_system_decider_is_refused_and_a_vote_says_what_is_still_needed(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = open_store(url)
    await store.open()
    try:
        await parked(store, "a-late", expires=time.time() - 1)
        await parked(store, "a-two", needed=2, expires=time.time() + 3600)
    finally:
        await store.close()

    for by in ("system:expired", "system:ops"):
        for approval in ("a-late", "a-two"):
            refused = cli_here("approvals", "approve", approval, "--by", by, "--db", url)
            assert refused.returncode != 0, refused
            lines = [line for line in refused.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and "system:" in lines[0], lines
            assert "Traceback" not in refused.stderr

    vote = cli_here("approvals", "approve", "a-two", "--by", "mona", "--db", url)
    assert vote.returncode == 0, vote.stderr
    assert vote.stdout.strip() == "a-two approve by mona recorded; 1 more approver needed", (
        vote.stdout
    )
    last = cli_here("approvals", "approve", "a-two", "--by", "max", "--db", url)
    assert last.returncode == 0, last.stderr
    assert last.stdout.startswith("a-two approve by max; run "), last.stdout

    store = open_store(url)
    await store.open()
    try:
        decided = {a.id: (a.decision, a.decided_by) for a in await store.get_approvals()}
    finally:
        await store.close()
    assert decided == {"a-late": (None, None), "a-two": ("approve", "max")}


def test_no_key_is_minted_for_a_system_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`keys create --user system:…` is refused in one line, and no key is stored."""
    monkeypatch.setenv("AGENTLEDGER_KEY_PEPPER", "p" * 32)
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    env_ok = cli_here("keys", "create", "--tenant", "t1", "--user", "mona", "--roles",
                     "approver", "--db", url)  # fmt: skip
    assert env_ok.returncode == 0, env_ok.stderr
    refused = cli_here("keys", "create", "--tenant", "t1", "--user", "system:expired",
                      "--roles", "approver", "--db", url)  # fmt: skip
    assert refused.returncode != 0 and refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1 and "reserved" in refused.stderr
    listed = cli_here("keys", "list", "--tenant", "t1", "--db", url)
    assert listed.returncode == 0 and "system:" not in listed.stdout and "mona" in listed.stdout
