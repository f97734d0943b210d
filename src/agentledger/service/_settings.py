"""The service's settings, from arguments or ``AGENTLEDGER_*`` environment variables."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentledger import _envsettings as envsettings
from agentledger.errors import UsageError

PEPPER_ENV = "AGENTLEDGER_KEY_PEPPER"


def pepper_from_env() -> bytes:
    """The server pepper API key secrets are HMACed under (env ``AGENTLEDGER_KEY_PEPPER``)."""
    value = envsettings.current().key_pepper.get_secret_value()
    if len(value) < 16:
        raise UsageError(
            f"set {PEPPER_ENV} to a secret of at least 16 characters (the same value for "
            "`agentledger keys` and every `agentledger serve`), e.g. "
            f"export {PEPPER_ENV}=$(python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return value.encode()


@dataclass(frozen=True)
class ClientBounds:
    """How long an HTTP client may take over a request's head and body, how large a
    head may be, and how many may be connected (service/_server.py); ``keep_alive``:
    uvicorn's idle time between requests."""

    header_timeout: float = 5.0
    body_timeout: float = 10.0
    keep_alive: int = 5
    max_connections: int = 2048
    # A request line and headers beyond this many bytes are answered 431 (bodies have
    # their own limit, service/_problems.py).
    max_head_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout"):
            value = getattr(self, name)
            if not 0.1 <= value <= 3600:
                raise ValueError(f"{name} = {value}: give 0.1 to 3600 seconds")
        if not 1 <= self.keep_alive <= 3600:
            raise ValueError(f"keep_alive = {self.keep_alive}: give 1 to 3600 seconds")
        if self.max_connections < 1:
            raise ValueError(f"max_connections = {self.max_connections}: give at least 1")
        if self.max_head_bytes < 1024:
            raise ValueError(f"max_head_bytes = {self.max_head_bytes}: give at least 1024")


@dataclass
class ServiceSettings:
    """What one service process needs; every field has a working default but the pepper."""

    db_url: str
    pepper: bytes
    # Idempotency-Key rows are kept this long (the IETF draft suggests 24 h).
    idempotency_ttl: float = 24 * 3600.0
    # A request whose key is in flight in this process waits this long for the first one
    # to commit, then gets 409.
    idempotency_wait: float = 10.0
    # Require an Idempotency-Key for agents that have side-effecting tools.
    require_idempotency_for_writes: bool = False
    # Default per-tenant quotas (a tenant's row may override): None = unlimited.
    runs_per_minute: int | None = None
    max_in_flight: int | None = None
    # A key lookup is cached this long: a revoke takes effect within this many seconds.
    key_cache_seconds: float = 2.0
    # Server-sent events: reconnect hint, heartbeat comment period, poll period.
    sse_retry_ms: int = 2000
    sse_heartbeat: float = 15.0
    event_poll: float = 0.02
    # The longest ``?wait=`` of a result long-poll.
    max_wait: float = 60.0
    # New audit events are sealed into the tenant's hash chain this often.
    audit_seal_every: float = 1.0
    # Webhooks: how often due deliveries are looked for; the first retry's delay (doubling).
    webhook_poll: float = 0.5
    webhook_backoff: float = 2.0
    # Console sessions end after this long without a request from their browser, and
    # this long after sign-in at most (AGENTLEDGER_CONSOLE_SESSION_IDLE / _LIFETIME).
    console_idle: float = field(default_factory=lambda: envsettings.current().console_session_idle)
    console_lifetime: float = field(
        default_factory=lambda: envsettings.current().console_session_lifetime
    )
    # Workers run inside the service process (the embedded SQLite case).
    workers_inline: int = 0
    # Per-agent webhooks set at deployment (agent name -> URL); they override the
    # agent's own ``webhook`` attribute (see service/_webhooks.py: webhook_for).
    agent_webhooks: dict[str, str] = field(default_factory=dict)
    # Webhook targets inside the network (loopback, link-local, private...) are refused
    # unless allowed here: host names (exact), addresses or networks (service/_egress.py).
    webhook_allow_hosts: tuple[str, ...] = ()
    # Fixed answers for webhook host names, consulted before DNS (like a hosts file).
    webhook_hosts: dict[str, list[str]] = field(default_factory=dict)
    # Slow and idle clients (service/_server.py), for `serve`'s uvicorn.
    client_bounds: ClientBounds = field(default_factory=ClientBounds)
    # Serve /metrics without a key on this port of its own (None: only on the API port,
    # to deployment keys).
    metrics_port: int | None = None
    # The address that port listens on: loopback unless the deployment says otherwise.
    metrics_host: str = "127.0.0.1"
    extra: dict[str, str] = field(default_factory=dict)
