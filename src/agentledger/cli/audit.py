"""`agentledger audit`: the audit trail of a run, and the chain check."""

from __future__ import annotations

import click


@click.group("audit")
def audit() -> None:
    """The append-only audit trail."""
