"""How a request flows through faults, idempotency and the database.

Write path, per request (endpoint + ``Idempotency-Key``):

1. missing key → 400;
2. ``latency`` sleeps; ``outage`` / ``rate_limit`` / ``error`` answer now, with no effect and
   nothing stored for the key;
3. the key is begun: a completed record with the same parameters is replayed
   (``Idempotent-Replayed: true``), different parameters → 422 ``idempotency_key_reuse``, a
   record still in progress → 409 ``request_in_progress``;
4. ``hold`` sleeps while the record is in progress;
5. the provider operation, its ledger entry and the stored response commit in one
   transaction (steps 4-5 are shielded: a client hanging up does not stop them);
6. ``timeout_after_commit`` holds the already-committed response.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse, Response

from agentledger.sandbox import idempotency as idem
from agentledger.sandbox.db import Database
from agentledger.sandbox.faults import FaultInjector
from agentledger.sandbox.ledger import append_effect
from agentledger.sandbox.providers import Outcome

Operation = Callable[[sqlite3.Connection], Outcome]


def json_response(status_code: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    """A JSON response."""
    return JSONResponse(body, status_code=status_code, headers=headers)


class Pipeline:
    """Runs reads and writes for the app against one database and one fault injector."""

    def __init__(self, db: Database, faults: FaultInjector) -> None:
        self.db = db
        self.faults = faults
        self._tasks: set[asyncio.Task[tuple[int, str, bool]]] = set()

    async def _injected(self, endpoint: str) -> Response | None:
        delay = self.faults.latency(endpoint)
        if delay:
            await asyncio.sleep(delay)
        failure = self.faults.failure(endpoint)
        if failure is None:
            return None
        return json_response(failure.status_code, failure.body, failure.headers)

    async def read(self, endpoint: str, operation: Operation) -> Response:
        """Serve a read: faults, then the operation (no transaction needed beyond one)."""
        injected = await self._injected(endpoint)
        if injected is not None:
            return injected
        hold = self.faults.hold_before(endpoint)
        if hold:
            await asyncio.sleep(hold)
        with self.db.transaction() as conn:
            outcome = operation(conn)
        hold = self.faults.hold_after_commit(endpoint)
        if hold:
            await asyncio.sleep(hold)
        return json_response(outcome.status_code, outcome.body)

    async def write(
        self, endpoint: str, key: str | None, params: Any, operation: Operation
    ) -> Response:
        """Serve a write with Stripe-like idempotency (see the module docstring)."""
        if not key:
            return json_response(
                400,
                {"error": "missing_idempotency_key", "detail": "send an Idempotency-Key header"},
            )
        injected = await self._injected(endpoint)
        if injected is not None:
            return injected
        with self.db.transaction() as conn:
            verdict, record = idem.begin(conn, endpoint, key, idem.request_hash(params))
        if verdict is idem.Verdict.MISMATCH:
            return json_response(422, {"error": "idempotency_key_reuse"})
        if verdict is idem.Verdict.IN_PROGRESS:
            return json_response(409, {"error": "request_in_progress"})
        if verdict is idem.Verdict.REPLAY:
            assert record is not None and record.status_code is not None
            return Response(
                record.response,
                status_code=record.status_code,
                media_type="application/json",
                headers={"Idempotent-Replayed": "true"},
            )
        task = asyncio.ensure_future(
            self._apply(endpoint, key, self.faults.hold_before(endpoint), operation)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        status_code, text, applied = await asyncio.shield(task)
        hold = self.faults.hold_after_commit(endpoint) if applied else 0.0
        if hold:
            await asyncio.sleep(hold)
        return Response(text, status_code=status_code, media_type="application/json")

    async def _apply(
        self, endpoint: str, key: str, hold: float, operation: Operation
    ) -> tuple[int, str, bool]:
        try:
            if hold:
                await asyncio.sleep(hold)
            with self.db.transaction() as conn:
                outcome = operation(conn)
                text = json.dumps(outcome.body)
                if outcome.effect is not None:
                    append_effect(conn, outcome.effect)
                idem.complete(conn, endpoint, key, outcome.status_code, text)
        except BaseException:
            with self.db.transaction() as conn:
                idem.abandon(conn, endpoint, key)
            raise
        return outcome.status_code, text, outcome.effect is not None

    async def aclose(self) -> None:
        """Cancel held writes that have not applied yet (their keys are abandoned)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @staticmethod
    def status_of(endpoint: str, key: str) -> Operation:
        """An operation answering the status check for ``key`` at a write endpoint."""

        def operation(conn: sqlite3.Connection) -> Outcome:
            return Outcome(*idem.status_view(idem.lookup(conn, endpoint, key)))

        return operation
