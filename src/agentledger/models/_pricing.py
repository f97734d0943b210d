"""Prices of model calls: the ``genai-prices`` package, with an override table.

Prices are USD per million tokens. An override (for a private deployment, a negotiated
rate or a local model) wins over the package: give it to a model as ``prices=`` or set
``AGENTLEDGER_MODEL_PRICES`` to a JSON object (or the path of a JSON file) keyed by the
model string or the bare model name::

    {"openai-compatible:llama3.1@http://gpu:8000/v1": {"input": 0.2, "output": 0.6},
     "gpt-4.1-mini": {"input": 0.3, "output": 1.2, "cached_input": 0.075}}

Every price carries its source (``genai-prices X.Y.Z``, ``override`` or ``unpriced``),
which the journal records with the cost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentledger import _envsettings as envsettings
from agentledger._envsettings import EnvSettings

PRICES_ENV = "AGENTLEDGER_MODEL_PRICES"


@dataclass(frozen=True)
class Price:
    """USD per million tokens; ``cached_input`` defaults to ``input``."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None

    def cost(
        self, input_tokens: int, output_tokens: int, cached: int = 0, written: int = 0
    ) -> float:
        """The cost of a call; ``input_tokens`` includes the cached and written ones."""
        plain = max(0, input_tokens - cached - written)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        write_rate = self.input if self.cache_write is None else self.cache_write
        total = (
            plain * self.input
            + cached * cached_rate
            + written * write_rate
            + output_tokens * self.output
        )
        return total / 1_000_000

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Price:
        """A price from ``{"input": .., "output": .., "cached_input": ..}``."""
        return cls(
            input=float(data["input"]),
            output=float(data["output"]),
            cached_input=_opt(data.get("cached_input")),
            cache_write=_opt(data.get("cache_write")),
        )


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def overrides_from_env(environ: dict[str, str] | None = None) -> dict[str, Price]:
    """The override table of ``AGENTLEDGER_MODEL_PRICES`` (inline JSON or a file path)."""
    env = envsettings.current() if environ is None else EnvSettings.from_environ(environ)
    raw = env.model_prices
    if not raw:
        return {}
    text = raw if raw.startswith("{") else Path(raw).read_text()
    table = json.loads(text)
    if not isinstance(table, dict):
        raise ValueError(f"{PRICES_ENV} must be a JSON object of model -> price")
    return {str(k): Price.from_dict(v) for k, v in table.items()}


@lru_cache(maxsize=1)
def genai_prices_version() -> str | None:
    """The installed ``genai-prices`` version, or None when it is not installed."""
    try:
        from genai_prices import __version__
    except ImportError:
        return None
    return str(__version__)


@lru_cache(maxsize=256)
def _package_price(provider: str | None, model: str) -> Any:
    """The package's price entry of a model (cached: the lookup is the slow part)."""
    try:
        from genai_prices import Usage, calc_price
    except ImportError:
        return None
    try:
        found = calc_price(Usage(input_tokens=0, output_tokens=0), model, provider_id=provider)
    except LookupError:
        return None
    return found.model_price


class Pricer:
    """Cost of a call for one model: the override if any, else ``genai-prices``."""

    def __init__(
        self, key: str, provider: str | None, model: str, override: Price | None = None
    ) -> None:
        self.key, self.provider, self.model = key, provider, model
        table = overrides_from_env()
        self.override = override or table.get(key) or table.get(model)

    @property
    def source(self) -> str:
        """Where the price comes from, as the journal records it."""
        if self.override is not None:
            return "override"
        if _package_price(self.provider, self.model) is None:
            return "unpriced"
        return f"genai-prices {genai_prices_version()}"

    def cost(
        self, input_tokens: int, output_tokens: int, cached: int = 0, written: int = 0
    ) -> float:
        """USD for a call (0.0 when the model has no known price)."""
        if self.override is not None:
            return round(self.override.cost(input_tokens, output_tokens, cached, written), 10)
        entry = _package_price(self.provider, self.model)
        if entry is None:
            return 0.0
        from genai_prices import Usage

        usage = Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cached or None,
            cache_write_tokens=written or None,
        )
        return round(float(entry.calc_price(usage)["total_price"]), 10)
