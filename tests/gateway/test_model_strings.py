"""Models named by strings, the environment override, and lazy SDK imports."""

from __future__ import annotations

import pytest

from agentledger.errors import UsageError
from agentledger.models._anthropic import AnthropicModel
from agentledger.models._fallback import FallbackModel
from agentledger.models._openai import OpenAICompatibleModel, OpenAIModel
from agentledger.models._pricing import Pricer
from agentledger.models._provider import import_sdk
from agentledger.models._scripted import ScriptedModel
from agentledger.models._spec import model_from_string, resolve_model


def test_strings_name_models_and_chains() -> None:
    assert isinstance(model_from_string("openai:gpt-4.1-mini", {}), OpenAIModel)
    assert isinstance(model_from_string("anthropic:claude-sonnet-4-5", {}), AnthropicModel)
    local = model_from_string("openai-compatible:llama3.1@http://user:pw@127.0.0.1:11434/v1", {})
    assert isinstance(local, OpenAICompatibleModel)
    assert local.name == "openai-compatible:llama3.1@http://127.0.0.1:11434/v1"  # no password
    chain = model_from_string("openai:gpt-4.1-mini -> anthropic:claude-sonnet-4-5", {})
    assert isinstance(chain, FallbackModel) and len(chain.models) == 2
    for bad in ("gpt-4", "azure:x", "openai-compatible:llama", ""):
        with pytest.raises(UsageError):
            model_from_string(bad, {})


def test_the_environment_overrides_every_agent_model() -> None:
    scripted = ScriptedModel([])
    assert resolve_model(scripted, {}) is scripted
    model = resolve_model(
        scripted,
        {"AGENTLEDGER_MODEL": "anthropic:claude-sonnet-4-5", "AGENTLEDGER_MODEL_MAX_TOKENS": "256"},
    )
    assert isinstance(model, AnthropicModel) and model.max_tokens == 256


def test_a_missing_extra_names_what_to_install() -> None:
    with pytest.raises(Exception, match=r"pip install 'agentledger\[openai\]'"):
        import_sdk("no_such_sdk_module_here", "openai")


def test_price_override_wins_and_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_MODEL_PRICES", '{"llama3.1": {"input": 1, "output": 2}}')
    pricer = Pricer("openai-compatible:llama3.1@x", None, "llama3.1")
    assert pricer.source == "override"
    assert pricer.cost(1_000_000, 500_000) == pytest.approx(2.0)
    assert Pricer("openai-compatible:zzz@x", None, "zzz-unknown").source == "unpriced"
