"""Helpers of the worker process tests: a worker in its own PID namespace, log waits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.engine.helpers import Env, wait_for


def pid_namespace_prefix() -> tuple[str, ...]:
    """The command prefix that starts a process in a new PID namespace (with its own /proc).

    Skipped where it cannot work (not Linux, not root, no ``unshare``); in CI on Linux as
    root it must work, so there it fails instead of skipping.
    """
    prefix = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
    should_work = sys.platform == "linux" and os.geteuid() == 0
    if should_work and shutil.which("unshare"):
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, check=False)
        if probe.returncode == 0:
            return prefix
        reason = f"unshare failed: {probe.stderr.strip()}"
    else:
        reason = "needs Linux, root and unshare(1) to start a worker in its own PID namespace"
    if should_work and os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def wait_log(env: Env, n: int, text: str, timeout: float = 30.0) -> str:
    """Wait until worker ``n``'s log contains ``text``; return the log."""
    return wait_for(
        lambda: env.worker_log(n) if text in env.worker_log(n) else "",
        timeout,
        f"worker {n} to log {text!r}",
    )
