"""The fault grammar: one ``--faults`` spec language for the chaos proxy and the StayHub sandbox.

Spec syntax (one line, entries separated by ``;``)::

    ENTRY := ENDPOINT ':' KIND ['@' PROBABILITY] (',' PARAM '=' VALUE)*
           | 'seed=' INT

Example::

    pay:error_after_commit@0.2;pay:timeout_after_commit@0.1,hold=5;seed=7

``ENDPOINT`` names what the fault hits: for ``agentledger chaos``, a ``--proxy`` NAME;
for the StayHub sandbox, one of its endpoints; ``*`` hits every endpoint. Which endpoints
and kinds are allowed is the consumer's :class:`Grammar`. ``PROBABILITY`` is in [0, 1]
and defaults to 1 (always). Several entries may name the same endpoint; they are
evaluated in order. Kinds and their parameters (every kind also takes ``count=N``: fire at
most N times, e.g. "fail the first 2 requests"):

- ``latency,ms=N``: sleep N ms (default 100) before handling.
- ``timeout_after_commit,hold=S``: apply the request, then hold the answer S seconds
  (default 30): a client with a shorter timeout never learns it applied.
- ``hold,hold=S``: hold the request S seconds (default 30) *before* applying it.
- ``rate_limit,retry_after=N``: 429 with ``Retry-After: N`` (default 1); not applied.
- ``error,status=N``: an N (500-599, default 503) response; not applied.
- ``outage,start=S,end=S`` or ``outage,duration=S``: every request fails with 503 in the
  window [start, end) seconds after the fault was installed (``start`` defaults to 0, an
  outage without ``end``/``duration`` lasts forever).
- ``error_after_commit,status=N,save=0|1`` (writes): apply the request, then answer N
  (500, 502 or 504; default 500) instead of the real answer. With ``save=1`` the 5xx is
  kept for the key and answered to every later write with that key, as Stripe does; a
  status check by key still reaches the provider.
- ``drop`` (writes): apply the request, then close the connection without an answer (the
  answer is lost in transit).
- ``in_progress,retry_after=N`` (writes): 409 ``request_in_progress`` with
  ``Retry-After: N`` (default 1), as a provider answers while an earlier request with the
  same key still runs; not applied.
- ``decline`` (the sandbox's ``payments.create``): 402 ``card_declined``.
- ``lag,lag=S`` (the sandbox's status lookups): a lookup by key answers ``not_found`` for
  S seconds (default 2) after the key's request committed.
- ``keyless`` (the sandbox's write endpoints; a mode, probability 1): the endpoint ignores
  the ``Idempotency-Key`` header.

``seed=N`` (default 0) seeds one ``random.Random`` per endpoint, so a run is reproducible
and traffic on one endpoint does not change the dice rolled for another.

The JSON shape is :meth:`FaultConfig.to_dict`::

    {"seed": 7, "faults": [{"endpoint": "pay", "kind": "rate_limit",
                            "probability": 0.5, "retry_after": 1}]}
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

FAULT_KINDS: tuple[str, ...] = (
    "latency",
    "timeout_after_commit",
    "hold",
    "rate_limit",
    "error",
    "outage",
    "decline",
    "error_after_commit",
    "lag",
    "keyless",
    "drop",
    "in_progress",
)
"""Every fault kind the grammar knows; a :class:`Grammar` allows a subset."""

_KIND_PARAMS: dict[str, frozenset[str]] = {
    "latency": frozenset({"ms"}),
    "timeout_after_commit": frozenset({"hold"}),
    "hold": frozenset({"hold"}),
    "rate_limit": frozenset({"retry_after"}),
    "error": frozenset({"status"}),
    "outage": frozenset({"start", "end", "duration"}),
    "decline": frozenset(),
    "error_after_commit": frozenset({"status", "save"}),
    "lag": frozenset({"lag"}),
    "keyless": frozenset(),
    "drop": frozenset(),
    "in_progress": frozenset({"retry_after"}),
}
_WRITE_ONLY_KINDS = frozenset({"error_after_commit", "keyless", "drop", "in_progress"})
_AFTER_COMMIT_STATUSES = frozenset({500, 502, 504})
_INT_PARAMS = frozenset({"count", "retry_after", "status", "save"})
_PARAMS = (
    "count",
    "ms",
    "hold",
    "retry_after",
    "status",
    "start",
    "end",
    "duration",
    "save",
    "lag",
)


@dataclass(frozen=True)
class Grammar:
    """What one consumer of the grammar accepts: its endpoints and kinds.

    ``endpoints`` None accepts any name (checked by the consumer); ``write_endpoints``
    None means every endpoint takes writes (the proxy tells a write by its method);
    ``only`` restricts a kind to some endpoints (the sandbox's ``decline``).
    """

    endpoints: tuple[str, ...] | None = None
    write_endpoints: frozenset[str] | None = None
    kinds: tuple[str, ...] = FAULT_KINDS
    only: Mapping[str, frozenset[str]] = field(default_factory=dict)
    example: str = "pay:error_after_commit@0.2;pay:timeout_after_commit@0.1,hold=5;seed=7"

    def bad(self, what: str) -> ValueError:
        """The one-line error of a bad spec, with an example of a good one."""
        return ValueError(f"bad fault spec: {what}; example: {self.example!r}")

    def fault(self, **kwargs: Any) -> Fault:
        """A :class:`Fault` this grammar allows, else ``ValueError`` saying why: where it
        applies first (an unknown endpoint or kind), then its parameters."""
        endpoint, kind = kwargs.get("endpoint"), kwargs.get("kind")
        if self.endpoints is not None and endpoint != "*" and endpoint not in self.endpoints:
            raise self.bad(
                f"unknown endpoint {endpoint!r} (expected one of {', '.join(self.endpoints)})"
            )
        if kind not in self.kinds:
            raise self.bad(f"unknown fault kind {kind!r} (expected one of {', '.join(self.kinds)})")
        allowed = self.only.get(str(kind))
        if allowed is not None and endpoint not in allowed:
            raise self.bad(f"{kind!r} applies to {', '.join(sorted(allowed))} only")
        if (
            kind in _WRITE_ONLY_KINDS
            and self.write_endpoints is not None
            and endpoint not in self.write_endpoints
        ):
            raise self.bad(f"{kind!r} applies to write endpoints only, not {endpoint!r}")
        try:
            return Fault(**kwargs)
        except (TypeError, ValueError) as exc:
            raise self.bad(str(exc)) from None


ANY = Grammar()
"""A grammar that accepts every kind on any endpoint name."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Fault:
    """One fault: what it hits, what it does, how often, and its parameters."""

    endpoint: str
    kind: str
    probability: float = 1.0
    count: int | None = None
    ms: float | None = None
    hold: float | None = None
    retry_after: int | None = None
    status: int | None = None
    start: float | None = None
    end: float | None = None
    duration: float | None = None
    save: int | None = None
    lag: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(
                f"unknown fault kind {self.kind!r} (expected one of {', '.join(FAULT_KINDS)})"
            )
        if not _is_number(self.probability) or not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability {self.probability} is not in [0, 1]")
        allowed = _KIND_PARAMS[self.kind] | {"count"}
        if self.kind == "keyless" and (self.probability != 1.0 or self.count is not None):
            raise ValueError("'keyless' is a mode of the endpoint: no probability, no count")
        for name in _PARAMS:
            value = getattr(self, name)
            if value is None:
                continue
            if not _is_number(value):
                raise ValueError(f"{name}={value!r} is not a number")
            if name not in allowed:
                raise ValueError(
                    f"{self.kind!r} takes no parameter {name!r} (allowed: {sorted(allowed)})"
                )
            if value < 0:
                raise ValueError(f"{name}={value} must not be negative")
        if self.status is not None and not 500 <= self.status <= 599:
            raise ValueError(f"error status={self.status} must be 500-599")
        if (
            self.kind == "error_after_commit"
            and self.status is not None
            and self.status not in _AFTER_COMMIT_STATUSES
        ):
            raise ValueError(f"error_after_commit status={self.status} must be 500, 502 or 504")
        if self.save is not None and self.save not in (0, 1):
            raise ValueError(f"save={self.save} must be 0 or 1")
        if self.end is not None and self.duration is not None:
            raise ValueError("outage takes either end= or duration=, not both")

    @property
    def hold_seconds(self) -> float:
        """Seconds to hold for ``hold`` / ``timeout_after_commit`` (default 30)."""
        return 30.0 if self.hold is None else self.hold

    def outage_window(self) -> tuple[float, float]:
        """The outage window ``[start, end)`` in seconds after installation."""
        start = self.start or 0.0
        if self.duration is not None:
            return start, start + self.duration
        return start, math.inf if self.end is None else self.end

    def to_spec(self) -> str:
        """This fault as one spec entry."""
        text = f"{self.endpoint}:{self.kind}"
        if self.probability != 1.0:
            text += f"@{self.probability:g}"
        for name in _PARAMS:
            value = getattr(self, name)
            if value is not None:
                text += f",{name}={value:g}"
        return text


@dataclass(frozen=True)
class FaultConfig:
    """A whole fault configuration: the faults, in evaluation order, and the seed."""

    faults: tuple[Fault, ...] = ()
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "seed": self.seed,
            "faults": [{k: v for k, v in asdict(f).items() if v is not None} for f in self.faults],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], grammar: Grammar = ANY) -> FaultConfig:
        """Build a config from :meth:`to_dict` output; ``{"spec": "..."}`` is parsed too."""
        if "spec" in data:
            return parse_faults(str(data["spec"]), grammar)
        known = {f.name for f in fields(Fault)}
        faults: list[Fault] = []
        for item in data.get("faults", []):
            if not isinstance(item, Mapping):
                raise grammar.bad(f"fault entry {item!r} is not an object")
            unknown = set(item) - known
            if unknown:
                raise grammar.bad(f"unknown fault field(s) {sorted(unknown)}")
            faults.append(grammar.fault(**item))
        seed = data.get("seed", 0)
        if not isinstance(seed, int):
            raise grammar.bad(f"seed {seed!r} is not an integer")
        return cls(faults=tuple(faults), seed=seed)

    def to_spec(self) -> str:
        """The config in spec syntax; ``parse_faults(c.to_spec()) == c``."""
        return ";".join([*(f.to_spec() for f in self.faults), f"seed={self.seed}"])


def _number(grammar: Grammar, name: str, text: str, entry: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise grammar.bad(f"{name}={text!r} in {entry!r} is not a number") from None
    if name in _INT_PARAMS:
        if not value.is_integer():
            raise grammar.bad(f"{name}={text!r} in {entry!r} must be an integer")
        return int(value)
    return value


def _parse_entry(entry: str, grammar: Grammar) -> Fault:
    head, _, rest = entry.partition(",")
    endpoint, colon, kind_prob = head.partition(":")
    if not colon:
        raise grammar.bad(f"entry {entry!r} is not ENDPOINT:KIND[@P][,k=v...] or seed=N")
    kind, at, prob_text = kind_prob.partition("@")
    kwargs: dict[str, Any] = {"endpoint": endpoint.strip(), "kind": kind.strip()}
    if at:
        kwargs["probability"] = _number(grammar, "probability", prob_text.strip(), entry)
    names = {f.name for f in fields(Fault)} - {"endpoint", "kind", "probability"}
    for param in filter(None, (p.strip() for p in rest.split(","))) if rest else ():
        name, eq, value = param.partition("=")
        name = name.strip()
        if not eq or name not in names:
            raise grammar.bad(f"bad parameter {param!r} in {entry!r} (expected NAME=VALUE)")
        kwargs[name] = _number(grammar, name, value.strip(), entry)
    return grammar.fault(**kwargs)


def parse_faults(spec: str, grammar: Grammar = ANY) -> FaultConfig:
    """Parse a ``--faults`` spec (see the module docstring); raise ``ValueError`` if bad."""
    faults: list[Fault] = []
    seed = 0
    for raw in spec.split(";"):
        entry = raw.strip()
        if not entry:
            continue
        if entry.startswith("seed="):
            try:
                seed = int(entry[5:].strip())
            except ValueError:
                raise grammar.bad(f"seed in {entry!r} is not an integer") from None
            continue
        faults.append(_parse_entry(entry, grammar))
    return FaultConfig(faults=tuple(faults), seed=seed)


@dataclass(frozen=True)
class Failure:
    """An injected failure response (nothing is applied)."""

    status_code: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class FaultInjector:
    """Runtime state of a :class:`FaultConfig`: per-endpoint RNGs, fire counts, install time.

    Each method rolls the dice for one phase of a request at one endpoint. ``modes`` maps
    an endpoint to the one whose ``keyless`` mode it shares.
    """

    def __init__(
        self,
        config: FaultConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        modes: Mapping[str, str] | None = None,
    ) -> None:
        self._clock = clock
        self._modes = dict(modes or {})
        self.install(config or FaultConfig())

    @property
    def config(self) -> FaultConfig:
        """The installed configuration."""
        return self._config

    def install(self, config: FaultConfig) -> None:
        """Replace the configuration; resets RNGs, counters and the outage clock."""
        self._config = config
        self._installed_at = self._clock()
        self._fired = [0] * len(config.faults)
        # Requests each fault met (its kind and endpoint asked about it), fired or not: a
        # fault that met none had no chance to fire.
        self._met = [0] * len(config.faults)
        self._dropped: dict[str, int] = {}
        self._rngs: dict[str, random.Random] = {}

    def _rng(self, endpoint: str) -> random.Random:
        rng = self._rngs.get(endpoint)
        if rng is None:
            rng = self._rngs[endpoint] = random.Random(f"{self._config.seed}:{endpoint}")
        return rng

    def _fires(self, endpoint: str, kinds: tuple[str, ...], first: bool = False) -> list[Fault]:
        fired: list[Fault] = []
        for index, fault in enumerate(self._config.faults):
            if fault.kind not in kinds or fault.endpoint not in ("*", endpoint):
                continue
            self._met[index] += 1
            if fault.count is not None and self._fired[index] >= fault.count:
                continue
            if fault.kind == "outage":
                start, end = fault.outage_window()
                if not start <= self._clock() - self._installed_at < end:
                    continue
            if fault.probability < 1.0 and self._rng(endpoint).random() >= fault.probability:
                continue
            self._fired[index] += 1
            fired.append(fault)
            if first:
                break
        return fired

    def latency(self, endpoint: str) -> float:
        """Seconds of injected latency for this request (0 if none)."""
        return (
            sum((f.ms if f.ms is not None else 100.0) for f in self._fires(endpoint, ("latency",)))
            / 1000
        )

    def failure(self, endpoint: str) -> Failure | None:
        """An outage, rate limit or error response for this request, if one fires."""
        for fault in self._fires(endpoint, ("outage", "rate_limit", "error"), first=True):
            if fault.kind == "outage":
                left = fault.outage_window()[1] - (self._clock() - self._installed_at)
                retry = str(max(1, math.ceil(left))) if math.isfinite(left) else "60"
                return Failure(503, {"error": "outage"}, {"Retry-After": retry})
            if fault.kind == "rate_limit":
                after = 1 if fault.retry_after is None else fault.retry_after
                return Failure(
                    429,
                    {"error": "rate_limited", "retry_after": after},
                    {"Retry-After": str(after)},
                )
            status = 503 if fault.status is None else fault.status
            return Failure(status, {"error": "injected_error", "status": status})
        return None

    def in_progress(self, endpoint: str) -> Failure | None:
        """A 409 "request in progress" for this write, if an ``in_progress`` fault fires."""
        for fault in self._fires(endpoint, ("in_progress",), first=True):
            after = 1 if fault.retry_after is None else fault.retry_after
            return Failure(409, {"error": "request_in_progress"}, {"Retry-After": str(after)})
        return None

    def hold_before(self, endpoint: str) -> float:
        """Seconds to hold before applying (``hold``); 0 if it does not fire."""
        return max((f.hold_seconds for f in self._fires(endpoint, ("hold",))), default=0.0)

    def hold_after_commit(self, endpoint: str) -> float:
        """Seconds to hold after committing (``timeout_after_commit``); 0 if none."""
        fired = self._fires(endpoint, ("timeout_after_commit",))
        return max((f.hold_seconds for f in fired), default=0.0)

    def declines(self, endpoint: str) -> bool:
        """Whether a ``decline`` fault fires for this payment."""
        return bool(self._fires(endpoint, ("decline",)))

    def error_after_commit(self, endpoint: str) -> tuple[int, bool] | None:
        """``(status, save)`` when an ``error_after_commit`` fault fires for this write."""
        for fault in self._fires(endpoint, ("error_after_commit",), first=True):
            return (500 if fault.status is None else fault.status), bool(fault.save)
        return None

    def drops(self, endpoint: str) -> bool:
        """Whether a ``drop`` fault fires: the write's answer is lost after it applied."""
        return bool(self._fires(endpoint, ("drop",), first=True))

    def lag(self, endpoint: str) -> float:
        """Seconds a status lookup lags behind a commit (``lag``); 0 if none fires."""
        fired = self._fires(endpoint, ("lag",))
        return max((2.0 if f.lag is None else f.lag for f in fired), default=0.0)

    def keyless(self, endpoint: str) -> bool:
        """Whether this write endpoint ignores the idempotency key (``keyless`` mode)."""
        return bool(self._fires(self._modes.get(endpoint, endpoint), ("keyless",), first=True))

    def is_keyless(self, endpoint: str) -> bool:
        """Whether the endpoint is in ``keyless`` mode, without counting a firing."""
        mode = self._modes.get(endpoint, endpoint)
        return any(f.kind == "keyless" and f.endpoint in ("*", mode) for f in self._config.faults)

    def dropped(self, endpoint: str) -> None:
        """Count a committed response the client never got (lost or replaced by a 5xx)."""
        self._dropped[endpoint] = self._dropped.get(endpoint, 0) + 1

    def stats(self) -> dict[str, Any]:
        """How often each configured fault fired and met its operation (``met``: requests
        it applied to, fired or not), and each endpoint's responses were dropped."""
        return {
            "fired": [
                {"fault": fault.to_spec(), "fired": n, "met": met}
                for fault, n, met in zip(self._config.faults, self._fired, self._met, strict=True)
            ],
            "dropped": dict(sorted(self._dropped.items())),
        }
