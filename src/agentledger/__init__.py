"""agentledger: a durable runtime for AI agents that change things in the world.

    from agentledger import App, Agent, ScriptedModel, ToolContext, tool

Public names are listed in ``__all__`` (pinned by a test).
"""

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
