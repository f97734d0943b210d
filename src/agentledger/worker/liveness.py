"""Who holds a lease, and whether that process is still alive.

A lease owner id is ``host:pid:start:nonce``. The start time of the process
(from /proc) guards against a reused pid. A worker that sees a lease held by a
process of its own host that no longer exists expires that lease at once, so a
SIGKILLed worker's runs resume within about a second instead of waiting out the
lease; owners on other hosts are left to lease expiry.
"""

from __future__ import annotations

import os
import secrets
import socket


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


def make_owner_id() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{process_start(pid) or '0'}:{secrets.token_hex(3)}"


def is_dead_local_owner(owner: str, host: str | None = None) -> bool:
    """True only when ``owner`` is a process of this host that is gone."""
    parts = owner.split(":")
    if len(parts) != 4:
        return False
    owner_host, pid_text, start, _ = parts
    if owner_host != (host or socket.gethostname()) or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    current = process_start(pid)
    return bool(current) and start != "0" and current != start
