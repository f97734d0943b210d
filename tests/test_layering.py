"""The package map of docs/architecture.md, enforced: what each package may import.

The kernel (the root definitions, models, tools, store, engine, worker) imports no
feature package; each feature imports the kernel and the features the map names. The
runtime never imports the examples or the benchmarks (installables of their own), and no
two modules import each other, directly or around a loop, even from inside a function.
Imports under ``if TYPE_CHECKING:`` are annotations only and are not counted.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "agentledger"

ROOT = "(root)"  # the modules directly under agentledger/ and the package itself
KERNEL = (ROOT, "models", "tools", "store", "engine", "worker")
EVERYTHING = (*KERNEL, "observe", "gateway", "retrieval", "memory", "service", "cli", "_chaos")
# Public helpers for users' own tests: the kernel, driven the way production drives it
# (with the features that register what a production worker needs: budgets, the chain).
TESTING = (*KERNEL, "gateway", "service")

# package -> the packages it may import besides itself (docs/architecture.md, "The map").
MAP: dict[str, tuple[str, ...]] = {
    ROOT: KERNEL,
    "models": (ROOT,),
    "tools": (ROOT, "models"),
    "store": (ROOT,),
    "engine": (ROOT, "models", "tools", "store"),
    "worker": (ROOT, "models", "tools", "store", "engine"),
    "observe": KERNEL,
    "gateway": (*KERNEL, "observe"),
    "retrieval": KERNEL,
    "memory": (*KERNEL, "retrieval", "service"),
    "service": (*KERNEL, "observe", "gateway", "memory", "retrieval"),
    "cli": EVERYTHING,
    "testing": TESTING,
    # `agentledger chaos`: the kernel driven from outside, and the tools' counting hook.
    "_chaos": (*KERNEL, "testing"),
}

# Kernel modules that still reach into a feature, each to be inverted (a hook the
# feature registers, or the code moved). The list only shrinks: an entry that no longer
# holds fails test_known_exceptions_still_hold, so it is removed with its fix.
KNOWN_EXCEPTIONS: dict[str, tuple[str, ...]] = {}
# The installables beside the runtime (examples/ and bench/): the CLI loads their
# commands by name when they are installed (cli/_main.py), no module imports them.
BESIDE = ("agentledger_examples", "agentledger_bench")


def package_of(module: str) -> str:
    """The map's name for the package ``module`` belongs to."""
    parts = module.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return ROOT


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


@functools.cache
def graph() -> dict[str, set[str]]:
    """module -> the agentledger modules it imports: parsed on first use, not while the
    suite is collected (every test process collects this file)."""
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def _violations() -> dict[str, set[str]]:
    """module -> the agentledger modules it imports against the map."""
    bad: dict[str, set[str]] = {}
    for mod, imps in graph().items():
        allowed = MAP[package_of(mod)]
        for imp in imps:
            if not (imp == "agentledger" or imp.startswith("agentledger.")):
                continue  # the installables beside the runtime: see the test below
            target = package_of(imp)
            if target != package_of(mod) and target not in allowed:
                bad.setdefault(mod, set()).add(imp)
    return bad


def test_every_package_is_on_the_map() -> None:
    packages = {package_of(mod) for mod in graph()}
    assert packages == set(MAP), "add the package to MAP and to docs/architecture.md"


@pytest.mark.parametrize("package", sorted(MAP))
def test_each_package_imports_only_what_the_map_allows(package: str) -> None:
    bad = sorted(
        f"{mod} imports {imp}"
        for mod, imps in _violations().items()
        if package_of(mod) == package
        for imp in imps
        if not imp.startswith(KNOWN_EXCEPTIONS.get(mod, ()))
    )
    assert not bad, "\n".join(bad)


def test_known_exceptions_still_hold() -> None:
    found = _violations()
    stale = sorted(
        f"{mod}: {prefix}"
        for mod, prefixes in KNOWN_EXCEPTIONS.items()
        for prefix in prefixes
        if not any(imp.startswith(prefix) for imp in found.get(mod, ()))
    )
    assert not stale, "fixed: remove from KNOWN_EXCEPTIONS\n" + "\n".join(stale)


def test_the_runtime_never_imports_the_examples_or_the_benchmarks() -> None:
    bad = sorted(
        f"{mod} imports {imp}"
        for mod, imps in graph().items()
        for imp in imps
        if imp.startswith(BESIDE)
    )
    assert not bad, "\n".join(bad)


def test_no_import_cycles_between_modules() -> None:
    # Package __init__ re-exports are edges to the package, not to its parts: leave them out.
    modules = graph()
    edges = {
        mod: {i for i in imps if i in modules and i != mod and not _is_parent(i, mod)}
        for mod, imps in modules.items()
        if not PACKAGE.joinpath(*mod.split(".")[1:], "__init__.py").exists()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges:
                continue
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _is_parent(candidate: str, mod: str) -> bool:
    return mod.startswith(candidate + ".")


def _doc_map() -> dict[str, set[str]]:
    """The table of docs/architecture.md, "The map": package -> what it may import."""
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    section = doc.split("## The map", 1)[1].split("\n## ", 1)[0]
    names = {"root": ROOT, "the kernel": "kernel", "kernel": "kernel"}
    found: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("package", "---"):
            continue
        package = ROOT if cells[0].startswith("*(root)*") else cells[0].strip("`/")
        allowed: set[str] = set()
        for word in (w.strip() for w in cells[2].split(",")):
            target = names.get(word, word)
            if target == "kernel":
                allowed.update(KERNEL)
            elif target == "everything":
                allowed.update(EVERYTHING)
            else:
                allowed.add(target)
        found[package] = allowed - {package}
    return found


def test_the_docs_map_is_this_map() -> None:
    assert _doc_map() == {p: set(allowed) - {p} for p, allowed in MAP.items()}
