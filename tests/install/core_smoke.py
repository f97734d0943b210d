"""What ``pip install agentledger`` alone must do, as a script run by a Python that has
only the core: import the package, run a workflow embedded on SQLite, list runs with the
CLI, and refuse the commands of the extras and of the installables beside the runtime
in one line each, naming what to install.

``python core_smoke.py`` checks the interpreter it runs in (a fresh venv with the core
installed: scripts/check_core_install.py); ``python core_smoke.py --block`` first makes
every module of the extras unimportable, as if not installed (tests/install). Prints
``core ok`` and exits 0, or raises.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The top-level modules only the extras (and the examples and benchmarks) bring.
EXTRA_MODULES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "httptools",
    "uvloop",
    "opentelemetry.sdk",
    "opentelemetry.exporter",
    "opentelemetry.proto",
    "prometheus_client",
    "psycopg",
    "psycopg_binary",
    "openai",
    "anthropic",
    "genai_prices",
    "wordllama",
    "numpy",
    "aiohttp",
    "agentledger_examples",
    "agentledger_bench",
)


class Blocker(importlib.abc.MetaPathFinder):
    """Makes :data:`EXTRA_MODULES` unimportable, as a missing install is."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if any(name == m or name.startswith(m + ".") for m in EXTRA_MODULES):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def block() -> None:
    sys.meta_path.insert(0, Blocker())


def _cli(args: list[str], blocked: bool, cwd: str) -> subprocess.CompletedProcess[str]:
    """``agentledger ARGS`` in a fresh process (blocked like this one when ``blocked``)."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        + ("import core_smoke; core_smoke.block(); " if blocked else "")
        + "from agentledger.cli._main import main; sys.argv[0] = 'agentledger'; main()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )


async def _embedded(url: str) -> str:
    # The audit chain that seals what the worker writes (a worker refuses without it).
    import agentledger.service  # noqa: F401
    from agentledger import App, RunStatus, Worker, WorkerConfig, WorkflowContext, open_store

    app = App("core")

    @app.workflow()
    async def greet(ctx: WorkflowContext, inp: dict[str, Any]) -> dict[str, Any]:
        name = await ctx.step("name", lambda: inp["name"])
        return {"greeting": f"hello {name}"}

    store = open_store(url)
    await store.open()
    try:
        run_id = await app.submit(store, "greet", {"name": "core"})
        await Worker(store, app, WorkerConfig(poll_seconds=0.02), burst=True).run(
            install_signals=False
        )
        run = await store.get_run(run_id)
        assert run is not None and run.status == RunStatus.COMPLETED, run
        assert run.result == {"greeting": "hello core"}, run.result
        return run_id
    finally:
        await store.close()


def _one_line_refusal(result: subprocess.CompletedProcess[str], expected: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1 and expected in lines[0], result.stderr


def main(blocked: bool) -> None:
    if blocked:
        block()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/core.db"
        run_id = asyncio.run(_embedded(url))
        listed = _cli(["runs", "list", "--db", url], blocked, folder)
        assert listed.returncode == 0 and run_id in listed.stdout, listed
        assert "completed" in listed.stdout, listed.stdout
        _one_line_refusal(
            _cli(["serve", "--app", "x:app", "--db", url], blocked, folder),
            "agentledger serve needs the service extra: pip install 'agentledger[service]'",
        )
        _one_line_refusal(
            _cli(["demo"], blocked, folder),
            "agentledger demo needs agentledger's examples: pip install -e ./examples",
        )
        _one_line_refusal(
            _cli(["bench", "--quick"], blocked, folder),
            "agentledger bench needs agentledger's bench: pip install -e ./bench",
        )
    loaded = sorted(
        m for m in sys.modules if any(m == e or m.startswith(e + ".") for e in EXTRA_MODULES)
    )
    assert not loaded, f"the core loaded modules of the extras: {loaded}"
    print("core ok")


if __name__ == "__main__":
    main(blocked="--block" in sys.argv[1:])
