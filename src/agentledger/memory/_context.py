"""The user's facts as a system message, for agents built with ``memory=True``."""

from __future__ import annotations

from agentledger.memory import _queries as memory_facts
from agentledger.records import Run
from agentledger.store._sqlstore import Store

MAX_FACTS_IN_CONTEXT = 50
NO_USER = "No user is attached to this run: nothing is remembered about them."
NO_FACTS = "Nothing is remembered about this user yet."


async def memory_note(store: Store, run: Run, limit: int = MAX_FACTS_IN_CONTEXT) -> str:
    """A system message listing what is remembered about the run's user.

    Only the run's own tenant and user are read. The facts are those created before the
    run began, so a resumed run's context does not move under it as other runs remember
    new things (a forgotten fact does disappear: forgetting wins over replay). The note
    is never empty, so the conversation's length is the same on every pass.
    """
    if not run.user_id:
        return NO_USER
    facts = await store.read(
        memory_facts.list_facts, run.tenant_id, run.user_id, created_before=run.created_at
    )
    if not facts:
        return NO_FACTS
    lines = [f"- {f.fact} (key {f.fact_key})" for f in facts[:limit]]
    return "What is remembered about this user (from earlier conversations):\n" + "\n".join(lines)
