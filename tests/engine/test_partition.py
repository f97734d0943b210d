"""A network partition between one worker "host" and PostgreSQL.

Worker A runs in a Linux network namespace made by this test and reaches the
database through a veth pair and a TCP relay on the test's own addresses. The
test cuts the link while A holds leases: worker B takes the runs over when A's
leases expire, and when the link comes back A's late journal writes are fenced
out. Every effect happens once.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from agentledger.records import RunStatus
from tests.engine.helpers import Env, tool_steps, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Relay:
    """A TCP relay: ``listen`` address -> ``target``, one thread pair per connection."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.sockets: list[socket.socket] = []
        self.server = socket.create_server(listen)
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()
        for s in self.sockets:
            s.close()


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


def _via(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    user = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}:{port}"))


def test_partitioned_worker_is_taken_over_and_its_late_writes_are_fenced(
    pg_url: str, tmp_path: Path, namespace: tuple[str, str, str]
) -> None:
    ns, host_if, host_ip = namespace
    pg = urlsplit(pg_url)
    relay = Relay((host_ip, 0), (pg.hostname or "127.0.0.1", pg.port or 5432))
    env = Env(tmp_path, pg_url)
    try:
        ids = [env.submit("slow_writes", {"tag": f"p{n}", "n": 5, "pause": 0.4}) for n in range(4)]
        worker_a = env.start_worker(
            lease=2.0,
            db=_via(pg_url, host_ip, relay.port),
            prefix=("ip", "netns", "exec", ns),
            extra=("-v",),
        )
        wait_for(
            lambda: all(env.run(i).step_count >= 2 and env.run(i).lease_epoch == 1 for i in ids),
            what="worker A (in the namespace) to run every run",
        )
        _ip("link", "set", host_if, "down")  # the partition
        cut_at = time.time()
        env.start_worker(lease=2.0)  # worker B, on the database's side of the cut
        for run_id in ids:
            env.wait_status(run_id, RunStatus.COMPLETED, timeout=90)
        _ip("link", "set", host_if, "up")  # A comes back with its late writes
        wait_for(
            lambda: re.search(r"lease.{0,40}lost", env.worker_log(1)),
            timeout=60,
            what="worker A to find its late writes fenced",
        )
        assert worker_a.poll() is None, env.worker_log(1)  # A lives on; it dropped the runs
    finally:
        env.close()
        relay.close()

    keys = []
    for run_id in ids:
        run = env.run(run_id)
        assert run.status == RunStatus.COMPLETED and run.lease_epoch == 2, run
        journal = env.journal(run_id)
        assert len({s.step_no for s in journal}) == len(journal) == 10
        epochs = [s.lease_epoch for s in journal]
        assert epochs == sorted(epochs) and set(epochs) == {1, 2}, epochs
        late = [s for s in journal if s.lease_epoch == 1 and (s.started_at or 0) > cut_at + 1]
        assert late == [], late
        keys += [s.idempotency_key for s in tool_steps(journal, "keyed_write")]
    assert len(keys) == 20
    assert env.effects("keyed") == dict.fromkeys(keys, 1)
