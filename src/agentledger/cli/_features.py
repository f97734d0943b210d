"""The features a worker process needs beside the kernel, registered by importing them
(``engine/_hooks.py``, ``agentledger/_auditchain.py``): the gateway checks priced model
calls against tenant budgets, the service seals the audit chain and prunes it.

Imported where a command runs steps or prunes (``worker``, ``serve``'s inline workers,
``prune``, the ``example`` and benchmark workers through
:func:`agentledger.cli._ops.worker_companions`), not with the ``agentledger`` command:
the commands that list, submit or decide, and every ``--help``, run without them and
start without importing them.
"""

import agentledger.gateway as _gateway  # noqa: F401
import agentledger.service as _service  # noqa: F401
