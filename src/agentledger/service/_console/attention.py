"""``/ui/attention``: what needs a person -- ``needs_human`` and failed runs grouped by
cause, stuck runs, the outbox's dead letters -- each group a link to its runs, whose
pages offer the resume with its dry run."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from agentledger.service._console import render
from agentledger.service._console.signin import signed_in
from agentledger.service._queries import console as queries

router = APIRouter(prefix="/ui/attention", include_in_schema=False)


@router.get("")
async def attention_page(request: Request) -> HTMLResponse:
    session = await signed_in(request)
    found = await request.app.state.store.read(queries.attention, session.principal.tenant_id)
    return render.page(request, "attention.html", title="Needs a human", **found)
