"""What tracing and metrics cost per step: ``python -m agentledger_bench.observe_overhead
[--db URL] [--reps N] [--steps N]`` prints JSON.

Conditions, measured in one process, interleaved (each repetition runs every condition,
in a rotating order, so the noise of a shared machine hits them alike):

- ``none``: no tracer provider (the default: every tracing hook is a type check);
- ``memory``: the OpenTelemetry SDK with a ``BatchSpanProcessor`` into an in-memory
  exporter (the cost of making the spans, without encoding or sending them);
- ``otlp``: what a user configures (:func:`agentledger.observe._tracing.otlp_provider`:
  the SDK's ``TracerProvider`` and ``BatchSpanProcessor`` with its default batch of 512
  spans, the official OTLP/HTTP exporter) sending to a collector stub on loopback, and
  ``/metrics`` scraped every ``--scrape-every`` seconds while the runs execute (store
  queries on the worker's event loop): the whole cost of being watched. The collector
  and the scraper run in a process of their own, as a real collector and Prometheus do
  (:mod:`agentledger_bench._watchers`). The target is
  on this condition.
- ``otlp_fast_encoder``: the same with the opt-in exporter
  (``AGENTLEDGER_OTLP_ENCODER=fast``, :mod:`agentledger.observe._otlp`: the same bytes,
  encoded with less CPU); ``target_met_fast_encoder`` is the target on it.
- ``unsampled``: the same provider with ``OTEL_TRACES_SAMPLER=parentbased_always_off``:
  what a run costs when a sampler left its trace out (each run's root span decides and
  its steps follow, a resume too). A sampled fraction ``p`` of runs costs about
  ``p * otlp + (1 - p) * unsampled``.

With ``--compare``, variants of ``otlp`` (same collector, same scraping):
``otlp_switch_1ms`` runs with the interpreter's switch interval at 1 ms instead of 5
(``sys.setswitchinterval``: how long the event loop's thread may wait for the GIL the
exporter's thread holds while it encodes); ``otlp_batch_2048`` exports batches of 2,048
spans (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``, a queue of 8,192); ``otlp_ratio_10`` samples a
tenth of the runs (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, argument 0.1);
``otlp_unscraped`` is ``otlp`` without the scraping (what the spans alone cost).

Figures per condition: the median per-step time of a ``--steps``-step workflow of no-op
read tools (``read_step_us``, timed inside the run as ``agentledger bench`` does) and of
no-op ``ctx.step`` calls (``ctx_step_us``), and their ratio to ``none`` (a ratio of
medians, and the median of the per-repetition ratios). The process histograms (step
duration, ``gen_ai.client.*``) are recorded in every condition; their own cost per
observation is ``histogram_observe_us``. ``read_step_cpu_us``: the process's CPU time per
read step (all threads, run start and end included, and the export of every span the
run made: what is still queued when the run ends is flushed inside the measurement),
steadier than wall time on a loaded machine; ``read_step_loop_cpu_us``: the CPU time of
the event loop's thread alone per read step (the worker's own; the processor's thread
encodes and sends apart from it). ``--freeze-heap``: after the warm-up, collect and
freeze the heap as the ``worker`` and ``serve`` commands do once started (spans waiting
in the processor's queue then survive collections that no longer walk the start-up
heap). The default ``--steps`` (1024) is two export
batches, so the processor's thread encodes and sends during the timed run as it does on
a busy worker. Target: ``otlp`` read-step overhead <= 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import trace

from agentledger import _heap as heap
from agentledger.observe import _tracing as tracing
from agentledger.observe._instruments import STEP_DURATION
from agentledger.observe._metrics import MetricsServer
from agentledger.store import open_store
from agentledger_bench._watchers import Watchers
from agentledger_bench.engine_runs import per_step_us

CONDITIONS = ("none", "memory", "otlp", "otlp_fast_encoder", "unsampled")
COMPARE = ("otlp_switch_1ms", "otlp_batch_2048", "otlp_ratio_10", "otlp_unscraped")
# The OTEL_* settings of each condition's provider beyond the defaults, read by the SDK
# as a user would set them.
_SETTINGS: dict[str, dict[str, str]] = {
    "unsampled": {"OTEL_TRACES_SAMPLER": "parentbased_always_off"},
    "otlp_batch_2048": {
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2048",
        "OTEL_BSP_MAX_QUEUE_SIZE": "8192",
    },
    "otlp_ratio_10": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
}


@contextmanager
def _environment(settings: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _providers(collector_url: str, conditions: tuple[str, ...]) -> dict[str, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = TracerProvider()
    exporter = InMemorySpanExporter()
    memory.add_span_processor(BatchSpanProcessor(exporter))
    providers: dict[str, Any] = {"none": trace.NoOpTracerProvider(), "memory": memory}
    for name in conditions:
        if name not in providers:  # the user's configuration, to loopback
            with _environment(_SETTINGS.get(name, {})):
                fast = name == "otlp_fast_encoder"
                providers[name] = tracing.otlp_provider(collector_url, fast_encoder=fast)
    providers["_mem"] = exporter
    return providers


def _flush(provider: Any) -> None:
    if hasattr(provider, "force_flush"):
        provider.force_flush()


@contextmanager
def _condition(name: str, providers: dict[str, Any], watchers: Watchers) -> Iterator[None]:
    tracing.set_provider(providers[name])
    switch = sys.getswitchinterval()
    if name == "otlp_switch_1ms":
        sys.setswitchinterval(0.001)
    # A watched worker: /metrics scraped (``otlp_unscraped``: the spans alone).
    if name != "otlp_unscraped" and (name.startswith("otlp") or name == "unsampled"):
        watchers.scrape(True)
    try:
        yield
    finally:
        watchers.scrape(False)
        sys.setswitchinterval(switch)
        _flush(providers[name])  # export what was batched, outside the timing
        providers["_mem"].clear()
        tracing.set_provider(None)


def histogram_observe_us(n: int = 20000) -> float:
    """The cost of one step-duration observation (recorded in every condition)."""
    child = STEP_DURATION.labels("bench_overhead", "read", "ok")
    started = time.perf_counter()
    for _ in range(n):
        child.observe(0.001)
    return (time.perf_counter() - started) / n * 1e6


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


async def measure(
    url: str,
    reps: int,
    steps: int,
    scrape_every: float,
    compare: bool = False,
    freeze: bool = False,
    only: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Every condition (or ``none`` and ``only``) ``reps`` times, interleaved; the report."""
    conditions = CONDITIONS + (COMPARE if compare else ())
    if only:
        conditions = ("none", *(c for c in conditions if c in only and c != "none"))
    store = open_store(url)
    await store.open()
    metrics = MetricsServer(store, 0, asyncio.get_running_loop(), host="127.0.0.1").start()
    watchers = Watchers(metrics.port, scrape_every)
    providers = _providers(watchers.url, conditions)
    read: dict[str, list[float]] = {c: [] for c in conditions}
    step: dict[str, list[float]] = {c: [] for c in conditions}
    read_cpu: dict[str, list[float]] = {c: [] for c in conditions}
    loop_cpu: dict[str, list[float]] = {c: [] for c in conditions}
    try:
        for name in conditions:  # warm up: imports, schema, page cache, the first spans
            with _condition(name, providers, watchers):
                await per_step_us(store, "bench_read_tool", 10)
        if freeze:  # as `worker` and `serve` do once started (agentledger._heap)
            heap.freeze_startup()
        for rep in range(reps):
            turn = rep % len(conditions)
            order = conditions[turn:] + conditions[:turn]
            for name in order:
                with _condition(name, providers, watchers):
                    cpu = time.process_time()  # every thread: the exporter's too
                    loop = time.thread_time()  # the event loop's thread alone
                    read[name].append(await per_step_us(store, "bench_read_tool", steps))
                    loop_cpu[name].append((time.thread_time() - loop) / steps * 1e6)
                    _flush(providers[name])  # the rest of this run's spans, counted
                    read_cpu[name].append((time.process_time() - cpu) / steps * 1e6)
                    step[name].append(await per_step_us(store, "bench_step", steps))
    finally:
        # The scraper's last request is answered on this loop: never block it to wait.
        for name in conditions[1:]:
            providers[name].shutdown()
        counts = await asyncio.to_thread(watchers.close)
        metrics.stop()
        await store.close()
    report: dict[str, Any] = {
        "backend": "postgresql" if url.startswith("postgres") else "sqlite",
        "reps": reps,
        "steps": steps,
        "scrape_every_s": scrape_every,
        "heap_frozen": freeze,
        "scrapes": counts["scrapes"],
        "scrape_errors": counts["scrape_errors"],
        "otlp_exports": {"requests": counts["requests"], "bytes": counts["bytes"]},
        "histogram_observe_us": round(histogram_observe_us(), 3),
    }
    figures = (
        ("read_step", read),
        ("ctx_step", step),
        ("read_step_cpu", read_cpu),
        ("read_step_loop_cpu", loop_cpu),
    )
    for figure, samples in figures:
        base = _median(samples["none"])
        for name in conditions:
            report[f"{figure}_us_{name}"] = round(_median(samples[name]), 1)
            if name == "none":
                continue
            report[f"{figure}_ratio_{name}"] = round(_median(samples[name]) / base, 3)
            paired = [v / b for v, b in zip(samples[name], samples["none"], strict=True)]
            report[f"{figure}_ratio_{name}_paired_median"] = round(_median(paired), 3)
        report[f"{figure}_samples_us"] = {k: [round(v, 1) for v in vs] for k, vs in samples.items()}
    report["target"] = "read_step_ratio_otlp <= 1.10"
    for name, key in (("otlp", "target_met"), ("otlp_fast_encoder", "target_met_fast_encoder")):
        if name in conditions:
            report[key] = report[f"read_step_ratio_{name}"] <= 1.10
    return report


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the benchmark, print its JSON."""
    parser = argparse.ArgumentParser(prog="python -m agentledger_bench.observe_overhead")
    parser.add_argument("--db", help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    parser.add_argument(
        "--compare", action="store_true", help="also otlp with larger batches, and sampled"
    )
    parser.add_argument(
        "--freeze-heap",
        action="store_true",
        help="after the warm-up, collect and freeze the heap as `worker` and `serve` do",
    )
    parser.add_argument(
        "--only",
        default="",
        help="measure these conditions (comma-separated) beside `none`, and no other",
    )
    args = parser.parse_args(argv)
    only = tuple(name for name in args.only.split(",") if name)
    unknown = set(only) - set(CONDITIONS + COMPARE)
    if unknown:
        parser.error(f"unknown conditions: {', '.join(sorted(unknown))}")
    workdir = None
    url = args.db
    if not url:
        workdir = Path(tempfile.mkdtemp(prefix=".agentledger-observe-bench-"))
        url = f"sqlite:///{workdir / 'engine.db'}"
    try:
        report = asyncio.run(
            measure(
                url,
                args.reps,
                args.steps,
                args.scrape_every,
                args.compare or bool(set(only) & set(COMPARE)),
                args.freeze_heap,
                only,
            )
        )
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
