"""Budgets: limits checked between steps, past which a run is handed to a human."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """Per-run limits. Active seconds count only time the run is executing."""

    max_steps: int = 20
    active_seconds: float = 90.0
    max_tokens: int = 60_000
    max_spend_usd: float = 1.0

    def exceeded(
        self, steps: int, active_seconds: float, tokens: int, spend_usd: float
    ) -> str | None:
        """The name of the first limit reached, or None."""
        if steps >= self.max_steps:
            return f"step budget reached ({steps} of {self.max_steps} steps)"
        if active_seconds >= self.active_seconds:
            return f"time budget reached ({active_seconds:.1f} s of {self.active_seconds:.0f} s)"
        if tokens >= self.max_tokens:
            return f"token budget reached ({tokens} of {self.max_tokens} tokens)"
        if spend_usd >= self.max_spend_usd:
            return f"spend budget reached (${spend_usd:.4f} of ${self.max_spend_usd:.2f})"
        return None
