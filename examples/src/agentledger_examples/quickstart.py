"""A small app to see the engine work: one workflow and one agent, no network.

agentledger example            # submits both, runs a worker, prints the journals
agentledger worker --app agentledger_examples.quickstart:app
"""

from __future__ import annotations

from typing import Any

from agentledger import Agent, App, ScriptedModel, ToolContext, Turn, WorkflowContext

app = App("quickstart")

_NOTES: dict[str, str] = {}  # the "provider": idempotent by key


@app.tool(effect="read", timeout=2)
async def lookup_weather(ctx: ToolContext, city: str) -> dict[str, Any]:
    """Today's weather in a city."""
    return {"city": city, "forecast": "sunny", "celsius": 21 + len(city) % 5}


@app.tool(effect="write", timeout=2, idempotency="provider")
async def save_note(ctx: ToolContext, text: str) -> dict[str, Any]:
    """Save a note for the user (keyed by the step's idempotency key)."""
    _NOTES.setdefault(ctx.idempotency_key, text)
    return {"saved": True, "key": ctx.idempotency_key}


app.add_agent(
    Agent(
        name="weather_agent",
        version="1",
        model=ScriptedModel(
            [
                Turn(calls=[("lookup_weather", {"city": "Lisbon"})]),
                Turn(calls=[("save_note", {"text": "Lisbon is sunny today"})]),
                Turn(text="It is sunny in Lisbon; I saved a note."),
            ]
        ),
        instructions="Answer weather questions and save a note.",
        tools=[lookup_weather, save_note],
    )
)


@app.workflow(name="daily_digest", version="1")
async def daily_digest(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    cities = await ctx.step("pick_cities", lambda: input.get("cities", ["Porto", "Rome"]))
    forecasts = [await ctx.tool("lookup_weather", city=c) for c in cities]
    summary = await ctx.step(
        "summarise", lambda: ", ".join(f"{f['city']} {f['celsius']}C" for f in forecasts)
    )
    await ctx.tool("save_note", text=summary)
    return {"summary": summary}
