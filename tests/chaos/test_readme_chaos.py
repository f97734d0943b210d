"""The README's "Prove it on your own agent" block runs as written."""

from __future__ import annotations

from pathlib import Path

from tests.docs.test_docs_run import ROOT, _bash, _check, _env, blocks


def chaos_block() -> list[str]:
    """The commands of the README's console block that runs ``agentledger chaos``."""
    found = [
        text
        for lang, text in blocks(ROOT / "README.md")
        if lang == "console" and "agentledger chaos" in text
    ]
    assert len(found) == 1, found
    return [line[2:] for line in found[0].splitlines() if line.startswith("$ ")]


def test_the_readme_chaos_command_runs_as_written(tmp_path: Path) -> None:
    """The block as written (tests/docs/test_docs_run.py leaves it to this test): it
    reports every invariant holding and its kills. Its runs may all finish before the
    first kill on a fast host: kills landing mid-run are test_chaos_command.py's (it
    counts them)."""
    commands = chaos_block()
    assert len([c for c in commands if c.startswith("agentledger chaos ")]) == 1
    result = _bash("set -euo pipefail\n" + "\n".join(commands), tmp_path, _env(tmp_path))
    _check(result, "the README's chaos block")
    assert "all invariants hold" in result.stdout
    assert "workers killed (SIGKILL)" in result.stdout
