"""The ``agentledger`` command.

Its workers run the kernel with the features a production worker needs, registered by
importing them (``engine/_hooks.py``, ``agentledger/_auditchain.py``): the gateway
checks priced model calls against tenant budgets, the service seals the audit chain.
"""

import agentledger.gateway as _gateway  # noqa: F401
import agentledger.service as _service  # noqa: F401
