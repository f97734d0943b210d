"""Owner ids built to confuse the reaper: colons in the hostname, non-ASCII digits, a pid
no kernel has, our own pid reused, a process whose /proc entry cannot be read. A live
process is never reaped, and a dead one on a host whose name holds a colon still is."""

from __future__ import annotations

import os

from agentledger.worker import _liveness as liveness
from agentledger.worker._liveness import ProcessId, is_dead_local_owner, owner_is_dead, parse_owner

BOOT = "928f2d2d7e9b481d9a74e8c659da6190"
NS = "4026531836"
MINE = ProcessId("node1", 100, "5000", "aaaaaa", BOOT, NS)


def test_a_hostname_with_colons_still_parses() -> None:
    owner = ProcessId("fe80::1%eth0", 200, "6000", "bbbbbb", BOOT, NS)
    parsed = parse_owner(str(owner))
    assert parsed == owner
    assert owner_is_dead(owner, MINE, lambda pid: None)


def test_non_ascii_digits_are_not_a_pid() -> None:
    # int("٣") == 3: read as pid 3 with a start that never matches, it was "reused": dead.
    for owner in (
        f"h:\u0663:6000:bbbbbb.{BOOT}.{NS}",
        f"h:200:\u0666\u0660\u0660\u0660:bbbbbb.{BOOT}.{NS}",
        f"h:200:6000:bbbbbb.{BOOT}.\u0664",
    ):
        assert parse_owner(owner) is None, owner
        assert not is_dead_local_owner(owner, MINE)


def test_a_pid_no_kernel_has_is_left_to_expiry_not_a_crash() -> None:
    mine = liveness.me()
    huge = f"h:{2**70}:6000:bbbbbb.{mine.boot_id}.{mine.pid_ns}"
    assert not is_dead_local_owner(huge, mine)  # os.kill raised OverflowError here


def test_our_own_pid_with_another_start_is_a_dead_predecessor() -> None:
    mine = liveness.me()
    if not (mine.boot_id and mine.pid_ns and mine.start not in ("", "0")):
        return  # nothing can be proven on this machine
    earlier = ProcessId(
        "h", os.getpid(), str(int(mine.start) - 1), "cccccc", mine.boot_id, mine.pid_ns
    )
    assert is_dead_local_owner(str(earlier), mine)
    assert not is_dead_local_owner(str(mine), mine)


def test_an_unreadable_proc_entry_is_alive(monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    mine = liveness.me()
    monkeypatch.setattr(liveness, "process_start", lambda pid: "")
    owner = ProcessId("h", 1, "6000", "bbbbbb", mine.boot_id, mine.pid_ns)  # pid 1 exists
    assert not is_dead_local_owner(str(owner), mine)
