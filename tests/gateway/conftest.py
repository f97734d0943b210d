"""Fixtures of the gateway tests: one fake provider server per module, reset per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentledger.gateway._cooldown import COOLDOWNS
from tests.gateway.fakes import FakeProviders


@pytest.fixture(scope="module")
def _server() -> Iterator[FakeProviders]:
    server = FakeProviders().start()
    yield server
    server.stop()


@pytest.fixture
def fake(_server: FakeProviders, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProviders]:
    """The fake server, its script empty; provider env vars point at it."""
    _server.reset()
    COOLDOWNS.reset()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-secret-key")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{_server.url}/v1")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", _server.url)
    monkeypatch.delenv("AGENTLEDGER_MODEL", raising=False)
    monkeypatch.delenv("AGENTLEDGER_MODEL_PRICES", raising=False)
    yield _server
    COOLDOWNS.reset()
