"""A small core install: ``pip install agentledger`` pulls no web server, no
OpenTelemetry SDK and no Prometheus client; each optional import is declared in an extra.

The fast check runs core_smoke.py with every module of the extras made unimportable;
``python scripts/check_core_install.py`` does the same in a fresh venv from PyPI.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from agentledger._extras import EXTRAS
from tests.install.check_core_install import FORBIDDEN as NOT_CORE

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OPTIONAL: dict[str, list[str]] = PROJECT["optional-dependencies"]


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~;@ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _declared(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The distributions an extra pulls, through ``agentledger[...]`` self-references."""
    names: set[str] = set()
    for requirement in OPTIONAL[extra]:
        match = re.match(r"agentledger\[([^\]]+)\]", requirement)
        if match:
            for inner in match.group(1).split(","):
                if inner.strip() not in seen:
                    names |= _declared(inner.strip(), seen | {extra})
        else:
            names.add(_name(requirement))
    return names


def test_the_core_runs_without_the_extras() -> None:
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("core_smoke.py")), "--block"],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert result.returncode == 0 and "core ok" in result.stdout, (
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    )


def test_the_core_dependencies_pull_no_server_sdk_or_metrics_client() -> None:
    core = {_name(r) for r in PROJECT["dependencies"]}
    assert not core & NOT_CORE, sorted(core & NOT_CORE)
    assert {"service", "postgres", "otel", "metrics", "openai", "anthropic", "embeddings"} <= set(
        OPTIONAL
    )
    assert {"fastapi", "uvicorn", "httptools", "uvloop"} <= _declared("service")
    assert _declared("postgres") == {"psycopg"}  # the binary build is the application's pick
    assert any("psycopg[binary]" in r for r in OPTIONAL["postgres-binary"])
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"} <= _declared("otel")
    assert _declared("metrics") == {"prometheus-client"}
    assert "numpy" in _declared("embeddings")


def test_all_and_dev_pull_every_extra() -> None:
    every = set().union(*(_declared(e) for e in OPTIONAL if e not in ("all", "dev")))
    assert _declared("all") | _declared("postgres-binary") == every
    assert every <= _declared("dev")  # the README's test command installs everything


def test_each_extra_module_is_in_its_extra() -> None:
    provided = packages_distributions()
    for extra, modules in EXTRAS.items():
        for module in modules:
            dists = {_name(d) for d in provided.get(module.split(".")[0], [])}
            assert dists & (_declared(extra) | {"opentelemetry-api"}), (extra, module, dists)


def test_every_third_party_import_is_declared() -> None:
    """A module of ``src/agentledger`` imports only the standard library, agentledger and
    distributions named in the core or an extra (numpy for retrieval, ...)."""
    declared = {_name(r) for r in PROJECT["dependencies"]}
    declared |= set().union(*(_declared(e) for e in OPTIONAL if e != "dev"))
    provided = packages_distributions()
    undeclared: set[str] = set()
    for path in (ROOT / "src" / "agentledger").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top in sys.stdlib_module_names or top == "agentledger":
                    continue
                dists = {_name(d) for d in provided.get(top, [top])}
                if not dists & declared:
                    undeclared.add(f"{top} ({path.relative_to(ROOT)})")
    assert not undeclared, sorted(undeclared)
