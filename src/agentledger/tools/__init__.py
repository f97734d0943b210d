"""Tools and their contracts."""

from agentledger.tools._context import ToolContext
from agentledger.tools._contract import Compensation, RetryPolicy, Tool, tool
from agentledger.tools._http import call_provider
from agentledger.tools._status import Status

__all__ = ["Compensation", "RetryPolicy", "Status", "Tool", "ToolContext", "call_provider", "tool"]
