"""`agentledger keys create|list|revoke`: API keys for the HTTP service."""

from __future__ import annotations

import re

import click

from agentledger._extras import require
from agentledger.cli._common import db_option, json_option, print_json, run_async, with_store
from agentledger.errors import UsageError
from agentledger.service._queries import keys as service_keys
from agentledger.store import Store

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, option: str = "--expires-in") -> float:
    """``90d``, ``12h``, ``30m``, ``45s`` -> seconds (``option``: named in the error)."""
    match = re.fullmatch(r"\s*(\d{1,9})\s*([smhd])\s*", text)
    if match is None:
        raise UsageError(f"{option} {text!r}: give a number and a unit, e.g. 90d, 12h, 30m")
    return int(match.group(1)) * _UNITS[match.group(2)]


@click.group("keys")
def keys() -> None:
    """API keys (`al_<id>_<secret>`, sent as `Authorization: Bearer <key>`)."""


@keys.command("create")
@click.option("--tenant", required=True, help="The tenant the key acts in.")
@click.option("--user", required=True, help="The user the key acts as.")
@click.option(
    "--roles", required=True,
    help="Comma-separated: viewer, operator, approver, admin, or a role a policy names.",
)  # fmt: skip
@click.option("--expires-in", default="90d", show_default=True, help="Lifetime: 90d, 12h, 30m.")
@db_option
@run_async
async def create(tenant: str, user: str, roles: str, expires_in: str, db: str) -> None:
    """Create a key and print it ONCE (only an HMAC of it is stored)."""
    # Imported here: the service (FastAPI) loads only for the commands that need it.
    require("service", "agentledger keys create")
    from agentledger.service._auth import create_key
    from agentledger.service._settings import pepper_from_env
    from agentledger.store._queries.approvals import SYSTEM_PREFIX

    if user.strip().startswith(SYSTEM_PREFIX):
        # The system's own deciders (the expiry default, cancel) are named so; a key
        # acting as one could never decide anything (403), so none is minted.
        raise UsageError(f"--user {user!r}: names starting {SYSTEM_PREFIX!r} are reserved")
    pepper = pepper_from_env()
    seconds = parse_duration(expires_in)
    try:
        role_list = [r for r in roles.split(",") if r.strip()]
        from agentledger.service._auth import check_roles

        check_roles(role_list)
    except ValueError as exc:
        raise UsageError(f"--roles: {exc}") from None

    async def go(store: Store) -> tuple[str, dict[str, object]]:
        return await create_key(store, pepper, tenant, user, role_list, seconds)

    key, row = await with_store(db, go, create=True)
    click.echo(key)
    click.echo(
        f"key id {row['id']} for {user} in tenant {tenant}, roles {', '.join(row['roles'])}; "  # type: ignore[arg-type]
        "store it now: it is not shown again.",
        err=True,
    )


@keys.command("list")
@click.option("--tenant", default=None, help="Only this tenant's keys.")
@db_option
@json_option
@run_async
async def list_(tenant: str | None, db: str, as_json: bool) -> None:
    """Keys: id, tenant, user, roles, the last four characters, expiry, revoked."""

    async def go(store: Store) -> list[dict[str, object]]:
        return await store.read(service_keys.list_keys, tenant)

    found = await with_store(db, go)
    if as_json:
        print_json(found)
        return
    for k in found:
        state = "revoked" if k["revoked_at"] else "active"
        click.echo(
            f"{k['id']}  ...{k['last4']}  {k['tenant_id']}  {k['user_id']}  "
            f"{','.join(k['roles'])}  {state}"  # type: ignore[arg-type]
        )


@keys.command("revoke")
@click.argument("key_id")
@db_option
@run_async
async def revoke(key_id: str, db: str) -> None:
    """Revoke a key by id (servers stop accepting it within seconds)."""
    key_id = key_id.split("_")[1] if key_id.startswith("al_") and key_id.count("_") >= 2 else key_id

    async def go(store: Store) -> bool:
        return await store.transact(service_keys.revoke_key, key_id)

    if not await with_store(db, go):
        raise UsageError(f"no key {key_id}; see `agentledger keys list`")
    click.echo(f"revoked {key_id}")


@keys.command("webhook-secret")
@click.option("--tenant", required=True, help="The tenant whose webhooks are signed with it.")
@db_option
@run_async
async def webhook_secret(tenant: str, db: str) -> None:
    """Print the tenant's webhook signing secret (made on first use); receivers verify
    `AgentLedger-Signature` with it (see agentledger.service._webhooks.verify)."""
    from agentledger.service._queries import webhooks as service_webhooks

    async def go(store: Store) -> str:
        return await store.transact(service_webhooks.webhook_secret, tenant)

    click.echo(await with_store(db, go, create=True))
