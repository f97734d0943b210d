"""`agentledger audit RUN_ID`, `audit verify` and `audit checkpoint`: the audit trail."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from agentledger import _auditkey as auditkey
from agentledger.cli._common import db_option, json_option, print_json, run_async, with_store
from agentledger.errors import UsageError
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from agentledger.store._tx import Tx


@click.command("audit")
@click.argument("target")
@click.option("--tenant", default=None, help="verify, checkpoint: only this tenant's chain.")
@click.option("--no-seal", is_flag=True, help="verify, checkpoint: do not seal new events first.")
@click.option(
    "--max-unsealed-age",
    type=click.FloatRange(min=0),
    default=None,
    help="verify: also exit 1 when a record has waited longer than this many seconds to be "
    "sealed (no sealer running: start a worker or `agentledger serve`).",
)
@click.option(
    "--since-checkpoint",
    "since",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="verify: also exit 1 when a chain lost or changed what this checkpoint (from "
    "`agentledger audit checkpoint`) recorded: a cut tail, a rewritten chain, a deleted "
    "tenant.",
)
@click.option(
    "--require-signed",
    is_flag=True,
    help=f"verify: exit 1 when {auditkey.ENV} is not set (the signatures cannot be checked).",
)
@db_option
@json_option
@run_async
async def audit(
    target: str,
    tenant: str | None,
    no_seal: bool,
    max_unsealed_age: float | None,
    since: Path | None,
    require_signed: bool,
    db: str,
    as_json: bool,
) -> None:
    """TARGET is a run id (print its audit records), `verify` (check every tenant's hash
    chain and, with AGENTLEDGER_AUDIT_KEY set, its signatures; exit 1 naming the first
    tampered record and every run whose records are gone) or `checkpoint` (verify, then
    print every tenant's signed head as JSON, to keep outside the database for
    `verify --since-checkpoint`), or `sign-unsigned` (sign, under AGENTLEDGER_AUDIT_KEY,
    the records sealed before it was set, once their chain is verified: you vouch for
    them as they are). Records not sealed yet are reported apart (how many,
    the oldest's age): they are not protected by the chain."""
    if target == "verify":
        await _verify(db, tenant, not no_seal, max_unsealed_age, since, require_signed, as_json)
    elif target == "checkpoint":
        await _checkpoint(db, tenant, not no_seal)
    elif target == "sign-unsigned":
        await _sign_unsigned(db, tenant)
    else:
        await _show(db, target, as_json)


@dataclass
class _Report:
    sealed: int
    checked: int
    broken: list[service_audit.Broken]
    missing_runs: list[tuple[str, str]]
    moved_runs: list[tuple[str, str | None, str]]
    unsealed: int
    oldest: float | None
    heads: list[dict[str, Any]]
    redacted: int = 0
    pruned: list[dict[str, Any]] | None = None  # each tenant's pruned-span summary


async def _check(
    db: str,
    tenant: str | None,
    seal: bool,
    key: auditkey.AuditKey | None,
    since: list[dict[str, Any]] | None,
) -> _Report:
    """Seal (when asked), then verify the chains, the runs' records and a checkpoint."""

    async def go(store: Store) -> _Report:
        sealed = await store.transact(service_audit.seal) if seal else 0

        def read(tx: Tx) -> _Report:
            checked, broken = service_audit.verify_chain(tx, tenant, key)
            if since is not None:
                broken += service_audit.against_checkpoint(tx, since, key)
            missing = service_audit.runs_without_records(tx, tenant)
            moved = service_audit.runs_in_other_chains(tx, tenant)
            unsealed, oldest = service_audit.unsealed_tail(tx, tenant)
            heads = service_audit.checkpoint(tx, tenant)
            redacted = service_audit.redacted_count(tx, tenant)
            pruned = service_audit.pruned_summaries(tx, tenant)
            return _Report(
                sealed,
                checked,
                broken,
                missing,
                moved,
                unsealed,
                oldest,
                heads,
                redacted,
                pruned,
            )

        return await store.read(read)

    return await with_store(db, go)


def _print_problems(report: _Report) -> None:
    for b in report.broken:
        where = f" event {b.event_id} (run {b.run_id}, seq {b.seq})" if b.event_id else ""
        click.echo(
            f"TAMPERED: tenant {b.tenant_id}, record {b.chain_no}{where}: {b.reason}", err=True
        )
    for run_id, run_tenant in report.missing_runs:
        click.echo(
            f"TAMPERED: run {run_id} (tenant {run_tenant}) has no audit records (deleted)",
            err=True,
        )
    for run_id, now_under, chained in report.moved_runs:
        click.echo(
            f"TAMPERED: run {run_id} (tenant {now_under}) has its audit records in tenant "
            f"{chained}'s chain (moved between tenants)",
            err=True,
        )


async def _verify(
    db: str,
    tenant: str | None,
    seal: bool,
    max_age: float | None,
    since: Path | None,
    require_signed: bool,
    as_json: bool,
) -> None:
    key = auditkey.configured()
    saved = _read_checkpoint(since, key) if since is not None else None
    report = await _check(db, tenant, seal, key, saved)
    age = max(0.0, time.time() - report.oldest) if report.oldest is not None else None
    stale = max_age is not None and age is not None and age > max_age
    failed = bool(report.broken or report.missing_runs or report.moved_runs or stale)
    if as_json:
        print_json(
            {
                "sealed": report.sealed,
                "checked": report.checked,
                "signatures_checked_with": key.key_id if key is not None else None,
                "broken": [b.__dict__ for b in report.broken],
                "runs_without_records": [
                    {"run_id": r, "tenant_id": t} for r, t in report.missing_runs
                ],
                "runs_in_other_chains": [
                    {"run_id": r, "tenant_id": t, "chain_tenant_id": c}
                    for r, t, c in report.moved_runs
                ],
                "unsealed": {"count": report.unsealed, "oldest_age_seconds": age},
                "redacted": report.redacted,
                "pruned": [
                    {
                        "tenant_id": p["tenant_id"],
                        "records": int(p["records"]),
                        "runs": int(p["runs"]),
                        "through": int(p["last_chain_no"]),
                        "signed_by": auditkey.signer_of(p["sig"]) if p["sig"] else None,
                    }
                    for p in report.pruned or []
                ],
            }
        )
    else:
        counts = f"{report.checked} records checked ({report.sealed} newly sealed)"
        if failed:
            pass  # the problems are printed below, and no summary claims otherwise
        elif key is not None:
            click.echo(f"audit chain intact: {counts}; signatures verified with key id "
                       f"{key.key_id}")  # fmt: skip
        else:
            click.echo(
                f"audit chain consistent, but UNSIGNED: {counts}; anyone who can write the "
                f"database could have rewritten it: set {auditkey.ENV} (every sealer and "
                "this command) to sign and check the seals"
            )
        if report.redacted:
            vouched = (
                "each redaction's signature verified"
                if key is not None and not failed
                else "their erased data is vouched for only by a redaction signature, "
                f"checked with {auditkey.ENV}"
            )
            click.echo(
                f"{report.redacted} records had a forgotten user's text erased "
                f"(`memory forget`): {vouched}"
            )
        if report.pruned:
            records = sum(int(p["records"]) for p in report.pruned)
            runs = sum(int(p["runs"]) for p in report.pruned)
            if failed:
                how = "see the problems below"
            elif key is not None:
                how = f"summary signed, verified with key id {key.key_id}"
            else:
                how = f"summary unsigned: set {auditkey.ENV} to check it"
            click.echo(
                f"{records} records pruned ({runs} runs, `agentledger prune`) from the front "
                f"of {len(report.pruned)} tenants' chains ({how}); the chains go on from "
                "their summaries"
            )
        if report.unsealed:
            click.echo(
                f"not sealed yet (not covered by the chain): {report.unsealed} records, the "
                f"oldest written {age:.1f} s ago"
            )
        _print_problems(report)
        if stale:
            click.echo(
                f"the oldest unsealed record is {age:.1f} s old (over --max-unsealed-age "
                f"{max_age:g}): is a worker or `agentledger serve` running on this database?",
                err=True,
            )
        if require_signed and key is None:
            click.echo(f"--require-signed: set {auditkey.ENV} to check signatures", err=True)
    if failed or (require_signed and key is None):
        sys.exit(1)


async def _checkpoint(db: str, tenant: str | None, seal: bool) -> None:
    key = auditkey.configured()
    report = await _check(db, tenant, seal, key, None)
    if report.broken or report.missing_runs or report.moved_runs:
        _print_problems(report)
        click.echo("no checkpoint taken: the chain is broken (see above)", err=True)
        sys.exit(1)
    if key is None:
        click.echo(
            f"warning: {auditkey.ENV} is not set: this checkpoint's heads are unsigned",
            err=True,
        )
    print_json(
        {
            "format": service_audit.CHECKPOINT_FORMAT,
            "taken_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "key_id": key.key_id if key is not None else None,
            "heads": report.heads,
        }
    )


async def _sign_unsigned(db: str, tenant: str | None) -> None:
    key = auditkey.configured()
    if key is None:
        raise UsageError(f"set {auditkey.ENV} to the key the sealers use, then run this again")

    async def go(store: Store) -> tuple[list[tuple[str, int]], list[str]]:
        def unsigned(tx: Tx) -> list[str]:
            where = "" if tenant is None else " AND tenant_id = :t"
            # A tenant pruned whole has no records left, only its unsigned summary.
            rows = tx.fetchall(
                "SELECT tenant_id FROM events WHERE chain_no IS NOT NULL "
                f"AND sig IS NULL{where} UNION SELECT tenant_id FROM audit_pruned "
                f"WHERE sig IS NULL{where} ORDER BY tenant_id", {"t": tenant},
            )  # fmt: skip
            return [str(r["tenant_id"]) for r in rows]

        # One transaction per tenant: a tenant refused does not undo (nor hide) the
        # tenants signed before it.
        done, refused = [], []
        for t in await store.read(unsigned):
            try:
                n = await store.transact(service_audit.sign_unsigned, t, key)
            except UsageError as exc:
                refused.append(str(exc))
            else:
                done.append((t, n))
        return done, refused

    done, refused = await with_store(db, go)
    for t, n in done:
        click.echo(f"tenant {t}: signed {n} records with key id {key.key_id}")
    for why in refused:
        click.echo(f"refused: {why}", err=True)
    if refused:
        sys.exit(1)
    if not done:
        click.echo("no unsigned records")


def _read_checkpoint(path: Path, key: auditkey.AuditKey | None) -> list[dict[str, Any]]:
    """The heads of the checkpoint at ``path``; :class:`UsageError` saying what is wrong
    with a file that is not one (nothing is read from the database first)."""

    def refuse(why: str) -> UsageError:
        return UsageError(
            f"{path} is not an audit checkpoint ({why}); take one with "
            "`agentledger audit checkpoint --db URL > FILE`"
        )

    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise refuse(str(exc).splitlines()[0]) from None
    if not isinstance(saved, dict) or saved.get("format") != service_audit.CHECKPOINT_FORMAT:
        raise refuse(f'no "format": "{service_audit.CHECKPOINT_FORMAT}"')
    heads = saved.get("heads")
    if not isinstance(heads, list):
        raise refuse("no list of heads")
    for h in heads:
        if not (
            isinstance(h, dict)
            and isinstance(h.get("tenant_id"), str)
            and type(h.get("chain_no")) is int
            and 0 < h["chain_no"] < 2**63
            and isinstance(h.get("hash"), str)
            and isinstance(h.get("sig"), str | None)
        ):
            raise refuse(f"a head is not tenant_id, chain_no (1 or more), hash, sig: {h!r:.200}")
    signer = saved.get("key_id")
    if key is not None and signer is not None and signer != key.key_id:
        raise UsageError(
            f"{path} was taken under key id {signer}, but {auditkey.ENV} is key id "
            f"{key.key_id}: verify with the key the sealers use"
        )
    return heads


async def _show(db: str, run_id: str, as_json: bool) -> None:
    async def go(store: Store) -> tuple[str | None, list[dict[str, object]]]:
        run = await store.get_run(run_id)
        if run is None:
            return None, []
        tenant = run.tenant_id
        records = await store.read(service_audit.audit_records, tenant, run_id, 0, 100_000)
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
