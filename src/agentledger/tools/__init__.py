"""Tools and their contracts."""

from agentledger.tools.context import ToolContext
from agentledger.tools.contract import Compensation, RetryPolicy, Tool, tool
from agentledger.tools.status import Status

__all__ = ["Compensation", "RetryPolicy", "Status", "Tool", "ToolContext", "tool"]
