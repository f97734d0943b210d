"""Models named by a string, per agent, overridable by the environment.

::

    openai:gpt-4.1-mini
    anthropic:claude-sonnet-4-5
    openai-compatible:llama3.1@http://127.0.0.1:11434/v1
    openai:gpt-4.1-mini -> anthropic:claude-sonnet-4-5      (a fallback chain; "," works too)

``AGENTLEDGER_MODEL`` (when set and not empty) replaces every agent's model in the
process, so an app written with the scripted model runs on a real one by configuration
alone. ``AGENTLEDGER_MODEL_MAX_TOKENS``, ``AGENTLEDGER_MODEL_TIMEOUT`` and
``AGENTLEDGER_MODEL_STREAM=1`` tune the models built from strings. Keys and base URLs
come from the SDKs' own variables (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``). The SDKs are imported at the first call,
so naming a model needs no extra installed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentledger import _envsettings as envsettings
from agentledger._envsettings import EnvSettings
from agentledger.errors import UsageError
from agentledger.models._base import Model

PROVIDERS = ("openai", "anthropic", "openai-compatible")


def _settings(environ: Mapping[str, str] | None) -> EnvSettings:
    return envsettings.current() if environ is None else EnvSettings.from_environ(environ)


def _options(env: EnvSettings) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if env.model_max_tokens is not None:
        options["max_tokens"] = env.model_max_tokens
    if env.model_timeout is not None:
        options["timeout"] = env.model_timeout
    if env.model_stream:
        options["stream"] = True
    return options


def model_from_string(spec: str, environ: Mapping[str, str] | None = None) -> Model:
    """Build the model (or fallback chain) a string names."""
    parts = [p.strip() for p in re.split(r"->|,", spec) if p.strip()]
    if not parts:
        raise UsageError("empty model name; expected e.g. openai:gpt-4.1-mini")
    options = _options(_settings(environ))
    models = [_one(p, dict(options)) for p in parts]
    if len(models) == 1:
        return models[0]
    from agentledger.models._fallback import FallbackModel

    return FallbackModel(models)


def _one(spec: str, options: dict[str, Any]) -> Model:
    provider, sep, rest = spec.partition(":")
    if not sep or provider not in PROVIDERS or not rest:
        raise UsageError(
            f"cannot read model {spec!r}: expected openai:MODEL, anthropic:MODEL or "
            "openai-compatible:MODEL@BASE_URL"
        )
    if provider == "openai":
        from agentledger.models._openai import OpenAIModel

        return OpenAIModel(rest, **options)
    if provider == "anthropic":
        from agentledger.models._anthropic import AnthropicModel

        return AnthropicModel(rest, **options)
    from agentledger.models._openai import OpenAICompatibleModel

    model, at, url = rest.partition("@")
    if not at or not model or not url.startswith(("http://", "https://")):
        raise UsageError(f"cannot read model {spec!r}: expected openai-compatible:MODEL@BASE_URL")
    return OpenAICompatibleModel(model, base_url=url, **options)


def resolve_model(model: Model | str, environ: Mapping[str, str] | None = None) -> Model:
    """The model an agent uses: ``AGENTLEDGER_MODEL`` if set, else its own (a string is
    parsed)."""
    override = _settings(environ).model
    if override:
        return model_from_string(override, environ)
    if isinstance(model, str):
        return model_from_string(model, environ)
    return model
