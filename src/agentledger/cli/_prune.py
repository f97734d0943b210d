"""`agentledger prune`: retention of finished runs (docs/architecture.md, "Retention")."""

from __future__ import annotations

from typing import Any

import click

from agentledger import _prune as pruning
from agentledger.cli import _features  # noqa: F401  # the audit chain it prunes
from agentledger.cli._common import db_option, json_option, print_json, run_async, with_store
from agentledger.cli._keys import parse_duration
from agentledger.errors import UsageError
from agentledger.store import Store
from agentledger.store._queries import retention
from agentledger.store._queries.retention import Policy, Removed


@click.command("prune")
@click.option("--older-than", default=None, help="Remove runs finished longer ago: 90d, 12h, 30m.")
@click.option(
    "--status",
    "statuses",
    default=",".join(retention.DEFAULT_STATUSES),
    show_default=True,
    help="Comma-separated terminal statuses to remove (completed, failed, cancelled, "
    "expired, needs_human).",
)
@click.option("--tenant", default=None, help="Only this tenant (default: every tenant).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option(
    "--set-retention",
    nargs=2,
    default=None,
    metavar="TENANT AGE",
    help="Configure TENANT's retention (with --status), used by `prune` without "
    "--older-than and by `worker --prune-every`.",
)
@click.option(
    "--unset-retention", default=None, metavar="TENANT", help="Remove TENANT's retention."
)
@click.option("--show-retention", is_flag=True, help="List the configured retentions.")
@db_option
@json_option
@run_async
async def prune(
    older_than: str | None,
    statuses: str,
    tenant: str | None,
    dry_run: bool,
    set_retention: tuple[str, str] | None,
    unset_retention: str | None,
    show_retention: bool,
    db: str,
    as_json: bool,
) -> None:
    """Remove finished runs with their journal, events, outbox rows and effects, in
    small transactions. Never a run that is not finished, an outcome not settled, a
    delivery or approval pending, or an audit record the chain still needs: the front
    of each tenant's audit chain is replaced by a summary signed under
    AGENTLEDGER_AUDIT_KEY, and `agentledger audit verify` still checks the rest. Without
    --older-than, each tenant's configured retention applies."""
    wanted = tuple(s.strip() for s in statuses.split(",") if s.strip())
    if set_retention is not None:
        t, age = set_retention
        policy = Policy(t, parse_duration(age, "--set-retention"), wanted)

        async def put(store: Store) -> None:
            await store.transact(retention.set_policy, policy)

        await with_store(db, put)
        click.echo(f"tenant {t}: runs {', '.join(wanted)} older than {age} are pruned")
        return
    if unset_retention is not None:
        t2 = unset_retention

        async def drop(store: Store) -> bool:
            return await store.transact(retention.unset_policy, t2)

        if not await with_store(db, drop):
            raise UsageError(f"tenant {t2} has no retention; list them with --show-retention")
        click.echo(f"tenant {t2}: retention removed")
        return
    if show_retention:

        async def show(store: Store) -> list[Policy]:
            return await store.read(retention.policies)

        for p in await with_store(db, show):
            click.echo(f"{p.tenant_id}\t{p.older_than:g}s\t{','.join(p.statuses)}")
        return

    async def go(store: Store) -> list[Removed]:
        if older_than is None:
            policies = await store.read(retention.policies)
            if tenant is not None:
                policies = [p for p in policies if p.tenant_id == tenant]
            if not policies:
                raise UsageError(
                    "no retention configured"
                    + (f" for tenant {tenant}" if tenant else "")
                    + ": give --older-than AGE, or configure one with --set-retention TENANT AGE"
                )
        else:
            age = parse_duration(older_than, "--older-than")
            tenants = (
                [tenant] if tenant is not None else await store.read(retention.chained_tenants)
            )
            policies = [Policy(t, age, wanted) for t in tenants]
        return [await pruning.prune_tenant(store, p, dry_run=dry_run) for p in policies]

    if older_than is not None:
        # Refused before the database is opened.
        Policy(tenant or "?", parse_duration(older_than, "--older-than"), wanted)
    done = await with_store(db, go)
    if as_json:
        print_json([_as_dict(r, dry_run) for r in done])
    else:
        _say(done, dry_run)
    if any(r.broken for r in done):
        # What it removed stands; what failed verification was left for `audit verify`.
        raise SystemExit(1)


def _say(done: list[Removed], dry_run: bool) -> None:
    verb = "would remove" if dry_run else "removed"
    for r in done:
        rows = ", ".join(f"{n} {table}" for table, n in sorted(r.rows.items()) if n)
        click.echo(
            f"tenant {r.tenant_id}: {verb} {r.runs} runs and {r.records} audit records"
            + (f" ({rows})" if rows else "")
        )
        if r.stopped:
            click.echo(f"tenant {r.tenant_id}: stopped: {r.stopped}", err=True)


def _as_dict(r: Removed, dry_run: bool) -> dict[str, Any]:
    return {
        "tenant_id": r.tenant_id,
        "dry_run": dry_run,
        "runs": r.runs,
        "records": r.records,
        "rows": r.rows,
        "stopped": r.stopped,
        "broken": r.broken,
    }
