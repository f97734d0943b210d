"""Fixtures of the chaos and soak command tests: orders to submit and the example's
payments provider (honouring idempotency keys, or ignoring them: the broken one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentledger_examples.chaos_demo.provider import PaymentsProvider


@pytest.fixture
def orders(tmp_path: Path) -> str:
    path = tmp_path / "orders.jsonl"
    path.write_text(
        "\n".join(json.dumps({"order_id": f"o-{i}", "amount": 1000 + i}) for i in range(5))
    )
    return str(path)


@pytest.fixture
def provider() -> Iterator[PaymentsProvider]:
    with PaymentsProvider() as p:
        yield p


@pytest.fixture
def keyless_provider() -> Iterator[PaymentsProvider]:
    with PaymentsProvider(ignore_keys=True) as p:
        yield p
