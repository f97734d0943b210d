"""`agentledger runs resume` (continue a failed or needs_human run from its failed
step) and `agentledger outbox retry` (redeliver a dead letter)."""

from __future__ import annotations

import getpass
from typing import Any

import click

from agentledger.cli.common import (
    check_text,
    db_option,
    json_option,
    print_json,
    run_async,
    with_store,
)
from agentledger.errors import UsageError
from agentledger.store import SQLStore
from agentledger.store.queries.observe_resume import ResumePlan, ResumeRefused


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in this environment
        return "cli"


def _describe(plan: ResumePlan, dry_run: bool) -> str:
    steps = ", ".join(f"{s['step_no']} {s['name']} ({s['status']})" for s in plan.reexecute)
    verb = "would resume" if dry_run else "resumed"
    text = f"{verb} {plan.run_id} ({plan.status}) from step {plan.from_step}"
    text += f"; re-executes: {steps}" if steps else "; nothing to re-execute"
    if plan.kept_in_flight:
        text += f"; in flight, settled by status check: {plan.kept_in_flight}"
    if plan.confirmed:
        names = ", ".join(f"{s['step_no']} {s['name']}" for s in plan.confirmed)
        text += f"; CONFIRMED side effects re-executed: {names}"
    return text


@click.command("resume")
@click.argument("run_id", required=False)
@click.option("--from-step", type=int, default=None,
              help="Re-execute from this step on [default: the failed step].")  # fmt: skip
@click.option("--status", type=click.Choice(["failed", "needs_human"]), default=None,
              help="Resume every run in this state (with --agent to narrow it).")  # fmt: skip
@click.option("--agent", default=None, help="With --status: only runs of this agent.")
@click.option("--limit", default=100, show_default=True, help="With --status: at most this many.")
@click.option("--dry-run", is_flag=True, help="Show what would be resumed; change nothing.")
@click.option("--force", is_flag=True,
              help="Re-execute steps whose side effect is confirmed (needs --reason).")  # fmt: skip
@click.option("--reason", default=None, help="Why (recorded in the audit trail).")
@click.option("--actor", default=None, help="Who resumes [default: cli:<user>].")
@db_option
@json_option
@run_async
async def resume(
    run_id: str | None,
    from_step: int | None,
    status: str | None,
    agent: str | None,
    limit: int,
    dry_run: bool,
    force: bool,
    reason: str | None,
    actor: str | None,
    db: str,
    as_json: bool,
) -> None:
    """Continue a failed or needs_human run after a fix, from its failed step (not the
    top). Steps before it replay from the journal; a step whose side effect is
    confirmed is never executed again unless --force --reason R."""
    for value, option in ((run_id, "RUN_ID"), (agent, "--agent"), (reason, "--reason"),
                          (actor, "--actor")):  # fmt: skip
        check_text(value, option, limit=None if option == "--reason" else 200)
    if (run_id is None) == (status is None):
        raise UsageError("give a RUN_ID or --status (with --agent), not both")
    if force and not reason:
        raise UsageError("--force needs --reason: it is recorded in the audit trail")
    if status is not None and from_step is not None:
        raise UsageError("--from-step applies to one run; drop it with --status")
    who = _actor(actor)

    async def go(store: SQLStore) -> list[tuple[str, ResumePlan | str]]:
        ids = [run_id] if run_id else await store.resume_candidates(str(status), agent, limit)
        done: list[tuple[str, ResumePlan | str]] = []
        for rid in ids:
            assert rid is not None
            try:
                if dry_run:
                    done.append((rid, await store.plan_resume(rid, from_step)))
                else:
                    plan = await store.resume_run(rid, from_step, who, reason, force)
                    done.append((rid, plan))
            except ResumeRefused as exc:
                done.append((rid, str(exc)))
        return done

    results = await with_store(db, go)
    refused = [r for r in results if isinstance(r[1], str)]
    if as_json:
        out: list[dict[str, Any]] = []
        for rid, res in results:
            out.append({"run_id": rid, "refused": res} if isinstance(res, str) else res.to_dict())
        print_json(out)
    else:
        for rid, res in results:
            click.echo(f"refused {rid}: {res}" if isinstance(res, str) else _describe(res, dry_run))
        if not results:
            click.echo("no runs to resume")
    if refused and run_id is not None:
        raise SystemExit(1)


@click.command("retry")
@click.argument("key")
@click.option("--actor", default=None, help="Who retries [default: cli:<user>].")
@db_option
@run_async
async def outbox_retry(key: str, actor: str | None, db: str) -> None:
    """Redeliver a dead letter (list them with `agentledger outbox dead`)."""
    check_text(key, "KEY", limit=None)
    done = await with_store(db, lambda s: s.retry_outbox(key, _actor(actor)))
    if not done:
        raise UsageError(f"no dead letter {key!r}; list them with `agentledger outbox dead`")
    click.echo(f"{key} queued for delivery again (a worker or `agentledger outbox` delivers it)")
