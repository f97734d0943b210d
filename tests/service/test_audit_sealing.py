"""Sealing the audit chain where records are written: in workers (no service running),
by several processes at once without forking or skipping the chain, and what `audit
verify` reports about records not sealed yet."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentledger import _sealer as sealer
from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store
from agentledger.store._queries.events import insert_event
from tests.cli.helpers import cli_here
from tests.engine.helpers import ROOT, Env
from tests.loopback_http import QuietHandler, serving
from tests.service import service_app

APP = "tests.service.service_app:app"
TENANTS = ("t1", "t2", "t3")


def submit(env: Env, tenant: str, name: str = "echo", input: Any = None) -> str:
    """A run submitted straight to the store (no service process)."""
    body = input if input is not None else {"text": "x", "steps": 2}
    return str(env._store(lambda s: service_app.app.submit(s, name, body, tenant_id=tenant)))


def chain_state(env: Env) -> tuple[int, list[Any], tuple[int, float | None], int]:
    """(records verified, breaks, unsealed tail, events in the database)."""

    async def go(store: Any) -> Any:
        checked, broken = await store.read(service_audit.verify_chain)
        tail = await store.read(service_audit.unsealed_tail)
        rows = await store.read(lambda tx: tx.fetchall("SELECT COUNT(*) AS n FROM events"))
        return checked, broken, tail, int(rows[0]["n"])

    return tuple(env._store(go))  # type: ignore[return-value]


def wait_for(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_running_worker_seals_what_it_writes(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `serve` process: the worker seals its runs' records while it runs."""
    monkeypatch.setenv(sealer.PERIOD_ENV, "0.05")
    env = Env(tmp_path, store_url)
    try:
        worker = env.start_worker(app=APP)
        ids = [submit(env, t) for t in TENANTS]
        for run_id in ids:
            env.wait_status(run_id, "completed")
        wait_for(lambda: chain_state(env)[2][0] == 0)
        assert worker.poll() is None  # sealed by the running worker, not on its way out
        checked, broken, tail, events = chain_state(env)
        assert broken == [] and tail == (0, None) and checked == events
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        env.close()


def test_a_stopping_worker_seals_its_last_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst worker seals once more after its last run: `audit verify --no-seal`
    finds nothing unsealed, with no sealer running."""
    monkeypatch.setenv(sealer.PERIOD_ENV, "3600")  # only the first seal, then the last
    monkeypatch.setenv("AGENTLEDGER_WEBHOOK_ALLOW_HOSTS", "127.0.0.1")  # the receiver
    env = Env(tmp_path)
    try:
        ids = [submit(env, t) for t in TENANTS]
        done = env.cli("worker", "--app", APP, "--db", env.url, "--burst", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert {env.run(i).status for i in ids} == {"completed"}
        verify = cli_here("audit", "verify", "--no-seal", "--db", env.url, "--json")
        assert verify.returncode == 0, verify.stderr
        report = json.loads(verify.stdout)
        assert report["unsealed"] == {"count": 0, "oldest_age_seconds": None}
        assert report["broken"] == [] and report["checked"] == chain_state(env)[3]
    finally:
        env.close()


def test_verify_reports_the_unsealed_tail_apart(tmp_path: Path) -> None:
    """Records nobody sealed are reported (count, oldest age), not counted as verified;
    `--max-unsealed-age` turns a stale tail into exit 1."""
    env = Env(tmp_path)
    try:
        ids = [submit(env, "t1"), submit(env, "t2")]
        events = chain_state(env)[3]
        assert events >= len(ids)
        time.sleep(0.01)  # the oldest record's age is positive
        out = cli_here("audit", "verify", "--no-seal", "--db", env.url, "--json")
        report = json.loads(out.stdout)
        assert out.returncode == 0 and report["checked"] == 0
        assert report["unsealed"]["count"] == events
        assert report["unsealed"]["oldest_age_seconds"] > 0
        text = cli_here("audit", "verify", "--no-seal", "--db", env.url)
        assert f"not sealed yet (not covered by the chain): {events} records" in text.stdout
        one = cli_here("audit", "verify", "--no-seal", "--tenant", "t1", "--db", env.url, "--json")
        assert 0 < json.loads(one.stdout)["unsealed"]["count"] < events
        stale = cli_here("audit", "verify", "--no-seal", "--max-unsealed-age", "0", "--db", env.url)
        assert stale.returncode == 1 and "is a worker or `agentledger serve` running" in (
            stale.stderr
        )
        sealed = cli_here("audit", "verify", "--max-unsealed-age", "0", "--db", env.url, "--json")
        assert sealed.returncode == 0, sealed.stderr
        report = json.loads(sealed.stdout)
        assert report["sealed"] == events and report["checked"] == events
        assert report["unsealed"]["count"] == 0
    finally:
        env.close()


async def test_two_processes_sealing_at_once_never_fork_or_skip_the_chain(
    store_url: str, tmp_path: Path
) -> None:
    """Two sealer processes seal in small batches while new events keep committing;
    every record ends up chained exactly once, each tenant's chain gapless and intact."""
    store = open_store(store_url)
    await store.open()
    try:
        runs = [
            await service_app.app.submit(store, "free", {"i": i}, tenant_id=t)
            for t in TENANTS
            for i in range(2)
        ]
        stop = tmp_path / "stop"
        readies = [tmp_path / f"ready{n}" for n in range(2)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.service.seal_proc", store_url, str(r), str(stop)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for r in readies
        ]
        try:
            while not all(r.exists() for r in readies):
                assert all(p.poll() is None for p in procs), "a sealer died on start"
                await asyncio.sleep(0.02)
            # At least 40 batches, and until both sealers have sealed something (on
            # PostgreSQL they must race; on a busy machine one may start late).
            batch = 0
            deadline = time.monotonic() + 60
            while batch < 40 or (
                not all(r.with_suffix(".sealed").exists() for r in readies)
                and store_url.startswith("postgresql")
                and time.monotonic() < deadline
            ):
                batch += 1
                await store.transact(
                    lambda tx, batch=batch: [
                        insert_event(tx, run_id, "test.record", "test", {"batch": batch})
                        for run_id in runs
                        for _ in range(5)
                    ]
                )
            stop.touch()
            outs = [await asyncio.to_thread(p.communicate, timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for p, (_out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err.decode()
        sealed = [int(out) for out, _ in outs]
        if store_url.startswith("postgresql"):
            assert all(n > 0 for n in sealed), sealed  # both sealed: they did race
        # (SQLite has one writer: a sealer polling for the lock may be starved by one
        # that keeps taking it; the chain must be whole either way.)
        assert sum(sealed) >= batch * 5 * len(runs), sealed
        checked, broken = await store.read(service_audit.verify_chain)
        tail = await store.read(service_audit.unsealed_tail)
        per_tenant = await store.read(lambda tx: tx.fetchall(
                "SELECT tenant_id, COUNT(*) AS n, MAX(chain_no) AS top FROM events "
                "GROUP BY tenant_id ORDER BY tenant_id",
            ))  # fmt: skip
        total = sum(int(r["n"]) for r in per_tenant)
        assert broken == [] and tail == (0, None)
        assert checked == total == sum(sealed)  # each record chained once, by one of them
        assert [(r["tenant_id"], int(r["n"])) for r in per_tenant] == [
            (r["tenant_id"], int(r["top"])) for r in per_tenant
        ]  # chain numbers 1..n: no gap
        assert {r["tenant_id"] for r in per_tenant} == set(TENANTS)
    finally:
        await store.close()


def test_a_bad_seal_period_stops_the_worker_with_a_one_line_reason(tmp_path: Path) -> None:
    env = Env(tmp_path)
    try:
        child = env.child_env()
        child[sealer.PERIOD_ENV] = "soon"
        done = subprocess.run(
            [sys.executable, "-m", "agentledger.cli._main", "worker", "--app", APP,
             "--db", env.url, "--burst"],
            cwd=ROOT, env=child, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode != 0
        last = done.stderr.strip().splitlines()[-1]
        assert sealer.PERIOD_ENV in last and "0.01 to 3600" in last, done.stderr
    finally:
        env.close()


def test_a_burst_worker_delivers_the_webhooks_of_its_last_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run.completed events of a burst worker's last runs are sealed only as it stops,
    after its dispatcher stopped: it delivers them before exiting, so a deployment of
    burst workers and no `serve` still hears of every run."""
    monkeypatch.setenv(sealer.PERIOD_ENV, "3600")  # only the first seal, then the last
    monkeypatch.setenv("AGENTLEDGER_WEBHOOK_ALLOW_HOSTS", "127.0.0.1")  # the receiver
    received: list[dict[str, Any]] = []

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append(json.loads(body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    env = Env(tmp_path)
    try:
        with serving(Handler) as url:
            ids = [submit(env, t) for t in TENANTS]

            async def hook(store: Any) -> None:
                await store.transact(
                    lambda tx: tx.execute("UPDATE runs SET webhook = :u", {"u": url})
                )

            env._store(hook)
            done = env.cli("worker", "--app", APP, "--db", env.url, "--burst", timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            assert {env.run(i).status for i in ids} == {"completed"}
            got = {(b["run_id"], b["type"]) for b in received}
            assert got == {(i, "run.completed") for i in ids}
    finally:
        env.close()
