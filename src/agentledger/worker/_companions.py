"""Side tasks a worker runs beside its runs, composed by whoever builds the worker.

The worker itself runs the kernel's own loops (claims, heartbeats, the outbox, sealing,
pruning); a feature that wants to run beside it -- the webhook dispatcher
(``service/_webhooks.py``), the stuck-run detector (``observe/_stuck.py``) -- hands it a
:class:`Companion`. The ``agentledger worker`` command, the service's inline worker and
tests choose which ones, so the worker imports no feature.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentledger.worker._worker import Worker


@dataclass(frozen=True)
class Companion:
    """One side task of a worker.

    ``loop(worker)`` returns the body the worker calls until it stops, supervised like
    its own loops (a transient store error is retried, any other stops the worker).
    ``at_exit(worker)``, if given, runs once after the worker's runs are released and
    its last records sealed, before it exits.
    """

    name: str
    loop: Callable[[Worker], Callable[[], Awaitable[None]]]
    at_exit: Callable[[Worker], Awaitable[None]] | None = None
