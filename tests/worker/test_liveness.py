"""Owner ids and the dead-worker decision: only a provably dead local process is reaped."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentledger.worker._liveness import (
    ProcessId,
    is_dead_local_owner,
    make_owner_id,
    me,
    owner_is_dead,
    parse_owner,
    read_boot_id,
    read_pid_namespace,
)

BOOT = "928f2d2d7e9b481d9a74e8c659da6190"
MINE = ProcessId("node1", 100, "5000", "aaaaaa", BOOT, "4026531836")


def other(**changes: object) -> ProcessId:
    fields = {
        "host": "node1",
        "pid": 200,
        "start": "6000",
        "nonce": "bbbbbb",
        "boot_id": BOOT,
        "pid_ns": "4026531836",
        **changes,
    }
    return ProcessId(**fields)  # type: ignore[arg-type]


def gone(pid: int) -> str | None:
    return None


def alive_with(start: str) -> object:
    return lambda pid: start


def test_owner_id_round_trips() -> None:
    owner = make_owner_id()
    parsed = parse_owner(owner)
    assert parsed is not None
    assert str(parsed) == owner
    assert parsed.pid == os.getpid()
    assert parsed.boot_id == read_boot_id() != ""
    assert parsed.pid_ns == read_pid_namespace() != ""
    assert owner.count(":") == 3 and int(owner.split(":")[1]) == os.getpid()


def test_old_and_malformed_owner_ids_are_never_reaped() -> None:
    for owner in (
        "node1:200:6000:abcdef",  # the old host:pid:start:nonce format
        "dead-worker",
        f"node1:x:6000:abcdef.{BOOT}.4026531836",
        "node1:200:6000:abcdef.not-hex.4026531836",
        f"node1:200:6000:abcdef.{BOOT}.pid:[4026531836]",
        f"node1:200:6000:abcdef.{BOOT}",
        f"node1:200:6000:abcdef.{BOOT}.4026531836.x",
        "",
    ):
        assert parse_owner(owner) is None, owner
        assert not is_dead_local_owner(owner), owner


def test_the_old_format_of_a_gone_pid_on_this_host_is_left_to_expiry() -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone_pid = int(proc.stdout)
    import socket

    assert not is_dead_local_owner(f"{socket.gethostname()}:{gone_pid}:123:abcdef")


def test_gone_pid_of_same_boot_and_namespace_is_dead() -> None:
    assert owner_is_dead(other(), MINE, gone)


def test_reused_pid_is_dead() -> None:
    assert owner_is_dead(other(), MINE, alive_with("7777"))  # type: ignore[arg-type]


def test_live_process_is_alive() -> None:
    assert not owner_is_dead(other(), MINE, alive_with("6000"))  # type: ignore[arg-type]
    # It exists but its start time cannot be read: not provably dead.
    assert not owner_is_dead(other(), MINE, alive_with(""))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {"pid_ns": "4026532178"},  # another PID namespace: same hostname, pid means nothing
        {"boot_id": "0" * 32},  # another machine or another boot
        {"host": "elsewhere", "pid_ns": "4026532178"},
        {"start": "0"},  # start unknown when it registered
    ],
)
def test_other_namespace_boot_or_unknown_start_is_never_reaped(changes: dict[str, str]) -> None:
    assert not owner_is_dead(other(**changes), MINE, gone)


def test_hostname_does_not_matter() -> None:
    # Same boot and namespace is the same kernel view, whatever the hostname says.
    assert owner_is_dead(other(host="renamed"), MINE, gone)


def test_we_cannot_judge_without_our_own_identity() -> None:
    assert not owner_is_dead(other(), ProcessId("n", 1, "1", "x", "", "4026531836"), gone)
    assert not owner_is_dead(other(), ProcessId("n", 1, "1", "x", BOOT, ""), gone)


def test_ourselves_are_alive() -> None:
    mine = me()
    assert not is_dead_local_owner(str(mine), mine)
    assert not is_dead_local_owner(make_owner_id(), mine)


def test_a_real_exited_process_is_dead_and_a_live_one_is_not() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "from agentledger.worker._liveness import make_owner_id as m;"
         "print(m(), flush=True); import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None and child.stdin is not None
    owner = child.stdout.readline().strip()
    assert not is_dead_local_owner(owner)
    child.stdin.close()
    child.wait(timeout=30)
    child.stdout.close()
    assert is_dead_local_owner(owner)
