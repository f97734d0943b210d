"""An app that imports in the command but not in its workers (a setting only a worker
process lacks): ``agentledger chaos`` must stop and say so, not restart workers forever."""

from __future__ import annotations

import os

from tests.apps.chaos_app import app

__all__ = ["app"]

if os.environ.get("AGENTLEDGER_CHAOS_EFFECTS"):  # set in the workers only
    raise RuntimeError("CHECKOUT_API_KEY is not set")
