"""``agentledger sandbox``: StayHub's providers as a local HTTP service."""

from __future__ import annotations

import click

from agentledger.cli._common import check_port_free
from agentledger_examples.stayhub.sandbox.faults import grammar_help


@click.command("sandbox")
@click.option(
    "--port",
    default=8700,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="TCP port to listen on.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Loopback address to listen on (the sandbox refuses any other).",
)
@click.option(
    "--faults",
    default=None,
    help="Faults to inject, e.g. 'payments.create:timeout_after_commit@0.1;seed=7'. "
    + grammar_help(),
)
@click.option("--ledger", default=None, help="SQLite file that keeps the ledger across restarts.")
def sandbox(port: int, host: str, faults: str | None, ledger: str | None) -> None:
    """Run StayHub's providers (hotels, bookings, payments, CRM, email) as a local HTTP
    service, with injected faults; Ctrl-C stops it."""
    from agentledger_examples.stayhub.sandbox import parse_faults, serve
    from agentledger_examples.stayhub.sandbox.server import LOOPBACK_HOSTS

    try:
        config = parse_faults(faults) if faults else None
    except ValueError as exc:
        raise click.UsageError(f"--faults: {exc}") from None
    if host not in LOOPBACK_HOSTS:
        raise click.UsageError(f"--host: the sandbox listens on loopback only, not {host!r}")
    check_port_free(host, port)
    shown = f"[{host}]" if ":" in host else host
    click.echo(
        f"StayHub sandbox on http://{shown}:{port} (faults: {faults or 'none'}); "
        f"GET /faults shows them, Ctrl-C stops it"
    )
    serve(host, port, ledger, config)
