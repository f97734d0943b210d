"""The app of the gateway tests that run in worker processes and behind the service.

Its agent names its model by a string, so the provider, its URL (the fake server's)
and streaming come from the environment the test gives the process.
"""

from __future__ import annotations

from typing import Any

from agentledger import App, ToolContext
from agentledger.agent import Agent


def make_app() -> App:
    """A fresh app; its model is built from the environment as it is now."""
    app = App("gateway-workers")

    @app.tool
    async def lookup(ctx: ToolContext, city: str) -> dict[str, Any]:
        """Hotels in a city (a read)."""
        return {"city": city, "hotels": 3}

    app.add_agent(
        Agent(
            name="concierge",
            model="openai:gpt-4.1-mini",
            instructions="Find hotels.",
            tools=[lookup],
        )
    )
    return app


#: The app worker processes load (``--app tests.gateway.worker_app:app``).
app = make_app()
