"""A SQLite file with the current schema, migrated once per test process.

A fresh file costs a migration (tens of DDL statements and their fsyncs); a copy of
this one costs a file copy. Tests of migrating a fresh file make their own files.
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
import threading
from pathlib import Path

from agentledger.store import open_store

_lock = threading.Lock()
_template: Path | None = None


def _build(path: Path) -> None:
    async def build() -> None:
        opened = open_store(f"sqlite:///{path}")
        await opened.open()
        await opened.close()

    # In a thread of its own: the caller may be inside a running event loop.
    thread = threading.Thread(target=lambda: asyncio.run(build()), name="sqlite-template")
    thread.start()
    thread.join()
    assert path.exists() and not Path(f"{path}-wal").exists()  # the one file is the database


def template() -> Path:
    """The migrated file (built on first use, removed when the process exits)."""
    global _template
    with _lock:
        if _template is None:
            folder = Path(tempfile.mkdtemp(prefix="al-sqlite-template-"))
            atexit.register(shutil.rmtree, folder, True)
            path = folder / "migrated.db"
            _build(path)
            _template = path
        return _template


def migrated_copy(path: Path, source: Path | None = None) -> str:
    """Copy the migrated template (or ``source``) to ``path`` (a new file) and return its
    URL: the database as a first ``store.open()`` leaves it."""
    assert not path.exists(), path
    shutil.copyfile(source or template(), path)
    return f"sqlite:///{path}"
