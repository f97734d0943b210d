"""How a request flows through faults, idempotency and the database.

Write path, per request (endpoint + ``Idempotency-Key``):

1. ``keyless`` endpoint: the key is ignored, every request is applied anew (steps 3-4 are
   skipped). Otherwise a missing key is a 400 ``missing_idempotency_key``, a key longer than
   255 characters a 400 ``idempotency_error``;
2. ``latency`` sleeps; ``outage`` / ``rate_limit`` / ``error`` answer now, with no effect and
   nothing stored for the key;
3. the key is begun in its provider's scope: a completed record with the same parameters
   is replayed (``Idempotent-Replayed: true``; a saved 5xx is replayed as that 5xx),
   different parameters → 422 ``idempotency_key_reuse``, a key first used on another
   endpoint → 400 ``idempotency_error``, a record still in progress → 409
   :data:`IN_PROGRESS_BODY` (with ``Retry-After: 1``);
4. ``hold`` sleeps while the record is in progress;
5. the provider operation, its ledger entry and the stored response commit in one
   transaction (steps 4-5 are shielded: a client hanging up does not stop them);
6. ``error_after_commit`` replaces the committed answer with a 5xx (with ``save=1`` the
   5xx was stored for the key in step 5); ``timeout_after_commit`` holds the committed
   answer, success or stored failure. Both count the answer as dropped.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentledger_examples.stayhub.sandbox import idempotency as idem
from agentledger_examples.stayhub.sandbox.db import Database
from agentledger_examples.stayhub.sandbox.faults import FaultInjector
from agentledger_examples.stayhub.sandbox.ledger import append_effect
from agentledger_examples.stayhub.sandbox.providers import Outcome

Operation = Callable[[sqlite3.Connection], Outcome]

IN_PROGRESS_BODY: dict[str, str] = {"error": "request_in_progress"}
"""The body of the 409 answered while the same key's first request is still running."""

RUN_ID_HEADER = "X-Run-Id"


def json_response(status_code: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    """A JSON response."""
    return JSONResponse(body, status_code=status_code, headers=headers)


def _after_commit_error(status: int) -> str:
    return json.dumps({"error": "internal_error", "status": status})


class Pipeline:
    """Runs reads and writes for the app against one database and one fault injector."""

    def __init__(
        self, db: Database, faults: FaultInjector, key_ttl: float = idem.DEFAULT_KEY_TTL
    ) -> None:
        self.db = db
        self.faults = faults
        self.key_ttl = key_ttl
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
        self,
        endpoint: str,
        key: str | None,
        params: Any,
        operation: Operation,
        request: Request | None = None,
    ) -> Response:
        """Serve a write with Stripe-like idempotency (see the module docstring)."""
        run_id = request.headers.get(RUN_ID_HEADER) if request is not None else None
        keyless = self.faults.keyless(endpoint)
        if not keyless:
            if not key:
                return json_response(
                    400,
                    {
                        "error": "missing_idempotency_key",
                        "detail": "send an Idempotency-Key header",
                    },
                )
            if len(key) > idem.MAX_KEY_LENGTH:
                return json_response(
                    400,
                    {
                        "error": "idempotency_error",
                        "detail": f"keys are at most {idem.MAX_KEY_LENGTH} characters",
                    },
                )
        injected = await self._injected(endpoint)
        if injected is not None:
            return injected
        if keyless:
            after_error = self.faults.error_after_commit(endpoint)
            hold = self.faults.hold_before(endpoint)
            status_code, text, _ = await self._shielded(
                self._apply(endpoint, None, hold, operation, run_id, None)
            )
        else:
            assert key is not None
            with self.db.transaction() as conn:
                verdict, record = idem.begin(
                    conn, endpoint, key, idem.request_hash(params), self.key_ttl
                )
            if verdict is idem.Verdict.WRONG_ENDPOINT:
                assert record is not None
                return json_response(
                    400,
                    {
                        "error": "idempotency_error",
                        "detail": f"key already used on {record.endpoint}",
                    },
                )
            if verdict is idem.Verdict.MISMATCH:
                return json_response(422, {"error": "idempotency_key_reuse"})
            if verdict is idem.Verdict.IN_PROGRESS:
                return json_response(409, IN_PROGRESS_BODY, {"Retry-After": "1"})
            if verdict is idem.Verdict.REPLAY:
                assert record is not None and record.status_code is not None
                code, body = record.replayed()
                return Response(
                    body,
                    status_code=code,
                    media_type="application/json",
                    headers={"Idempotent-Replayed": "true"},
                )
            # Only a request that will apply rolls the after-commit dice (not a replay).
            after_error = self.faults.error_after_commit(endpoint)
            saved = (
                (after_error[0], _after_commit_error(after_error[0]))
                if after_error is not None and after_error[1]
                else None
            )
            hold = self.faults.hold_before(endpoint)
            status_code, text, _ = await self._shielded(
                self._apply(endpoint, key, hold, operation, run_id, saved)
            )
        if after_error is not None:
            self.faults.dropped(endpoint)
            return Response(
                _after_commit_error(after_error[0]),
                status_code=after_error[0],
                media_type="application/json",
            )
        hold = self.faults.hold_after_commit(endpoint)
        if hold:
            await asyncio.sleep(hold)
            if request is None or await request.is_disconnected():
                self.faults.dropped(endpoint)
        return Response(text, status_code=status_code, media_type="application/json")

    async def _shielded(self, coro: Any) -> tuple[int, str, bool]:
        task: asyncio.Task[tuple[int, str, bool]] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _apply(
        self,
        endpoint: str,
        key: str | None,
        hold: float,
        operation: Operation,
        run_id: str | None,
        saved: tuple[int, str] | None,
    ) -> tuple[int, str, bool]:
        try:
            if hold:
                await asyncio.sleep(hold)
            with self.db.transaction() as conn:
                outcome = operation(conn)
                text = json.dumps(outcome.body)
                if outcome.effect is not None:
                    append_effect(conn, outcome.effect, run_id)
                if key is not None:
                    idem.complete(conn, endpoint, key, outcome.status_code, text, saved)
        except BaseException:
            if key is not None:
                with self.db.transaction() as conn:
                    idem.abandon(conn, endpoint, key)
            raise
        return outcome.status_code, text, outcome.effect is not None

    async def aclose(self) -> None:
        """Cancel held writes that have not applied yet (their keys are abandoned)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def status_of(self, endpoint: str, key: str, lookup_endpoint: str) -> Operation:
        """An operation answering the status check for ``key`` at a write endpoint.

        ``lookup_endpoint`` is the fault endpoint of the lookup (where ``lag`` applies).
        A keyless endpoint keeps no record: it answers 400 ``idempotency_not_supported``,
        never a ``not_found`` that would invite a second send.
        """
        keyless = self.faults.is_keyless(endpoint)
        lag = 0.0 if keyless else self.faults.lag(lookup_endpoint)

        def operation(conn: sqlite3.Connection) -> Outcome:
            if keyless:
                return Outcome(
                    400,
                    {
                        "error": "idempotency_not_supported",
                        "detail": f"{endpoint} ignores idempotency keys; nothing is known by key",
                    },
                )
            idem.prune(conn, self.key_ttl)
            return Outcome(*idem.status_view(idem.lookup(conn, endpoint, key), endpoint, lag))

        return operation
