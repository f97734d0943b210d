"""``pip install agentledger`` for real: build the wheel of this checkout, install it
alone into a fresh venv (its dependencies from the package index), and check what came:
no web server, no OpenTelemetry SDK, no Prometheus client, no examples or benchmarks in
the wheel; then core_smoke.py in that venv (import, an embedded run on SQLite,
``runs list``, the one-line refusals).

    python tests/install/check_core_install.py [--venv DIR]

Slower than the suite's check (tests/install/test_core_install.py, which blocks the
extras' modules instead), so it is a command of its own: ``make core-install``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What the core must never pull: the web stack, the SDK, the Prometheus client, psycopg.
FORBIDDEN = {
    "fastapi",
    "starlette",
    "uvicorn",
    "httptools",
    "uvloop",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-http",
    "prometheus-client",
    "psycopg",
    "psycopg-binary",
}


def run(*cmd: str | Path) -> str:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=None, help="Where to make the venv.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentledger-core-") as tmp:
        venv = args.venv or Path(tmp) / "venv"
        run(sys.executable, "-m", "venv", "--clear", venv)
        python = venv / "bin" / "python"
        run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
        run(python, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", tmp, ROOT)
        wheel = next(Path(tmp).glob("agentledger-*.whl"))
        names = zipfile.ZipFile(wheel).namelist()
        shipped = [n for n in names if n.startswith(("agentledger/examples", "agentledger/bench"))]
        assert not shipped, f"the wheel ships examples or benchmarks: {shipped[:5]}"
        run(python, "-m", "pip", "install", "--quiet", wheel)
        installed = {
            d["name"].lower().replace("_", "-")
            for d in json.loads(run(python, "-m", "pip", "list", "--format", "json"))
        }
        assert not installed & FORBIDDEN, f"the core pulled {sorted(installed & FORBIDDEN)}"
        print(f"core install: {len(installed)} distributions: {', '.join(sorted(installed))}")
        print(run(python, Path(__file__).with_name("core_smoke.py")).strip())


if __name__ == "__main__":
    main()
