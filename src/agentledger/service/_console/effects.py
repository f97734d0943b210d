"""``/ui/effects``: the side effects ledger across the tenant's runs -- every write with
its key, state and tool (the provider it calls); writes whose outcome is open are listed
first."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from agentledger.service._console import render, story
from agentledger.service._console.signin import signed_in
from agentledger.service._cursors import make_cursor, parse_cursor
from agentledger.service._problems import Problem
from agentledger.service._queries import console as queries

router = APIRouter(prefix="/ui/effects", include_in_schema=False)


@router.get("")
async def effects_page(request: Request, cursor: str | None = None) -> HTMLResponse:
    session = await signed_in(request)
    try:
        after = parse_cursor(cursor) if cursor and len(cursor) <= 400 else None
    except Problem:
        after = None
    found = await request.app.state.store.read(queries.ledger, session.principal.tenant_id, after)
    for group in ("open", "writes"):
        for row in found[group]:
            row["words"] = story.effect_words(row["step"], row["run_status"])
    nxt = make_cursor(*found["next"]) if found["next"] else None
    return render.page(
        request, "effects.html", title="Side effects", open=found["open"],
        writes=found["writes"], next_cursor=nxt,
    )  # fmt: skip
