"""Unknown outcomes, retry classes, budgets, policies, server args, outbox, versions."""

from __future__ import annotations

import json
import time

import pytest

from agentledger.records import RunStatus, StepStatus
from tests.apps import ledger
from tests.cli.helpers import cli_here
from tests.engine.helpers import Env, tool_steps, wait_for

pytestmark = pytest.mark.slow


def _one(env: Env, tool: str, **args: object) -> str:
    return env.submit("one_call", {"tool": tool, "args": args})


def _key(env: Env, run_id: str, tool: str) -> str:
    (step,) = tool_steps(env.journal(run_id), tool)
    assert step.idempotency_key
    return step.idempotency_key


# unknown outcomes ------------------------------------------------------------------


def test_unknown_outcomes(env: Env) -> None:
    after = _one(env, "timeout_write", item="a", phase="after")
    before = _one(env, "timeout_write", item="b", phase="before")
    guarded = _one(env, "guarded_write", item="g", sleep_after=3.0)
    nocheck = _one(env, "keyed_nocheck", item="n")
    env.start_worker()
    # (1) timed out after the effect: the status check finds it; no second call.
    env.wait_status(after, RunStatus.COMPLETED)
    key = _key(env, after, "timeout_write")
    assert env.effects("tw")[key] == 1 and env.calls("tw")[key] == 1
    # (2) timed out before the effect: not found, called again with the same key.
    env.wait_status(before, RunStatus.COMPLETED)
    key = _key(env, before, "timeout_write")
    assert env.effects("tw")[key] == 1 and env.calls("tw")[key] == 1
    # (3) no keys, no status check: needs_human after exactly one call.
    run = env.wait_status(guarded, RunStatus.NEEDS_HUMAN)
    assert "status check" in (run.handover_reason or "")
    key = _key(env, guarded, "guarded_write")
    assert env.calls("guarded") == {key: 1}
    assert env.effects("guarded") == {key: 1}
    # provider keys without a status check: the same key again; the provider dedupes.
    env.wait_status(nocheck, RunStatus.COMPLETED)
    key = _key(env, nocheck, "keyed_nocheck")
    assert env.effects("nocheck") == {key: 1} and env.calls("nocheck") == {key: 2}


# retry by failure class ----------------------------------------------------------------


def test_retry_classes(env: Env) -> None:
    cases = {
        "429_after": (
            dict(mode="rate_limited", fail_first=1, retry_after=1.0),
            RunStatus.COMPLETED,
            2,
        ),
        "429_exhausted": (
            dict(mode="rate_limited", fail_first=10, retry_after=0.05),
            RunStatus.FAILED,
            4,
        ),
        "5xx_twice": (dict(mode="provider_error", fail_first=2), RunStatus.COMPLETED, 3),
        "5xx_thrice": (dict(mode="provider_error", fail_first=3), RunStatus.FAILED, 3),
        "refused": (dict(mode="refused", fail_first=5), RunStatus.FAILED, 1),
        "business": (dict(mode="business_error", fail_first=5), RunStatus.FAILED, 1),
    }
    ids = {
        name: _one(env, "flaky_write", item=name, **args) for name, (args, _, _) in cases.items()
    }
    read_once = _one(env, "flaky_read", item="r1", fail_first=1)
    read_twice = _one(env, "flaky_read", item="r2", fail_first=2)
    env.start_worker()
    for name, (_, status, n_calls) in cases.items():
        env.wait_status(ids[name], status)
        key = _key(env, ids[name], "flaky_write")
        total = env.calls("flaky").get(key, 0)
        assert total == n_calls, name
        assert env.effects("flaky").get(key, 0) == (1 if status == RunStatus.COMPLETED else 0)
    times = env.call_times(_key(env, ids["429_after"], "flaky_write"))
    assert times[1] - times[0] >= 1.0  # Retry-After honoured
    (failed_429,) = tool_steps(env.journal(ids["429_exhausted"]), "flaky_write")
    assert failed_429.status == StepStatus.FAILED and failed_429.error_class == "rate_limited"
    # A read's timeout is retried once (reads are not journaled with a key).
    env.wait_status(read_once, RunStatus.COMPLETED)
    assert sum(n for k, n in env.calls("flaky_read").items() if read_once in k) == 2
    env.wait_status(read_twice, RunStatus.FAILED)
    assert sum(n for k, n in env.calls("flaky_read").items() if read_twice in k) == 2


def test_long_retry_after_parks_the_run(env: Env) -> None:
    parked = _one(env, "flaky_write", item="p", mode="rate_limited", fail_first=1, retry_after=3.0)
    env.start_worker(concurrency=1)
    run = env.wait_status(parked, RunStatus.WAITING)
    assert run.available_at is not None and run.available_at > time.time()
    assert run.lease_owner is None
    # The only slot of the worker is free meanwhile.
    other = _one(env, "read_tool", x="meanwhile")
    env.wait_status(other, RunStatus.COMPLETED)
    assert env.run(parked).status == RunStatus.WAITING
    env.wait_status(parked, RunStatus.COMPLETED)
    key = _key(env, parked, "flaky_write")
    times = env.call_times(key)
    assert len(times) == 2 and times[1] - times[0] >= 3.0
    assert env.effects("flaky") == {key: 1}


# the agent loop ----------------------------------------------------------------------


def _tool_message(env: Env, run_id: str, step_no: int) -> str:
    step = {s.step_no: s for s in env.journal(run_id)}[step_no]
    return json.dumps(step.output) + (step.error or "")


def test_invalid_arguments_fed_back_once_then_needs_human(env: Env) -> None:
    once = env.submit(
        "scripted", {"turns": [{"calls": [["read_tool", {"wrong": 1}]]}, {"text": "$echo"}]}
    )
    twice = env.submit(
        "scripted",
        {"turns": [{"calls": [["read_tool", "{not json"]]}, {"calls": [["teleport", {}]]}]},
    )
    env.start_worker()
    run = env.wait_status(once, RunStatus.COMPLETED)
    journal = env.journal(once)
    assert journal[1].status == StepStatus.FAILED
    assert journal[1].error_class == "invalid_arguments"
    # The second model turn saw the error in the tool message.
    assert "invalid_arguments" in run.result["answer"]
    assert "invalid_arguments" in journal[2].output["message"]["content"]
    run = env.wait_status(twice, RunStatus.NEEDS_HUMAN)
    assert "invalid" in (run.handover_reason or "")
    assert env.calls("read") == {}


def test_model_refusal_fails_the_run(env: Env) -> None:
    run_id = env.submit("scripted", {"turns": [{"refusal": "I can't help with that."}]})
    env.start_worker()
    run = env.wait_status(run_id, RunStatus.FAILED)
    assert "refused" in (run.error or "")


def test_budgets(env: Env) -> None:
    looping = env.submit("budget_steps", {"loop": ["read_tool", {"x": "a"}]})
    # The read would last 30 s, and its own timeout is 10 s: the time budget (1 s) cut it
    # if it lasted less than 8 s, a margin no stall of a loaded machine uses up (the
    # bound was 3 s, with 2 s over the budget).
    deadline = env.submit(
        "budget_time", {"turns": [{"calls": [["slow_read", {"seconds": 30}]]}, {"text": "never"}]}
    )
    tokens = env.submit("budget_tokens", {"turns": [{"calls": [["read_tool", {"x": "t"}]]}]})
    spend = env.submit("budget_spend", {"turns": [{"calls": [["read_tool", {"x": "s"}]]}]})
    env.start_worker()
    for run_id, words in (
        (looping, "step budget"),
        (deadline, "time budget"),
        (tokens, "token budget"),
        (spend, "spend budget"),
    ):
        run = env.wait_status(run_id, RunStatus.NEEDS_HUMAN)
        assert words in (run.handover_reason or ""), run
        assert run.error and "Traceback" not in run.error and "\n" not in run.error
        assert "budget" not in run.error  # the end user gets a clean message
    assert env.run(looping).step_count == 6
    (slow,) = tool_steps(env.journal(deadline), "slow_read")
    assert slow.status == StepStatus.FAILED and slow.error_class == "timeout"
    assert slow.duration_ms is not None and slow.duration_ms < 8000


def test_server_computed_argument(env: Env) -> None:
    run_id = env.submit(
        "scripted",
        {"turns": [{"calls": [["charge", {"order": "o1", "amount": 1}]]}, {"text": "charged"}]},
    )
    env.start_worker()
    env.wait_status(run_id, RunStatus.COMPLETED)
    (step,) = tool_steps(env.journal(run_id), "charge")
    assert step.input["args"] == {"order": "o1", "amount": 4200}
    assert step.input["ignored_model_args"] == {"amount": 1}
    (effect,) = ledger.effects(env.ledger, kind="charge")
    assert effect["payload"] == {"order": "o1", "amount": 4200}
    assert any(e.type == "tool.server_args_overridden" for e in env.events(run_id))


def test_policies_deny_and_approval(env: Env) -> None:
    denied = env.submit(
        "scripted",
        {
            "deny": ["keyed_write"],
            "turns": [{"calls": [["keyed_write", {"item": "d"}]]}, {"text": "$echo"}],
        },
    )
    approved = env.submit(
        "scripted",
        {
            "approve": ["keyed_write"],
            "turns": [{"calls": [["keyed_write", {"item": "a"}]]}, {"text": "$echo"}],
        },
    )
    rejected = env.submit(
        "scripted",
        {
            "approve": ["keyed_write"],
            "turns": [{"calls": [["keyed_write", {"item": "r"}]]}, {"text": "$echo"}],
        },
    )
    env.start_worker()
    run = env.wait_status(denied, RunStatus.COMPLETED)
    assert "not_allowed" in run.result["answer"]
    (step,) = tool_steps(env.journal(denied), "keyed_write")
    assert step.status == StepStatus.FAILED
    for run_id, verb in ((approved, "approve"), (rejected, "reject")):
        env.wait_status(run_id, RunStatus.WAITING)
        (approval,) = env.approvals(run_id)
        assert approval.tool == "keyed_write" and approval.decision is None
        result = cli_here("approvals", verb, approval.id, "--by", "alice", "--db", env.url)
        assert result.returncode == 0, result.stderr
    run = env.wait_status(approved, RunStatus.COMPLETED)
    key = _key(env, approved, "keyed_write")
    assert env.effects("keyed") == {key: 1}
    run = env.wait_status(rejected, RunStatus.COMPLETED)
    assert "rejected by alice" in run.result["answer"]


def test_outbox_row_commits_with_the_step_and_is_delivered_once(env: Env) -> None:
    run_id = env.submit("notify_flow", {"msg": "hi"})
    env.start_worker()
    env.wait_status(run_id, RunStatus.COMPLETED)
    (step,) = tool_steps(env.journal(run_id), "notify")
    assert step.status == StepStatus.SUCCEEDED and step.output["queued"] is True
    (row,) = env.outbox()
    assert (row.run_id, row.step_no, row.key) == (run_id, step.step_no, step.output["outbox_key"])
    # Once the row is settled ``delivered`` no dispatcher takes it again: count then.
    with env.one_store():
        wait_for(lambda: env.outbox("delivered"), what="outbox row delivered")
    assert env.effects("notify") == {step.output["outbox_key"]: 1}


def test_versions(env: Env) -> None:
    from tests.apps.engine_app_v2 import app as app_v2

    run_id = env.submit("versioned", {}, version="1")
    # A version-2 run queued after it: once the v2 worker has completed that one, it
    # has polled the queue with the v1 run in it (older, so first in line) and left it.
    v2_id = str(env._store(lambda s: app_v2.submit(s, "versioned", {}, version="2")))
    env.start_worker(app="tests.apps.engine_app_v2:app")
    assert env.wait_status(v2_id, RunStatus.COMPLETED).result == {"version": "2"}
    assert env.run(run_id).status == RunStatus.QUEUED
    listed = cli_here("runs", "list", "--json", "--db", env.url)
    assert listed.returncode == 0, listed.stderr
    (row,) = [r for r in json.loads(listed.stdout) if r["id"] == run_id]
    assert row["worker_available"] is False
    env.start_worker()
    run = env.wait_status(run_id, RunStatus.COMPLETED)
    assert run.result == {"version": "1"}


def test_concurrency_20_runs_40_quick_runs(env: Env) -> None:
    ids = [env.submit("quick", {"n": n}) for n in range(40)]
    env.start_worker(concurrency=20)
    for run_id in ids:
        run = env.wait_status(run_id, RunStatus.COMPLETED, timeout=60)
        assert run.lease_owner is None
    assert len(env.effects("keyed")) == 40
    assert set(env.effects("keyed").values()) == {1}
