"""The audit chain seam: what the kernel asks of the feature that owns the chain.

The kernel writes events; ``agentledger.service`` chains them into each tenant's audit
chain (``service/_queries/audit.py``: the hashes, the signatures, the webhooks a sealed
event enqueues) and registers that work here when it is imported. The kernel drives it:
every worker seals what it wrote (``agentledger/_sealer.py``) and retention replaces
the front of a chain by a signed summary (``store/_queries/retention.py``).

There is no silent default. A seal or a prune in a process that never imported
``agentledger.service`` raises :class:`~agentledger._extras.MissingFeature` before it
reads or removes anything, and a worker refuses to start: a worker whose records nobody
seals, or a prune that cannot check and summarize the records it removes, would leave
a chain that no longer verifies. The ``agentledger`` commands, the service and the test
harness import it; a program embedding the worker imports ``agentledger.service`` too
(the core install has it; it loads no web framework).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentledger._extras import MissingFeature

if TYPE_CHECKING:
    from agentledger._auditkey import AuditKey
    from agentledger.store._tx import Tx


@dataclass(frozen=True)
class AuditChain:
    """The chain's operations the kernel calls (each a store operation ``f(tx, ...)``
    but :attr:`check_record`)."""

    #: Whether any committed event waits to be sealed.
    has_unsealed: Callable[[Tx], bool]
    #: Seal up to ``limit`` committed events into their tenants' chains; how many.
    seal: Callable[[Tx, int], int]
    #: The hash a chain starts from.
    genesis: str
    #: The tenant's pruned-span summary, or None when nothing of its chain was pruned.
    pruned_summary: Callable[[Tx, str], dict[str, Any] | None]
    #: ``(key, tenant, summary)``: why the summary cannot stand for the records it
    #: replaced, or None.
    summary_problem: Callable[[AuditKey | None, str, dict[str, Any]], str | None]
    #: ``(tenant, head, key)``: whether records may be added to (or summarized from)
    #: the chain whose head is ``head`` under ``key``.
    may_extend: Callable[[str, dict[str, Any], AuditKey | None], bool]
    #: ``(key, tenant, row, prev_hash, expected_no, signed_at)``: why the record breaks
    #: the chain, as ``(chain_no, reason)``, or None when it verifies.
    check_record: Callable[
        [AuditKey | None, str, dict[str, Any], str, int, int | None], tuple[int, str] | None
    ]
    #: ``(tx, tenant, summary, removed_records, removed_runs, key)``: extend the pruned
    #: span's signed summary over records about to be removed.
    extend_pruned: Callable[
        [Tx, str, dict[str, Any] | None, list[dict[str, Any]], int, AuditKey | None], None
    ]


_registered: AuditChain | None = None

_MISSING = (
    "{what} needs the audit chain of agentledger.service, which this process never "
    "imported: import agentledger.service where the worker starts (the agentledger "
    "commands do); nothing was {done}"
)


def register(chain: AuditChain) -> None:
    """Make ``chain`` the process's audit chain (``agentledger.service`` does, imported)."""
    global _registered
    _registered = chain


def registered() -> bool:
    """Whether a chain is registered in this process."""
    return _registered is not None


def required(what: str, done: str = "changed") -> AuditChain:
    """The registered chain; :class:`MissingFeature` saying ``what`` needed it when none
    is, and that nothing was ``done``."""
    if _registered is None:
        raise MissingFeature(_MISSING.format(what=what, done=done))
    return _registered
