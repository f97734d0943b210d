"""The CPU one step costs: ``python -m agentledger_bench.step_cpu [--db URL] [--engine]
[--reps N] [--workflow NAME]`` prints JSON.

Default: the process's CPU time (``time.process_time``, every thread) while one
in-process worker drains 200 runs x 10 read-tool steps (figure (d),
:func:`agentledger_bench.engine_runs.concurrent`, after a 50 x 10 warm-up in the same
process), per step: what bounds figure (d) when the commits are grouped. A fresh SQLite
file unless ``--db`` names a store. The heap is set up as a worker process sets it up
(:func:`agentledger._heap.freeze_startup`, once the store is open). ``--workflow
bench_write_tool``: the same with write steps (each journals ``started``, then its
outcome: two commits a step).

``--window``: the same phase measured inside its window only, from the first step of
the first run to the last step of the last (the runs' own times, what figure (d)'s
steps/s divides by), so the submits, the claim and the read back of the runs are left
out: each thread's CPU per step (by thread name), and the bytes and write calls the
process made per step (``/proc/self/io``, where there is one), from samples every 3 ms.

``--engine``: the engine alone, above the store API: the same 200 runs executed by
:func:`agentledger.engine._runner.execute_run` at once, with the store's ``commit``
replaced by one turn of the event loop (a measuring harness only: nothing is journaled,
no group is committed, and no step event is encoded). ``--reps`` times over fresh runs
in one process; the figures are each repetition's CPU per step, their minimum and median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agentledger import _heap as heap
from agentledger import gateway, observe  # noqa: F401 (the hooks a worker process has)
from agentledger.engine._runner import execute_run
from agentledger.store import Store, open_store
from agentledger.store._base import Batch
from agentledger_bench import engine_runs
from agentledger_bench.apps import app as bench_app

RUNS, STEPS = 200, 10


async def worker_cpu_us(store: Store, workflow: str = "bench_read_tool") -> dict[str, Any]:
    """Process CPU per step over figure (d) (of ``workflow``), after a warm-up."""
    await engine_runs.concurrent(store, 50, STEPS, workflow)
    start = time.process_time()
    inside, _, groups = await engine_runs.concurrent(store, RUNS, STEPS, workflow)
    cpu = time.process_time() - start
    return {
        "cpu_us_per_step": round(cpu / (RUNS * STEPS) * 1e6, 1),
        "steps_per_s": round(inside),
        "group_size_median": statistics.median(groups) if groups else 0,
    }


class _Sampler:
    """Every thread's CPU clock and the process's I/O counters, sampled on a thread of
    its own every ``period`` seconds, each sample stamped with the wall clock."""

    def __init__(self, period: float = 0.003) -> None:
        self.period = period
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-cpu-sampler", daemon=True)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self._sample()))
            time.sleep(self.period)

    def _sample(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for thread in threading.enumerate():
            if thread is threading.current_thread() or thread.ident is None:
                continue
            try:
                clock = time.pthread_getcpuclockid(thread.ident)
                cpu = time.clock_gettime(clock)
            except OSError:  # the thread ended meanwhile
                continue
            values[f"cpu:{thread.name}"] = values.get(f"cpu:{thread.name}", 0.0) + cpu
        try:
            with open("/proc/self/io") as io:
                for line in io:
                    name, _, value = line.partition(":")
                    if name in ("wchar", "syscw", "rchar"):
                        values[f"io:{name}"] = float(value)
        except OSError:  # no /proc: CPU only
            pass
        return values

    def at(self, when: float) -> dict[str, float]:
        """The first sample taken at or after ``when`` (the last one if none)."""
        for stamp, values in self.samples:
            if stamp >= when:
                return values
        return self.samples[-1][1]


async def window_cpu_us(store: Store, workflow: str = "bench_read_tool") -> dict[str, Any]:
    """Figure (d) of ``workflow`` measured inside its window (see the module doc)."""
    await engine_runs.concurrent(store, 50, STEPS, workflow)
    with _Sampler() as sampler:
        results, _ = await engine_runs.execute(
            store, workflow, [{"steps": STEPS} for _ in range(RUNS)], concurrency=RUNS
        )
    first = min(r["t_first"] for r in results)
    last = max(r["t_last"] for r in results)
    start, end = sampler.at(first), sampler.at(last)
    steps = RUNS * STEPS
    per_step = {k: (end[k] - start.get(k, 0.0)) / steps for k in end}
    report: dict[str, Any] = {
        "steps_per_s": round(steps / (last - first)),
        "window_s": round(last - first, 3),
        "thread_cpu_us_per_step": {
            k.removeprefix("cpu:"): round(v * 1e6, 1)
            for k, v in sorted(per_step.items())
            if k.startswith("cpu:")
        },
    }
    names = {"io:wchar": "bytes_written", "io:syscw": "write_calls", "io:rchar": "bytes_read"}
    for key, name in names.items():
        if key in per_step:
            report[f"{name}_per_step"] = round(per_step[key], 2)
    return report


async def engine_cpu_us(store: Store, reps: int) -> dict[str, Any]:
    """Process CPU per step of the engine with no journal write behind ``commit``."""

    async def commit(batch: Batch) -> None:
        await asyncio.sleep(0)  # a write's one wait, without the write

    values = []
    for _ in range(reps):
        ids = [
            await bench_app.submit(store, "bench_read_tool", {"steps": STEPS}) for _ in range(RUNS)
        ]
        runs = [await store.get_run(run_id) for run_id in ids]
        real = store.commit
        store.commit = commit  # type: ignore[method-assign]
        try:
            start = time.process_time()
            outcomes = await asyncio.gather(
                *(execute_run(store, bench_app, run, "bench") for run in runs if run is not None)
            )
            cpu = time.process_time() - start
        finally:
            store.commit = real  # type: ignore[method-assign]
        if set(outcomes) != {"completed"}:
            raise RuntimeError(f"engine runs ended {sorted(set(outcomes))}")
        values.append(round(cpu / (RUNS * STEPS) * 1e6, 1))
    return {
        "engine_cpu_us_per_step": values,
        "min": min(values),
        "median": statistics.median(values),
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    url = args.db or f"sqlite:///{Path(tempfile.mkdtemp()) / 'step_cpu.db'}"
    store = open_store(url)
    await store.open()
    heap.freeze_startup()  # as `agentledger worker` does once its store is open
    try:
        if args.engine:
            return await engine_cpu_us(store, args.reps)
        if args.window:
            return await window_cpu_us(store, args.workflow)
        return await worker_cpu_us(store, args.workflow)
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    """Parse the options, measure, print the JSON."""
    parser = argparse.ArgumentParser(prog="python -m agentledger_bench.step_cpu")
    parser.add_argument("--db", help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--engine", action="store_true", help="the engine alone (no writes)")
    parser.add_argument(
        "--window", action="store_true", help="per thread, inside figure (d)'s window only"
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions of --engine")
    parser.add_argument(
        "--workflow",
        default="bench_read_tool",
        choices=["bench_read_tool", "bench_write_tool"],
        help="the steps the worker runs (default: read-tool steps)",
    )
    print(json.dumps(asyncio.run(_main(parser.parse_args(argv)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
