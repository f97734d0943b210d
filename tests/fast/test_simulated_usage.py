"""Tokens and dollars of the scripted (offline) model are marked simulated wherever they
are shown: the model step's usage, the run, `runs show`, `runs list`, stats, metrics."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console

from agentledger import Agent, App, ScriptedModel, Turn
from agentledger.cli._tables import journal_entry, journal_view
from agentledger.observe._metrics import render_metrics
from agentledger.observe._stats import stats
from agentledger.observe._stuck import StuckPolicy
from agentledger.records import RunStatus
from tests.cli.helpers import cli_here
from tests.fast.lifecycle_harness import Harness
from tests.observe.test_stuck_metrics import samples, value


def _app() -> App:
    app = App("simulated")
    app.add_agent(
        Agent(name="helper", model=ScriptedModel([Turn(text="done")]), instructions="Help.")
    )
    return app


async def test_a_scripted_models_usage_is_marked_simulated(store_url: str, tmp_path: Path) -> None:
    async with Harness(tmp_path, _app(), store_url) as h:
        run = await h.drive(await h.submit("helper", "hi"))
        (step,) = await h.journal(run.id)
        found = await stats(h.store)
        metrics = samples(await render_metrics(h.store, StuckPolicy(after=3600), process=False))
    assert run.status == RunStatus.COMPLETED and run.tokens > 0
    assert step.output["usage"]["simulated"] is True and step.output["usage"]["source"] == (
        "simulated"
    )
    assert run.usage_simulated is True
    assert found.simulated_runs == 1 and found.to_dict()["simulated_runs"] == 1
    assert value(metrics, "agentledger_run_tokens_total", agent="helper", usage="simulated") == (
        run.tokens
    )
    assert value(metrics, "agentledger_run_tokens_total", agent="helper", usage="reported") == 0
    shown = _cli("runs", "show", run.id, "--db", store_url)
    assert "(simulated: a scripted model answered)" in shown.splitlines()[1], shown
    said = " ".join(_cli("stats", "--db", store_url).split())  # however wide the terminal
    assert "simulated: 1 of 1 runs were answered by the scripted model" in said, said
    # The step's own figures too, as a table and as records (the demo shows entries it
    # already read once).
    entry = journal_entry(step)
    for width in (200, 80):
        text = _render(journal_view([journal_entry(entry)], width))
        assert "sim" in text.split("helper", 1)[-1] or "(simulated)" in text, text


def _render(view: Any) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(view)
    return console.export_text()


def _cli(*args: str) -> Any:
    result = cli_here(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout
