"""Commands built on optional parts: sandbox, demo, bench, example."""

from __future__ import annotations

import click


@click.command("sandbox")
@click.option("--port", default=8700, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--faults",
    default=None,
    help="Fault spec, e.g. 'payments.create:timeout_after_commit@0.1;seed=7'.",
)
@click.option("--ledger", default=None, help="SQLite file that keeps the ledger across restarts.")
def sandbox(port: int, host: str, faults: str | None, ledger: str | None) -> None:
    """Run StayHub's providers as a local HTTP service."""
    from agentledger.sandbox import parse_faults, serve

    try:
        config = parse_faults(faults) if faults else None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    serve(host, port, ledger, config)


def register(cli: click.Group) -> None:
    cli.add_command(sandbox)
    for module, name in (
        ("agentledger.cli.example", "example"),
        ("agentledger.cli.demo", "demo"),
        ("agentledger.cli.bench", "bench"),
    ):
        try:
            mod = __import__(module, fromlist=[name])
        except ImportError:
            continue
        cli.add_command(getattr(mod, name))
