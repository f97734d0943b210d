"""The import layers of the package, and no import cycles.

store <- engine <- worker <- cli: a lower layer never imports a higher one, the runtime
never imports the examples or the benchmarks (installables of their own), and no
two modules import each other, directly or around a loop, even from inside a function.
Imports under ``if TYPE_CHECKING:`` are annotations only and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "agentledger"

# (importer prefix, forbidden prefixes)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "agentledger.store",
        (
            "agentledger.engine",
            "agentledger.worker",
            "agentledger.cli",
            "agentledger_examples",
            "agentledger.outbox",
        ),
    ),
    ("agentledger.engine", ("agentledger.worker", "agentledger.cli", "agentledger_examples")),
    ("agentledger.worker", ("agentledger.cli", "agentledger_examples")),
    (
        "agentledger.tools",
        ("agentledger.engine", "agentledger.worker", "agentledger.cli", "agentledger_examples"),
    ),
    (
        "agentledger.models",
        (
            "agentledger.engine",
            "agentledger.worker",
            "agentledger.cli",
            "agentledger_examples",
            "agentledger.store",
        ),
    ),
]
# The installables beside the runtime (examples/ and bench/): the CLI loads their
# commands by name when they are installed (cli/main.py), no module imports them.
BESIDE = ("agentledger_examples", "agentledger_bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_block(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Name | ast.Attribute)
        and "TYPE_CHECKING" in ast.unparse(node.test)
    )


def imports_of(path: Path) -> set[str]:
    """Every agentledger module ``path`` imports, at any depth, outside TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.add(mod)
            for alias in node.names:  # `from pkg import submodule`
                candidate = f"{mod}.{alias.name}"
                if (SRC / candidate.replace(".", "/")).with_suffix(".py").exists() or (
                    SRC / candidate.replace(".", "/") / "__init__.py"
                ).exists():
                    found.add(candidate)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m.startswith("agentledger")}


GRAPH = {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


@pytest.mark.parametrize(("layer", "forbidden"), LAYERS, ids=[layer for layer, _ in LAYERS])
def test_lower_layers_never_import_higher_ones(layer: str, forbidden: tuple[str, ...]) -> None:
    bad = sorted(
        f"{mod} imports {imp}"
        for mod, imps in GRAPH.items()
        if mod == layer or mod.startswith(layer + ".")
        for imp in imps
        if imp.startswith(forbidden)
    )
    assert not bad, "\n".join(bad)


def test_the_runtime_never_imports_the_examples_or_the_benchmarks() -> None:
    bad = sorted(
        f"{mod} imports {imp}"
        for mod, imps in GRAPH.items()
        for imp in imps
        if imp.startswith(BESIDE)
    )
    assert not bad, "\n".join(bad)


def test_no_import_cycles_between_modules() -> None:
    # Package __init__ re-exports are edges to the package, not to its parts: leave them out.
    graph = {
        mod: {i for i in imps if i in GRAPH and i != mod and not _is_parent(i, mod)}
        for mod, imps in GRAPH.items()
        if not PACKAGE.joinpath(*mod.split(".")[1:], "__init__.py").exists()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _is_parent(candidate: str, mod: str) -> bool:
    return mod.startswith(candidate + ".")
