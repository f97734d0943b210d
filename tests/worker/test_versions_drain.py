"""A deploy that drains the old version (docs/architecture.md, "Versions"): v2's worker
starts beside v1's, `versions` shows each version's runs and workers, v1's worker started
with --exit-when-drained leaves once v1 has no run left (not before), and a v1 run left
with no worker is flagged. Real worker subprocesses of two app versions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentledger.cli._routing import LIVE_WITHIN
from agentledger.records import RunStatus
from tests.cli.helpers import cli_here
from tests.engine.helpers import APP, APP_V2, Env, wait_for


def _versions(env: Env) -> dict[str, dict[str, Any]]:
    done = cli_here("versions", "--json", "--db", env.url)
    assert done.returncode == 0, done.stderr
    return {r["target"]: r for r in json.loads(done.stdout)}


def _serving(env: Env, target: str, n: int) -> dict[str, dict[str, Any]]:
    def live() -> bool:
        workers = env._store(lambda s: s.list_workers(live_within=LIVE_WITHIN))
        return sum(target in w.targets for w in workers) == n

    # Waited for in the store (a query, not a process per look), then read with the
    # command itself.
    wait_for(live, 30, f"{n} live worker(s) of {target} in the store")

    def check() -> dict[str, dict[str, Any]]:
        found = _versions(env)
        return found if len(found.get(target, {}).get("workers", [])) == n else {}

    return wait_for(check, 30, f"{n} live worker(s) of {target}")


@pytest.mark.long
def test_old_version_drains_and_a_version_left_without_workers_is_flagged(
    backend_env: Env,
) -> None:
    env = backend_env
    flag = env.hold_flag("v1")
    held = {"hold": {"item": "v1", "phase": "after_started", "flag": str(flag)}}
    run_id = env.submit("versioned", held, version="1")
    old = env.start_worker(app=APP, extra=("--exit-when-drained",))
    env.wait_marker(flag)  # v1's run is in flight on the old worker
    new = env.start_worker(app=APP_V2)
    found = _serving(env, "versioned@2", 1)

    v1, v2 = found["versioned@1"], found["versioned@2"]
    assert v1["runs"] == {"running": 1} and len(v1["workers"]) == 1 and v1["flag"] is None
    assert v2["runs"] == {} and v2["flag"] is None
    table = cli_here("versions", "--db", env.url)
    assert table.returncode == 0 and "versioned@1" in table.stdout and "versioned@2" in table.stdout
    # Not drained while its run is in flight: the old worker still serves v1.
    assert old.poll() is None

    # New runs go to v2 (the newest version a live worker has).
    submitted = cli_here("submit", "versioned", "--db", env.url)
    assert submitted.returncode == 0, submitted.stderr
    new_run = submitted.stdout.strip()
    assert env.wait_status(new_run, RunStatus.COMPLETED).version == "2"

    flag.unlink()
    env.wait_status(run_id, RunStatus.COMPLETED)
    assert old.wait(timeout=60) == 0  # drained: v1 has no run left
    assert "drained" in env.worker_log(1)

    # A v1 run queued after v1's last worker left waits, and is flagged.
    late = env.submit("versioned", {}, version="1")
    found = _versions(env)
    assert found["versioned@1"]["workers"] == []
    assert found["versioned@1"]["runs"].get("queued") == 1
    assert "no live worker" in (found["versioned@1"]["flag"] or "")
    assert found["versioned@2"]["flag"] is None
    assert "no live worker" in cli_here("versions", "--db", env.url).stdout
    assert env.run(late).status == RunStatus.QUEUED
    assert new.poll() is None


def test_a_draining_worker_waits_for_a_parked_run(env: Env) -> None:
    """A run of its version parked for later (not due now) keeps the worker: drained
    means no run left at all, unlike --burst."""
    run_id = env.submit("versioned", {}, version="1")
    # Park it: waiting, due in an hour.
    env._store(
        lambda s: s._call(
            lambda tx: tx.execute(
                f"UPDATE runs SET status = 'waiting', available_at = {s.dialect.now_sql} + 3600 "
                "WHERE id = :id",
                {"id": run_id},
            )
        )
    )
    worker = env.start_worker(app=APP, extra=("--exit-when-drained",))
    wait_for(lambda: "started" in env.worker_log(1), 30, "the worker to start")
    _serving(env, "versioned@1", 1)
    assert worker.poll() is None  # a parked run of its version is left: it stays
    env._store(lambda s: s.cancel_run(run_id, "deploy done", "test"))
    assert worker.wait(timeout=60) == 0
    assert env.run(run_id).status == RunStatus.CANCELLED


def test_a_version_the_new_workers_also_serve_does_not_hold_the_old_worker(env: Env) -> None:
    """Only `versioned` changed in the deploy; `quick@1` is in both apps. A parked
    quick@1 run is the new worker's to take: the draining old worker leaves. Two draining
    old workers never leave on each other's word while an old-only run is left."""
    shared = "tests.apps.engine_app_v2_shared:app"
    parked = env.submit("quick", {"n": 1}, version="1")
    env._store(
        lambda s: s._call(
            lambda tx: tx.execute(
                f"UPDATE runs SET status = 'waiting', available_at = {s.dialect.now_sql} + 3600 "
                "WHERE id = :id",
                {"id": parked},
            )
        )
    )
    flag = env.hold_flag("v1")
    held = {"hold": {"item": "v1", "phase": "after_started", "flag": str(flag)}}
    old_only = env.submit("versioned", held, version="1")
    first = env.start_worker(app=APP, extra=("--exit-when-drained",))
    env.wait_marker(flag)
    second = env.start_worker(app=APP, extra=("--exit-when-drained",))
    _serving(env, "versioned@1", 2)
    new = env.start_worker(app=shared)
    _serving(env, "quick@1", 3)
    # The draining one idle (not holding the run) stays: versioned@1 still has a run.
    assert first.poll() is None and second.poll() is None
    flag.unlink()
    env.wait_status(old_only, RunStatus.COMPLETED)
    assert first.wait(timeout=60) == 0 and second.wait(timeout=60) == 0
    assert env.run(parked).status == RunStatus.WAITING  # left for the new worker
    assert new.poll() is None
