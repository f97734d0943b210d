"""A guard that makes any test connection to a non-loopback address fail.

Installed for the whole session by tests/conftest.py: no test may reach a real model
provider (or anything else off this machine). Unix sockets and loopback addresses
(127.0.0.0/8, ::1, ``localhost``) stay allowed: the store, PostgreSQL, the sandbox and
the fake providers all live there. Worker subprocesses are not covered (they get the
fake servers' URLs from their environment).
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


class ExternalNetworkBlocked(ConnectionError):
    """A test tried to reach a host that is not this machine."""


def is_local(host: Any) -> bool:
    """True for a loopback address or name (and for Unix socket paths)."""
    if isinstance(host, bytes | bytearray):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host in _LOCAL_NAMES or host == "":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _check(address: Any) -> None:
    if isinstance(address, str | bytes):  # AF_UNIX path
        return
    if isinstance(address, tuple) and address and is_local(address[0]):
        return
    raise ExternalNetworkBlocked(f"tests may not connect to {address!r} (not loopback)")


def install() -> None:
    """Patch socket connect and name resolution (idempotent)."""
    if getattr(socket.socket.connect, "_netguard", False):
        return
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family != getattr(socket, "AF_UNIX", None):
            _check(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        if self.family != getattr(socket, "AF_UNIX", None):
            _check(address)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not is_local(host):
            raise ExternalNetworkBlocked(f"tests may not resolve {host!r} (not loopback)")
        return real_getaddrinfo(host, *args, **kwargs)

    connect._netguard = True  # type: ignore[attr-defined]
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo
