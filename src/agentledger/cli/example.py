"""`agentledger example`: the engine end to end on an embedded SQLite file."""

from __future__ import annotations

import asyncio
import os
import tempfile

import click

from agentledger.cli.common import db_option
from agentledger.cli.tables import journal_table
from agentledger.records import RunStatus


@click.command("example")
@db_option
@click.option("--fresh/--keep", default=True, help="Start from an empty temporary database.")
def example(db: str, fresh: bool) -> None:
    """Submit a workflow and an agent run, execute them with a worker, print the journals."""
    from rich.console import Console

    from agentledger import Worker, WorkerConfig, open_store
    from agentledger.examples.quickstart import app

    if fresh:
        db = "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="agentledger-"), "example.db")

    async def main() -> None:
        store = open_store(db)
        await store.open()
        try:
            ids = [
                await app.submit(store, "daily_digest", {"cities": ["Porto", "Rome"]}),
                await app.submit(store, "weather_agent", {"message": "Weather in Lisbon?"}),
            ]
            worker = Worker(store, app, WorkerConfig(poll_seconds=0.05))
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
                console.print(journal_table(await store.load_journal(run.id)))
            console.print(f"\ndatabase: {db}")
        finally:
            await store.close()

    asyncio.run(main())
