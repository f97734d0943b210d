"""`agentledger audit RUN_ID` and `agentledger audit verify`: the audit trail."""

from __future__ import annotations

import sys
import time

import click

from agentledger.cli.common import db_option, json_option, print_json, run_async, with_store
from agentledger.errors import UsageError
from agentledger.store import SQLStore
from agentledger.store.queries import service_audit


@click.command("audit")
@click.argument("target")
@click.option("--tenant", default=None, help="verify: only this tenant's chain.")
@click.option("--no-seal", is_flag=True, help="verify: do not seal new events first.")
@click.option(
    "--max-unsealed-age",
    type=click.FloatRange(min=0),
    default=None,
    help="verify: also exit 1 when a record has waited longer than this many seconds to be "
    "sealed (no sealer running: start a worker or `agentledger serve`).",
)
@db_option
@json_option
@run_async
async def audit(
    target: str,
    tenant: str | None,
    no_seal: bool,
    max_unsealed_age: float | None,
    db: str,
    as_json: bool,
) -> None:
    """TARGET is a run id (print its audit records) or `verify` (check every tenant's
    hash chain; exit 1 naming the first tampered record). Records not sealed yet are
    reported apart (how many, the oldest's age): they are not protected by the chain."""
    if target == "verify":
        await _verify(db, tenant, not no_seal, max_unsealed_age, as_json)
    else:
        await _show(db, target, as_json)


async def _verify(
    db: str, tenant: str | None, seal: bool, max_age: float | None, as_json: bool
) -> None:
    async def go(
        store: SQLStore,
    ) -> tuple[int, int, list[service_audit.Broken], tuple[int, float | None]]:
        sealed = await store.transact(lambda d, c: service_audit.seal(d, c)) if seal else 0
        checked, broken = await store.transact(
            lambda d, c: service_audit.verify_chain(d, c, tenant), write=False
        )
        tail = await store.transact(
            lambda d, c: service_audit.unsealed_tail(d, c, tenant), write=False
        )
        return sealed, checked, broken, tail

    sealed, checked, broken, (unsealed, oldest) = await with_store(db, go)
    age = max(0.0, time.time() - oldest) if oldest is not None else None
    stale = max_age is not None and age is not None and age > max_age
    if as_json:
        print_json(
            {
                "sealed": sealed,
                "checked": checked,
                "broken": [b.__dict__ for b in broken],
                "unsealed": {"count": unsealed, "oldest_age_seconds": age},
            }
        )
    else:
        if not broken:
            click.echo(f"audit chain intact: {checked} records checked ({sealed} newly sealed)")
        if unsealed:
            click.echo(
                f"not sealed yet (not covered by the chain): {unsealed} records, the oldest "
                f"written {age:.1f} s ago"
            )
        for b in broken:
            where = f"event {b.event_id} (run {b.run_id}, seq {b.seq})" if b.event_id else ""
            click.echo(
                f"TAMPERED: tenant {b.tenant_id}, record {b.chain_no} {where}: {b.reason}",
                err=True,
            )
        if stale:
            click.echo(
                f"the oldest unsealed record is {age:.1f} s old (over --max-unsealed-age "
                f"{max_age:g}): is a worker or `agentledger serve` running on this database?",
                err=True,
            )
    if broken or stale:
        sys.exit(1)


async def _show(db: str, run_id: str, as_json: bool) -> None:
    async def go(store: SQLStore) -> tuple[str | None, list[dict[str, object]]]:
        run = await store.get_run(run_id)
        if run is None:
            return None, []
        tenant = run.tenant_id
        records = await store.transact(
            lambda d, c: service_audit.audit_records(d, c, tenant, run_id, 0, 100_000),
            write=False,
        )
        return tenant, records

    tenant, records = await with_store(db, go)
    if tenant is None:
        raise UsageError(f"no run {run_id}; list runs with `agentledger runs list`")
    if as_json:
        print_json(records)
        return
    for r in records:
        sealed = f"#{r['chain_no']}" if r["chain_no"] is not None else "(unsealed)"
        click.echo(f"{r['seq']:>4}  {r['type']:<28} {r['actor']:<24} {sealed}")
