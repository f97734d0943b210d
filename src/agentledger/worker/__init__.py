"""Workers: claim runs under a lease, execute them, heartbeat, resume the dead's."""

from agentledger.worker._companions import Companion
from agentledger.worker._config import WorkerConfig
from agentledger.worker._worker import Worker, WorkerFailed

__all__ = ["Companion", "Worker", "WorkerConfig", "WorkerFailed"]
