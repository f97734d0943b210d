"""Attacks on the gateway's engine hooks (engine/_hooks.py, gateway/_engine.py): a hook
that raises mid-call, hooks installed twice, and the public test Harness with a tenant
budget, on both backends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import agentledger.gateway  # installs the hooks this module replaces
from agentledger.engine import _hooks as hooks
from agentledger.gateway import _engine as gateway_engine
from agentledger.gateway import _queries as gateway_budgets
from agentledger.records import RunStatus
from agentledger.testing import Harness
from tests.gateway.fakes import FakeProviders, openai_answer
from tests.gateway.worker_app import make_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def gateway_hooks() -> Iterator[None]:
    """The gateway's hooks before and after the test, whatever it installs."""
    gateway_engine.install()
    yield
    gateway_engine.install()


async def _close_models(h: Harness) -> None:
    """The provider clients of the app's models (the Harness leaves them to the app)."""
    for definition in h.app.definitions.values():
        closer = getattr(getattr(definition, "model", None), "aclose", None)
        if closer is not None:
            await closer()


async def _tenant_spend(h: Harness) -> float:
    row = await h.store.transact(
        gateway_budgets.reserve_tenant_usage, "default", time.time(), 0.0, 0
    )
    return float(row["spend_usd"])


async def test_a_settle_hook_failing_after_the_answer_never_resends_the_call(
    store_url: str, fake: FakeProviders, gateway_hooks: None
) -> None:
    """The provider answered (and billed); settling the tenant's row then fails (the
    store, or a user's hook). The answer must not be thrown away and the call sent
    again: one request, the run goes on, the tenant row never under-counts."""
    settled: list[float] = []

    async def failing_settle(*args: Any) -> None:
        settled.append(args[3])
        raise RuntimeError("settle failed")

    fake.script(openai_answer("Three hotels."))
    async with Harness(make_app("openai:gpt-4.1-mini"), db=store_url) as h:
        await h.store.transact(gateway_budgets.set_tenant_budget, "default", 86_400, 10.0)
        hooks.install(settle_tenant=failing_settle)
        run_id = await h.submit("concierge", {"message": "Hotels?"})
        run = await h.run_until_settled(run_id)
        assert len(fake.requests) == 1, fake.requests  # never sent twice
        assert settled, "the settle hook was never called"
        assert run.status == RunStatus.COMPLETED, (run.status, run.error, run.handover_reason)
        # Not settled: the row stays at the reservation, at least what the run spent.
        assert await _tenant_spend(h) >= run.cost_usd > 0
        await _close_models(h)


async def test_a_live_token_hook_that_raises_never_costs_the_answer(
    store_url: str, fake: FakeProviders, gateway_hooks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live stream is best effort ("never blocks, never raises"): a ``model_delta``
    hook (a user's own, or a relay that breaks) raising mid-stream must not turn a paid,
    whole answer into a failed model call handed to a human."""
    from tests.gateway.fakes import openai_stream

    seen: list[str] = []

    def broken_delta(store: Any, run_id: str, step_no: int, text: str, attempt: int) -> None:
        seen.append(text)
        raise RuntimeError("listener gone")

    monkeypatch.setenv("AGENTLEDGER_MODEL_STREAM", "1")
    fake.script(openai_stream(["Three ", "hotels."]))
    async with Harness(make_app("openai:gpt-4.1-mini"), db=store_url) as h:
        hooks.install(model_delta=broken_delta)
        run_id = await h.submit("concierge", {"message": "Hotels?"})
        run = await h.run_until_settled(run_id)
        assert seen, "the stream hook was never called"
        assert len(fake.requests) == 1
        assert run.status == RunStatus.COMPLETED, (run.status, run.handover_reason)
        assert run.result == {"answer": "Three hotels."}
        await _close_models(h)


async def test_the_harness_enforces_a_tenant_budget(
    store_url: str, fake: FakeProviders, gateway_hooks: None
) -> None:
    """The public Harness (a user's tests) runs with the gateway: a tenant over its budget
    is refused, the call not sent."""
    fake.script(openai_answer("Three hotels."))
    async with Harness(make_app("openai:gpt-4.1-mini"), db=store_url) as h:
        await h.store.transact(
            gateway_budgets.set_tenant_budget, "default", 86_400, max_spend_usd=0.0001
        )
        run_id = await h.submit("concierge", {"message": "Hotels?"})
        run = await h.run_until_settled(run_id, timeout=10)
        assert run.status == RunStatus.WAITING, run.status
        assert fake.requests == []
        assert await _tenant_spend(h) == 0.0
        await _close_models(h)


def test_installing_the_gateway_twice_keeps_one_set_of_hooks(gateway_hooks: None) -> None:
    """A reload (or a second import path) installs the same functions again: the hooks
    are the gateway's, not stacked wrappers, and the cooldowns stay one table."""
    import importlib

    from agentledger.gateway._cooldown import COOLDOWNS

    importlib.reload(agentledger.gateway)
    importlib.reload(agentledger.gateway)
    assert hooks.reserve_tenant.__module__ == "agentledger.gateway._engine"
    assert hooks.model_call_ended == COOLDOWNS.record


# ---------------------------------------------------------------------------------------
# In fresh processes: which imports install the seams, and what a worker does with them.

import asyncio  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from agentledger import Worker, WorkerConfig  # noqa: E402
from agentledger.store import open_store  # noqa: E402
from agentledger.worker import WorkerFailed  # noqa: E402
from tests.gateway import worker_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

SEAMS = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
from agentledger import _auditchain
from agentledger.engine import _hooks
print(_hooks.reserve_tenant.__module__, _hooks.settle_tenant.__module__, _auditchain.registered())
"""


def _python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    "entry",
    [
        # What `agentledger worker`, `prune` and the example command's worker import
        # before they run (tests/cli/test_command_loading.py holds them to it).
        "agentledger.cli._features",
        "agentledger.service._app",  # `serve --workers-inline N`
        "agentledger.testing",  # the public Harness
    ],
)
def test_every_process_that_runs_steps_has_both_seams(entry: str) -> None:
    done = _python(SEAMS, entry)
    gw = "agentledger.gateway._engine"
    assert done.stdout.split() == [gw, gw, "True"], (done.stdout, done.stderr)


def test_the_kernel_alone_has_neither_seam_so_both_refuse() -> None:
    """`import agentledger` (an embedded Worker): the defaults, which refuse."""
    done = _python(SEAMS, "agentledger", "agentledger.worker", "agentledger.engine._runner")
    hooks_mod = "agentledger.engine._hooks"
    assert done.stdout.split() == [hooks_mod, hooks_mod, "False"], (done.stdout, done.stderr)


async def _submit(url: str, n: int, max_spend: float) -> list[str]:
    store = open_store(url)
    await store.open()
    try:
        await store.transact(
            gateway_budgets.set_tenant_budget, "default", 86_400, max_spend_usd=max_spend
        )
        return [
            str(await worker_app.app.submit(store, "concierge", {"message": f"Hotels {i}?"}))
            for i in range(n)
        ]
    finally:
        await store.close()


async def _state(url: str, run_ids: list[str]) -> tuple[list[Any], float]:
    store = open_store(url)
    await store.open()
    try:
        runs = [await store.get_run(r) for r in run_ids]
        row = await store.transact(
            gateway_budgets.reserve_tenant_usage, "default", time.time(), 0.0, 0
        )
        return runs, float(row["spend_usd"])
    finally:
        await store.close()


@pytest.fixture
def without_gateway(gateway_hooks: None) -> None:
    """This process's engine hooks as without ``agentledger.gateway`` (the gateway's put
    back after the test): a worker here is a worker of a process that never imported it
    (test_the_kernel_alone_has_neither_seam_so_both_refuse holds the kernel to that)."""
    points = ("reserve_tenant", "settle_tenant", "model_cooled_until", "model_call_ended")
    hooks.install(**hooks.kernel_hooks(*points, "model_delta"))


async def _worker_here(
    url: str, config: WorkerConfig, *, slow_release: bool = False
) -> tuple[asyncio.Task[None], Callable[[], Awaitable[None]]]:
    """A worker of a fresh app (its model the fake server's) on ``url``, started in this
    process; the returned close waits for it and closes its models and store.
    ``slow_release``: the store slows down after the first give-back."""
    app = make_app()
    store = open_store(url)
    await store.open()
    if slow_release:
        real, calls = store.release_run, []

        async def slowed(*args: Any) -> Any:
            calls.append(args)
            if len(calls) > 1:  # five times the test's grace: it ends mid-release
                await asyncio.sleep(0.5)
            return await real(*args)

        store.release_run = slowed  # type: ignore[method-assign, assignment]
    worker = Worker(store, app, config, burst=True)
    task = asyncio.create_task(worker.run(install_signals=False))

    async def close() -> None:
        try:
            worker.stop()
            await asyncio.gather(task, return_exceptions=True)
        finally:
            await _close_app_models(app)
            await store.close()

    return task, close


async def _close_app_models(app: Any) -> None:
    for definition in app.definitions.values():
        closer = getattr(getattr(definition, "model", None), "aclose", None)
        if closer is not None:
            await closer()


async def test_a_gateway_less_worker_with_many_runs_gives_every_one_back(
    store_url: str, fake: FakeProviders, without_gateway: None
) -> None:
    """Four priced runs claimed at once by a worker without the gateway: the first
    refusal stops it, and every run -- not only the one that refused -- is given back
    queued, none left leased, nothing sent, no spend."""
    fake.script(*(openai_answer("Answer.") for _ in range(4)))
    run_ids = await _submit(store_url, 4, 10.0)
    config = WorkerConfig(poll_seconds=0.02, shutdown_grace=1.0, concurrency=4)
    task, close = await _worker_here(store_url, config)
    try:
        with pytest.raises(WorkerFailed) as failed:
            await asyncio.wait_for(asyncio.shield(task), 120)
    finally:
        await close()
    assert "import agentledger.gateway" in str(failed.value).splitlines()[0]
    assert fake.requests == []
    runs, spend = await _state(store_url, run_ids)
    assert [r.status for r in runs] == [RunStatus.QUEUED] * 4, [
        (r.status, r.lease_owner) for r in runs
    ]
    assert all(r.lease_owner is None and r.error is None and r.resumes == 0 for r in runs), runs
    assert spend == 0.0


async def test_runs_giving_themselves_back_when_the_grace_ends_are_still_given_back(
    store_url: str, fake: FakeProviders, without_gateway: None
) -> None:
    """The first refusal stops the worker; the other runs refuse too and give themselves
    back, slowly. The drain's grace ends meanwhile and cancels them mid-release: they must
    still be given back (by the drain), not left leased to a worker that has exited."""
    run_ids = await _submit(store_url, 4, 10.0)
    config = WorkerConfig(poll_seconds=0.02, shutdown_grace=0.1, concurrency=4)
    task, close = await _worker_here(store_url, config, slow_release=True)
    try:
        with pytest.raises(WorkerFailed):
            await asyncio.wait_for(asyncio.shield(task), 120)
    finally:
        await close()
    runs, spend = await _state(store_url, run_ids)
    assert [(r.status, r.lease_owner) for r in runs] == [(RunStatus.QUEUED, None)] * 4
    assert fake.requests == [] and spend == 0.0


LATE = """
import asyncio, sys
import agentledger.service
from agentledger import Worker, WorkerConfig, open_store
from tests.gateway.worker_app import app
from tests.gateway.test_attack_seams import _submit

async def main(url):
    store = open_store(url)
    await store.open()
    worker = Worker(store, app, WorkerConfig(poll_seconds=0.02, shutdown_grace=1.0))
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        while not await store.list_workers():  # the worker is up and polling
            assert not task.done(), task
            await asyncio.sleep(0.02)
        import agentledger.gateway  # after the worker started
        (run_id,) = await _submit(url, 1, 0.0001)
        while (await store.get_run(run_id)).status == "queued":
            await asyncio.sleep(0.05)
        while (await store.get_run(run_id)).status == "running":
            await asyncio.sleep(0.05)
        print("status", (await store.get_run(run_id)).status)
    finally:
        worker.stop()
        await task
        await store.close()

asyncio.run(main(sys.argv[1]))
"""


async def test_a_gateway_imported_after_the_worker_started_is_used(
    store_url: str, fake: FakeProviders
) -> None:
    """The hooks are looked up at each call: a worker that started before the gateway was
    imported enforces the tenant's budget on the next call (refused: parked, not sent).
    In a fresh process: the engine's modules are imported before the gateway, as in a
    process that imports it late."""
    fake.script(openai_answer("Answer."))
    done = _python(LATE, store_url)
    assert "status waiting" in done.stdout, (done.stdout, done.stderr)
    assert fake.requests == []


KILLED_AFTER_RESERVING = """
import asyncio, os, signal, sys
import agentledger.gateway, agentledger.service
from agentledger import Worker, WorkerConfig, open_store
from agentledger.engine import _hooks
from tests.gateway.worker_app import app

real = _hooks.reserve_tenant

async def reserve_then_die(store, tenant, now, usd, tokens):
    got = await real(store, tenant, now, usd, tokens)  # committed in the store
    print("reserved", usd, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # before the journal says the call started

_hooks.install(reserve_tenant=reserve_then_die)

async def main(url):
    store = open_store(url)
    await store.open()
    await Worker(store, app, WorkerConfig(poll_seconds=0.02), burst=True).run(
        install_signals=False)

asyncio.run(main(sys.argv[1]))
"""


async def test_a_kill_between_the_reservation_and_the_journal_over_counts_one_call(
    store_url: str, fake: FakeProviders
) -> None:
    """SIGKILL after the tenant's reservation committed and before the model step's
    ``started`` entry: the call was never sent, but nothing records the reservation, so
    the tenant's period row keeps it (until the period ends). Bounded and on the safe side:
    the row over-counts by exactly that one reservation, it never under-counts, and the
    run itself (resumed by a worker with the gateway) counts only what it spent."""
    fake.script(openai_answer("Answer."))
    (run_id,) = await _submit(store_url, 1, 10.0)
    killed = _python(KILLED_AFTER_RESERVING, store_url)
    assert killed.returncode == -9, (killed.stdout, killed.stderr)
    reserved = float(killed.stdout.split()[1])
    assert fake.requests == []

    # Resumed by a burst worker with the gateway: this process's (tests/conftest.py).
    await worker_app.burst_here(store_url)
    (run,), spend = await _state(store_url, [run_id])
    assert run.status == RunStatus.COMPLETED, run.status
    assert len(fake.requests) == 1
    assert spend == pytest.approx(run.cost_usd + reserved)


UNPRICED = """
import asyncio, os, sys, time
import agentledger.service
from agentledger import Agent, App, ScriptedModel, Turn, Worker, WorkerConfig, open_store
from tests.gateway.worker_app import app as priced

app = App("unpriced")
app.add_agent(Agent(name="scripted", model=ScriptedModel([Turn(text="hi")]), instructions="x"))

async def main(url, which):
    store = open_store(url)
    await store.open()
    try:
        target = app if which == "scripted" else priced
        run_id = await target.submit(store, which, {"message": "hello"})
        try:
            await Worker(store, target, WorkerConfig(poll_seconds=0.02, shutdown_grace=1.0),
                         burst=True).run(install_signals=False)
        except Exception as exc:
            print(type(exc).__name__)
        print("status", (await store.get_run(run_id)).status, flush=True)
    finally:
        await store.close()

url, go = sys.argv[1], sys.argv[2]
asyncio.run(main(url, "concierge"))
while not os.path.exists(go):  # the test configures a tenant budget meanwhile
    time.sleep(0.02)
asyncio.run(main(url, "scripted"))
print("gateway imported:", any(m.startswith("agentledger.gateway") for m in sys.modules))
"""


async def test_the_priced_rule_without_the_gateway(
    store_url: str, fake: FakeProviders, tmp_path: Path
) -> None:
    """ "Priced" is a provider model (OpenAI, Anthropic: what has a price and a tenant
    reservation). Without the gateway an unpriced model (ScriptedModel, a user's own
    Model) runs as before, even under a tenant budget it never reserves against; a
    provider model is refused even when its tenant has no budget configured -- without
    the gateway nothing can tell that it has none. One process without the gateway runs
    the provider model first (no budget), then the scripted one (under a budget)."""
    fake.script(openai_answer("Answer."))
    go = tmp_path / "budget-set"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, "-c", UNPRICED, store_url, str(go)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        first: list[str] = []
        while not (first and first[-1].startswith("status")):
            line = await asyncio.to_thread(proc.stdout.readline)  # type: ignore[union-attr]
            assert line, ("".join(first), proc.stderr.read())  # type: ignore[union-attr]
            first.append(line)
        assert "WorkerFailed" in "".join(first) and first[-1].split() == ["status", "queued"]
        assert fake.requests == []

        await _submit(store_url, 0, 0.0001)  # a budget the scripted model never touches
        go.touch()
        rest, err = await asyncio.to_thread(proc.communicate, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (rest, err)
    assert "status completed" in rest, (rest, err)
    assert "gateway imported: False" in rest
    assert fake.requests == []
