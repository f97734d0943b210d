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
    "StoreError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolTimeout",
    "Turn",
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
