"""StayHub's help agent: answers from its policy document and remembers guests.

The cancellation policy and FAQ ship with the package (``policy.md`` beside this module).
Index it for a tenant, then ask::

    python -m agentledger_examples.stayhub.knowledge --db sqlite:///stayhub.db --tenant default
    agentledger submit stayhub_help --input '{"message": "Can I cancel for free?"}' \\
        --app agentledger_examples.stayhub.app:app --db sqlite:///stayhub.db

(``agentledger docs add .../policy.md`` indexes it as well.) The scripted model searches
the documents with ``search_docs`` and answers from the best passage, citing its chunk id;
it never answers a policy question from nothing. Run input keys: ``message`` (the
question), ``remember`` (a fact about the guest to keep), ``recall`` (a query over what is
remembered). The agent is built with ``memory=True``: what is remembered about the guest
is in its context.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from agentledger import Agent, App, Budget, ModelRequest, ScriptedModel, Turn
from agentledger.memory import memory_tools
from agentledger.retrieval import Document, index_path, search_docs
from agentledger.store import Store, open_store
from agentledger_examples.stayhub.script import Result, run_input, tool_results

POLICY_PATH = Path(__file__).with_name("policy.md")
POLICY_SOURCE = "stayhub:policy.md"
NOT_FOUND = "I could not find that in our policies; a member of our team will follow up."

INSTRUCTIONS = (
    "You are StayHub's help assistant. Answer questions about bookings only from the "
    "passages search_docs returns, and cite each passage by its chunk_id in brackets. "
    "If nothing answers the question, say so. Remember what the guest asks you to."
)


def _first_sentences(text: str, limit: int = 2) -> str:
    sentences = [s.strip() for s in text.replace("\n", " ").split(". ") if s.strip()]
    picked = ". ".join(sentences[:limit])
    return picked if picked.endswith(".") else picked + "."


def _answer(results: list[Result]) -> str:
    parts: list[str] = []
    for r in results:
        if r.tool == "remember" and r.ok:
            parts.append(f"I will remember that: {r.data['remembered']['fact']}")
        elif r.tool == "recall" and r.ok:
            facts = [f["fact"] for f in r.data["facts"]]
            parts.append("What I remember: " + ("; ".join(facts) if facts else "nothing yet."))
    searched = [r for r in results if r.tool == "search_docs"]
    if searched:
        hits = searched[-1].data.get("results", []) if searched[-1].ok else []
        if hits:
            top = hits[0]
            parts.append(
                f"According to our {top['title']} ({top['heading']}): "
                f"{_first_sentences(top['text'])} [{top['chunk_id']}]"
            )
        else:
            parts.append(NOT_FOUND)
    return "\n".join(parts) or NOT_FOUND


def help_script(request: ModelRequest) -> Turn:
    """Remember, recall, search the policy, then answer citing the passage used."""
    data = run_input(request)
    done = {r.tool for r in tool_results(request)}
    if data.get("remember") and "remember" not in done:
        return Turn(calls=[("remember", {"fact": str(data["remember"])})])
    if data.get("recall") is not None and "recall" not in done:
        return Turn(calls=[("recall", {"query": str(data["recall"])})])
    question = data.get("message")
    if question and "search_docs" not in done:
        return Turn(calls=[("search_docs", {"query": str(question), "k": 3})])
    return Turn(text=_answer(tool_results(request)))


def help_agent() -> Agent:
    """The help agent: search_docs, remember and recall, memory in its context."""
    return Agent(
        name="stayhub_help",
        version="1",
        model=ScriptedModel(help_script, name="stayhub-help-scripted"),
        instructions=INSTRUCTIONS,
        tools=[search_docs, *memory_tools()],
        memory=True,
        budget=Budget(max_steps=10, active_seconds=60.0),
        end_user_message="We could not answer automatically; our team will follow up.",
        # The guest's question, or a fact to remember / a topic to recall (scripted demo).
        input_model={
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "remember": {"type": "string"},
                "recall": {"type": "string"},
            },
        },
    )


def register_knowledge(app: App) -> Agent:
    """Add the help agent (and its tools) to the StayHub app."""
    return app.add_agent(help_agent())


async def index_policy(store: Store, tenant_id: str = "default") -> tuple[Document, bool]:
    """Index the shipped policy document for a tenant (again: unchanged)."""
    return await index_path(store, POLICY_PATH, tenant_id, source=POLICY_SOURCE, actor="stayhub")


def main(argv: list[str] | None = None) -> None:
    """Index the policy document: ``python -m agentledger_examples.stayhub.knowledge``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", default="sqlite:///agentledger.db")
    parser.add_argument("--tenant", default="default")
    args = parser.parse_args(argv)

    async def go() -> Any:
        store = open_store(args.db)
        await store.open()
        try:
            return await index_policy(store, args.tenant)
        finally:
            await store.close()

    doc, changed = asyncio.run(go())
    state = "indexed" if changed else "unchanged"
    print(f"{state} {doc.id} {doc.title!r} for tenant {args.tenant}: {doc.chunks} chunks")


if __name__ == "__main__":
    main()
