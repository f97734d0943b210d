"""The memory tools an agent calls: ``remember`` (a write) and ``recall`` (a read).

Both act for the run's tenant and user (``ToolContext.tenant_id`` / ``user_id``): the
model names no tenant and no user, so it cannot reach anyone else's facts. ``remember``
stores the step's idempotency key with the fact and declares a status check that looks
it up, so a retried or resumed step stores its fact once (docs/architecture.md,
"Unknown outcomes").
"""

from __future__ import annotations

from typing import Any

from agentledger.errors import BusinessError
from agentledger.memory import _queries as memory_facts
from agentledger.memory._facts import fact_key_of, normalize_fact, rank_facts
from agentledger.store._sqlstore import Store
from agentledger.tools._context import ToolContext
from agentledger.tools._contract import Tool, tool
from agentledger.tools._status import Status

MAX_KEY_CHARS = 100


def store_of(ctx: ToolContext) -> Store:
    """The worker's store, from the tool's context."""
    if not isinstance(ctx.store, Store):
        raise RuntimeError("no store in the tool context: memory tools run inside a worker")
    return ctx.store


def user_of(ctx: ToolContext) -> str:
    """The run's user; a run without one has no memory (the tool's answer, not a crash)."""
    if not ctx.user_id:
        raise BusinessError(
            "this run has no user: nothing can be remembered or recalled",
            data={"error": "no_user"},
        )
    return ctx.user_id


async def remember_status(ctx: ToolContext, args: dict[str, Any]) -> Status:
    """Did the step with this idempotency key store its fact?"""
    fact = await store_of(ctx).read(
        memory_facts.fact_by_source, ctx.tenant_id, user_of(ctx), ctx.idempotency_key
    )
    return Status.not_found() if fact is None else Status.succeeded({"remembered": fact.to_dict()})


@tool(effect="write", idempotency="provider", status_check=remember_status, timeout=5.0)
async def remember(ctx: ToolContext, fact: str, key: str | None = None) -> dict[str, Any]:
    """Remember a fact about the user for later conversations, such as "prefers quiet
    rooms". Give a short ``key`` (e.g. "room_preference") to replace an earlier fact."""
    text = normalize_fact(fact)
    if not text:
        raise BusinessError("an empty fact cannot be remembered", data={"error": "empty_fact"})
    name = (key or "").strip()[:MAX_KEY_CHARS] or fact_key_of(text)
    stored = await store_of(ctx).transact(
        memory_facts.upsert_fact,
        ctx.tenant_id,
        user_of(ctx),
        name,
        text,
        ctx.run_id,
        ctx.idempotency_key,
    )
    return {"remembered": stored.to_dict()}


@tool(effect="read", timeout=5.0)
async def recall(ctx: ToolContext, query: str = "", k: int = 5) -> dict[str, Any]:
    """Recall what is remembered about the user: the facts that match ``query`` best
    (all recent facts when the query is empty)."""
    facts = await store_of(ctx).read(memory_facts.list_facts, ctx.tenant_id, user_of(ctx))
    found = rank_facts(facts, query, max(1, min(k, 50)))
    return {"facts": [f.to_dict() for f in found]}


def memory_tools() -> list[Tool]:
    """The memory tools, to add to an agent's tools."""
    return [remember, recall]
