"""Agents remember, recall and search through tools, for their run's tenant and user
only, on both backends; StayHub answers "can I cancel for free?" from its policy."""

from __future__ import annotations

from agentledger._app import App
from agentledger.memory import _queries as memory_facts
from agentledger.memory._queries import memory_audit_id
from agentledger.models._base import ModelRequest, ModelResponse
from agentledger.models._scripted import ScriptedModel
from agentledger.records import RunStatus
from agentledger.store import Store
from agentledger_examples.stayhub.knowledge import NOT_FOUND, help_agent, index_policy
from tests.memory.runs import count, run_to_rest


class Recording(ScriptedModel):
    """The help agent's scripted model, keeping every request it was sent."""

    def __init__(self) -> None:
        super().__init__(help_agent().model.script, name="recording")  # type: ignore[attr-defined]
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return await super().complete(request)


def help_app() -> tuple[App, Recording]:
    model = Recording()
    agent = help_agent()
    agent.model = model
    app = App("help-test")
    app.add_agent(agent)
    return app, model


async def test_stayhub_answers_free_cancellation_from_the_policy_citing_it(
    store: Store,
) -> None:
    doc, _ = await index_policy(store, "default")
    app, _ = help_app()
    run = await run_to_rest(
        store, app, "stayhub_help", {"message": "Can I cancel for free?"}, user_id="g-1"
    )
    assert run.status == RunStatus.COMPLETED, run.error
    answer = run.result["answer"]
    assert "cancel for free up to 48 hours before check-in" in answer
    assert f"[{doc.id}#" in answer  # cites the chunk, which names the document
    steps = await store.load_journal(run.id)
    search = next(s for s in steps if s.name == "search_docs")
    cited = answer.rsplit("[", 1)[1].rstrip("]")
    assert search.output["results"][0]["chunk_id"] == cited


async def test_one_tenants_memory_and_documents_never_reach_another(
    store: Store, store_url: str
) -> None:
    await index_policy(store, "acme")
    app, model = help_app()
    wrote = await run_to_rest(
        store,
        app,
        "stayhub_help",
        {"remember": "prefers quiet rooms"},
        tenant_id="acme",
        user_id="g-1",
    )
    assert wrote.status == RunStatus.COMPLETED, wrote.error
    sql = "SELECT COUNT(*) FROM memory_facts WHERE tenant_id = ? AND user_id = ?"
    assert count(store_url, sql, ("acme", "g-1")) == 1

    # The same user id in another tenant: no facts in context, none recalled, no policy.
    model.requests.clear()
    other = await run_to_rest(
        store,
        app,
        "stayhub_help",
        {"message": "Can I cancel for free?", "recall": "rooms"},
        tenant_id="globex",
        user_id="g-1",
    )
    assert other.status == RunStatus.COMPLETED, other.error
    assert "What I remember: nothing yet." in other.result["answer"]
    assert NOT_FOUND in other.result["answer"]
    notes = [m.content for r in model.requests for m in r.messages if m.role == "system"]
    assert notes and not any("quiet" in (n or "") for n in notes)

    # The run's own tenant: the fact is in the model's context and recalled.
    model.requests.clear()
    own = await run_to_rest(
        store,
        app,
        "stayhub_help",
        {"message": "Can I cancel for free?", "recall": "rooms"},
        tenant_id="acme",
        user_id="g-1",
    )
    assert "What I remember: prefers quiet rooms" in own.result["answer"]
    assert "48 hours" in own.result["answer"]
    first = model.requests[0].messages
    assert first[1].role == "system" and "prefers quiet rooms" in (first[1].content or "")

    # Forgotten: the rows go, and the next run neither sees nor recalls the fact.
    assert await store.transact(memory_facts.forget_facts, "acme", "g-1", None, "cli") == (1, 0)
    assert count(store_url, sql, ("acme", "g-1")) == 0
    model.requests.clear()
    after = await run_to_rest(
        store, app, "stayhub_help", {"recall": "rooms"}, tenant_id="acme", user_id="g-1"
    )
    assert "What I remember: nothing yet." in after.result["answer"]
    assert "quiet" not in (model.requests[0].messages[1].content or "")
    events = await store.list_events(memory_audit_id("acme", "g-1"))
    assert [e.type for e in events] == ["memory.forgotten"]


async def test_a_run_without_a_user_gets_a_clear_tool_answer(store: Store) -> None:
    app, model = help_app()
    run = await run_to_rest(store, app, "stayhub_help", {"remember": "likes tea"})
    assert run.status == RunStatus.COMPLETED
    step = next(s for s in await store.load_journal(run.id) if s.name == "remember")
    assert step.error_class == "business_error" and "no user" in (step.error or "")
    assert "No user is attached" in (model.requests[0].messages[1].content or "")


def test_the_stayhub_app_registers_the_help_agent() -> None:
    from agentledger_examples.stayhub.app import app

    assert app.resolve("stayhub_help").name == "stayhub_help"
    assert {"search_docs", "remember", "recall"} <= set(app.tools)
