"""Running the CLI as a user does: ``python -m agentledger.cli._main ARGS`` in a subprocess
(:func:`run_cli`), or its entry point in this process (:func:`cli_here`)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from click.testing import CliRunner


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``agentledger ARGS`` (output captured as text, never raising on a non-zero exit)."""
    return subprocess.run(
        [sys.executable, "-m", "agentledger.cli._main", *args],
        capture_output=True, text=True, check=False, cwd=cwd, timeout=120,
    )  # fmt: skip


def cli_here(
    *args: str, cwd: Path | None = None, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """:func:`run_cli`'s result, from the same entry point (``agentledger.cli._main:main``,
    its one-line errors and exit codes) called in this process: for a test of what a
    command says and how it exits, without a process start per command.

    What a process would give it, it gets: ``ARGS`` as its argv, ``cwd`` as its working
    directory and first path entry (an ``--app`` module there is imported from there, and
    forgotten after), this process's environment with ``env`` over it (``None`` removes a
    variable) and no ``AGENTLEDGER_DEBUG``, a fresh thread (so it runs its own event
    loop even when called from a test's), and an exception it lets out is a traceback on
    stderr and exit code 1, as the interpreter would make it. Not for what only a process
    shows (signals, a kill, a server that keeps running)."""
    from agentledger.cli._main import main

    runner = CliRunner()
    done: list[subprocess.CompletedProcess[str]] = []

    def call() -> None:
        with runner.isolation(env={"AGENTLEDGER_DEBUG": None, **(env or {})}) as (out, err, _):
            code = 0
            try:
                main()
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:  # sys.exit("text"): the interpreter prints it and exits 1
                    sys.stderr.write(f"{exc.code}\n")
                    code = 1
            except BaseException:
                traceback.print_exc(file=sys.stderr)
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            stdout = out.getvalue().decode(errors="replace")
            stderr = err.getvalue().decode(errors="replace")
            done.append(subprocess.CompletedProcess(["agentledger", *args], code, stdout, stderr))

    where = Path(cwd) if cwd is not None else Path.cwd()
    before_cwd, before_argv, before_path = os.getcwd(), sys.argv, list(sys.path)
    before_modules = set(sys.modules)
    os.chdir(where)
    sys.argv = ["agentledger", *args]
    importlib.invalidate_caches()  # modules the test just wrote
    try:
        thread = threading.Thread(target=call, name="agentledger-cli")
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive(), f"agentledger {' '.join(args)} still running after 120 s"
    finally:
        os.chdir(before_cwd)
        sys.argv = before_argv
        sys.path[:] = before_path
        # The modules of a test's own folder (not on the path before) are forgotten: the
        # next test's module of that name is its own.
        root = str(where.resolve())
        if cwd is not None and root not in before_path:
            for name in set(sys.modules) - before_modules:
                origin = getattr(sys.modules[name], "__file__", None) or ""
                if (
                    origin.startswith(root + os.sep)
                    and name.partition(".")[0] not in before_modules
                ):
                    del sys.modules[name]
    return done[0]
