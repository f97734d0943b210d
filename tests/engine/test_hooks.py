"""The engine's hook points (engine/_hooks.py): no-ops until a feature installs its own,
except the user's facts, which an agent built with ``memory=True`` never runs without,
and the tenant budgets, without which a priced model call is never sent. Each case in a
fresh interpreter: importing a feature installs its hooks for good."""

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
        "\ntry:\n asyncio.run(hooks.reserve_tenant(None, 't', 0.0, 0.1, 10))"
        "\nexcept Exception as exc:\n print(type(exc).__name__, 'agentledger.gateway' in str(exc))"
        "\nprint(hooks.model_cooled_until('m', 0.0), hooks.model_call_ended('m', 0.0, 'x'))"
    )
    assert out.splitlines() == [
        "[]",
        "Attempt",
        "MissingFeature",
        "MissingFeature True",
        "None None",
    ], out


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


def test_importing_the_gateway_installs_its_hooks() -> None:
    out = _run(
        "import agentledger.gateway;"
        "from agentledger.engine import _hooks as hooks;"
        "from agentledger.gateway import _engine as engine;"
        "from agentledger.gateway._cooldown import COOLDOWNS;"
        "print(hooks.reserve_tenant is engine.reserve_tenant,"
        " hooks.settle_tenant is engine.settle_tenant,"
        " hooks.model_cooled_until == COOLDOWNS.cooled_until)"
    )
    assert out == "True True True"
