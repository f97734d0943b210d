"""The audit trail: ``GET /v1/runs/{id}/audit`` and ``GET /v1/audit`` (admin)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["audit"])
