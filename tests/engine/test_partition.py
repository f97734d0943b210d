"""A network partition between one worker "host" and PostgreSQL.

Worker A runs in a Linux network namespace made by this test and reaches the
database through a veth pair and a TCP relay on the test's own addresses. The
test cuts the link while A is inside a write: worker B takes the run over when
A's lease expires and is held inside a later step; when the link comes back A's
late journal write arrives while the run is ``running`` under B's lease, so only
the fence's epoch/owner comparison can turn it away. Every effect happens once.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agentledger.records import RunStatus
from tests.engine.helpers import Env, tool_steps, wait_for
from tests.pgrelay import Relay, via

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespace() -> Iterator[tuple[str, str, str]]:
    """(namespace, host-side veth, host-side address) of a fresh network namespace."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        reason = "network namespaces need root and iproute2"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    tag = secrets.token_hex(3)
    name, host_if, ns_if = f"al_{tag}", f"alh{tag}", f"aln{tag}"
    octet = int(tag[:2], 16) % 250 + 1
    host_ip, ns_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"
    try:
        _ip("netns", "add", name)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", name)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _ip("netns", "exec", name, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        reason = f"cannot make a network namespace here: {exc.stderr.decode().strip()}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield name, host_if, host_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def test_partitioned_worker_late_write_is_fenced_while_the_new_owner_is_mid_run(
    pg_url: str, tmp_path: Path, namespace: tuple[str, str, str]
) -> None:
    ns, host_if, host_ip = namespace
    pg = urlsplit(pg_url)
    relay = Relay((host_ip, 0), (pg.hostname or "127.0.0.1", pg.port or 5432))
    env = Env(tmp_path, pg_url)
    env.on_close(relay.close)
    try:
        flag_a, flag_b = env.hold_flag("partitioned"), env.hold_flag("successor")
        run_id = env.submit(
            "five_writes",
            {
                "hold": [
                    {"item": "i1", "phase": "after_effect", "flag": str(flag_a)},
                    {"item": "i2", "phase": "before_started", "flag": str(flag_b)},
                ]
            },
        )
        worker_a = env.start_worker(
            lease=2.0,
            db=via(pg_url, host_ip, relay.port),
            prefix=("ip", "netns", "exec", ns),
            extra=("-v",),
        )
        env.wait_marker(flag_a)  # A (in the namespace) is inside its first write
        owner_a = env.run(run_id).lease_owner
        _ip("link", "set", host_if, "down")  # the partition
        # Worker B, on the database's side of the cut; its lease is the long default, so
        # a stall of the loaded machine does not hand the run to a third epoch.
        env.start_worker()
        env.wait_marker(flag_b)  # B took the run over and is held inside step 4
        taken = env.run(run_id)
        assert taken.status == RunStatus.RUNNING and taken.lease_epoch == 2
        assert taken.lease_owner not in (None, owner_a)
        journal_b = env.journal(run_id)
        by_a_before = [e.id for e in env.events(run_id) if e.actor == owner_a]
        # A's write goes out on its journal connection; its heartbeat (another
        # connection) is held at the relay, so the write reaches the fence first.
        relay.hold(lambda name: not name.endswith(":journal"))
        flag_a.unlink()
        _ip("link", "set", host_if, "up")  # A comes back with its late write
        # B is held and writes nothing: a changed journal can only be A's.
        wait_for(
            lambda: env.lease_lost_by_fence(1) or env.journal(run_id) != journal_b,
            timeout=60,
            what="worker A to try its late write",
        )
        relay.release()
        assert env.journal(run_id) == journal_b, "the partitioned worker's write was accepted"
        assert env.lease_lost_by_fence(1), env.worker_log(1)
        assert worker_a.poll() is None, env.worker_log(1)  # A lives on; it dropped the run
        assert [e.id for e in env.events(run_id) if e.actor == owner_a] == by_a_before
        flag_b.unlink()
        run = env.wait_status(run_id, RunStatus.COMPLETED)
    finally:
        env.close()

    assert run.lease_epoch == 2, run
    journal = env.journal(run_id)
    assert journal[0].lease_epoch == 1
    assert all(s.lease_epoch == 2 for s in journal[1:]), [
        (s.step_no, s.lease_epoch) for s in journal
    ]
    writes = tool_steps(journal, "keyed_write")
    assert env.effects("keyed") == {s.idempotency_key: 1 for s in writes}
    assert env.calls("keyed") == {s.idempotency_key: 1 for s in writes}
