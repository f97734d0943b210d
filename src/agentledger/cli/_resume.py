"""`agentledger runs resume` (continue a failed or needs_human run from its failed
step), `agentledger runs settle` (a person's decision on a write whose outcome is
unknown, or on a compensation that failed) and `agentledger outbox retry` (redeliver a
dead letter)."""

from __future__ import annotations

import getpass
from typing import TYPE_CHECKING, Any

import click

from agentledger.cli._common import (
    check_text,
    db_option,
    json_option,
    parse_json_input,
    print_json,
    run_async,
    with_store,
)
from agentledger.errors import StoreError, StoreLocked, StoreUnavailable, UsageError
from agentledger.store import Store
from agentledger.store._queries.common import new_token

if TYPE_CHECKING:
    from agentledger.observe._queries.resume import ResumePlan

# The resume plan (observe/_queries/resume.py) loads the engine's execution; imported by
# the commands that use it, not with the `runs` group (`runs list` never does).


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in this environment
        return "cli"


_STATES = {
    "executed": "EXECUTED",
    "unknown": "UNKNOWN outcome",
    "not_applied": "not applied",
    "failed": "failed (applied nothing)",
    "failed_checked": "failed (it may have applied: asked first)",
    "not_called": "never called",
}


def _describe(plan: ResumePlan, dry_run: bool) -> str:
    """The plan: steps run again, then one line per side effect (state, key, action)."""
    steps = ", ".join(f"{s['step_no']} {s['name']} ({s['status']})" for s in plan.reexecute)
    verb = "would resume" if dry_run else "resumed"
    if dry_run and plan.refused:
        verb = "would refuse to resume"
    text = f"{verb} {plan.run_id} ({plan.status}) from step {plan.from_step}"
    text += f"; re-executes: {steps}" if steps else "; nothing to re-execute"
    for e in plan.effects:
        text += (
            f"\n  {e['step_no']} {e['name']}: {_STATES[e['state']]}, key {e['key']}"
            f" -> {e['action']}"
        )
    if dry_run:
        text += "".join(f"\n  refused: {r}" for r in plan.refused)
        text += "".join(f"\n  needs --force --reason R: {r}" for r in plan.needs_force)
    elif plan.needs_force:
        keys = ", ".join(f"{e['step_no']} {e['name']} key {e['key']}" for e in plan.forced)
        text += f"\n  forced: re-executes confirmed effects {keys}"
    return text


class NotTried(StoreError):
    """A run of a bulk left untried: the store failed the run before it in a way that
    every run after it would meet too."""


async def _answers(store: Store, run_id: str) -> bool:
    """Whether the store still answers a plain read (a lock held on one run's row, or
    a statement cancelled, blocks no read of it)."""
    try:
        await store.get_run(run_id)
    except StoreError:
        return False
    return True


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
              help="Re-execute the confirmed effects the dry run lists (needs --reason; "
                   "recorded in the audit trail with them).")  # fmt: skip
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
    top). Steps before it replay from the journal. Refused while a write from that step
    on has an unknown outcome and no status check (settle it: `runs settle`), and, unless
    --force with --reason, when it would re-execute a confirmed write or compensation
    (submit a new run instead, or force it: the audit trail records who forced it, why,
    and those effects). --dry-run lists every side effect with its key. With --status,
    one line per run (resumed; refused: why and what to do; error), then the counts.
    Exits 1 when any run it was asked to resume was refused or errored."""
    for value, option in ((run_id, "RUN_ID"), (agent, "--agent"), (reason, "--reason"),
                          (actor, "--actor")):  # fmt: skip
        check_text(value, option, limit=None if option == "--reason" else 200)
    if (run_id is None) == (status is None):
        raise UsageError("give a RUN_ID or --status (with --agent), not both")
    if force and not (reason or "").strip():
        raise UsageError(
            "--force needs --reason R: the audit trail records who forced the resume, why, "
            "and the confirmed effects it re-executes"
        )
    if status is not None and from_step is not None:
        raise UsageError("--from-step applies to one run; drop it with --status")
    who = _actor(actor)
    from agentledger.observe._queries import resume as observe_resume
    from agentledger.observe._queries.resume import ResumeNeedsForce, ResumeRefused

    async def go(store: Store) -> list[tuple[str, ResumePlan | str | Exception]]:
        ids = (
            [run_id]
            if run_id
            else await store.read(observe_resume.candidates, str(status), agent, limit)
        )
        done: list[tuple[str, ResumePlan | str | Exception]] = []
        for n, rid in enumerate(ids):
            assert rid is not None
            try:
                if dry_run:
                    done.append((rid, await store.read(observe_resume.plan_resume, rid, from_step)))
                else:
                    # One token per run asked for: a resume committed before its reply
                    # was lost answers its plan when the store runs it again.
                    plan = await store.transact(
                        observe_resume.resume_run, rid, from_step, who, reason, force, new_token()
                    )
                    done.append((rid, plan))
            except ResumeNeedsForce as exc:
                again = f" --from-step {from_step}" if from_step is not None else ""
                done.append(
                    (
                        rid,
                        f"{exc}; to go ahead anyway: `agentledger runs resume {rid}{again} "
                        "--force --reason R`",
                    )
                )
            except ResumeRefused as exc:
                done.append((rid, str(exc)))
            except StoreError as exc:
                # Each run is its own transaction: this one rolled back, the ones before
                # it stand. A bulk goes on with the others and reports every run (a run
                # held by another command must not hide what was already resumed).
                if run_id is not None:
                    raise
                done.append((rid, exc))
                if isinstance(exc, StoreLocked) or (
                    isinstance(exc, StoreUnavailable) and not await _answers(store, rid)
                ):
                    # The store itself is gone, or its one write lock is held (not one
                    # run's row held by another command): every run left would wait as
                    # long in turn, so they are reported as not tried.
                    done.extend((r, NotTried(exc)) for r in ids[n + 1 :] if r is not None)
                    break
        return done

    results = await with_store(db, go)
    refused = [r for r in results if isinstance(r[1], str)]
    failed = [r for r in results if isinstance(r[1], Exception)]

    def error(rid: str, exc: Exception) -> str:
        if isinstance(exc, NotTried):
            return (
                f"not tried, nothing changed for it (the command stopped at the run "
                f"before): {exc}; run the command again"
            )
        return (
            f"not resumed, nothing changed for it: {exc}; look again "
            f"(`agentledger runs show {rid}`), then run the command again"
        )

    if as_json:
        out: list[dict[str, Any]] = []
        for rid, res in results:
            if isinstance(res, str):
                out.append({"run_id": rid, "refused": res})
            elif isinstance(res, Exception):
                out.append({"run_id": rid, "error": error(rid, res)})
            else:
                out.append(res.to_dict())
        print_json(out)
    else:
        for rid, res in results:
            if isinstance(res, str):
                click.echo(f"refused {rid}: {res}")
            elif isinstance(res, Exception):
                click.echo(f"error {rid}: {error(rid, res)}")
            else:
                click.echo(_describe(res, dry_run))
        if not results:
            click.echo("no runs to resume")
        elif run_id is None:
            click.echo(_summary(results, dry_run, force))
    # As a single resume: a run asked for and not resumed fails the command, so a script
    # never reads a bulk that resumed nothing (or only some) as done.
    if failed or refused:
        raise SystemExit(1)


def _summary(
    results: list[tuple[str, ResumePlan | str | Exception]], dry_run: bool, force: bool
) -> str:
    """A bulk resume's counts, after its one line per run."""
    from agentledger.observe._queries.resume import ResumePlan

    refused = sum(1 for _, r in results if isinstance(r, str))
    errors = sum(1 for _, r in results if isinstance(r, Exception))
    plans = [r for _, r in results if isinstance(r, ResumePlan)]
    if dry_run:
        # A plan that lists refusals, or confirmed effects without --force, is refused.
        blocked = sum(1 for p in plans if p.refused or (p.needs_force and not force))
        text = f"dry run: would resume {len(plans) - blocked}, would refuse {refused + blocked}"
    else:
        text = f"resumed {len(plans)}, refused {refused}"
    if errors:
        text += f", errors {errors}"
    if refused or errors:
        text += " (each line above says why, and what to do)"
    return text


@click.command("settle")
@click.argument("run_id")
@click.argument("step_no", type=int)
@click.option("--applied", is_flag=True, help="The provider shows it happened (give --result).")
@click.option("--not-applied", is_flag=True,
              help="The provider shows it did not happen: sent again, same key.")  # fmt: skip
@click.option("--result", "result_json", default=None,
              help="With --applied: the result the provider shows, as JSON.")  # fmt: skip
@click.option("--reason", default=None, help="Why (recorded in the journal and the audit).")
@click.option("--actor", default=None, help="Who decides [default: cli:<user>].")
@db_option
@run_async
async def settle(
    run_id: str,
    step_no: int,
    applied: bool,
    not_applied: bool,
    result_json: str | None,
    reason: str | None,
    actor: str | None,
    db: str,
) -> None:
    """Settle step STEP_NO of RUN_ID, a write whose outcome is unknown or a compensation
    that failed after it was called, after looking at the provider: --applied --result
    JSON (it happened; the run goes on with that result, and a compensation is never
    called again) or --not-applied (it may be sent again with the same key; a failed
    compensation then without a status check). Recorded with who and why in the journal
    and the audit trail; then `agentledger runs resume`."""
    for value, option in ((run_id, "RUN_ID"), (actor, "--actor")):
        check_text(value, option)
    check_text(reason, "--reason", limit=None)
    if applied == not_applied:
        raise UsageError("give one of --applied (with --result JSON) or --not-applied")
    if not reason or not reason.strip():
        raise UsageError("--reason is required: it is recorded in the journal and the audit")
    result = None
    if applied:
        if result_json is None:
            raise UsageError(
                "--applied needs --result JSON: the result the provider shows (later steps "
                """and its compensation read it), e.g. --result '{"id": "po_1"}'"""
            )
        result = parse_json_input(result_json, "--result")
    elif result_json is not None:
        raise UsageError("--result goes with --applied only")
    from agentledger.observe._queries import resume as observe_resume
    from agentledger.observe._queries.resume import ResumeRefused

    try:
        step = await with_store(
            db,
            lambda s: s.transact(
                observe_resume.settle_step, run_id, step_no, applied, result, _actor(actor), reason
            ),
        )
    except ResumeRefused as exc:
        raise UsageError(str(exc)) from None
    what = "applied (succeeded)" if applied else "not applied (sent again with the same key)"
    if not applied and step.kind == "compensation":
        what = "not applied (called again with the same key, without a status check)"
    click.echo(
        f"settled step {step_no} ({step.name}, key {step.idempotency_key}) of {run_id} as "
        f"{what}; continue it with `agentledger runs resume {run_id}`"
    )


@click.command("retry")
@click.argument("key")
@click.option("--actor", default=None, help="Who retries [default: cli:<user>].")
@db_option
@run_async
async def outbox_retry(key: str, actor: str | None, db: str) -> None:
    """Redeliver a dead letter (list them with `agentledger outbox dead`)."""
    check_text(key, "KEY", limit=None)
    # One token per retry asked for: a retry committed before its reply was lost
    # answers done when the store runs it again (the letter is no longer dead then).
    from agentledger.observe._queries import resume as observe_resume

    token = new_token()
    done = await with_store(
        db, lambda s: s.transact(observe_resume.retry_outbox, key, _actor(actor), token)
    )
    if not done:
        raise UsageError(f"no dead letter {key!r}; list them with `agentledger outbox dead`")
    click.echo(f"{key} queued for delivery again (a worker or `agentledger outbox` delivers it)")
