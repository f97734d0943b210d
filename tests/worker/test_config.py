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
