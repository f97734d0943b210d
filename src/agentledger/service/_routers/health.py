"""``/healthz`` (the process is up) and ``/readyz`` (database reachable, schema current)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from agentledger.service._problems import PROBLEM_SCHEMA, Problem
from agentledger.store._queries.migrations import is_current

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, Any]:
    """200 while the process serves requests."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: PROBLEM_SCHEMA})
async def readyz(request: Request) -> dict[str, Any]:
    """200 when the database answers, every migration is applied and no inline worker
    (``serve --workers-inline``) has stopped on an error; 503 otherwise."""
    failure = getattr(request.app.state, "inline_failure", None)
    if failure is not None:
        raise Problem("unavailable", f"an inline worker stopped: {failure}")
    try:
        current = await request.app.state.store.read(is_current)
    except Exception as exc:
        raise Problem("unavailable", f"database unreachable: {exc}") from None
    if not current:
        raise Problem("unavailable", "migrations pending; run `agentledger migrate`")
    return {"status": "ready"}
