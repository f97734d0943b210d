"""Model interface and the offline scripted model."""

from agentledger.models.base import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSchema,
    Usage,
)
from agentledger.models.scripted import ScriptedModel, Turn

__all__ = [
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "ToolCall",
    "ToolSchema",
    "Turn",
    "Usage",
]
