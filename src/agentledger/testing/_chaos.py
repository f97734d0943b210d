"""The hook a tool calls so that ``agentledger chaos`` counts its side effects.

A provider behind ``--proxy`` is counted at the proxy. One the command cannot stand in
front of (a provider without HTTP, or without idempotency keys) is counted by its tool:
right after the provider applied the effect, the tool calls ``chaos_effect(key)`` with the
key that names that one effect (the step's ``ctx.idempotency_key``, or the tool's effect
key). Outside ``agentledger chaos`` it does nothing.
"""

from __future__ import annotations

import json
import os
import time

from agentledger import _envsettings as envsettings
from agentledger._envsettings import env_name

EFFECTS_ENV = env_name("chaos_effects")
"""The file ``agentledger chaos`` reads the hook's records from (set in its workers)."""


def chaos_effect(key: str, provider: str = "tool") -> None:
    """Record that one side effect named ``key`` took place at ``provider``.

    Call it after the provider applied the effect. A no-op unless the process runs under
    ``agentledger chaos``, which then reports any key with more than one effect.
    """
    path = envsettings.current().chaos_effects
    if not path:
        return
    line = json.dumps({"key": str(key), "provider": str(provider), "at": time.time()}) + "\n"
    # One O_APPEND write per record: concurrent workers' lines never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
