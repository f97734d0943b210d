"""Prometheus metrics: store gauges computed at scrape time, process histograms.

Two sources, one text:

- the **store** (the truth shared by every worker): runs by state, agent, version and
  tenant; queued runs and queue wait; tokens, cost and lease takeovers per agent; budget
  hits by kind; unknown outcomes by resolution; outbox backlog and dead letters; stuck
  runs. The same figures whichever process is scraped. A scrape reads the live part
  (unfinished runs, the queue, the backlog) and reuses the settled history (finished
  runs, audit counts) read at most :data:`REFRESH` seconds ago (:class:`StoreFigures`).
- this **process** (a worker): step duration histograms by tool, model call durations
  and token usage (``gen_ai.client.*``), stuck episodes it reported.

:func:`render_metrics` is what ``/metrics`` serves (the worker's ``--metrics-port`` and
the HTTP service alike).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentledger import _envsettings as envsettings
from agentledger.observe import _instruments as instruments
from agentledger.observe._queries import metrics as observe_metrics
from agentledger.observe._stuck import StuckPolicy
from agentledger.records import DeliveryStatus
from agentledger.store._sqlstore import Store

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


#: How often a process reads the store's settled history again (seconds), overridden by
#: ``$AGENTLEDGER_METRICS_REFRESH``; in between, scrapes read only the live part.
REFRESH: float = envsettings.default("metrics_refresh")
REFRESH_ENV = "AGENTLEDGER_METRICS_REFRESH"


def refresh_seconds() -> float:
    """``$AGENTLEDGER_METRICS_REFRESH`` or :data:`REFRESH`."""
    return envsettings.current().metrics_refresh


class StoreFigures:
    """One process's view of a store's figures, kept cheap at any volume.

    Each scrape reads the live part (unfinished runs, the queue, the outbox backlog:
    indexed, small at any volume). The settled history (finished runs, delivered
    outbox rows, audit counts) is read from the daily rollup and what is not folded
    yet, and the audit events by type: it is read again only when older than
    ``refresh`` seconds, in the background, so finished-run counts
    and the counters lag by about that much. A counter never goes backwards: a run whose tokens move
    from the live part to a settled part not yet read again is held at its last value.
    """

    def __init__(self, refresh: float | None = None) -> None:
        self.refresh = refresh_seconds() if refresh is None else refresh
        self.settled: dict[str, Any] | None = None
        self.read_at = -math.inf
        self.last: dict[tuple[str, tuple[str, ...]], float] = {}
        self._reading: asyncio.Task[None] | None = None

    async def read(self, store: Store) -> dict[str, Any]:
        """The figures now: the live part merged with the history read last.

        The first read (and every read with ``refresh`` 0) reads the history too; later
        ones start reading it again in the background once it is older than
        ``refresh``, so no scrape but a process's first waits for that scan."""
        if self.settled is None or self.refresh <= 0:
            data = await store.read(observe_metrics.snapshot, live=True, settled=True)
            self._keep(data)
        else:
            data = await store.read(observe_metrics.snapshot, live=True, settled=False)
            stale = time.monotonic() - self.read_at >= self.refresh
            if stale and (self._reading is None or self._reading.done()):
                self._reading = asyncio.create_task(self._read_settled(store))
        settled = self.settled
        assert settled is not None
        merged = {**data, **settled}
        merged["runs"] = [*data["live_runs"], *settled["settled_runs"]]
        merged["outbox"] = [*data["live_outbox"], *settled["settled_outbox"]]
        return merged

    def _keep(self, data: dict[str, Any]) -> None:
        self.settled = {k: data[k] for k in _SETTLED_KEYS}
        self.read_at = time.monotonic()

    async def _read_settled(self, store: Store) -> None:
        try:
            self._keep(await store.read(observe_metrics.snapshot, live=False, settled=True))
        except Exception as exc:  # the next stale scrape tries again
            log.warning("metrics: reading the store's history failed: %s", exc)

    def reported(self, name: str) -> list[tuple[str, ...]]:
        """The label values counter ``name`` was reported with (a counter, once shown,
        stays in the text)."""
        return [labels for (n, labels) in self.last if n == name]

    def counter(self, name: str, labels: tuple[str, ...], value: float) -> float:
        """``value``, or the last value reported for this counter when higher."""
        key = (name, labels)
        value = max(value, self.last.get(key, value))
        self.last[key] = value
        return value


_SETTLED_KEYS = (
    "settled_runs", "settled_outbox", "budget_hits", "unknown_resolutions", "unknown_seen",
)  # fmt: skip
_FIGURES: weakref.WeakKeyDictionary[Store, StoreFigures] = weakref.WeakKeyDictionary()


def figures_of(store: Store) -> StoreFigures:
    """This process's :class:`StoreFigures` of ``store`` (one per store object)."""
    found = _FIGURES.get(store)
    if found is None:
        found = _FIGURES[store] = StoreFigures()
    return found


class _Snapshot(Collector):
    """The store's figures as metric families (one scrape's worth)."""

    def __init__(self, data: dict[str, Any], stuck: list[Any], figures: StoreFigures) -> None:
        self.data, self.stuck, self.figures = data, stuck, figures

    def collect(self) -> Iterator[Metric]:
        data = self.data
        runs = GaugeMetricFamily(
            "agentledger_runs", "Runs by state, agent, version and tenant.",
            labels=("status", "agent", "version", "tenant"),
        )  # fmt: skip
        # ``usage``: "simulated" for runs a scripted (offline) model answered, whose
        # tokens and cost no provider counted or billed; "reported" for the others.
        tokens = CounterMetricFamily(
            "agentledger_run_tokens", "Tokens spent by runs, per agent.", labels=("agent", "usage")
        )
        cost = CounterMetricFamily(
            "agentledger_run_cost_usd",
            "Spend of runs in USD, per agent.",
            labels=("agent", "usage"),
        )
        takeovers = CounterMetricFamily(
            "agentledger_lease_takeovers",
            "Leases taken over from a worker that stopped renewing them, per agent.",
            labels=("agent",),
        )
        per_agent: dict[str, float] = {}
        spend: dict[tuple[str, str], list[float]] = {}
        for row in data["runs"]:
            runs.add_metric(
                [row["status"], row["name"], row["version"], row["tenant_id"]], float(row["n"])
            )
            usage = "simulated" if row.get("usage_simulated") else "reported"
            acc = spend.setdefault((row["name"], usage), [0.0, 0.0])
            acc[0] += float(row["tokens"] or 0)
            acc[1] += float(row["cost"] or 0)
            per_agent[row["name"]] = per_agent.get(row["name"], 0.0) + float(row["resumes"] or 0)
        up = self.figures.counter
        for labels in self.figures.reported("tokens"):  # its runs moved out of view
            if len(labels) == 2:
                spend.setdefault((labels[0], labels[1]), [0.0, 0.0])
        for (agent,) in self.figures.reported("takeovers"):
            per_agent.setdefault(agent, 0.0)
        for (agent, usage), (t, c) in sorted(spend.items()):
            tokens.add_metric([agent, usage], up("tokens", (agent, usage), t))
            cost.add_metric([agent, usage], up("cost", (agent, usage), c))
        for agent, r in sorted(per_agent.items()):
            takeovers.add_metric([agent], up("takeovers", (agent,), r))
        yield from (runs, tokens, cost, takeovers)
        queued = GaugeMetricFamily(
            "agentledger_queued_runs", "Runs due and waiting for a worker (autoscale on this).",
            labels=("agent", "version"),
        )  # fmt: skip
        wait = GaugeMetricFamily(
            "agentledger_queue_wait_seconds", "How long the oldest due run has waited.",
            labels=("agent", "version"),
        )  # fmt: skip
        for row in data["queued"]:
            queued.add_metric([row["name"], row["version"]], float(row["n"]))
            wait.add_metric([row["name"], row["version"]], max(0.0, float(row["wait"] or 0)))
        yield from (queued, wait)
        budget = CounterMetricFamily(
            "agentledger_budget_hits", "Runs handed over on a budget, by kind.", labels=("kind",)
        )
        for kind, n in sorted(data["budget_hits"].items()):
            budget.add_metric([kind], up("budget", (kind,), float(n)))
        yield budget
        unknown = CounterMetricFamily(
            "agentledger_unknown_outcomes",
            "Unknown outcomes settled, by resolution.",
            labels=("resolution",),
        )
        for res, n in sorted(data["unknown_resolutions"].items()):
            unknown.add_metric([res], up("unknown", (res,), float(n)))
        yield unknown
        yield CounterMetricFamily(
            "agentledger_unknown_outcomes_seen",
            "Writes whose outcome was unknown (timed out, or found in flight on resume).",
            value=up("unknown_seen", (), float(data["unknown_seen"])),
        )
        backlog = GaugeMetricFamily(
            "agentledger_outbox", "Outbox rows by status.", labels=("status",)
        )
        dead = 0.0
        oldest = 0.0
        for row in data["outbox"]:
            backlog.add_metric([row["status"]], float(row["n"]))
            if row["status"] == DeliveryStatus.DEAD:
                dead = float(row["n"])
            if row["status"] == DeliveryStatus.PENDING:
                oldest = max(0.0, float(row["age"] or 0))
        yield backlog
        yield GaugeMetricFamily("agentledger_outbox_dead_letters", "Dead letters.", value=dead)
        yield GaugeMetricFamily(
            "agentledger_outbox_oldest_pending_seconds",
            "Age of the oldest pending row.",
            value=oldest,
        )
        stuck = GaugeMetricFamily(
            "agentledger_stuck_runs", "Runs stuck now, by agent and reason.",
            labels=("agent", "reason"),
        )  # fmt: skip
        counts: dict[tuple[str, str], int] = {}
        for run in self.stuck:
            counts[(run.name, run.reason)] = counts.get((run.name, run.reason), 0) + 1
        for (agent, reason), n in sorted(counts.items()):
            stuck.add_metric([agent, reason], float(n))
        yield stuck


async def render_metrics(
    store: Store,
    policy: StuckPolicy | None = None,
    *,
    process: bool = True,
    figures: StoreFigures | None = None,
) -> str:
    """The Prometheus text of ``/metrics``: the store's figures now (and, with
    ``process``, this process's histograms). Mount this in the HTTP service.
    ``figures``: the cache of the store's history to use (default: this process's)."""
    policy = policy or StuckPolicy.from_env()
    figures = figures or figures_of(store)
    data = await figures.read(store)
    stuck = await policy.find(store)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(data, stuck, figures))
    text = generate_latest(registry).decode()
    if process:
        text += generate_latest(instruments.PROCESS).decode()
    return text


class _IPv6HTTPServer(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """``GET /metrics`` on a port, served from a thread; the figures are computed on the
    event loop that owns the store (the worker's)."""

    def __init__(self, store: Store, port: int, loop: asyncio.AbstractEventLoop,
                 host: str = "127.0.0.1", policy: StuckPolicy | None = None) -> None:  # fmt: skip
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                future = asyncio.run_coroutine_threadsafe(
                    render_metrics(outer.store, outer.policy), outer.loop
                )
                try:
                    body = future.result(timeout=30).encode()
                except Exception as exc:  # the store is unavailable: say so, do not die
                    self.send_error(503, str(exc).splitlines()[0][:200] if str(exc) else None)
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes are not worth a log line each

        self.store, self.loop, self.policy = store, loop, policy
        server_class = _IPv6HTTPServer if ":" in host else ThreadingHTTPServer
        self.server = server_class((host, port), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="agentledger-metrics", daemon=True
        )

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_metrics(store: Store, port: int | None, host: str = "127.0.0.1") -> MetricsServer | None:
    """Serve ``/metrics`` on ``host``:``port`` from the running event loop (None: not
    served); loopback by default, as ``serve`` is. Prints the address to stderr so that
    ``--metrics-port 0`` can be found."""
    if port is None:
        return None
    server = MetricsServer(store, port, asyncio.get_running_loop(), host=host).start()
    import sys

    shown = f"[{host}]" if ":" in host else host
    print(f"metrics on http://{shown}:{server.port}/metrics", file=sys.stderr, flush=True)
    return server
