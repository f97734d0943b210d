"""Per-user memory: facts that outlive a run, scoped by tenant and user.

Agents remember and recall through tools (:func:`memory_tools`): ``remember`` is a write
tool keyed by its step's idempotency key, so a retried step stores its fact once;
``recall`` is a read tool. Both act for the run's tenant and user only. An agent built
with ``Agent(memory=True)`` also gets the user's facts as a system message
(:func:`memory_note`). Operators list and forget facts with ``agentledger memory``;
forgetting deletes the rows and records a ``memory.forgotten`` audit event.
"""

from agentledger.engine import _hooks as _hooks
from agentledger.memory._context import memory_note
from agentledger.memory._facts import fact_key_of, rank_facts
from agentledger.memory._tools import memory_tools, recall, remember

# The agent loop reads the user's facts through the engine's hook (engine/_hooks.py).
_hooks.install(memory_note=memory_note)

__all__ = ["fact_key_of", "memory_note", "memory_tools", "rank_facts", "recall", "remember"]
