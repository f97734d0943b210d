"""A SQLite file written by the release that chained accept events at insert (its own
code, taken from the repository's history, run in a child process) is then extended by
this release's accepts and sealer, and must verify: signed and unsigned, against a
checkpoint the old release took, with ``--require-signed`` when signed."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from agentledger.service._accepting import IdempotencyMismatch, IdempotencyRequest
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store, open_store
from agentledger.store._queries.events import insert_event
from tests.service.test_accept_group_fast import ok, request, submit, table

# The last commit whose accepts chained their events at insert on SQLite.
OLD = "0e93f9b^"
ROOT = Path(__file__).resolve().parents[2]

OLD_DRIVER = r"""
import asyncio, sys
from agentledger.store import NewRun, open_store
from agentledger.store.queries import service_runs, service_audit
from agentledger.store.queries.events import insert_event
from agentledger.store.queries.service_quota import Quota
from agentledger.store.queries.service_submits import IdempotencyRequest, SubmitRequest

def respond(run):
    return {"id": run.id, "status": run.status, "created_at": run.created_at}

def req(i, tenant, key=None, rid=None, text="x"):
    new = NewRun(kind="workflow", name="free", version="1",
                 input={"i": i, "t": text, "f": -0.0, "big": 1e308},
                 tenant_id=tenant, user_id="u\u00e9", request_id=rid or f"old{i}")
    idem = IdempotencyRequest(key, "fp", 3600.0) if key else None
    return SubmitRequest(new, {"user_id": "u\x00", "key_id": "k", "roles": ["operator"]},
                         None, idem, Quota(), respond, f"req{i}")

async def main(url):
    store = open_store(url)
    await store.open()
    # The set-based path: two tenants, a key, its replay in the same group.
    g1 = [req(0, "t1", "k0"), req(1, "t2"), req(2, "t1", "k0"), req(3, "t1", text="nul\x00")]
    out = await store.transact(lambda d, c: service_runs.submit_group(d, c, g1))
    assert not any(isinstance(o, BaseException) for o in out), out
    run_id = out[1].run.id
    # A worker's event, sealed by the old sealer, between two chained groups.
    await store.transact(lambda d, c: insert_event(d, c, run_id, "run.started", "w", {}))
    await store.transact(lambda d, c: service_audit.seal(d, c))
    # The per-request path (one request id twice: the old release took it then).
    g2 = [req(4, "t1", rid="dup"), req(5, "t1", rid="dup"), req(6, "t2", "k6")]
    out = await store.transact(lambda d, c: service_runs.submit_group(d, c, g2))
    assert not any(isinstance(o, BaseException) for o in out), out
    await store.close()

asyncio.run(main(sys.argv[1]))
"""


def old_source(dest: Path) -> Path:
    """The old release's ``src`` tree, from git history (skip where there is none)."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", OLD, "src"],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the old release is not in this checkout's history: {exc}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "src"


# The command line of whichever release is on PYTHONPATH (its module moved since).
MAIN = """
import importlib, sys
try:
    main = importlib.import_module("agentledger.cli._main").main
except ModuleNotFoundError:
    main = importlib.import_module("agentledger.cli.main").main
main()
"""


def cli(url: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", MAIN, "audit", *args, "--db", url],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def old_release(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[bool], tuple[Path, str, dict[str, str]]]:
    """``written(signed)``: a file the old release wrote (signed or not), the checkpoint
    its own command took of it, and the old release's environment. Each kind is written
    once per module; a test extends a copy."""
    base = tmp_path_factory.mktemp("old-release")
    tree = old_source(base / "old")
    files: dict[bool, tuple[Path, str, dict[str, str]]] = {}

    def written(signed: bool) -> tuple[Path, str, dict[str, str]]:
        if signed not in files:
            path = base / f"{'signed' if signed else 'unsigned'}.db"
            url = f"sqlite:///{path}"
            env = {k: v for k, v in os.environ.items() if k != "AGENTLEDGER_AUDIT_KEY"}
            old_env = {**env, "PYTHONPATH": str(tree)}
            if signed:
                old_env["AGENTLEDGER_AUDIT_KEY"] = KEY
            done = subprocess.run(
                [sys.executable, "-c", OLD_DRIVER, url],
                capture_output=True, text=True, env=old_env, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            # The old release's checkpoint, taken by its own command.
            taken = cli(url, "checkpoint", env=old_env)
            assert taken.returncode == 0, taken.stdout + taken.stderr
            files[signed] = (path, taken.stdout, old_env)
        return files[signed]

    return written


KEY = "s" * 40


@pytest.mark.parametrize("mode", ["unsigned", "signed", "adopted"])
async def test_an_old_release_file_extended_by_the_sealer_verifies_since_its_checkpoint(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    old_release: Callable[[bool], tuple[Path, str, dict[str, str]]],
) -> None:
    """``adopted``: written unsigned by the old release, then signed by
    ``audit sign-unsigned`` when this release starts with a key."""
    env = {k: v for k, v in os.environ.items() if k != "AGENTLEDGER_AUDIT_KEY"}
    signed = mode != "unsigned"
    if signed:
        env["AGENTLEDGER_AUDIT_KEY"] = KEY
        monkeypatch.setenv("AGENTLEDGER_AUDIT_KEY", KEY)
    else:
        monkeypatch.delenv("AGENTLEDGER_AUDIT_KEY", raising=False)
    old_file, taken, _ = old_release(mode == "signed")
    for part in old_file.parent.glob(f"{old_file.name}*"):  # the file (and any journal)
        shutil.copyfile(part, tmp_path / part.name.replace(old_file.stem, "old", 1))
    url = f"sqlite:///{tmp_path / 'old.db'}"
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text(taken)
    if mode == "adopted":
        # This release's schema first (`audit` commands do not migrate), then adopt.
        migrated = subprocess.run(
            [sys.executable, "-m", "agentledger.cli._main", "migrate", "--db", url],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        adopted = cli(url, "sign-unsigned", env=env)
        assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    store: Store = open_store(url)
    await store.open()
    try:
        old_rows = await table(store, "SELECT id, hash, chain_no FROM events ORDER BY id")
        assert old_rows and all(r["hash"] is not None for r in old_rows)
        # This release: groups with replays of the old keys, new keys, a refusal.
        group = [request(i, tenant=f"t{1 + i % 2}", tag="new") for i in range(4)]
        group.append(request(9, key="k0", body="other", tenant="t1", tag="new"))
        group[0].idem = IdempotencyRequest("k6", "fp", 3600.0)  # the old release's body
        group[0].new.tenant_id = "t2"
        outcomes, _ = await submit(store, group)
        assert ok(outcomes[0]).replayed  # the old release's key, replayed
        assert isinstance(outcomes[4], IdempotencyMismatch)  # same key, another body
        run_id = ok(outcomes[1]).run.id
        await store.transact(insert_event, run_id, "run.started", "w", {})
        await store.transact(service_audit.seal)
        checked, broken = await store.read(lambda tx: service_audit.verify_chain(tx))
        assert broken == [], broken
        assert checked == len(old_rows) + 3 * 2 + 1
        # The old records were not touched.
        again = await table(store, "SELECT id, hash, chain_no FROM events ORDER BY id")
        assert again[: len(old_rows)] == old_rows
    finally:
        await store.close()
    args = ["verify", "--since-checkpoint", str(checkpoint)]
    if signed:
        args.append("--require-signed")
    verified = cli(url, *args, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert ("intact" if signed else "consistent") in verified.stdout
