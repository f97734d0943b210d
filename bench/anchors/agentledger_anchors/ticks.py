"""The step every system runs for kill -> resume: it leaves a trace in a side file.

Each step appends ``start <pid> <i> <time>`` before its work (5 ms of sleep) and
``done <pid> <i> <time>`` after it, to a plain file outside the system's database.
From that file: the first step a new process started after the kill, and the steps
whose work had finished before the kill and ran again after it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

WORK_SECONDS = 0.005
TICKS = 100_000


def _append(path: str, what: str, i: int) -> None:
    with open(path, "a") as handle:
        handle.write(f"{what} {os.getpid()} {i} {time.time():.6f}\n")


def tick(path: str, i: int) -> int:
    """One step of the long run: trace, work, trace."""
    _append(path, "start", i)
    time.sleep(WORK_SECONDS)
    _append(path, "done", i)
    return i


def read_trace(path: str | Path) -> list[tuple[str, int, int, float]]:
    rows = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4:
            rows.append((parts[0], int(parts[1]), int(parts[2]), float(parts[3])))
    return rows


def done_by(path: str | Path, pid: int) -> int:
    return sum(1 for what, p, _i, _t in read_trace(path) if what == "done" and p == pid)


def outcome(path: str | Path, old_pid: int, killed_at: float) -> dict[str, Any] | None:
    """Seconds from the kill to the first step started by another process, and the
    steps finished by the killed process that ran again; None until one resumed."""
    rows = read_trace(path)
    resumed = [t for what, p, _i, t in rows if what == "start" and p != old_pid]
    if not resumed:
        return None
    finished = {i for what, p, i, _t in rows if what == "done" and p == old_pid}
    again = {i for what, p, i, _t in rows if what == "start" and p != old_pid}
    return {"seconds": min(resumed) - killed_at, "reexecuted": len(finished & again)}
