"""Importing one part of agentledger does not import the rest: the package's public
names load when first used, and a process that needs a submodule (the StayHub sandbox,
which shares the fault grammar) starts without the runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import agentledger

ROOT = Path(__file__).resolve().parents[2]


def modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


#: What loads the lazy names themselves (a few lines, no import of its own).
LOADER = "agentledger._lazy"


def test_the_package_alone_imports_none_of_its_modules() -> None:
    loaded = modules_after("import agentledger")
    assert {m for m in loaded if m.startswith("agentledger.")} == {LOADER}


def test_a_submodule_does_not_import_the_runtime() -> None:
    loaded = modules_after("import agentledger._chaos.faults")
    assert {m for m in loaded if m.startswith("agentledger")} == {
        "agentledger", LOADER, "agentledger._chaos", "agentledger._chaos.faults",
    }  # fmt: skip


def test_every_public_name_loads_when_used() -> None:
    for name in agentledger.__all__:
        assert getattr(agentledger, name) is not None, name
    assert set(agentledger.__all__) <= set(dir(agentledger))
    loaded = modules_after("from agentledger import App, Worker, tool")
    assert {"agentledger._app", "agentledger.worker", "agentledger.tools"} <= loaded


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        agentledger.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018


def test_the_sandbox_process_imports_no_http_client() -> None:
    loaded = modules_after("import agentledger_examples.stayhub.sandbox.__main__")
    assert not {m for m in loaded if m.startswith(("httpx", "agentledger.engine"))}


def test_a_worker_with_nothing_to_deliver_imports_no_http_client_and_no_tables(
    tmp_path: Path,
) -> None:
    """A worker starts without httpx (the webhook dispatcher makes its client at its first
    delivery) and without rich (only the commands that print tables load it): together
    about a quarter of a worker's start-up CPU."""
    db = f"sqlite:///{tmp_path / 'agentledger.db'}"
    loaded = modules_after(
        "import sys\n"
        "from agentledger.cli._main import cli\n"
        "try:\n"
        f"    cli(['worker', '--app', 'tests.apps.engine_app:app', '--db', {db!r}, '--burst'])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
    )
    assert "agentledger.worker" in loaded and "agentledger.service._webhooks" in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("httpx", "rich")}
