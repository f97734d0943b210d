"""What a worker says about the runs it executes: one log line per change of state.

Lines go to the ``agentledger.worker`` logger (standard :mod:`logging`). A failed run's
line carries its error and traceback, which the engine also keeps in the run's error;
at DEBUG level every step the execution journaled gets a line too.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from agentledger.engine._runner import Stopped
from agentledger.records import Run, RunStatus
from agentledger.store._sqlstore import Store

log = logging.getLogger("agentledger.worker")


async def waiting_for(store: Store, run: Run) -> str:
    """Why a ``waiting`` run waits: the approval it needs, or until when (or that a
    cancel requested as it parked made it due now)."""
    if run.status == RunStatus.QUEUED and run.cancel_requested is not None:
        return f"parked, then due now to honour its cancel ({run.cancel_requested})"
    approvals = [a for a in await store.get_approvals(run_id=run.id, pending=True)]
    if approvals:
        a = approvals[-1]
        return f"waiting for approval {a.id} (role {a.required_role}) on {a.tool}"
    if run.available_at:
        when = time.strftime("%H:%M:%S", time.localtime(run.available_at))
        why = ""
        for event in reversed(await store.list_events(run.id)):
            if event.type == "run.parked" and isinstance(event.data, dict):
                why = f" ({event.data.get('why')})"
                break
        return f"waiting until {when}{why}"
    return "waiting"


async def log_outcome(store: Store, run: Run, outcome: str) -> None:
    """Log where an execution of ``run`` left it: ``run`` as the execution's last write
    left it (:func:`~agentledger.engine._runner.execute_run` keeps it so), not read back."""
    if outcome not in RunStatus.ALL and outcome != Stopped.RELEASED:
        log.info("run %s %s", run.id, outcome)
        return
    if outcome == Stopped.RELEASED:
        log.info("run %s released", run.id)
        return
    try:
        if outcome == RunStatus.COMPLETED:
            log.info("run %s completed in %d steps", run.id, run.step_count)
        elif outcome == RunStatus.FAILED:
            log.error("run %s failed: %s", run.id, run.error or "?")
        elif outcome == RunStatus.NEEDS_HUMAN:
            log.warning("run %s needs a human: %s", run.id, run.handover_reason or run.error or "?")
        elif outcome == RunStatus.WAITING:
            log.info("run %s %s", run.id, await waiting_for(store, run))
        else:
            log.info("run %s %s", run.id, outcome)
        if log.isEnabledFor(logging.DEBUG):
            for step in await store.load_journal(run.id):
                if step.lease_epoch != run.lease_epoch:
                    continue  # written by an earlier execution
                log.debug(
                    "run %s step %d %s %s: %s, attempts %d, %s ms",
                    run.id,
                    step.step_no,
                    step.kind,
                    step.name,
                    step.status,
                    step.attempts,
                    "?" if step.duration_ms is None else f"{step.duration_ms:.0f}",
                )
    except Exception as exc:  # a log line never fails a run
        log.info("run %s %s (details unavailable: %s)", run.id, outcome, exc)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["traceback"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


def configure_logging(verbose: int = 0, fmt: str = "text") -> None:
    """Worker-process logging: INFO (state changes) by default, DEBUG (steps) with -v."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("agentledger").setLevel(logging.DEBUG if verbose else logging.INFO)
