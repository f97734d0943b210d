"""The audit trail: ``GET /v1/runs/{id}/audit`` and ``GET /v1/audit`` (admin).

Read-only: nothing in the API edits or deletes an audit record.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from agentledger.service._auth import ADMIN, Caller, require
from agentledger.service._deps import run_or_404
from agentledger.service._problems import PROBLEM_SCHEMA
from agentledger.service._queries import audit as service_audit

router = APIRouter(tags=["audit"])
ERRORS: dict[int | str, dict[str, Any]] = {code: PROBLEM_SCHEMA for code in (401, 403, 404, 422)}


@router.get("/v1/runs/{run_id}/audit", responses=ERRORS)
async def run_audit(
    run_id: str,
    request: Request,
    principal: Caller,
    after: int = Query(0, ge=0, le=2**62),
    limit: int = Query(500, ge=1, le=1000),
) -> dict[str, Any]:
    """Who started the run, what the model proposed, policy decisions, approvals, what
    executed and what it cost, in order (``hash`` is set once the record is sealed)."""
    await run_or_404(request, run_id, principal.tenant_id)
    records = await request.app.state.store.read(
        service_audit.audit_records, principal.tenant_id, run_id, after, limit
    )
    return {"run_id": run_id, "records": records}


@router.get("/v1/audit", responses=ERRORS)
async def tenant_audit(
    request: Request,
    principal: Caller,
    cursor: int = Query(0, ge=0, le=2**62, description="chain_no of the last record seen"),
    limit: int = Query(500, ge=1, le=1000),
) -> dict[str, Any]:
    """The tenant's sealed audit chain, in chain order (admin)."""
    require(principal, ADMIN, action="reading the tenant's audit trail")
    records = await request.app.state.store.read(
        service_audit.audit_records, principal.tenant_id, None, cursor, limit
    )
    nxt = records[-1]["chain_no"] if len(records) == limit else None
    return {"records": records, "next_cursor": nxt}
