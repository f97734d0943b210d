"""The retrieval tool an agent calls: ``search_docs`` (a read).

It searches the run's tenant's documents only (``ToolContext.tenant_id``): the model
names no tenant. Each result carries ``document_id`` and ``chunk_id`` for the answer to
cite, plus the document's title and the headings above the chunk.
"""

from __future__ import annotations

from typing import Any

from agentledger.retrieval._search import search
from agentledger.store._sqlstore import Store
from agentledger.tools._context import ToolContext
from agentledger.tools._contract import tool

MAX_K = 20


@tool(effect="read", timeout=5.0)
async def search_docs(ctx: ToolContext, query: str, k: int = 4) -> dict[str, Any]:
    """Search the company's documents (policies, FAQ) and return the best passages.
    Answer from them only, and cite each passage you use by its chunk_id."""
    store = ctx.store
    if not isinstance(store, Store):
        raise RuntimeError("no store in the tool context: search_docs runs inside a worker")
    hits = await search(store, ctx.tenant_id, query, max(1, min(k, MAX_K)))
    return {"query": query, "results": [h.to_dict() for h in hits]}
