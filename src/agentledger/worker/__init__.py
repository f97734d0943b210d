"""Workers: claim runs under a lease, execute them, heartbeat, resume the dead's.

The names below load their modules when first used, so a process that needs one of the
package's small parts (liveness, companions, its logging) -- a command that lists or
decides, the stuck-run detector -- does not import the worker and the engine with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentledger import _lazy

if TYPE_CHECKING:
    from agentledger.worker._companions import Companion
    from agentledger.worker._config import WorkerConfig
    from agentledger.worker._worker import Worker, WorkerFailed

__all__ = ["Companion", "Worker", "WorkerConfig", "WorkerFailed"]

_SOURCES: dict[str, str] = {
    "Companion": "agentledger.worker._companions",
    "WorkerConfig": "agentledger.worker._config",
    "Worker": "agentledger.worker._worker",
    "WorkerFailed": "agentledger.worker._worker",
}


__getattr__, __dir__ = _lazy.lazy_names(__name__, _SOURCES, __all__)
