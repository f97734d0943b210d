"""Settings of one worker process, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

# (field, CLI option, minimum, maximum); None = unbounded. Integers are whole numbers.
_LIMITS: tuple[tuple[str, str, float, float | None], ...] = (
    ("concurrency", "--concurrency", 1, 10_000),
    ("lease_seconds", "--lease-seconds", 0.5, 86_400),
    ("poll_seconds", "--poll-seconds", 0.01, 3_600),
    ("reap_seconds", "reap_seconds", 0.05, None),
    ("shutdown_grace", "--shutdown-grace", 0, None),
    ("park_threshold", "park_threshold", 0, None),
    ("max_resumes", "max_resumes", 1, None),
    ("store_retry_seconds", "--store-retry-seconds", 0, 86_400),
)


@dataclass
class WorkerConfig:
    """Tuning of one worker process (defaults documented in the README).

    Raises ``ValueError`` naming the setting and its valid range when a value would
    make the worker misbehave: a lease too short to renew (a run re-claimed while its
    step is in flight), no concurrency, a busy-polling loop, heartbeats slower than
    half the lease.
    """

    concurrency: int = 50
    lease_seconds: float = 15.0
    heartbeat_seconds: float | None = None  # default: a third of the lease
    poll_seconds: float = 0.2
    reap_seconds: float = 0.5
    reap_dead_local_owners: bool = True  # off: behave like a worker on another host
    shutdown_grace: float = 10.0
    park_threshold: float = 2.0
    max_resumes: int = 50  # lease takeovers before a run is handed to a human
    outbox: bool = True
    webhooks: bool = True  # deliver webhooks (also done by every `serve` process)
    # How long a write the store refuses for a reason that is not the run's (disk full,
    # I/O error, read-only, connection lost) is retried: a run's journal write, then its
    # release; and, in burst mode, how long a failing claim loop goes on.
    store_retry_seconds: float = 10.0
    # Seconds between scheduled prunes of the tenants with a configured retention
    # (agentledger/_prune.py); None: this worker never prunes.
    prune_every: float | None = None

    def __post_init__(self) -> None:
        for name, option, low, high in _LIMITS:
            value = getattr(self, name)
            whole = name in ("concurrency", "max_resumes")
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
                raise ValueError(f"{option} must be a {'whole ' if whole else ''}number")
            # `not (low <= value)` also refuses NaN.
            if not (low <= value) or (high is not None and not (value <= high)):
                top = f" and at most {high:g}" if high is not None else ""
                raise ValueError(f"{option} must be {low:g} or more{top} (got {value:g})")
        pe = self.prune_every
        if pe is not None and (
            isinstance(pe, bool) or not isinstance(pe, (int, float)) or not (1 <= pe <= 604_800)
        ):
            raise ValueError(f"--prune-every must be 1 or more and at most 604800 (got {pe!r})")
        hb = self.heartbeat_seconds
        if hb is not None:
            if isinstance(hb, bool) or not isinstance(hb, (int, float)):
                raise ValueError("--heartbeat-seconds must be a number")
            if not (0.01 <= hb <= self.lease_seconds / 2):
                raise ValueError(
                    f"--heartbeat-seconds must be 0.01 or more and at most half of "
                    f"--lease-seconds ({self.lease_seconds / 2:g}), so a lease is renewed "
                    f"before it can expire (got {hb:g})"
                )

    @property
    def heartbeat_interval(self) -> float:
        """How often leases are renewed."""
        return self.heartbeat_seconds or self.lease_seconds / 3
