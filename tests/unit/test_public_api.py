"""The public API is what users import; changing it is a decision, not an accident."""

import agentledger

EXPECTED = {
    "Agent",
    "AgentLedgerError",
    "Allow",
    "App",
    "Budget",
    "BusinessError",
    "Compensation",
    "Decision",
    "Deny",
    "InProgress",
    "InvalidArguments",
    "LeaseLost",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Policy",
    "ProposedCall",
    "ProviderError",
    "RateLimited",
    "Refused",
    "RequireApproval",
    "RetryPolicy",
    "RunStatus",
    "ScriptedModel",
    "Status",
    "StepStatus",
    "StoreCorrupt",
    "StoreError",
    "StoreUnavailable",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolTimeout",
    "ToolCall",
    "ToolSchema",
    "Turn",
    "UnknownTargetError",
    "Usage",
    "UsageError",
    "Worker",
    "WorkerConfig",
    "WorkflowContext",
    "load_app",
    "open_store",
    "tool",
}


def test_exported_names_are_pinned() -> None:
    assert set(agentledger.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(agentledger, name) is not None


def test_the_testing_surface_is_pinned() -> None:
    import agentledger.testing

    expected = {
        "FAULTS",
        "FakeProvider",
        "Harness",
        "KeyConflict",
        "KeyInProgress",
        "ProviderDown",
        "ProviderTimeout",
        "chaos_effect",
    }
    assert set(agentledger.testing.__all__) == expected
    for name in expected:
        assert getattr(agentledger.testing, name) is not None


PUBLIC_MODULES = {
    "agentledger",
    "agentledger.cli",
    "agentledger.engine",
    "agentledger.errors",
    "agentledger.gateway",
    "agentledger.memory",
    "agentledger.models",
    "agentledger.observe",
    "agentledger.records",
    "agentledger.retrieval",
    "agentledger.service",
    "agentledger.store",
    "agentledger.testing",
    "agentledger.tools",
    "agentledger.worker",
}
# Packages that are parts of the map (docs/architecture.md) but export nothing: every
# module inside them is private.
NAMESPACES = {"agentledger.cli", "agentledger.engine", "agentledger.gateway"}


def _modules() -> set[str]:
    from pathlib import Path

    root = Path(agentledger.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        parts = ["agentledger", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found.add(".".join(parts))
    return found


def test_implementation_modules_are_private() -> None:
    public = {m for m in _modules() if not any(p.startswith("_") for p in m.split("."))}
    assert public == PUBLIC_MODULES, (
        "a new module is private (_name.py) unless it is part of the public surface"
    )


def test_namespace_packages_export_nothing() -> None:
    import importlib

    for name in NAMESPACES:
        module = importlib.import_module(name)
        assert not [n for n in vars(module) if not n.startswith("_")], name


def test_every_public_package_pins_what_it_exports() -> None:
    import importlib

    for name in PUBLIC_MODULES - NAMESPACES - {"agentledger.errors", "agentledger.records"}:
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        assert exported, f"{name} declares __all__"
        for attr in exported:
            assert getattr(module, attr) is not None, f"{name}.{attr}"
