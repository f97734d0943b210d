"""Retention under attack (docs/architecture.md, "Retention"): a run taken back between
two batches of a prune, prunes racing and killed mid-way, a pruned front forged without
the key, a checkpoint inside the pruned span, hostile values."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentledger.service._queries import audit as service_audit
from agentledger.store import Store
from agentledger.store._queries import retention
from agentledger.worker import Worker, WorkerConfig
from tests.cli.helpers import cli_here
from tests.engine.helpers import wait_for
from tests.service import service_app
from tests.store.test_prune import ENV, KEY, _count, _finished, _rows_of, run_cli


async def _rows(store: Store, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    return await store.read(lambda tx: tx.fetchall(sql, params or {}))


async def _exec(store: Store, sql: str, params: dict[str, Any] | None = None) -> None:
    await store.transact(lambda tx: tx.execute(sql, params or {}))


async def _handed_over(store: Store, tenant: str, n: int) -> list[str]:
    """``n`` runs ended ``needs_human`` by the service app's over-budget workflow (each
    resumable by `runs resume`), their events sealed."""
    ids = [
        await service_app.app.submit(store, "over_budget", {}, tenant_id=tenant) for _ in range(n)
    ]
    await Worker(store, service_app.app, WorkerConfig(poll_seconds=0.02), burst=True).run(
        install_signals=False
    )
    for run_id in ids:
        run = await store.get_run(run_id)
        assert run is not None and run.status == "needs_human", run
    return ids


async def test_a_run_split_by_a_batch_is_not_resumed_half_pruned(
    keyed: None, store: Store, store_url: str
) -> None:
    """A batch ends inside a run (its first records summarized, its row and the rest
    still there): a `runs resume` between that batch and the next -- a kill, or just the
    next batch not yet begun -- must not put a run back to work without its history."""
    first, _second = await _handed_over(store, "t1", 2)
    policy = retention.Policy("t1", 0.0, ("needs_human",))
    # One batch of 2 records: the first run's front only (the state between batches).
    got = await store.transact(retention.prune_batch, policy, 1e12, 10**9, _key(), limit=2)
    assert got.records == 2 and got.runs == 0
    assert (await _rows_of(store, first))["runs"] == 1
    resumed = await run_cli("runs", "resume", first, "--db", store_url)
    assert resumed.exit_code != 0, resumed.output
    assert "being pruned" in resumed.output + str(resumed.exception)
    run = await store.get_run(first)
    assert run is not None and run.status == "needs_human"
    # The next prune finishes what the first began; the chain verifies.
    done = await run_cli("prune", "--older-than", "0s", "--status", "needs_human", "--db",
                         store_url)  # fmt: skip
    assert done.exit_code == 0 and "removed 2 runs" in done.output, done.output
    assert set((await _rows_of(store, first)).values()) == {0}
    assert not await _rows(store, "SELECT run_id FROM runs_pruning")
    ok = await run_cli("audit", "verify", "--db", store_url)
    assert ok.exit_code == 0 and "intact" in ok.output, ok.output


def _key() -> Any:
    from agentledger import _auditkey as auditkey

    return auditkey.configured()


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY)


async def test_a_front_deleted_past_a_checkpoint_is_found_on_an_unsigned_chain(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """No key: a writer of the database deletes the front of a chain beyond a
    checkpoint's position and writes a summary of their own (unsigned, as a keyless
    prune writes it). Nothing can vouch for the checkpoint's record: verify says so."""
    await _finished(store, "t1", 2)
    cp = await run_cli("audit", "checkpoint", "--db", store_url, key=None)
    assert cp.exit_code == 0, cp.output
    (tmp_path / "cp.json").write_text(cp.stdout)
    await _finished(store, "t1", 2)
    (at,) = json.loads(cp.stdout)["heads"] if "heads" in cp.stdout else json.loads(cp.stdout)
    n = int(at["chain_no"]) + 2  # past the checkpoint's position
    (row,) = await _rows(
        store, "SELECT hash FROM events WHERE tenant_id = 't1' AND chain_no = :n", {"n": n}
    )
    await _exec(store, "DELETE FROM events WHERE tenant_id = 't1' AND chain_no <= :n", {"n": n})
    await _exec(store, "DELETE FROM runs WHERE id NOT IN (SELECT run_id FROM events)")
    await _exec(
        store,
        "INSERT INTO audit_pruned (tenant_id, last_chain_no, last_hash, records, runs, counts, "
        "digest, first_at, last_at, pruned_at, sig) VALUES ('t1', :n, :h, :n, 0, '{}', 'x', "
        "NULL, NULL, 0, NULL)",
        {"n": n, "h": row["hash"]},
    )
    plain = await run_cli("audit", "verify", "--db", store_url, key=None)
    assert plain.exit_code == 0, plain.output  # unsigned: nothing else can tell
    since = await run_cli("audit", "verify", "--db", store_url, "--since-checkpoint",
                          str(tmp_path / "cp.json"), key=None)  # fmt: skip
    assert since.exit_code == 1, since.output
    assert "inside the pruned span" in since.output


async def test_a_checkpoint_taken_after_a_tenant_was_pruned_whole_verifies(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """Unsigned: the checkpoint's position is the summary's last record (nothing after
    it): the summary's hash is the checkpoint's, no false alarm."""
    await _finished(store, "t1", 2)
    got = await run_cli("prune", "--older-than", "0s", "--db", store_url, key=None)
    assert got.exit_code == 0 and "removed 2 runs" in got.output, got.output
    cp = await run_cli("audit", "checkpoint", "--db", store_url, key=None)
    assert cp.exit_code == 0, cp.output
    (tmp_path / "cp.json").write_text(cp.stdout)
    since = await run_cli("audit", "verify", "--db", store_url, "--since-checkpoint",
                          str(tmp_path / "cp.json"), key=None)  # fmt: skip
    assert since.exit_code == 0, since.output


async def test_the_summary_forged_moved_or_replayed_is_found(
    keyed: None, store: Store, store_url: str
) -> None:
    """Keyed: edits of every signed field, the row moved to another tenant, an older
    summary put back after a later prune."""
    await _finished(store, "t1", 2)
    await _finished(store, "t2", 1)
    assert (await run_cli("prune", "--older-than", "0s", "--tenant", "t1", "--db",
                          store_url)).exit_code == 0  # fmt: skip
    (old,) = await _rows(store, "SELECT * FROM audit_pruned WHERE tenant_id = 't1'")
    old = dict(old)
    edits = [
        "UPDATE audit_pruned SET counts = '{\"run.submitted\":1}'",
        f"UPDATE audit_pruned SET last_hash = '{'a' * 64}'",
        f"UPDATE audit_pruned SET digest = '{'b' * 64}'",
        "UPDATE audit_pruned SET runs = runs + 1",
        "UPDATE audit_pruned SET first_at = first_at - 1",
        "UPDATE audit_pruned SET tenant_id = 't2'",
        "UPDATE audit_pruned SET sig = NULL",
    ]
    for edit in edits:
        await _exec(store, edit)
        bad = await run_cli("audit", "verify", "--db", store_url)
        assert bad.exit_code == 1, (edit, bad.output)
        await _exec(store, "DELETE FROM audit_pruned")
        await _put_summary(store, old)
        assert (await run_cli("audit", "verify", "--db", store_url)).exit_code == 0, edit
    # Replayed: a later prune extends the summary; the older one put back is found.
    await _finished(store, "t1", 1)
    assert (await run_cli("prune", "--older-than", "0s", "--tenant", "t1", "--db",
                          store_url)).exit_code == 0  # fmt: skip
    await _exec(store, "DELETE FROM audit_pruned WHERE tenant_id = 't1'")
    await _put_summary(store, old)
    replayed = await run_cli("audit", "verify", "--db", store_url)
    assert replayed.exit_code == 1, replayed.output
    # Verified without the key, a keyed prune's chain is still intact (nothing to check
    # the signature with, and it says so).
    await _exec(store, "DELETE FROM audit_pruned WHERE tenant_id = 't1'")
    (fresh,) = await _rows(store, "SELECT COUNT(*) AS n FROM events WHERE tenant_id = 't1'")
    assert int(fresh["n"]) == 0


async def _put_summary(store: Store, s: dict[str, Any]) -> None:
    cols = ", ".join(s)
    marks = ", ".join(f":{k}" for k in s)
    await _exec(store, f"INSERT INTO audit_pruned ({cols}) VALUES ({marks})", s)


async def test_a_tenant_pruned_whole_goes_on_after_its_summary(
    keyed: None, store: Store, store_url: str
) -> None:
    await _finished(store, "t1", 3)
    got = await run_cli("prune", "--older-than", "0s", "--db", store_url)
    assert got.exit_code == 0 and "removed 3 runs" in got.output, got.output
    assert await _count(store, "SELECT COUNT(*) AS n FROM events") == 0
    empty = await run_cli("audit", "verify", "--db", store_url)
    assert empty.exit_code == 0 and "intact" in empty.output, empty.output
    (s,) = await _rows(store, "SELECT last_chain_no FROM audit_pruned")
    later = await _finished(store, "t1", 1)
    ok = await run_cli("audit", "verify", "--db", store_url)
    assert ok.exit_code == 0 and "intact" in ok.output, ok.output
    (first,) = await _rows(
        store, "SELECT MIN(chain_no) AS n FROM events WHERE run_id = :r", {"r": later[0]}
    )
    assert int(first["n"]) == int(s["last_chain_no"]) + 1
    # Verified without the key: intact, the summary's signature unchecked and said so.
    nokey = await run_cli("audit", "verify", "--db", store_url, key=None)
    assert nokey.exit_code == 0 and "summary" in nokey.output, nokey.output


async def test_hostile_values_are_refused_in_one_line(store: Store, store_url: str) -> None:
    await _finished(store, "t1", 1)
    for args, words in [
        (["--older-than", "-1d"], "--older-than"),
        (["--older-than", "10"], "--older-than"),
        (["--older-than", "9999999999d"], "--older-than"),
        (["--older-than", "1d", "--status", "queued"], "only finished runs"),
        (["--older-than", "1d", "--status", "waiting,completed"], "only finished runs"),
        (["--older-than", "1d", "--status", ","], "only finished runs"),
        (["--set-retention", "t1", "0s", "--status", "running"], "only finished runs"),
    ]:
        got = await run_cli("prune", *args, "--db", store_url, key=None)
        said = got.output + str(got.exception)
        assert got.exit_code != 0 and words in said, (args, said)
        assert len(said.strip().splitlines()) == 1, said
    assert await _count(store, "SELECT COUNT(*) AS n FROM runs") == 1
    # A huge age prunes nothing; text in --tenant is a value, never SQL.
    for tenant in ("t1' OR '1'='1", "t1; DELETE FROM runs; --", "t\u00e9\u2603\U0001f600"):
        got = await run_cli("prune", "--older-than", "999999999d", "--tenant", tenant, "--db",
                            store_url, key=None)  # fmt: skip
        assert got.exit_code == 0, got.output
        got = await run_cli("prune", "--older-than", "0s", "--tenant", tenant, "--db",
                            store_url, key=None)  # fmt: skip
        assert got.exit_code == 0 and "removed 0 runs" in got.output, got.output
    assert await _count(store, "SELECT COUNT(*) AS n FROM runs") == 1
    # needs_human is pruned only when named: the default leaves it with its journal.
    (held,) = await _handed_over(store, "t1", 1)
    got = await run_cli("prune", "--older-than", "0s", "--db", store_url, key=None)
    assert got.exit_code == 0, got.output
    assert (await _rows_of(store, held))["runs"] == 1


def _prune_proc(url: str, tenant: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agentledger.cli._main", "prune", "--older-than", "0s",
             "--tenant", tenant, "--json", "--db", url],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, ENV: KEY},
        )  # fmt: skip


@pytest.mark.long
async def test_prunes_racing_and_killed_between_batches_leave_an_exact_summary(
    keyed: None, store: Store, store_url: str, tmp_path: Path
) -> None:
    """Two prune processes of one tenant at once, the first stopped (SIGSTOP, maybe
    inside a batch's transaction) after its first batch committed, then SIGKILLed; a
    third finishes. The summary covers exactly the records gone, its digest is the fold
    of their hashes, no run is left without being marked or whole, the chain verifies."""
    await _finished(store, "t1", 200, steps=3)  # about 1,200 records: several batches
    before = await _rows(
        store, "SELECT chain_no, hash, run_id FROM events WHERE tenant_id = 't1' ORDER BY chain_no"
    )
    assert len(before) > 2 * retention.BATCH
    a = _prune_proc(store_url, "t1", tmp_path / "a.log")
    try:
        while not await _rows(store, "SELECT 1 FROM audit_pruned WHERE tenant_id = 't1'"):
            assert a.poll() is None, (tmp_path / "a.log").read_text()
            await asyncio.sleep(0.005)
        a.send_signal(signal.SIGSTOP)
        b = _prune_proc(store_url, "t1", tmp_path / "b.log")
        await asyncio.sleep(0.3)  # b meets a's held lock, or runs between a's batches
        a.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(b.wait) == 0, (tmp_path / "b.log").read_text()
    finally:
        if a.poll() is None:
            a.kill()
        a.wait()
    c = await run_cli("prune", "--older-than", "0s", "--tenant", "t1", "--db", store_url)
    assert c.exit_code == 0, c.output
    await _exact_summary(store, store_url, before, 200)


async def _exact_summary(store: Store, url: str, before: list[Any], runs: int) -> None:
    """Every record of ``before`` (t1's chain before the prunes) is gone, the summary
    stands for exactly them, every run is gone, and the chain verifies."""
    (s,) = await _rows(store, "SELECT * FROM audit_pruned WHERE tenant_id = 't1'")
    left = {int(r["chain_no"]) for r in await _rows(
        store, "SELECT chain_no FROM events WHERE tenant_id = 't1'")}  # fmt: skip
    gone = [r for r in before if int(r["chain_no"]) not in left]
    assert [int(r["chain_no"]) for r in gone] == list(range(1, int(s["last_chain_no"]) + 1))
    assert int(s["records"]) == len(gone) == len(before)
    digest = service_audit.GENESIS
    for r in gone:
        digest = service_audit.fold(digest, str(r["hash"]))
    assert s["digest"] == digest and s["last_hash"] == gone[-1]["hash"]
    assert int(s["runs"]) == runs
    assert await _count(store, "SELECT COUNT(*) AS n FROM runs") == 0
    assert not await _rows(store, "SELECT run_id FROM runs_pruning")
    ok = await run_cli("audit", "verify", "--db", url)
    assert ok.exit_code == 0 and "intact" in ok.output, ok.output


async def test_a_cli_prune_beside_a_worker_pruning_on_schedule(
    keyed: None, store: Store, store_url: str, tmp_path: Path
) -> None:
    """`agentledger prune` and `worker --prune-every 1` (a real process) prune the same
    tenant at once: their batches take turns, the summary is exact."""
    await _finished(store, "t1", 200, steps=3)
    before = await _rows(
        store, "SELECT chain_no, hash, run_id FROM events WHERE tenant_id = 't1' ORDER BY chain_no"
    )
    got = await run_cli("prune", "--set-retention", "t1", "0s", "--db", store_url)
    assert got.exit_code == 0, got.output
    with (tmp_path / "w.log").open("ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "agentledger.cli._main", "worker", "--app",
             "tests.service.service_app:app", "--db", store_url, "--poll-seconds", "0.05",
             "--prune-every", "1"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, ENV: KEY},
        )  # fmt: skip
    try:
        while not await _rows(store, "SELECT 1 FROM audit_pruned"):  # its round began
            assert worker.poll() is None, (tmp_path / "w.log").read_text()
            await asyncio.sleep(0.005)
        cli = _prune_proc(store_url, "t1", tmp_path / "cli.log")
        assert await asyncio.to_thread(cli.wait) == 0, (tmp_path / "cli.log").read_text()
        while await _count(store, "SELECT COUNT(*) AS n FROM runs"):
            assert worker.poll() is None, (tmp_path / "w.log").read_text()
            await asyncio.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.to_thread(worker.wait)
    assert worker.returncode == 0, (tmp_path / "w.log").read_text()
    await _exact_summary(store, store_url, before, 200)


async def test_a_bad_retention_row_does_not_stop_the_worker_or_the_other_tenants(
    store: Store, store_url: str
) -> None:
    """A retention row no `--set-retention` would write (edited by hand: a status that
    is not finished) is skipped with a warning; the worker goes on stepping runs and
    pruning the other tenants on schedule."""
    old = await _finished(store, "t1", 2)
    got = await run_cli("prune", "--set-retention", "t1", "0s", "--db", store_url, key=None)
    assert got.exit_code == 0, got.output
    await _exec(
        store,
        "INSERT INTO retention (tenant_id, older_than, statuses, updated_at) "
        "VALUES ('t0', 0, 'running', 0)",
    )
    worker = Worker(store, service_app.app, WorkerConfig(poll_seconds=0.05, prune_every=1))
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        while await _count(store, "SELECT COUNT(*) AS n FROM runs WHERE tenant_id = 't1'"):
            assert not task.done(), "the worker stopped"
            await asyncio.sleep(0.05)
        for r in old:
            assert set((await _rows_of(store, r)).values()) == {0}
        fresh = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t2")
        while (run := await store.get_run(fresh)) is None or run.status != "completed":
            assert not task.done(), "the worker stopped"
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await task


async def test_an_unsigned_prune_then_a_key_is_adopted_with_the_chain(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruned without a key (unsigned chain, unsigned summary); verified with a key the
    summary is named unsigned, never taken as signed; `audit sign-unsigned` signs it
    with the chain, and a keyed prune goes on from it."""
    await _finished(store, "t1", 2)
    got = await run_cli("prune", "--older-than", "0s", "--db", store_url, key=None)
    assert got.exit_code == 0 and "removed 2 runs" in got.output, got.output
    keyed_verify = await run_cli("audit", "verify", "--db", store_url)
    assert keyed_verify.exit_code == 1, keyed_verify.output
    assert "not signed" in keyed_verify.output, keyed_verify.output
    signed = await run_cli("audit", "sign-unsigned", "--db", store_url)
    assert signed.exit_code == 0, signed.output
    ok = await run_cli("audit", "verify", "--db", store_url, "--require-signed")
    assert ok.exit_code == 0 and "summary signed" in ok.output, ok.output
    monkeypatch.setenv(ENV, KEY)  # the sealers have the key from now on
    await _finished(store, "t1", 1)
    more = await run_cli("prune", "--older-than", "0s", "--db", store_url)
    assert more.exit_code == 0 and "removed 1 runs" in more.output, more.output
    ok = await run_cli("audit", "verify", "--db", store_url, "--require-signed")
    assert ok.exit_code == 0 and "intact" in ok.output, ok.output


def test_a_shared_effect_key_outlives_its_pruned_run(backend_env: Any) -> None:
    """A key shared across runs (``effect_key``: one gift per guest whatever the run) is
    the effects table's at-most-once ledger: pruning the run that used it must not let
    a later run call the provider again with it."""
    from agentledger.records import RunStatus

    env = backend_env
    env.start_worker(concurrency=1)
    first = env.submit("gift_flow", {"guest": "g-9"})
    env.wait_status(first, RunStatus.COMPLETED)
    assert cli_here("audit", "verify", "--db", env.url).returncode == 0  # sealed
    pruned = cli_here("prune", "--older-than", "0s", "--db", env.url)
    assert pruned.returncode == 0 and "removed 1 runs" in pruned.stdout, pruned.stdout
    second = env.submit("gift_flow", {"guest": "g-9"})
    assert env.wait_status(second, RunStatus.COMPLETED).result is not None
    assert sum(env.calls("gift").values()) == 1  # one call at the provider, ever


def test_a_shared_outbox_key_outlives_its_pruned_run(backend_env: Any) -> None:
    """An outbox key shared across runs (``outbox_key``: one message per recipient) is
    refused to a second run while the first run's row stands; pruning the first run
    must not let the second send the message again."""
    from agentledger.records import RunStatus

    env = backend_env
    env.start_worker(concurrency=1)
    first = env.submit("note_flow", {"to": "g-3"})
    own = env.submit("notify_flow", {"msg": "hi"})  # its key is its own step's: it goes
    env.wait_status(first, RunStatus.COMPLETED)
    env.wait_status(own, RunStatus.COMPLETED)
    wait_for(lambda: sum(env.calls("note").values()) == 1, what="the message delivered")
    wait_for(lambda: not env.outbox("pending"), what="the outbox row settled")
    assert cli_here("audit", "verify", "--db", env.url).returncode == 0  # sealed
    pruned = cli_here("prune", "--older-than", "0s", "--db", env.url)
    assert pruned.returncode == 0 and "removed 2 runs" in pruned.stdout, pruned.stdout
    assert [o.key for o in env.outbox()] == ["note:g-3"]
    second = env.submit("note_flow", {"to": "g-3"})
    run = env.wait_status(second, RunStatus.COMPLETED, RunStatus.NEEDS_HUMAN)
    assert run.status == RunStatus.NEEDS_HUMAN, run  # refused, as before the prune
    assert sum(env.calls("note").values()) == 1  # one message, ever


async def test_a_prune_that_meets_tampering_exits_non_zero(
    keyed: None, store: Store, store_url: str
) -> None:
    """A record of the prunable front edited: the prune stops before it (it never
    launders it into a summary) and says so with a non-zero exit, so a scheduled
    `agentledger prune` is noticed; `audit verify` still names the record."""
    ids = await _finished(store, "t1", 3)
    await _exec(store, "UPDATE events SET actor = 'mallory' WHERE run_id = :r", {"r": ids[1]})
    got = await run_cli("prune", "--older-than", "0s", "--db", store_url)
    assert got.exit_code == 1, got.output
    assert "does not verify" in got.output, got.output
    assert (await _rows_of(store, ids[1]))["runs"] == 1
    bad = await run_cli("audit", "verify", "--db", store_url)
    assert bad.exit_code == 1 and "TAMPERED" in bad.output, bad.output
