"""Workers: claim runs under a lease, execute them, heartbeat, resume the dead's."""

from agentledger.worker.companions import Companion
from agentledger.worker.config import WorkerConfig
from agentledger.worker.worker import Worker, WorkerFailed

__all__ = ["Companion", "Worker", "WorkerConfig", "WorkerFailed"]
