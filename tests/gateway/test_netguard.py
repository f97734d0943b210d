"""The session's network guard: a test that tries a real provider host fails."""

from __future__ import annotations

import socket

import pytest

from tests.netguard import ExternalNetworkBlocked


def test_resolving_a_provider_host_is_refused() -> None:
    with pytest.raises(ExternalNetworkBlocked):
        socket.getaddrinfo("api.openai.com", 443)


def test_connecting_off_loopback_is_refused() -> None:
    with socket.socket() as s, pytest.raises(ExternalNetworkBlocked):
        s.connect(("93.184.216.34", 443))


async def test_the_sdk_cannot_reach_a_real_provider() -> None:
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(api_key="x", base_url="https://api.openai.com/v1", max_retries=0)
    try:
        with pytest.raises(openai.APIConnectionError):
            await client.chat.completions.create(
                model="gpt-4.1-mini", messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        await client.close()
