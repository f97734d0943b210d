"""One measurement in a process of its own: ``python -m agentledger_anchors.child SYSTEM
JOB ARGS-JSON``; prints ``RESULT <json>`` last. A process each keeps the systems'
global state (DBOS's one instance per process, thread pools, loggers) apart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
from typing import Any

from agentledger_anchors.common import (
    bench_module,
    drop_raw,
    interleave,
    pg_rows_bytes,
    raw_commit_us,
    span_rate,
    sqlite_used_bytes,
)


def system(name: str, store: str, target: str, variant: str) -> Any:
    if name == "dbos":
        from agentledger_anchors import dbos_system

        return dbos_system.System(store, target, variant)
    if name == "langgraph":
        from agentledger_anchors import langgraph_system

        return langgraph_system.System(store, target, variant)
    raise SystemExit(f"unknown system {name}")


def steps_job(name: str, a: dict[str, Any]) -> dict[str, Any]:
    """(a)-(d) of agentledger's bench, on another system: raw, read, write interleaved,
    then the concurrent runs with a raw commit measured beside each repetition."""
    sys_ = system(name, a["store"], a["target"], a["variant"])
    try:

        def raw() -> float:
            return raw_commit_us(a["store"], a["raw_target"], a["steps"])

        def per_step(kind: str) -> float:
            result = sys_.seq(kind, a["steps"])
            return float(result["elapsed_s"]) / a["steps"] * 1e6

        raw_commit_us(a["store"], a["raw_target"], 20)
        per_step("read")
        samples = interleave(
            a["reps"], raw, {"read": lambda: per_step("read"), "write": lambda: per_step("write")}
        )
        rates: dict[str, list[float]] = {mode: [] for mode in sys_.concurrency_modes}
        raw_beside = []
        for _ in range(a["concurrent_reps"]):
            raw_beside.append(raw())
            for mode in sys_.concurrency_modes:
                rates[mode].append(span_rate(sys_.concurrent(a["runs"], a["run_steps"], mode)))
        return {
            "config": sys_.config(),
            "samples_us": samples,
            "concurrent_steps_per_s": rates,
            "raw_beside_concurrent_us": raw_beside,
        }
    finally:
        sys_.close()
        drop_raw(a["store"], a["raw_target"])


def bytes_job(name: str, a: dict[str, Any]) -> dict[str, Any]:
    """Growth from an empty run to an ``n``-step run of ``payload``-byte step outputs."""
    sys_ = system(name, a["store"], a["target"], a["variant"])
    try:
        empty = sys_.payload_run(0, a["payload"])
        if a["store"] == "sqlite":
            base = sqlite_used_bytes(a["target"])
            sys_.payload_run(a["n"], a["payload"])
            grown = sqlite_used_bytes(a["target"]) - base
        else:
            full = sys_.payload_run(a["n"], a["payload"])
            schema, column = sys_.bytes_schema
            grown = pg_rows_bytes(a["target"], schema, column, full) - pg_rows_bytes(
                a["target"], schema, column, empty
            )
        return {"config": sys_.config(), "steps": a["n"], "growth": grown}
    finally:
        sys_.close()


def agentledger_job(a: dict[str, Any]) -> dict[str, Any]:
    """agentledger's own bench (its public entry point), without the parts measured
    elsewhere here (kill -> resume) or that the others have no counterpart of."""
    bench = bench_module("", ("run_bench", "BenchConfig"))
    config = bench.BenchConfig.make(db=a["db"], quick=a.get("quick", False))
    config = dataclasses.replace(config, kills=0, procs=(), workdir=a["workdir"])
    report: dict[str, Any] = asyncio.run(bench.run_bench(config, None))
    return report


def tick_job(name: str, a: dict[str, Any]) -> None:
    """Start the long traced run (``first``) or resume it after a restart (``resume``)."""
    sys_ = system(name, a["store"], a["target"], a["variant"])
    if a["role"] == "first":
        sys_.start_ticks(a["run_key"], a["path"])
    else:
        sys_.resume_ticks(a["run_key"], a["path"])
    time.sleep(3600)


def main() -> None:
    name, job, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if job == "tick":
        tick_job(name, args)
        return
    if job == "steps":
        out = agentledger_job(args) if name == "agentledger" else steps_job(name, args)
    elif job == "bytes":
        out = bytes_job(name, args)
    else:
        raise SystemExit(f"unknown job {job}")
    sys.stdout.write("RESULT " + json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)  # not waiting for the systems' background threads


if __name__ == "__main__":
    main()
