"""The chaos proxy on real HTTP: what it forwards, what it does to answers, what it counts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentledger._chaos.counting import read_hook_effects
from agentledger._chaos.faults import Grammar, parse_faults
from agentledger._chaos.proxy import ChaosProxy, env_name
from agentledger.testing import chaos_effect
from agentledger.testing._chaos import EFFECTS_ENV
from agentledger_examples.chaos_demo.provider import PaymentsProvider

PROXY = Grammar(
    endpoints=("pay",), kinds=("error_after_commit", "drop", "in_progress", "rate_limit")
)


@pytest.fixture
def keyed() -> Iterator[PaymentsProvider]:
    with PaymentsProvider() as p:
        yield p


@pytest.fixture
def keyless() -> Iterator[PaymentsProvider]:
    with PaymentsProvider(ignore_keys=True) as p:
        yield p


def proxy(provider: PaymentsProvider, faults: str = "") -> ChaosProxy:
    return ChaosProxy("pay", provider.url, parse_faults(faults, PROXY) if faults else None).start()


def charge(url: str, key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return httpx.post(f"{url}/charges", json={"order_id": "o-1", "amount": 100}, headers=headers)


def test_a_resend_a_provider_replays_is_one_effect(keyed: PaymentsProvider) -> None:
    p = proxy(keyed)
    try:
        first, again = charge(p.url, "k1"), charge(p.url, "k1")
        assert first.status_code == again.status_code == 200
        assert first.json() == again.json()  # forwarded both ways, unchanged
        assert httpx.get(f"{p.url}/charges/k1").json()["id"] == first.json()["id"]
        assert [(e.key, e.source) for e in p.effects()] == [("k1", "proxy")]
        assert p.stats()["replays"] == 1 and p.stats()["writes"] == 2
    finally:
        p.close()


def test_a_resend_a_provider_applies_again_is_two_effects(keyless: PaymentsProvider) -> None:
    p = proxy(keyless)
    try:
        charge(p.url, "k1")
        charge(p.url, "k1")
        assert [e.key for e in p.effects()] == ["k1", "k1"]
        assert len(keyless.charges()) == 2
    finally:
        p.close()


def test_after_commit_faults_apply_then_withhold_the_answer(keyed: PaymentsProvider) -> None:
    p = proxy(keyed, "pay:error_after_commit,count=1,save=1;pay:drop,count=1")
    try:
        assert charge(p.url, "k1").status_code == 500  # applied, answered 500
        assert charge(p.url, "k1").status_code == 500  # the saved 500, not forwarded
        with pytest.raises(httpx.TransportError):
            charge(p.url, "k2")  # applied, the connection closed with no answer
        assert charge(p.url, "k3").status_code == 200
        assert sorted(c["key"] for c in keyed.charges()) == ["k1", "k2", "k3"]
        assert sorted(e.key or "" for e in p.effects()) == ["k1", "k2", "k3"]
        assert p.stats()["answers_withheld"] == 2
    finally:
        p.close()


def test_faults_before_the_provider_apply_nothing(keyed: PaymentsProvider) -> None:
    p = proxy(keyed, "pay:in_progress,count=1,retry_after=2;pay:rate_limit,count=1")
    try:
        # Outages, rate limits and errors are rolled first, then "in progress".
        assert charge(p.url, "k1").status_code == 429
        busy = charge(p.url, "k1")
        assert busy.status_code == 409 and busy.headers["Retry-After"] == "2"
        assert busy.json() == {"error": "request_in_progress"}
        assert keyed.charges() == [] and p.effects() == []
        assert charge(p.url, "k1").status_code == 200
    finally:
        p.close()


def test_the_workers_find_a_proxy_by_its_name() -> None:
    assert env_name("pay") == "AGENTLEDGER_CHAOS_PROXY_PAY"
    assert env_name("crm.v2-eu") == "AGENTLEDGER_CHAOS_PROXY_CRM_V2_EU"


def test_the_hook_records_only_under_chaos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "effects.jsonl"
    monkeypatch.delenv(EFFECTS_ENV, raising=False)
    chaos_effect("k0")
    assert not path.exists()
    monkeypatch.setenv(EFFECTS_ENV, str(path))
    chaos_effect("k1", provider="mail")
    chaos_effect("k1", provider="mail")
    # A worker killed mid-write leaves a cut last line: skipped, not an error.
    with path.open("a") as out:
        out.write(json.dumps({"key": "k2", "provider": "mail", "at": 1.0})[:20])
    assert [(e.provider, e.key) for e in read_hook_effects(path)] == [("mail", "k1")] * 2


def test_the_proxy_grammar_names_its_proxies() -> None:
    with pytest.raises(ValueError, match="unknown endpoint 'mail'"):
        parse_faults("mail:drop", PROXY)
    with pytest.raises(ValueError, match="unknown fault kind 'decline'"):
        parse_faults("pay:decline", PROXY)
    config = parse_faults("pay:drop@0.5;pay:in_progress,retry_after=3;seed=4", PROXY)
    assert parse_faults(config.to_spec(), PROXY) == config
