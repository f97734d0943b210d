"""The SQL of agentledger, written once for every dialect.

Each function runs on one open connection inside a transaction the caller
manages (see :mod:`agentledger.store.sqlstore`). Placeholders are ``:name``.
One module per concern; this package re-exports them all (``queries.create_run``).
"""

from agentledger.store.queries.approvals import (
    decide_approval,
    get_approvals,
    insert_approval,
)
from agentledger.store.queries.common import (
    RUN_COLUMNS,
    new_id,
    new_token,
)
from agentledger.store.queries.events import (
    has_event,
    insert_event,
    list_events,
)
from agentledger.store.queries.journal import (
    STEP_COLUMNS,
    STEP_UPSERT,
    apply_batch,
    committed,
    fence_update,
    get_effect,
    load_journal,
    step_params,
    upsert_step,
    validate_batch,
    write_effect,
)
from agentledger.store.queries.migrations import (
    is_current,
    migrate,
)
from agentledger.store.queries.outbox import (
    claim_outbox,
    claimed_outbox,
    drop_outbox,
    insert_outbox,
    list_outbox,
    settle_outbox,
)
from agentledger.store.queries.runs import (
    cancel_requests,
    cancel_run,
    claim_runs,
    claimed_with,
    count_runs,
    create_run,
    expire_leases_of,
    find_request,
    get_run,
    lease_owners,
    list_runs,
    release_run,
    renew_leases,
)
from agentledger.store.queries.workers import (
    deregister_worker,
    heartbeat_worker,
    list_workers,
    open_runs,
    register_worker,
    registrations,
    version_counts,
)

__all__ = [
    "RUN_COLUMNS",
    "STEP_COLUMNS",
    "STEP_UPSERT",
    "apply_batch",
    "cancel_requests",
    "cancel_run",
    "claim_outbox",
    "claim_runs",
    "claimed_outbox",
    "claimed_with",
    "committed",
    "count_runs",
    "create_run",
    "decide_approval",
    "deregister_worker",
    "drop_outbox",
    "expire_leases_of",
    "fence_update",
    "find_request",
    "get_approvals",
    "get_effect",
    "get_run",
    "has_event",
    "heartbeat_worker",
    "insert_approval",
    "insert_event",
    "insert_outbox",
    "is_current",
    "lease_owners",
    "list_events",
    "list_outbox",
    "list_runs",
    "list_workers",
    "load_journal",
    "migrate",
    "new_id",
    "new_token",
    "open_runs",
    "register_worker",
    "registrations",
    "release_run",
    "renew_leases",
    "settle_outbox",
    "step_params",
    "upsert_step",
    "validate_batch",
    "version_counts",
    "write_effect",
]
