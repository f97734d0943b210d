"""`agentledger example`: the engine end to end on an embedded SQLite file."""

from __future__ import annotations

import asyncio
import os
import tempfile

import click

from agentledger.cli._common import db_option
from agentledger.cli._ops import worker_companions
from agentledger.cli._tables import journal_notes, journal_view
from agentledger.records import RunStatus


@click.command("example")
@db_option
@click.option(
    "--fresh/--keep",
    default=True,
    help="--fresh (default): an empty temporary database, unless --db names one; "
    "--keep: the --db database (default sqlite:///agentledger.db).",
)
@click.pass_context
def example(ctx: click.Context, db: str, fresh: bool) -> None:
    """Submit a workflow and an agent run, execute them with a worker, print the journals."""
    from rich.console import Console

    from agentledger import Worker, WorkerConfig, open_store
    from agentledger_examples.quickstart import app

    given = ctx.get_parameter_source("db") not in (
        click.core.ParameterSource.DEFAULT,
        click.core.ParameterSource.DEFAULT_MAP,
        None,
    )
    if fresh and not given:  # a --db (or AGENTLEDGER_DB) the user named is used as given
        db = "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="agentledger-"), "example.db")

    async def main() -> None:
        store = open_store(db)
        await store.open()
        try:
            ids = [
                await app.submit(store, "daily_digest", {"cities": ["Porto", "Rome"]}),
                await app.submit(store, "weather_agent", {"message": "Weather in Lisbon?"}),
            ]
            config = WorkerConfig(poll_seconds=0.05)
            worker = Worker(store, app, config, companions=worker_companions(config))
            task = asyncio.create_task(worker.run(install_signals=False))
            while True:
                runs = [await store.get_run(i) for i in ids]
                if all(r is not None and r.status in RunStatus.TERMINAL for r in runs):
                    break
                await asyncio.sleep(0.05)
            worker.stop()
            await task
            console = Console()
            for run in runs:
                assert run is not None
                console.print(
                    f"\n[bold]{run.target}[/] {run.id} -> [bold]{run.status}[/] result={run.result}"
                )
                steps = await store.load_journal(run.id)
                notes = await journal_notes(store, run.id)
                console.print(journal_view(steps, console.width, notes=notes))
            click.echo(f"\ndatabase: {db}")  # not wrapped: it is copied into commands
        finally:
            await store.close()

    asyncio.run(main())
