"""The one backoff and the one Retry-After parser every retry in the runtime uses."""

from __future__ import annotations

import math

import pytest

from agentledger._backoff import Backoff, exponential, retry_after, retry_after_seconds
from agentledger.engine._retries import backoff
from agentledger.tools._contract import RetryPolicy


def test_delays_double_from_the_first_up_to_the_cap() -> None:
    assert [exponential(n, 0.5, 3.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert exponential(0, 0.5, 3.0) == 0.5  # attempt counts start at 1
    assert exponential(3, 0.0, 3.0) == 0.0


def test_a_very_late_attempt_is_capped_not_an_overflow() -> None:
    # 0.1 * 2**4999 is no float: the doubling stops at the cap.
    assert exponential(5000, 0.1, 2.0) == 2.0
    delay = backoff(RetryPolicy(base_delay=0.1, max_delay=2.0), 5000)
    assert delay is not None and 1.0 <= delay <= 2.0


def test_a_backoff_is_jittered_within_half_to_all_of_its_delay_and_resets() -> None:
    b = Backoff(first=0.1, cap=0.4)
    pauses = [b.next() for _ in range(4)]
    for pause, delay in zip(pauses, (0.1, 0.2, 0.4, 0.4), strict=True):
        assert delay / 2 <= pause <= delay
    b.reset()
    assert b.next() <= 0.1
    steady = Backoff(first=0.1, cap=0.4, jitter=False)
    assert [steady.next() for _ in range(4)] == [0.1, 0.2, 0.4, 0.4]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "12"}, 12.0),
        ({"retry-after": "-5"}, 0.0),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "NaN"}, None),
        ({"retry-after": "inf"}, math.inf),
        ({"retry-after": "garbage"}, None),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "-100"}, 0.0),
        ({"retry-after-ms": "nan"}, None),
        ({"retry-after-ms": "soon"}, None),
        ({}, None),
    ],
)
def test_a_providers_retry_after_is_never_negative_nor_nan(
    headers: dict[str, str], expected: float | None
) -> None:
    assert retry_after(headers) == expected


def test_model_providers_and_http_tools_parse_retry_after_alike() -> None:
    from agentledger.models import _provider as provider
    from agentledger.tools import _http as http

    assert provider.retry_after is retry_after
    assert http.retry_after_seconds is retry_after_seconds


def test_unreadable_headers_mean_no_retry_after() -> None:
    class Broken:
        def get(self, name: str) -> str:
            raise RuntimeError("no")

    assert retry_after(Broken()) is None
    assert retry_after_seconds("") is None
    assert retry_after_seconds(None) is None
