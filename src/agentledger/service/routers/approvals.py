"""``/v1/approvals``: what the caller may decide, and decisions by role."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/v1/approvals", tags=["approvals"])
