"""``agentledger bench``: the engine against the physical limit of its database.

See ``docs/benchmarks.md`` for what each figure means and how it is measured.
"""

from __future__ import annotations

from agentledger_bench.runner import BenchConfig, run_bench

__all__ = ["BenchConfig", "run_bench"]
