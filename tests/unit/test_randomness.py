"""Random hex for ids (agentledger/_randomness.py): buffered from the OS, never shared
with a forked child."""

from __future__ import annotations

import os

from agentledger._randomness import random_hex


def test_random_hex_has_the_asked_length_and_does_not_repeat() -> None:
    drawn = [random_hex(5) for _ in range(5000)]  # several 4 KiB pages
    assert all(len(h) == 10 and int(h, 16) >= 0 for h in drawn)
    assert len(set(drawn)) == len(drawn)
    assert len(random_hex(8)) == 16 and len(random_hex(4000)) == 8000


def test_a_forked_child_never_hands_out_the_parents_bytes() -> None:
    random_hex(1)  # the parent's buffer holds unread bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what it would hand out next
        os.write(write, random_hex(16).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 32
    assert child != random_hex(16)  # the parent's next bytes
