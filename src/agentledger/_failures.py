"""Logging a failing dependency once, and saying when it works again.

A store that refuses writes (a full disk, a read-only database, a lost connection)
fails every write of every loop of a process, every period, until someone fixes it.
Logged at each failure, the one line that names the cause drowns in thousands of
copies; logged never, an operator cannot tell whether it is over. A
:class:`FailureLog` names each cause once at its level, repeats at DEBUG, and says at
INFO when the dependency worked again after failing. Every loop of a process that
meets the same store shares one (the worker's claim, heartbeat, seal and prune loops;
``serve``'s sealer), so a full disk is one ERROR line, not one per loop.
"""

from __future__ import annotations

import logging

__all__ = ["FailureLog", "cause_of"]


def cause_of(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name when it has none."""
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _key(cause: str) -> str:
    """What a store error says failed, without the statement's own words: "database
    is read-only: PostgreSQL at h/db (cannot execute UPDATE ...)" is one cause for
    every statement it refuses."""
    return cause.split(" (", 1)[0]


class FailureLog:
    """The causes a dependency is failing with, each logged once.

    ``subject`` names the dependency in the lines (``"store"``), ``level`` is the level
    of the first line of each cause."""

    def __init__(
        self, logger: logging.Logger, subject: str = "store", level: int = logging.ERROR
    ) -> None:
        self.log, self.subject, self.level = logger, subject, level
        self._causes: set[str] = set()
        self._failed: set[str] = set()  # what met a cause since it was last logged

    def failed(self, what: str, exc: BaseException) -> None:
        """``what`` (a loop, a run) met ``exc``: logged at the log's level the first
        time its cause is seen since the dependency last worked, else at DEBUG."""
        cause = cause_of(exc)
        self._failed.add(what)
        if _key(cause) in self._causes:
            self.log.debug("%s: %s; retrying", what, cause)
            return
        self._causes.add(_key(cause))
        self.log.log(self.level, "%s failing: %s (%s; retrying)", self.subject, cause, what)

    def knows(self, exc: BaseException) -> bool:
        """Whether ``exc``'s cause was logged already (a caller can then point to it)."""
        return _key(cause_of(exc)) in self._causes

    def recovered(self, what: str) -> None:
        """``what`` worked. If it had failed, the dependency works again: said once,
        and the causes are forgotten (the next failure is news). Only the loop that
        failed can tell: another one succeeding (a read while writes fail, a table
        that is not locked) proves nothing, and would make the log flap."""
        if what not in self._failed:
            return
        self._failed.clear()
        self._causes.clear()
        self.log.info("%s works again (%s)", self.subject, what)
