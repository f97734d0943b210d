"""The engine's hook points (engine/_hooks.py): no-ops until a feature installs its own,
except the user's facts, which an agent built with ``memory=True`` never runs without.
Each case in a fresh interpreter: importing a feature installs its hooks for good."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_engine_imports_no_feature_and_its_hooks_start_as_defaults() -> None:
    out = _run(
        "import sys, asyncio, agentledger.engine._runner, agentledger.worker;"
        "from agentledger.engine import _hooks as hooks;"
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('agentledger.')}"
        " & {'observe', 'memory', 'service', 'gateway'}));"
        "rec = hooks.tool_attempt(None, None, None, 'k', 1).__enter__();"
        "print(type(rec).__name__);"
        "\ntry:\n asyncio.run(hooks.memory_note(None, None))"
        "\nexcept Exception as exc:\n print(type(exc).__name__)"
    )
    # Still imported (tests/test_layering.py, KNOWN_EXCEPTIONS): the gateway by the model
    # step, the service's audit chain by the sealer.
    assert out.splitlines() == ["['gateway', 'service']", "Attempt", "UsageError"], out


def test_importing_observe_and_memory_installs_their_hooks() -> None:
    out = _run(
        "import agentledger.observe, agentledger.memory;"
        "from agentledger.engine import _hooks as hooks;"
        "from agentledger.observe import _tracing as tracing;"
        "from agentledger.memory import _context as context;"
        "print(hooks.tool_attempt is tracing.tool_attempt, hooks.run_span is tracing.run_span,"
        " hooks.memory_note is context.memory_note)"
    )
    assert out == "True True True"
