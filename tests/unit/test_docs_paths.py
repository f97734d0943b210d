"""Every source path the docs name exists: a reader who follows ``store/_queries/runs.py``
from docs/architecture.md finds it (modules get renamed; the docs must follow).

A path is a word ending in ``.py`` in docs/*.md, README.md or CONTRIBUTING.md. One that
starts at the repository (``src/``, ``tests/``, ``examples/``, ``bench/``, ``scripts/``)
or names an installable's package (``agentledger/``, ``agentledger_examples/``,
``agentledger_bench/``) is looked up there; one that starts with a package of the
runtime (``store/_tx.py``) is looked up in ``src/agentledger/``; a bare file name
(``_heap.py``) must exist somewhere in the repository's code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md"])
CODE = ("src", "tests", "examples", "bench", "scripts")
PACKAGE = ROOT / "src" / "agentledger"
INSTALLABLES = {
    "agentledger": ROOT / "src",
    "agentledger_examples": ROOT / "examples" / "src",
    "agentledger_bench": ROOT / "bench" / "src",
}
PATH = re.compile(r"(?<![\w./-])([\w][\w./-]*\.py)\b")
SHIPPED = ("src", "examples/src", "bench/src", "scripts")
BARE = {p.name for top in SHIPPED for p in (ROOT / top).rglob("*.py")}
#: The reader's own files in the README and the guide, and the private module's pattern.
READERS = {"hotel.py", "shop.py", "path/to/file.py", "_name.py"}


def exists(path: str) -> bool:
    if path in READERS:
        return True
    first = path.split("/", 1)[0]
    if "/" not in path:
        return path in BARE
    if first in CODE:
        return (ROOT / path).is_file()
    if first in INSTALLABLES:
        return (INSTALLABLES[first] / path).is_file()
    if (PACKAGE / first).is_dir():
        return (PACKAGE / path).is_file()
    # A path inside a package named in the sentence around it (``stayhub/app.py``):
    # it must be somewhere in the code under that folder.
    return any(p.as_posix().endswith("/" + path) for top in CODE for p in (ROOT / top).rglob(path))


def named_paths(doc: Path) -> list[tuple[int, str]]:
    found = []
    for no, line in enumerate(doc.read_text().splitlines(), 1):
        for match in PATH.finditer(line):
            path = match.group(1).rstrip(".")
            if "://" in line[max(0, match.start() - 8) : match.start()]:
                continue  # a URL
            found.append((no, path))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_the_docs_name_exists(doc: Path) -> None:
    missing = [f"{doc.name}:{no}: {path}" for no, path in named_paths(doc) if not exists(path)]
    assert not missing, "\n".join(missing)
