"""Spans made after the fact, together: tool attempts and replayed steps.

A span that is never made current -- nothing the user's code starts can nest in it --
need not exist while its work runs. What it will say (name, parent context, attributes,
status, start and end times) is kept when the work ends, and the kept spans are made
one after the other through the provider's public ``Tracer.start_span`` with those
times, then ended with theirs: when ``BATCH`` are kept, when the run's execution ends
(:func:`agentledger.observe._tracing.run_span`), and at most ``FLUSH_AFTER`` seconds after
the first one was kept. Made back to back, the SDK's per-span work runs in a tight loop
instead of one span at a time between the engine's own work, which is most of what a
traced step costs (docs/benchmarks.md, tracing overhead).

Each span is what it would be if made inline: the same provider (the one configured
when its work started), parent, name, attributes, status and times, and the provider's
sampler, span limits and processors decide about it. Two things differ: a processor's
``on_start`` is called when the span is made, just before its ``on_end``, and the
sampler sees the attributes set at the end (the outcome) along with the others.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status

__all__ = ["BATCH", "FLUSH_AFTER", "SpanBatch"]

_log = logging.getLogger(__name__)

#: Spans kept before they are made: enough for the SDK's code to stay warm while it
#: makes them, few enough that holding them costs little.
BATCH = 64
#: The longest a kept span waits to be made (a run waiting on a long model call, a quiet
#: worker): well inside the batch processor's own export delay (5 s by default).
FLUSH_AFTER = 0.5

# tracer, name, parent context, attributes, start and end (ns since the epoch), status
_Kept = tuple[trace.Tracer, str, Context, dict[str, Any], int, int, Status | None]


class SpanBatch:
    """Spans kept until they are made together (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[_Kept] = []
        self._timed = False  # a flush is scheduled for what is kept
        self._at_exit = False
        os.register_at_fork(after_in_child=self._forget)

    def add(
        self,
        tracer: trace.Tracer,
        name: str,
        parent: Context,
        attributes: dict[str, Any],
        start: int,
        end: int,
        status: Status | None = None,
    ) -> None:
        """Keep one span, to be made with ``tracer`` as a child of ``parent``."""
        with self._lock:
            kept = self._kept
            kept.append((tracer, name, parent, attributes, start, end, status))
            full = len(kept) >= BATCH
            schedule = not full and not self._timed
            if schedule:
                self._timed = True
        if full:
            self.flush()
        elif schedule:
            self._schedule()

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to come back on: made now
            self.flush()
            return
        loop.call_later(FLUSH_AFTER, self.flush)
        if not self._at_exit:
            # Registered once spans are kept, so after the provider's own shutdown hook
            # and run before it: what is kept at exit reaches a provider still open.
            self._at_exit = True
            atexit.register(self.flush)

    def flush(self) -> None:
        """Make every kept span now."""
        with self._lock:
            kept, self._kept = self._kept, []
            self._timed = False
        for tracer, name, parent, attributes, start, end, status in kept:
            try:
                span = tracer.start_span(
                    name,
                    context=parent,
                    kind=SpanKind.INTERNAL,
                    attributes=attributes,
                    start_time=start,
                )
                if status is not None:
                    span.set_status(status)
                span.end(end_time=end)
            except Exception:  # a processor's failure loses its span, not the others
                _log.exception("could not make the span %r", name)

    def _forget(self) -> None:
        # A forked child must not make its parent's spans a second time.
        self._lock = threading.Lock()
        self._kept, self._timed = [], False
