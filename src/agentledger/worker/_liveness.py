"""Who holds a lease, and whether that process is still alive.

A lease owner id names a process by what a PID namespace cannot fake::

    host:pid:start:nonce.boot_id.pidns

``boot_id`` is the kernel's boot id (/proc/sys/kernel/random/boot_id; the same
inside every container of one boot of one machine), ``pidns`` the inode of the
process's PID namespace (readlink /proc/self/ns/pid), ``pid`` its pid in that
namespace and ``start`` its start time in clock ticks since boot (guards a reused
pid). The hostname is informative only: containers on host networking share it.
The id keeps the older ``host:pid:start:nonce`` shape (the pid is the second field);
an id of that older form is never reaped.

A worker expires at once the leases of an owner that is provably dead: same boot,
same PID namespace as the reaper, and its pid is gone or belongs to a process with
another start time. Anything else (another machine, another namespace, an old-format
id, an identity that could not be read) is left to lease expiry, so a SIGKILLed
worker's runs resume within about a second on its own host and never earlier than
the lease anywhere else.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# A worker is live if it heartbeat within this many seconds (cli/_routing.py's too).
LIVE_WITHIN = 60.0


def process_start(pid: int) -> str:
    """The start time of a process in clock ticks since boot ('' if unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    # Field 22; the command name (field 2) may contain spaces, so split after ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """This boot of this machine, as 32 hex digits ('' if unknown)."""
    try:
        with open(path) as f:
            text = f.read().strip().replace("-", "").lower()
    except OSError:
        return ""
    return text if text and all(c in "0123456789abcdef" for c in text) else ""


def read_pid_namespace(path: str = "/proc/self/ns/pid") -> str:
    """The inode of our PID namespace, from ``pid:[4026531836]`` ('' if unknown)."""
    try:
        link = os.readlink(path)
    except OSError:
        return ""
    inner = link.removeprefix("pid:[").removesuffix("]")
    return inner if inner.isdigit() else ""


@dataclass(frozen=True)
class ProcessId:
    """A process as a lease owner: enough to tell, on the same boot and PID namespace,
    whether it still exists."""

    host: str
    pid: int
    start: str  # clock ticks since boot; '' or '0' when unknown
    nonce: str
    boot_id: str  # '' when unknown
    pid_ns: str  # '' when unknown

    def __str__(self) -> str:
        tail = ".".join((self.nonce, self.boot_id, self.pid_ns))
        return ":".join((self.host, str(self.pid), self.start or "0", tail))


@lru_cache(maxsize=1)
def _machine_identity() -> tuple[str, str]:
    # Read once per process: neither changes while a process lives (a process cannot
    # leave its PID namespace; only its children can be in another one).
    return read_boot_id(), read_pid_namespace()


def me() -> ProcessId:
    """This process's identity."""
    pid = os.getpid()
    boot_id, pid_ns = _machine_identity()
    return ProcessId(
        host=socket.gethostname(),
        pid=pid,
        start=process_start(pid) or "0",
        nonce=secrets.token_hex(3),
        boot_id=boot_id,
        pid_ns=pid_ns,
    )


def make_owner_id() -> str:
    """A fresh lease owner id for this process (see the module docstring)."""
    return str(me())


def _ascii_digits(text: str) -> bool:
    # str.isdigit() accepts other scripts' digits, and int() reads them: "\u0663" is 3.
    return text.isascii() and text.isdigit()


def parse_owner(owner: str) -> ProcessId | None:
    """The identity in an owner id; None for an old-format or malformed id (never reaped).

    Parsed from the right: a hostname may hold colons (an IPv6 literal)."""
    parts = owner.rsplit(":", 3)
    if len(parts) != 4 or parts[3].count(".") != 2:
        return None
    host, pid_text, start, tail = parts
    nonce, boot_id, pid_ns = tail.split(".")
    if not (_ascii_digits(pid_text) and _ascii_digits(start) and _ascii_digits(pid_ns)):
        return None
    if not boot_id or not all(c in "0123456789abcdef" for c in boot_id):
        return None
    return ProcessId(host, int(pid_text), start, nonce, boot_id, pid_ns)


def owner_is_dead(
    owner: ProcessId,
    mine: ProcessId,
    start_of: Callable[[int], str | None],
) -> bool:
    """True only when ``owner`` is provably gone.

    ``start_of(pid)`` gives the start time of the process with that pid in our
    namespace, None if there is none, '' if it exists but cannot be read.
    """
    if not mine.boot_id or not mine.pid_ns or owner.start in ("", "0"):
        return False  # we cannot prove anything
    if owner.boot_id != mine.boot_id or owner.pid_ns != mine.pid_ns:
        return False  # another machine, boot or PID namespace: the pid means nothing here
    if owner.pid == mine.pid and owner.start == mine.start:
        return False  # ourselves
    current = start_of(owner.pid)
    if current is None:
        return True  # no such process
    return bool(current) and current != owner.start  # the pid was reused


def _start_in_our_namespace(pid: int) -> str | None:
    if pid <= 0:
        return ""  # 0 and below name process groups, not a process: prove nothing
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists, owned by someone else
    except (OverflowError, ValueError):
        return ""  # a pid no kernel has: an id we did not write, prove nothing
    return process_start(pid)


def is_dead_local_owner(owner: str, mine: ProcessId | None = None) -> bool:
    """True only when ``owner`` is a process of our boot and PID namespace that is gone."""
    parsed = parse_owner(owner)
    if parsed is None:
        return False
    return owner_is_dead(parsed, mine or me(), _start_in_our_namespace)
