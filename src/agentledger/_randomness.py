"""Random hex for ids and tokens, drawn from the OS a page at a time.

``secrets.token_hex`` makes one ``getrandom`` system call per id, and CPython releases
the GIL around it. ``serve`` draws several ids per accepted run on the event loop's
thread, and each release lets the store's writer thread take the GIL: the event loop
then waits until that thread gives it back (up to the interpreter's switch interval),
which under load shows in every request's latency. Here the bytes come from one
``os.urandom`` of a page, handed out in slices: the same source and quality as
``secrets`` (never the ``random`` module), one system call per few hundred ids.

A forked child drops the parent's unread bytes: parent and child must never hand out
the same ones.
"""

from __future__ import annotations

import os
import threading

__all__ = ["random_hex"]

_PAGE = 4096
_lock = threading.Lock()
_buffer = b""
_offset = 0


def _drop_after_fork() -> None:
    global _buffer, _offset, _lock
    _lock = threading.Lock()  # a thread of the parent may have held it at the fork
    _buffer, _offset = b"", 0


os.register_at_fork(after_in_child=_drop_after_fork)


def random_hex(nbytes: int) -> str:
    """``nbytes`` random bytes from the OS's cryptographic source, as ``2 * nbytes`` hex
    digits (as ``secrets.token_hex(nbytes)``)."""
    global _buffer, _offset
    if nbytes > _PAGE // 4:
        return os.urandom(nbytes).hex()
    with _lock:
        start = _offset
        end = start + nbytes
        if end > len(_buffer):
            _buffer = os.urandom(_PAGE)
            start, end = 0, nbytes
        _offset = end
        return _buffer[start:end].hex()
