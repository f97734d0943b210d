"""SIGTERM/SIGINT while a worker starts: exit 0 with a log line, never die by the signal.

A worker's own handlers (:meth:`agentledger.worker.Worker.run`) exist only once its event
loop runs, after the app is imported and the store opened -- which can take long (a slow
app import, a schema migration waiting out another process's lock). A process manager
that stops the worker in that window must still see a clean exit, so the worker command
calls :func:`install` first thing.

Until the worker's loop handlers replace them, the handlers installed here end the
process at once with exit code 0: nothing is claimed, registered or written yet (a
migration is one transaction the database rolls back), so there is nothing to release.
They end it with :func:`os._exit` because the interrupted code may be waiting in another
thread (opening the store runs the migration there) that an orderly exit would join.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType

log = logging.getLogger("agentledger.worker")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install() -> None:
    """Make SIGTERM/SIGINT end the starting process cleanly (exit 0, one log line)."""
    for sig in SIGNALS:
        signal.signal(sig, _exit_during_startup)


def _exit_during_startup(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    line = f"worker: {name} while starting (nothing claimed yet); exiting"
    if log.isEnabledFor(logging.INFO) and log.hasHandlers():
        log.info(line)
    else:  # logging is not configured yet
        print(line, file=sys.stderr)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
