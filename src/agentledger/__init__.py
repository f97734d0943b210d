"""agentledger: a durable runtime for AI agents that change things in the world.

    from agentledger import App, Agent, ScriptedModel, ToolContext, tool

Public names are listed in ``__all__`` (pinned by a test).
"""

from typing import TYPE_CHECKING

from agentledger import _lazy

if TYPE_CHECKING:
    from agentledger._agent import Agent
    from agentledger._app import App, load_app
    from agentledger._budget import Budget
    from agentledger._policies import Allow, Decision, Deny, Policy, ProposedCall, RequireApproval
    from agentledger.engine._workflow_runner import WorkflowContext
    from agentledger.errors import (
        AgentLedgerError,
        BusinessError,
        InProgress,
        InvalidArguments,
        LeaseLost,
        ProviderError,
        RateLimited,
        Refused,
        StoreCorrupt,
        StoreError,
        StoreUnavailable,
        ToolError,
        ToolTimeout,
        UnknownTargetError,
        UsageError,
    )
    from agentledger.models import (
        Message,
        Model,
        ModelRequest,
        ModelResponse,
        ScriptedModel,
        ToolCall,
        ToolSchema,
        Turn,
        Usage,
    )
    from agentledger.records import RunStatus, StepStatus
    from agentledger.store import open_store
    from agentledger.tools import Compensation, RetryPolicy, Status, Tool, ToolContext, tool
    from agentledger.worker import Worker, WorkerConfig

# Each public name is imported from its module when first used, not when the package is:
# a process that needs one part of agentledger (a submodule, a tool's own server, the
# command's other subcommands) does not pay for importing all of it.
_SOURCES: dict[str, str] = {
    "Agent": "agentledger._agent",
    "App": "agentledger._app",
    "load_app": "agentledger._app",
    "Budget": "agentledger._budget",
    "Allow": "agentledger._policies",
    "Decision": "agentledger._policies",
    "Deny": "agentledger._policies",
    "Policy": "agentledger._policies",
    "ProposedCall": "agentledger._policies",
    "RequireApproval": "agentledger._policies",
    "WorkflowContext": "agentledger.engine._workflow_runner",
    "AgentLedgerError": "agentledger.errors",
    "BusinessError": "agentledger.errors",
    "InProgress": "agentledger.errors",
    "InvalidArguments": "agentledger.errors",
    "LeaseLost": "agentledger.errors",
    "ProviderError": "agentledger.errors",
    "RateLimited": "agentledger.errors",
    "Refused": "agentledger.errors",
    "StoreCorrupt": "agentledger.errors",
    "StoreError": "agentledger.errors",
    "StoreUnavailable": "agentledger.errors",
    "ToolError": "agentledger.errors",
    "ToolTimeout": "agentledger.errors",
    "UnknownTargetError": "agentledger.errors",
    "UsageError": "agentledger.errors",
    "Message": "agentledger.models",
    "Model": "agentledger.models",
    "ModelRequest": "agentledger.models",
    "ModelResponse": "agentledger.models",
    "ScriptedModel": "agentledger.models",
    "ToolCall": "agentledger.models",
    "ToolSchema": "agentledger.models",
    "Turn": "agentledger.models",
    "Usage": "agentledger.models",
    "RunStatus": "agentledger.records",
    "StepStatus": "agentledger.records",
    "open_store": "agentledger.store",
    "Compensation": "agentledger.tools",
    "RetryPolicy": "agentledger.tools",
    "Status": "agentledger.tools",
    "Tool": "agentledger.tools",
    "ToolContext": "agentledger.tools",
    "tool": "agentledger.tools",
    "Worker": "agentledger.worker",
    "WorkerConfig": "agentledger.worker",
}


__version__ = "0.1.0"

__all__ = [
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
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolSchema",
    "ToolTimeout",
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
]

__getattr__, __dir__ = _lazy.lazy_names(__name__, _SOURCES, __all__)
