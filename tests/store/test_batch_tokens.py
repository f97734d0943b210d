"""Batch tokens (read back after a lost COMMIT reply) are unique per batch: within a
process, across processes, and in a forked child, which must not repeat its parent's."""

from __future__ import annotations

import os
import subprocess
import sys

from agentledger.store._base import Batch, batch_token


def test_every_batch_gets_its_own_token() -> None:
    tokens = {Batch("r", 1, "o").token for _ in range(10_000)}
    assert len(tokens) == 10_000


def test_two_processes_never_share_a_token() -> None:
    code = "from agentledger.store._base import batch_token; print(batch_token())"

    def first_token() -> str:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    # Both processes hand out their first token: only the prefix can tell them apart.
    one, two = first_token(), first_token()
    assert one and two and one != two


def test_a_forked_child_does_not_repeat_its_parents_tokens() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next tokens, then exit at once
        os.close(read)
        os.write(write, " ".join(batch_token() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [batch_token() for _ in range(3)]
    assert len(child) == 3
    assert not set(child) & set(parent)
