"""Shared request plumbing: the store, the App, the caller's tenant-scoped run."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from agentledger.service._problems import Problem
from agentledger.store._queries import service_runs


async def run_or_404(request: Request, run_id: str, tenant_id: str) -> dict[str, Any]:
    """The run in the caller's tenant; 404 (never 403) for another tenant's, so ids of
    other tenants do not leak."""
    store = request.app.state.store
    if len(run_id) > 200:
        raise Problem("not-found", f"no run {run_id[:40]}...")
    row = await store.read(service_runs.service_run, run_id, tenant_id)
    if row is None:
        raise Problem("not-found", f"no run {run_id}")
    return row
