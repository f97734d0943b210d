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
    "Deny",
    "InProgress",
    "InvalidArguments",
    "LeaseLost",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
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
    }
    assert set(agentledger.testing.__all__) == expected
    for name in expected:
        assert getattr(agentledger.testing, name) is not None
