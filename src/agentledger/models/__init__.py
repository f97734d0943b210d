"""The model interface, the provider adapters and the offline scripted model.

An agent names its model with a string (``"openai:gpt-4o-mini"``, ``"anthropic:..."``,
a list for fallback) or passes a :class:`Model`; the adapters import their SDK when
first used (the ``openai`` and ``anthropic`` extras).
"""

from agentledger.models._anthropic import AnthropicModel
from agentledger.models._base import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSchema,
    Usage,
)
from agentledger.models._errors import (
    ContextWindowExceeded,
    IncompleteAnswer,
    InvalidResponse,
    ModelRejected,
)
from agentledger.models._fallback import FallbackModel
from agentledger.models._openai import OpenAICompatibleModel, OpenAIModel
from agentledger.models._scripted import ScriptedModel, Turn

__all__ = [
    "AnthropicModel",
    "ContextWindowExceeded",
    "FallbackModel",
    "IncompleteAnswer",
    "InvalidResponse",
    "Message",
    "Model",
    "ModelRejected",
    "ModelRequest",
    "ModelResponse",
    "OpenAICompatibleModel",
    "OpenAIModel",
    "ScriptedModel",
    "ToolCall",
    "ToolSchema",
    "Turn",
    "Usage",
]
