"""Worker settings that would make a worker misbehave are refused at construction."""

from __future__ import annotations

import math

import pytest

from agentledger.worker import WorkerConfig


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"lease_seconds": 0}, "--lease-seconds"),
        ({"lease_seconds": -1}, "--lease-seconds"),
        ({"lease_seconds": math.nan}, "--lease-seconds"),
        ({"lease_seconds": math.inf}, "--lease-seconds"),
        ({"concurrency": 0}, "--concurrency"),
        ({"concurrency": 2.5}, "--concurrency"),
        ({"poll_seconds": 0}, "--poll-seconds"),
        ({"poll_seconds": -0.1}, "--poll-seconds"),
        ({"heartbeat_seconds": 15.0}, "--heartbeat-seconds"),  # == lease
        ({"heartbeat_seconds": 20.0}, "--heartbeat-seconds"),  # > lease
        ({"heartbeat_seconds": 0.0}, "--heartbeat-seconds"),
        ({"lease_seconds": 4.0, "heartbeat_seconds": 3.0}, "--heartbeat-seconds"),
        ({"shutdown_grace": -1}, "--shutdown-grace"),
        ({"max_resumes": 0}, "max_resumes"),
    ],
)
def test_invalid_settings_are_refused(settings: dict[str, float], names: str) -> None:
    with pytest.raises(ValueError, match=names) as caught:
        WorkerConfig(**settings)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


def test_valid_settings_are_kept() -> None:
    config = WorkerConfig(concurrency=1, lease_seconds=0.5, poll_seconds=0.01)
    assert config.heartbeat_interval == pytest.approx(0.5 / 3)
    assert WorkerConfig(lease_seconds=10, heartbeat_seconds=5).heartbeat_interval == 5


@pytest.mark.parametrize("value", [-1, math.nan, math.inf, 86_401])
def test_a_store_retry_window_out_of_range_names_the_range(value: float) -> None:
    with pytest.raises(ValueError) as caught:
        WorkerConfig(store_retry_seconds=value)
    assert str(caught.value).startswith(
        "--store-retry-seconds must be 0 or more and at most 86400 (got "
    ), caught.value
