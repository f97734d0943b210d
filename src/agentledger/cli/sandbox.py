"""``agentledger sandbox``: StayHub's providers as a local HTTP service."""

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
    from agentledger.examples.stayhub.sandbox import parse_faults, serve

    try:
        config = parse_faults(faults) if faults else None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    serve(host, port, ledger, config)
