"""The operator's first day: a busy port, a wrong --app, an unknown name, a database that
is a directory or read-only, help texts, units, migrate's report and empty listings,
each said in one line that says what to do, with nothing created."""

from __future__ import annotations

import json
import socket
import sqlite3
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import cli_here, run_cli

APP = "tests.apps.engine_app:app"


def one_line_error(result: object, code: int = 2) -> str:
    """The single stderr line of a refused command (asserting there is exactly one)."""
    rc, err = result.returncode, result.stderr  # type: ignore[attr-defined]
    assert rc == code, (rc, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return str(lines[0])


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield int(busy.getsockname()[1])


# 8. a busy port ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (("sandbox",), "--port"),
        (("serve", "--app", APP), "--port"),
        (("worker", "--app", APP, "--burst", "--metrics-host", "127.0.0.1"), "--metrics-port"),
        (("serve", "--app", APP, "--port", "0"), "--metrics-port"),
    ],
    ids=["sandbox", "serve", "worker", "serve-metrics"],
)
def test_a_busy_port_is_one_line_before_anything_starts(
    tmp_path: Path,
    busy_port: int,
    command: tuple[str, ...],
    option: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTLEDGER_KEY_PEPPER", "p" * 32)  # serve's only other need
    db = tmp_path / "never.db"
    with_db = () if command[0] == "sandbox" else ("--db", f"sqlite:///{db}")
    # A worker sets its signal handlers first: only a process of its own can start it.
    run = run_cli if command[0] == "worker" else cli_here
    result = run(*command, *with_db, option, str(busy_port))
    line = one_line_error(result)
    assert line == (
        f"error: port {busy_port} on 127.0.0.1 is in use; stop what listens there or "
        f"pick another with {option}"
    )
    assert "startup complete" not in result.stdout + result.stderr
    assert not db.exists()


@pytest.mark.parametrize(
    ("options", "host_option"),
    [
        (("--host", "203.0.113.7", "--port", "0"), "--host"),
        (("--port", "0", "--metrics-host", "203.0.113.7", "--metrics-port", "0"), "--metrics-host"),
    ],
    ids=["api", "metrics"],
)
def test_an_address_not_of_this_host_is_one_line_even_on_any_free_port(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: tuple[str, ...],
    host_option: str,
) -> None:
    # Port 0 asks for any free port: the host must still be checked before anything
    # starts (203.0.113.7 is a documentation address no host of a test network holds).
    # A process of its own: binding sends nothing, but this process's guard refuses to
    # resolve any address that is not loopback.
    monkeypatch.setenv("AGENTLEDGER_KEY_PEPPER", "p" * 32)
    db = tmp_path / "never.db"
    result = run_cli("serve", "--app", APP, "--db", f"sqlite:///{db}", *options)
    assert one_line_error(result) == (
        f"error: cannot listen on 203.0.113.7: it is not an address of this host; "
        f"check {host_option}"
    )
    assert not db.exists()


def test_serve_refuses_one_port_for_the_api_and_keyless_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTLEDGER_KEY_PEPPER", "p" * 32)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    db = tmp_path / "never.db"
    result = cli_here("serve", "--app", APP, "--db", f"sqlite:///{db}", "--port", port,
                     "--metrics-port", port)  # fmt: skip
    assert one_line_error(result) == (
        f"error: --metrics-port {port} is the API's --port; give the keyless /metrics a "
        "port of its own"
    )
    assert not db.exists()


def test_serve_refuses_a_webhook_allow_item_that_names_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTLEDGER_KEY_PEPPER", "p" * 32)
    db = tmp_path / "never.db"
    result = cli_here("serve", "--app", APP, "--db", f"sqlite:///{db}", "--port", "0",
                     "--webhook-allow-host", "*.internal")  # fmt: skip
    line = one_line_error(result)
    assert "'*.internal'" in line and "--webhook-allow-host" in line, line
    assert not db.exists()


# 10. a wrong --app ----------------------------------------------------------------------


def write_module(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


HOTEL = """
    from agentledger import Agent, App, ScriptedModel, Turn

    app = App("hotel")
    other = App("other")

    @app.tool(effect="read", timeout=2)
    async def echo(ctx, text: str) -> str:
        return text

    for name in ("nightly", "concierge"):
        app.add_agent(Agent(name=name, model=ScriptedModel([Turn(text="done")]),
                            instructions="x", tools=[echo]))

    @app.workflow(name="checkout", version="1")
    async def checkout(ctx, input):
        return 1
"""


def test_an_app_attribute_that_is_missing_names_the_apps_the_module_has(tmp_path: Path) -> None:
    write_module(tmp_path, "hotel", HOTEL)
    line = one_line_error(cli_here("describe", "--app", "hotel:ap", cwd=tmp_path))
    assert line == "error: module hotel has no attribute 'ap'; its App objects: app, other"
    line = one_line_error(cli_here("describe", "--app", "hotel:echo", cwd=tmp_path))
    assert line.startswith("error: hotel:echo is a Tool, not an agentledger App;"), line
    assert line.endswith("its App objects: app, other"), line


def test_a_failed_import_inside_the_app_names_the_missing_module(tmp_path: Path) -> None:
    write_module(tmp_path, "needs", "import requests_not_installed_here\n")
    line = one_line_error(cli_here("describe", "--app", "needs:app", cwd=tmp_path))
    assert "needs" in line and "'requests_not_installed_here'" in line, line
    assert "PYTHONPATH" not in line, line
    # The --app module itself missing still says to check --app and PYTHONPATH.
    line = one_line_error(cli_here("describe", "--app", "no_such_module_x:app", cwd=tmp_path))
    assert "no_such_module_x" in line and "check --app and PYTHONPATH" in line, line


def test_a_syntax_error_in_the_app_is_its_file_and_line(tmp_path: Path) -> None:
    path = write_module(tmp_path, "broken", "from agentledger import App\napp = App('x'\n")
    line = one_line_error(cli_here("describe", "--app", "broken:app", cwd=tmp_path))
    assert f"{path}, line 2" in line, line


def test_an_agent_with_a_tool_that_is_not_one_names_it(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "badtool",
        """
        from agentledger import Agent, App, ScriptedModel, Turn
        app = App("x")
        app.add_agent(Agent(name="nightly", model=ScriptedModel([Turn(text="done")]),
                            instructions="x", tools=["nope"]))
        """,
    )
    line = one_line_error(cli_here("describe", "--app", "badtool:app", cwd=tmp_path))
    assert "'nope'" in line and "agent nightly" in line, line
    assert f"{path}, line 4" in line, line


# 9. an unknown name with --app ------------------------------------------------------------


def test_an_unknown_name_lists_the_apps_names_suggests_the_closest_and_creates_nothing(
    tmp_path: Path,
) -> None:
    write_module(tmp_path, "hotel", HOTEL)
    result = cli_here("submit", "nightlyy", "--app", "hotel:app", cwd=tmp_path)
    line = one_line_error(result)
    assert line == (
        "error: unknown agent or workflow 'nightlyy' in hotel:app; did you mean 'nightly'? "
        "(agents: concierge, nightly; workflows: checkout)"
    )
    assert not (tmp_path / "agentledger.db").exists()
    # An unknown version of a known name is still refused before anything is created.
    line = one_line_error(
        cli_here("submit", "nightly", "--version", "9", "--app", "hotel:app", cwd=tmp_path)
    )
    assert "nightly@9" in line, line
    assert not (tmp_path / "agentledger.db").exists()


# 11. a database that is a directory, or read-only ----------------------------------------


@pytest.mark.parametrize(
    "args", [("runs", "list"), ("migrate",), ("submit", "quick", "--app", APP)]
)
def test_a_database_that_is_a_directory_says_so(tmp_path: Path, args: tuple[str, ...]) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    line = one_line_error(cli_here(*args, "--db", f"sqlite:///{folder}"))
    assert line == (
        f"error: {folder} is a directory, not a database file; name a file in it, e.g. "
        f"--db sqlite:///{folder}/agentledger.db"
    )
    assert list(folder.iterdir()) == []


@pytest.fixture
def read_only_db(tmp_path: Path) -> Iterator[str]:
    """A database file nothing may write (immutable: read-only even for root), in the
    rollback-journal mode a copied or restored file can have."""
    import shutil
    import subprocess

    path = tmp_path / "ro.db"
    url = f"sqlite:///{path}"
    assert cli_here("submit", "quick", "--app", APP, "--db", url).returncode == 0
    sqlite3.connect(path).execute("PRAGMA journal_mode = DELETE").connection.close()
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(path)]).returncode:
        pytest.skip("cannot make a file immutable here")
    try:
        yield url
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_read_only_commands_read_a_read_only_database(read_only_db: str) -> None:
    listed = cli_here("runs", "list", "--db", read_only_db, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["name"] for r in json.loads(listed.stdout)] == ["quick"]
    for args in (("approvals", "list"), ("outbox", "dead"), ("stats",)):
        result = cli_here(*args, "--db", read_only_db)
        assert result.returncode == 0, (args, result.stderr)
    # A command that writes says the file is read-only, in one line.
    line = one_line_error(cli_here("runs", "cancel", "r-x", "--db", read_only_db))
    assert "read-only" in line, line


# 18. stats ------------------------------------------------------------------------------------


def test_stats_since_needs_a_unit_and_shows_all_five_numbers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert cli_here("migrate", "--db", url).returncode == 0
    line = one_line_error(cli_here("stats", "--since", "7", "--db", url))
    assert "'7'" in line and "7d" in line, line
    shown = cli_here("stats", "--db", url)
    assert shown.returncode == 0, shown.stderr
    assert "failing steps     none" in shown.stdout, shown.stdout


# 19. migrate ---------------------------------------------------------------------------------


def test_migrate_says_it_created_the_schema_and_its_version(tmp_path: Path) -> None:
    from agentledger.store import open_store

    url = f"sqlite:///{tmp_path / 'm.db'}"
    latest = max(v for v, _ in open_store(url).dialect.migrations())
    created = cli_here("migrate", "--db", url)
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == f"schema created (version {latest}) in {url}"
    again = cli_here("migrate", "--db", url)
    assert again.stdout.strip() == f"schema up to date (version {latest}) in {url}"


# 21. empty listings -------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("runs", "list", "--stuck"), ("outbox", "dead")])
def test_an_empty_listing_says_none(tmp_path: Path, args: tuple[str, ...]) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    assert cli_here("migrate", "--db", url).returncode == 0
    result = cli_here(*args, "--db", url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none", result.stdout


# 13. help texts and the README's command table --------------------------------------------


def cli_commands() -> dict[str, object]:
    """Every command a user can invoke, by its full path (``agentledger runs list``)."""
    import click

    from agentledger.cli._main import cli

    found: dict[str, object] = {}

    def walk(command: click.Command, path: str) -> None:
        if not isinstance(command, click.Group) or command.invoke_without_command:
            found[path] = command
        if isinstance(command, click.Group):
            # Through click's listing: the examples' and benchmarks' commands load by name.
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, f"{path} {name}")

    walk(cli, "agentledger")
    return found


def test_the_readme_command_table_names_every_command_and_only_real_options() -> None:
    import re

    import click

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("| command | what it does |") :].split("\n\n", 1)[0]
    spans = [s for s in re.findall(r"`([^`]+)`", table) if s.startswith("agentledger ")]
    commands = cli_commands()
    named: dict[str, set[str]] = {}
    for span in spans:
        words = span.split()
        path = max((p for p in commands if words[: len(p.split())] == p.split()), key=len)
        named.setdefault(path, set()).update(re.findall(r"(?:^|[\s\[])(--?[a-z][a-z-]*)", span))
    assert sorted(set(commands) - set(named)) == [], "commands missing from README's table"
    for path, options in named.items():
        command = commands[path]
        assert isinstance(command, click.Command)
        real = {o for p in command.params for o in getattr(p, "opts", [])}
        assert options <= real, (path, options - real)
    for path, option in [("agentledger submit", "--tenant"), ("agentledger submit", "--user"),
                         ("agentledger runs list", "--stuck"), ("agentledger runs list", "--name"),
                         ("agentledger runs list", "--limit")]:  # fmt: skip
        assert option in named[path], (path, option)


def test_help_texts_say_what_the_commands_do() -> None:
    from click.testing import CliRunner

    from agentledger.cli._main import cli

    def help_of(*args: str) -> str:
        return " ".join(CliRunner().invoke(cli, [*args, "--help"]).output.split())

    assert "resume" in help_of("runs").split("Options:")[0]
    assert "Pending approvals" in help_of("approvals", "list")
    assert "SIGTERM or SIGINT" in help_of("worker")
    for command in (("demo",), ("sandbox",)):
        text = help_of(*command)
        assert "docs/guide.md" not in text and "python -m" not in text, command
        assert "ENDPOINT:KIND[@PROBABILITY]" in text and "timeout_after_commit" in text, command
    # Every command has a description of its own.
    for path, command in cli_commands().items():
        assert getattr(command, "help", None), path
