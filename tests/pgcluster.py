"""The tests' private PostgreSQL cluster: the one ``agentledger chaos --pg-private`` uses,
its data directory a copy of one ``initdb`` per test process.

``initdb`` takes about 2 s (a second of it CPU) on a 2-core machine; a copy of the
directory it makes takes a fraction of that, and is the same cluster: nothing in it names
the port or the path (both are given at start). Each test still gets a cluster of its
own, never started before.
"""

from __future__ import annotations

import atexit
import subprocess
import threading
from pathlib import Path

from agentledger._chaos import pgcluster as _clusters
from agentledger._chaos.pgcluster import ClusterUnavailable, find_bindir, free_port

__all__ = ["ClusterUnavailable", "PrivateCluster", "find_bindir", "free_port"]

_template: _clusters.PrivateCluster | None = None
_template_lock = threading.Lock()


def _initdb_once(bindir: Path) -> Path:
    """The data directory of this process's one ``initdb`` (never started; removed at
    exit)."""
    global _template
    with _template_lock:
        if _template is None:
            _template = _clusters.PrivateCluster(bindir)
            atexit.register(_template.destroy)
        return _template.data


class PrivateCluster(_clusters.PrivateCluster):
    """:class:`agentledger._chaos.pgcluster.PrivateCluster` whose ``initdb`` is a copy of
    the process's first one (as the cluster's OS user, so owner and modes are kept)."""

    def _run(self, tool: str, *args: str, timeout: float = 60) -> None:
        if tool != "initdb":
            super()._run(tool, *args, timeout=timeout)
            return
        target = args[list(args).index("-D") + 1]
        done = subprocess.run(
            [*self._runas, "cp", "-a", str(_initdb_once(self.bindir)), target],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"copying the initdb'd directory failed: {done.stderr}")
