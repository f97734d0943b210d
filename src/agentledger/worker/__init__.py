"""Workers: claim runs under a lease, execute them, heartbeat, resume the dead's."""

from agentledger.worker.worker import Worker, WorkerConfig

__all__ = ["Worker", "WorkerConfig"]
