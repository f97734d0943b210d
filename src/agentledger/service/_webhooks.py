"""Signed webhooks: delivery with retries, and the receiver's verification recipe.

Each POST carries:

* ``AgentLedger-Event-Id``: the event id -- the same on every retry; deduplicate on it.
* ``AgentLedger-Event``: ``run.completed``, ``run.failed``, ``run.needs_human``,
  ``run.stuck``, ``approval.needed`` or ``approval.expiring``.
* ``AgentLedger-Signature: t=<unix seconds>,v1=<hex>`` where
  ``hex = HMAC-SHA256(tenant secret, "<t>." + raw body)``.

A receiver verifies it like this (:func:`verify` does exactly this)::

    t, v1 = (dict(p.split("=", 1) for p in header.split(",")) [k] for k in ("t", "v1"))
    expected = hmac.new(secret.encode(), f"{t}.".encode() + raw_body, sha256).hexdigest()
    ok = hmac.compare_digest(expected, v1) and abs(time.time() - int(t)) <= 300

Failed deliveries (non-2xx, timeouts) are retried with exponential backoff
(``base * 2**attempts``, capped), then kept as ``dead`` rows.

Who delivers: every ``agentledger serve`` process and every worker (``agentledger
worker``; ``--no-webhooks`` turns it off), so a deployment without a running service
still delivers. They claim due deliveries from one table: a claim is a lease (three
HTTP timeouts long, so it outlasts the attempt, which is given one timeout in all) with
an owner and the next epoch, so one delivery attempt is made by one process at a time,
and an attempt's outcome is written back only under its own claim. Each dispatcher also enqueues the
``approval.expiring`` warnings (once each: the delivery id comes from the approval).

Where a run's events go: the URL the run was started with, else its agent's (the
deployment's ``agent_webhooks`` setting, else the Agent/Workflow ``webhook``
attribute). The URL is fixed on the run row when the run is accepted, so per-agent
webhooks are delivered exactly like per-run ones, and a later redeploy does not
redirect the events of runs already started.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from agentledger import _envsettings as envsettings
from agentledger._backoff import exponential
from agentledger._failures import FailureLog
from agentledger.service._egress import Egress, Refused, Unresolved
from agentledger.service._queries import webhooks as service_webhooks
from agentledger.store import Store
from agentledger.worker._companions import Companion

if TYPE_CHECKING:  # loaded with the first delivery: a process with none to make never does
    import httpx

log = logging.getLogger(__name__)


def backoff_from_env() -> float:
    """First retry delay of a worker's deliveries (env ``AGENTLEDGER_WEBHOOK_BACKOFF``,
    seconds, 0.01-3600; ``serve`` takes its own setting).

    Raises :class:`UsageError` naming the variable when it is set to anything else."""
    return envsettings.current().webhook_backoff


def webhook_for(definition: Any, agent_webhooks: dict[str, str], given: str | None) -> str | None:
    """The URL a new run's events go to: ``given``, else its agent's (setting, attribute)."""
    if given:
        return given
    return agent_webhooks.get(definition.name) or getattr(definition, "webhook", None)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``AgentLedger-Signature`` header value."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, tolerance: float = 300.0) -> bool:
    """True when ``header`` signs ``body`` under ``secret`` within ``tolerance`` seconds."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        timestamp = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, given) and abs(time.time() - timestamp) <= tolerance


def delivery_client(timeout: float) -> httpx.AsyncClient:
    """The HTTP client deliveries are sent with (every dispatcher's, the burst worker's
    last round too). Redirects are not followed: a 3xx would send the POST to a target
    never checked. Connections are direct -- a proxy from ``HTTP_PROXY``/``ALL_PROXY``
    would make a connection the check never looked at, and over HTTPS could not carry
    the pinned server name (service/_egress.py) -- so an explicit transport, which
    httpx does not route through environment proxies; certificates are still found
    as usual (``SSL_CERT_FILE``)."""
    import httpx

    return httpx.AsyncClient(
        timeout=timeout, follow_redirects=False, transport=httpx.AsyncHTTPTransport()
    )


class LazyClient:
    """A dispatcher's :func:`delivery_client`, made when a round first has a delivery to
    make: a worker or service with nothing to deliver never loads httpx (a tenth or more
    of a worker's start-up). Closed with :meth:`aclose`."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._client: httpx.AsyncClient | None = None

    def get(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = delivery_client(self.timeout)
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class Dispatcher:
    """Delivers due webhooks from this process (every service process and worker runs
    one: each delivery is leased to one of them at a time, see the module docstring)."""

    def __init__(
        self,
        store: Store,
        period: float = 0.5,
        backoff: float = 2.0,
        max_backoff: float = 600.0,
        max_attempts: int = 10,
        timeout: float = 10.0,
        owner: str | None = None,
        egress: Egress | None = None,
    ) -> None:
        self.store = store
        # Which targets may be posted to (service/_egress.py); default: the environment's.
        self.egress = egress if egress is not None else Egress.from_env()
        # Who holds a claim (shown in the table); the epoch, not the owner, fences.
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.period = period
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_attempts = max_attempts
        self.timeout = timeout
        self._secrets: dict[str, str] = {}

    async def run_forever(self) -> None:
        await self.run(asyncio.Event())

    async def run(self, stopping: asyncio.Event) -> None:
        """Deliver what is due every ``period`` until ``stopping`` is set. Never raises
        on a failed round (a store error, an unreachable receiver): it is retried."""
        # A failing store fails every round: each cause is logged once.
        failures = FailureLog(log, "webhook dispatch", logging.WARNING)
        client = LazyClient(self.timeout)
        try:
            while not stopping.is_set():
                try:
                    await self.once(client)
                except Exception as exc:  # retried next period
                    failures.failed("webhooks", exc)
                else:
                    failures.recovered("webhooks")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.period)
        finally:
            await client.aclose()

    async def once(self, client: httpx.AsyncClient | LazyClient) -> int:
        """Enqueue expiring-approval warnings, deliver what is due; return deliveries tried."""
        now = time.time()
        await self.store.transact(service_webhooks.enqueue_expiring, now)
        due = await self.store.transact(
            service_webhooks.claim_due, now, 50, self.timeout * 3, self.owner
        )
        if not due:
            return 0
        sender = client.get() if isinstance(client, LazyClient) else client
        await asyncio.gather(*(self._deliver(sender, row) for row in due))
        return len(due)

    async def _secret(self, tenant_id: str) -> str:
        if tenant_id not in self._secrets:
            self._secrets[tenant_id] = await self.store.transact(
                service_webhooks.webhook_secret, tenant_id
            )
        return self._secrets[tenant_id]

    async def _post(
        self, client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]
    ) -> httpx.Response:
        """POST to the address the target resolves to now, checked and pinned
        (service/_egress.py): the connection goes where the check looked."""
        target = await self.egress.pin(url)
        return await client.post(
            target.url, content=body, headers={**headers, **target.headers},
            extensions=target.extensions,
        )  # fmt: skip

    async def _deliver(self, client: httpx.AsyncClient, row: dict[str, Any]) -> None:
        body = str(row["body"]).encode()
        secret = await self._secret(row["tenant_id"])
        headers = {
            "Content-Type": "application/json",
            "AgentLedger-Event-Id": row["id"],
            "AgentLedger-Event": row["type"],
            "AgentLedger-Signature": sign(secret, int(time.time()), body),
        }
        error = None
        refused = False
        import httpx  # loaded by now: the client is made

        try:
            # The client's timeout bounds each read, not the answer: a receiver sending
            # a byte now and then would keep the attempt going past its claim, and the
            # next claimer would send the delivery while this one still is. A whole
            # attempt (its name resolution included) gets one timeout (its claim lasts
            # three).
            reply = await asyncio.wait_for(
                self._post(client, row["url"], body, headers), self.timeout
            )
            if not 200 <= reply.status_code < 300:
                error = f"HTTP {reply.status_code}"
        except Refused as exc:  # not retried: only the deployment's settings can change it
            error, refused = f"Refused: {exc}", True
        except (httpx.HTTPError, Unresolved) as exc:  # retried
            error = f"{type(exc).__name__}: {exc}"
        except TimeoutError:
            error = f"Timeout: no whole answer within {self.timeout:g} s"
        attempts = int(row["attempts"]) + 1
        delay = exponential(attempts, self.backoff, self.max_backoff)
        dead = error is not None and (refused or attempts >= self.max_attempts)
        settled = await self.store.transact(
            service_webhooks.settle_delivery,
            row["id"],
            error is None,
            error,
            time.time() + delay,
            dead,
            int(row["lease_epoch"]),
        )
        if not settled:  # our lease ran out mid-attempt: the next claimer decides
            log.warning("webhook %s: claim lost before its outcome was written", row["id"])


def companion() -> Companion:
    """The dispatcher as a worker's side task
    (:class:`~agentledger.worker._companions.Companion`): a deployment without a running
    service delivers webhooks too; deliveries are claimed, so any number of workers and
    service processes dispatch at once. A burst worker's last seal enqueues the webhooks
    of its last runs' events (completed, failed, needs_human) after its dispatcher
    stopped: it delivers what is due once before exiting, within the shutdown grace. A
    failed attempt is rescheduled as usual and retried by the next dispatcher."""

    def loop(worker: Any) -> Any:
        dispatcher = Dispatcher(worker.store, backoff=backoff_from_env(), owner=worker.owner)
        return lambda: dispatcher.run(worker.stopping)

    async def at_exit(worker: Any) -> None:
        if not worker.burst:
            return
        dispatcher = Dispatcher(worker.store, backoff=backoff_from_env(), owner=worker.owner)

        async def rounds() -> None:
            client = LazyClient(dispatcher.timeout)
            try:
                while await dispatcher.once(client):  # a round takes up to 50
                    pass
            finally:
                await client.aclose()

        try:
            await asyncio.wait_for(rounds(), worker.config.shutdown_grace)
        except Exception as exc:  # a timeout too: left for the next dispatcher
            log.warning("webhooks left for the next dispatcher: %s", exc or type(exc).__name__)

    return Companion("webhooks", loop, at_exit)
