"""The test suite.

Bytecode is cached even where the environment turns caching off
(``PYTHONDONTWRITEBYTECODE``): the suite starts thousands of Python processes (workers,
commands, servers), and without a cache each one compiles every module it imports from
source again. It goes under ``PYTHONPYCACHEPREFIX`` (a directory of the temp dir unless
one is set), never into the source tree, which is what turning it off keeps clean. Set
here, before the conftest imports anything: pytest's own rewritten test modules and every
child process (they inherit the environment) use it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def _cache_bytecode_outside_the_tree() -> None:
    if not (sys.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return
    prefix = os.environ.get("PYTHONPYCACHEPREFIX") or str(
        Path(tempfile.gettempdir()) / f"agentledger-tests-pycache-{os.getuid()}"
    )
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False


_cache_bytecode_outside_the_tree()
