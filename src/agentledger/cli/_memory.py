"""``agentledger memory``: what agents remember about users, and forgetting it."""

from __future__ import annotations

import getpass
import time

import click
from rich import box
from rich.table import Table

from agentledger import _auditkey as auditkey
from agentledger.cli._common import (
    check_text,
    db_option,
    json_option,
    print_json,
    run_async,
    with_store,
)
from agentledger.cli._text import cell, console
from agentledger.memory import _queries as memory_facts
from agentledger.store._sqlstore import Store


def default_actor() -> str:
    """Who runs the command, for the audit trail."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in this environment: still audited
        return "cli"


@click.group("memory")
def memory() -> None:
    """Per-user facts agents remember (list, forget)."""


@memory.command("list")
@click.option("--user", "user_id", required=True, help="The user whose facts to show.")
@click.option("--tenant", "tenant_id", default=None, help="Only this tenant [default: all].")
@db_option
@json_option
@run_async
async def list_memory(user_id: str, tenant_id: str | None, db: str, as_json: bool) -> None:
    """List what is remembered about a user."""
    check_text(user_id, "--user")
    check_text(tenant_id, "--tenant")
    facts = await with_store(db, lambda s: s.read(memory_facts.all_facts, tenant_id, user_id))
    if as_json:
        print_json([f.__dict__ for f in facts])
        return
    if not facts:
        click.echo(f"nothing is remembered about {user_id}")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("tenant", "key", "fact", "source run", "updated"):
        table.add_column(header, overflow="fold")
    for f in facts:
        table.add_row(
            cell(f.tenant_id),
            cell(f.fact_key),
            cell(f.fact),
            cell(f.source_run or "-"),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(f.updated_at)),
        )
    console().print(table)


@memory.command("forget")
@click.option("--user", "user_id", required=True, help="The user whose facts to delete.")
@click.option("--key", "fact_key", default=None, help="Only this fact [default: all of them].")
@click.option(
    "--tenant", "tenant_id", default="default", show_default=True, help="The tenant of the user."
)
@click.option("--by", "actor", default=None, help="Who asks (audited) [default: cli:$USER].")
@db_option
@run_async
async def forget(
    user_id: str, fact_key: str | None, tenant_id: str, actor: str | None, db: str
) -> None:
    """Delete what is remembered about a user, and erase the copies of it in the user's
    runs (recorded as an audit event that gives a count and a digest, never a key or a
    fact). Matching nothing is an error that names the tenants where the user has facts."""
    for value, option in ((user_id, "--user"), (fact_key, "--key"), (tenant_id, "--tenant")):
        check_text(value, option)
    who = actor or default_actor()
    check_text(who, "--by")
    # Redactions are signed under the audit key, so `audit verify` with the key tells
    # them from an edit of the records' data.
    key = auditkey.configured()

    async def run(store: Store) -> tuple[memory_facts.Forgotten, list[str]]:
        done = await store.transact(
            memory_facts.forget_facts, tenant_id, user_id, fact_key, who, key
        )
        if done.deleted:
            return done, []
        found = await store.read(memory_facts.tenants_with_facts, user_id)
        return done, found

    done, elsewhere = await with_store(db, run)
    deleted = done.deleted
    what = f"fact {fact_key!r}" if fact_key else "every fact"
    if not deleted:
        where = (
            f"; {user_id} has facts in tenant(s) {', '.join(elsewhere)}: add --tenant"
            if elsewhere
            else ""
        )
        raise click.ClickException(
            f"nothing to forget: no {what} of {user_id} in tenant {tenant_id}{where}"
        )
    click.echo(f"forgot {what} of {user_id} in tenant {tenant_id}: {deleted} deleted")
    if done.undelivered:
        click.echo(
            f"{done.undelivered} outbox deliveries of {user_id}'s runs not made yet still hold "
            "the text (a resend must carry what was queued); run this again once they are "
            "delivered (`agentledger outbox dead` lists those that gave up)"
        )
