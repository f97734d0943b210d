"""First use as written: burst workers, declared inputs, read-only commands, logging,
liveness notes, approvals hints, one-line errors and help texts."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from agentledger import Agent, App, ScriptedModel, Turn, WorkflowContext
from agentledger._inputs import InvalidInput
from agentledger._policies import RequireApproval
from agentledger.cli._main import cli
from agentledger.records import RunStatus, WorkerInfo
from agentledger.store import open_store
from agentledger.worker import Worker, WorkerConfig
from agentledger.worker._liveness import me
from tests.cli.helpers import cli_here, run_cli


class Day(BaseModel):
    day: str
    rows: int = 1


def make_app() -> App:
    app = App("firstuse")

    @app.tool(effect="read", timeout=2)
    async def echo(ctx: Any, text: str) -> str:
        return text

    @app.workflow(name="typed", version="1", input_model=Day)
    async def typed(ctx: WorkflowContext, input: dict[str, Any]) -> str:
        return str(input["day"])

    @app.workflow(name="schema", version="1", input_model={
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
        "required": ["n"], "additionalProperties": False})  # fmt: skip
    async def schema(ctx: WorkflowContext, input: dict[str, Any]) -> int:
        return int(input["n"])

    @app.workflow(name="untyped", version="1")
    async def untyped(ctx: WorkflowContext, input: dict[str, Any]) -> str:
        return str(input["day"])  # KeyError on {}

    app.add_agent(
        Agent(
            name="helper",
            model=ScriptedModel([Turn(calls=[("echo", {"text": "hi"})]), Turn(text="done")]),
            instructions="Help.",
            tools=[echo],
        )
    )
    app.add_agent(
        Agent(
            name="asker",
            model=ScriptedModel([Turn(calls=[("echo", {"text": "hi"})]), Turn(text="done")]),
            instructions="Ask first.",
            tools=[echo],
            policy=lambda call: RequireApproval(role="guest"),
        )
    )
    return app


async def test_submit_validates_declared_inputs(tmp_path: Path) -> None:
    app = make_app()
    store = open_store(f"sqlite:///{tmp_path / 'v.db'}")
    await store.open()
    try:
        with pytest.raises(
            InvalidInput, match=r"^invalid input for typed@1: input\.day: field required$"
        ):
            await app.submit(store, "typed", {})
        with pytest.raises(InvalidInput, match=r"input\.rows: input should be a valid integer"):
            await app.submit(store, "typed", {"day": "x", "rows": "many"})
        with pytest.raises(InvalidInput, match=r"input\.n: must be at least 1"):
            await app.submit(store, "schema", {"n": 0})
        with pytest.raises(InvalidInput, match=r"input\.extra: not an allowed field"):
            await app.submit(store, "schema", {"n": 1, "extra": 2})
        for bad in ([1, 2], None, 3):
            with pytest.raises(
                InvalidInput, match=r'a string or an object with a string "message"'
            ):
                await app.submit(store, "helper", bad)
        assert await app.submit(store, "helper", "hello")
        assert await app.submit(store, "helper", {"message": "hello"})
        assert await app.submit(store, "typed", {"day": "2026-01-01"})
        assert len(await store.list_runs()) == 3
    finally:
        await store.close()


def test_describe_lists_inputs_and_contracts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fu_app.py").write_text(
        "from tests.cli.test_first_use import make_app\napp = make_app()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(cli, ["describe", "--app", "fu_app:app"])
    assert result.exit_code == 0, result.output
    assert "workflow typed@1" in result.output
    assert "input: {day: string (required), rows: integer = 1}" in result.output
    assert "input: string or {message: string (required)}" in result.output
    assert "echo(text): effect=read timeout=2s" in result.output
    data = json.loads(CliRunner().invoke(cli, ["describe", "--app", "fu_app:app", "--json"]).output)
    assert {d["target"] for d in data["definitions"]} >= {"typed@1", "helper@1"}


async def _burst(store: Any, app: App, **config: Any) -> None:
    worker = Worker(store, app, WorkerConfig(poll_seconds=0.02, **config), burst=True)
    await worker.run(install_signals=False)


async def test_burst_exits_when_nothing_is_left_and_keeps_tracebacks(tmp_path: Path) -> None:
    app = make_app()
    store = open_store(f"sqlite:///{tmp_path / 'b.db'}")
    await store.open()
    try:
        done = await app.submit(store, "typed", {"day": "monday"})
        broken = await app.submit(store, "untyped", {})
        parked = await app.submit(store, "asker", "please")
        await _burst(store, app)  # returns by itself: the test's timeout is the failure
        runs = {r.id: r for r in await store.list_runs()}
        assert runs[done].status == RunStatus.COMPLETED
        assert runs[parked].status == RunStatus.WAITING  # waits for a human: not counted
        failed = runs[broken]
        assert failed.status == RunStatus.FAILED
        assert failed.error is not None and failed.error.startswith("KeyError: 'day'")
        assert "Traceback" in failed.error and "in untyped" in failed.error, failed.error
        events = [e for e in await store.list_events(broken) if e.type == "run.failed"]
        assert events and "in untyped" in events[-1].data["traceback"]
    finally:
        await store.close()


def _dead_owner() -> str:
    """The owner id of a process of this host that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    mine = me()
    return str(mine.__class__(mine.host, proc.pid, "12345", "dead00", mine.boot_id, mine.pid_ns))


async def test_burst_takes_over_a_dead_workers_run(tmp_path: Path) -> None:
    app = make_app()
    url = f"sqlite:///{tmp_path / 'd.db'}"
    store = open_store(url)
    await store.open()
    try:
        run_id = await app.submit(store, "typed", {"day": "tuesday"})
        [claimed] = await store.claim_runs(_dead_owner(), ["typed@1"], 1, 3600)
        assert claimed.id == run_id
        # runs list says so at once, an hour before the lease expires
        [row] = json.loads(cli_here("runs", "list", "--db", url, "--json").stdout)
        assert "is gone (its process ended)" in row["note"], row
        await _burst(store, app)
        run = await store.get_run(run_id)
        assert run is not None and run.status == RunStatus.COMPLETED and run.lease_epoch == 2
    finally:
        await store.close()


def test_owner_notes_flag_stale_heartbeats_and_expired_leases() -> None:
    from agentledger.cli._runs import owner_note
    from agentledger.records import Run

    now = 1_000_000.0
    owner = "elsewhere:1:1:aa.bb.1"  # another host: only the liveness data can tell
    worker = WorkerInfo(owner, "elsewhere", 1, ["w@1"], now - 100, heartbeat_at=now - 12)
    run = Run("r1", "default", None, "workflow", "w", "1", {}, RunStatus.RUNNING,
              lease_owner=owner, lease_expires_at=now + 3)  # fmt: skip
    # renewed with its heartbeat 12 s ago for 15 s: four heartbeats (every 5 s) missed
    assert owner_note(run, [worker], now) == (
        "worker elsewhere:1:1:aa is gone (no heartbeat for 12 s); its lease expires in 3 s"
    )
    fresh = WorkerInfo(owner, "elsewhere", 1, ["w@1"], now - 100, heartbeat_at=now - 2)
    run.lease_expires_at = now + 13
    assert owner_note(run, [fresh], now) == ""
    run.lease_expires_at = now - 4
    assert owner_note(run, [fresh], now).startswith("lease expired 4 s ago")


async def test_waiting_run_names_its_approval_and_the_command(tmp_path: Path) -> None:
    app = make_app()
    url = f"sqlite:///{tmp_path / 'a.db'}"
    store = open_store(url)
    await store.open()
    try:
        run_id = await app.submit(store, "asker", "please")
        await _burst(store, app)
        [approval] = await store.get_approvals(pending=True)
    finally:
        await store.close()
    [row] = json.loads(cli_here("runs", "list", "--db", url, "--json").stdout)
    assert row["note"].startswith(f"waiting for approval {approval.id} (role guest)"), row
    shown = cli_here("runs", "show", run_id, "--db", url).stdout
    assert f"agentledger approvals approve {approval.id} --by NAME --db {url}" in shown


def test_read_only_commands_never_create_a_schema(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    sqlite3.connect(path).execute("CREATE TABLE mine (x)").connection.close()
    url = f"sqlite:///{path}"
    result = cli_here("runs", "list", "--db", url)
    assert result.returncode == 2
    assert result.stderr.startswith("error: no agentledger schema"), result.stderr
    assert f"agentledger migrate --db {url}" in result.stderr
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert tables == {"mine"}


def test_read_only_commands_on_postgres_say_how_to_create_it() -> None:
    pytest.importorskip("psycopg")
    from tests import dbutil

    try:
        url = dbutil.make_pg_database(migrated=False)
    except Exception as exc:  # no server here
        pytest.skip(f"no PostgreSQL: {exc}")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "agentledger.cli._main", "runs", "list", "--db", url],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert result.returncode == 2
        assert result.stderr.startswith("error: no agentledger schema"), result.stderr
        assert f"agentledger migrate --db {url}" in result.stderr
        import psycopg

        with psycopg.connect(url) as conn:
            count = conn.execute(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'public'"
            ).fetchone()
        assert count is not None and count[0] == 0
    finally:
        dbutil.drop_pg_database(url)


def test_worker_logs_state_changes_as_json(tmp_path: Path) -> None:
    (tmp_path / "fu_app.py").write_text(
        "from tests.cli.test_first_use import make_app\napp = make_app()\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), root, os.environ.get("PYTHONPATH", "")]),
    )
    url = f"sqlite:///{tmp_path / 'l.db'}"
    for name, payload in (("untyped", "{}"), ("typed", '{"day": "x"}'), ("asker", '"hi"')):
        submitted = cli_here("submit", name, "--app", "fu_app:app", "--input", payload, "--db",
                             url, cwd=tmp_path)  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
    result = subprocess.run(
        [sys.executable, "-m", "agentledger.cli._main", "worker", "--app", "fu_app:app",
         "--db", url, "--burst", "--log-format", "json", "-v"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    messages = [line["message"] for line in lines]
    assert any(m.startswith("worker ") and f"database {url}" in m and "lease 15 s" in m
               for m in messages), messages  # fmt: skip
    assert any("failed: KeyError: 'day'" in m and "Traceback" in m for m in messages), messages
    assert any(m.endswith("completed in 0 steps") for m in messages), messages
    assert any("waiting for approval" in m and "(role guest)" in m for m in messages), messages
    assert any(
        " step 1 " in m and line["level"] == "debug"
        for m, line in zip(messages, lines, strict=True)
    )


def test_redacted_database_url() -> None:
    from agentledger.store._sqlstore import redacted_url

    assert redacted_url("postgresql://al:secret@db:5432/x") == "postgresql://al:***@db:5432/x"
    assert redacted_url("sqlite:///a.db") == "sqlite:///a.db"


def test_every_option_has_help() -> None:
    missing = []

    def walk(command: click.Command, path: str) -> None:
        for param in command.params:
            if isinstance(param, click.Option) and not param.help and param.name != "help":
                missing.append(f"{path} {param.opts[0]}")
        if isinstance(command, click.Group):
            # Through click's listing: commands load when named (cli/_main.py).
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, f"{path} {name}")
                walked.append(f"{path} {name}")

    walked: list[str] = []
    walk(cli, "agentledger")
    assert not missing, missing
    assert {"agentledger worker", "agentledger runs resume", "agentledger outbox retry"} <= set(
        walked
    ), walked


def test_demo_refuses_zero_runs_and_says_what_runs_by_default() -> None:
    result = CliRunner().invoke(cli, ["demo", "--runs", "0"])
    assert result.exit_code == 2 and "0 is not in the range x>=1" in result.output
    text = " ".join(CliRunner().invoke(cli, ["demo", "--help"]).output.split())
    default = "By default: 20 booking runs on 2 workers, against a local sandbox with no faults"
    assert f"{default} and no kills" in text


def test_sandbox_port_errors_are_one_line() -> None:
    out_of_range = cli_here("sandbox", "--port", "99999")
    assert out_of_range.returncode == 2 and "Traceback" not in out_of_range.stderr
    assert "99999 is not in the range 1<=x<=65535" in out_of_range.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        in_use = cli_here("sandbox", "--port", str(port))
    assert in_use.returncode == 2, in_use.stderr
    assert in_use.stderr.strip() == (
        f"error: port {port} on 127.0.0.1 is in use; stop what listens there or pick "
        "another with --port"
    )


def test_example_uses_the_db_it_is_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    result = run_cli("example", "--db", url)
    assert result.returncode == 0, result.stderr
    assert f"database: {url}" in result.stdout
    assert (tmp_path / "mine.db").exists()
