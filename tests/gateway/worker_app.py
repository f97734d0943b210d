"""The app of the gateway tests that run in worker processes and behind the service.

Its agent names its model by a string, so the provider, its URL (the fake server's)
and streaming come from the environment the test gives the process.
"""

from __future__ import annotations

from typing import Any

from agentledger import App, Budget, ToolContext, Worker, WorkerConfig
from agentledger._agent import Agent
from agentledger.store import open_store


def make_app(model: Any = "openai:gpt-4.1-mini", budget: Budget | None = None) -> App:
    """A fresh app; a model named by a string is built from the environment as it is now
    (in-process tests pass a model object instead)."""
    app = App("gateway")

    @app.tool
    async def lookup(ctx: ToolContext, city: str) -> dict[str, Any]:
        """Hotels in a city (a read)."""
        return {"city": city, "hotels": 3}

    app.add_agent(
        Agent(
            name="concierge",
            model=model,
            instructions="Find hotels.",
            tools=[lookup],
            budget=budget or Budget(),
        )
    )
    return app


async def burst_here(url: str) -> None:
    """A burst worker of a fresh app in this process until nothing is left (its model
    built from the environment as the test set it: the fake server), its models' clients
    and its store closed after."""
    app = make_app()
    store = open_store(url)
    await store.open()
    try:
        config = WorkerConfig(poll_seconds=0.02, shutdown_grace=1.0)
        await Worker(store, app, config, burst=True).run(install_signals=False)
    finally:
        for definition in app.definitions.values():
            closer = getattr(getattr(definition, "model", None), "aclose", None)
            if closer is not None:
                await closer()
        await store.close()


_app: App | None = None


def __getattr__(name: str) -> App:
    """``app``: the app worker processes load (``--app tests.gateway.worker_app:app``),
    made when first asked for. Building its agent imports the model's SDK (openai), which
    a test process collecting these tests would otherwise pay for without running one."""
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        _app = make_app()
    return _app
