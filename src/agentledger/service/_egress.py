"""Where webhooks may go: never inside the deployment's network unless allowed.

A webhook URL is given by whoever holds an operator key, and the service POSTs signed
run results to it, so an unchecked URL turns the service into a client of its own
network (metadata services, databases, admin ports on loopback). :class:`Egress` holds
the rule: a target whose address is loopback, link-local, private, shared (CGNAT),
multicast, unspecified or reserved -- anything not globally routable -- is refused,
unless the operator allows that host (``AGENTLEDGER_WEBHOOK_ALLOW_HOSTS`` /
``serve --webhook-allow-host``: host names, matched exactly, or addresses and networks,
matched against the resolved address).

The rule is applied twice (docs/architecture.md, "The HTTP service"):

* at submit (:meth:`Egress.check`): the URL's host, resolved, must be allowed; the
  caller answers 422;
* at delivery (:meth:`Egress.pin`): the host is resolved again, the first allowed
  address is chosen, and the request is sent to that address (the URL's host goes in
  the ``Host`` header and as the TLS server name), so a name rebound to an inside
  address between the check and the connection cannot redirect the POST.

Name resolution is the OS resolver's, after the fixed answers of ``hosts`` (like a
hosts file: ``AGENTLEDGER_WEBHOOK_HOSTS`` / ``ServiceSettings.webhook_hosts``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import re
import socket
from collections import ChainMap
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentledger import _envsettings as envsettings
from agentledger.errors import UsageError

if TYPE_CHECKING:  # httpx is loaded with the first delivery (a worker may never make one)
    import httpx

ALLOW_ENV = "AGENTLEDGER_WEBHOOK_ALLOW_HOSTS"
HOSTS_ENV = "AGENTLEDGER_WEBHOOK_HOSTS"

#: How long one webhook host's name may take to resolve. A name that takes longer is
#: treated as not resolving yet (a submit passes it; a delivery is retried later).
RESOLVE_SECONDS = 3.0

# Webhook names resolve on threads of their own: the loop's default executor also runs
# the store's blocking calls, and a tenant's slow-resolving names must not hold them.
_RESOLVER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-dns")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Refused(Exception):
    """The target is not allowed; the message says why and how to allow it."""


class Unresolved(Exception):
    """The host name did not resolve (a transient failure at delivery)."""


_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_][a-z0-9_-]{0,62}(\.[a-z0-9_][a-z0-9_-]{0,62})*$")
_NUMERIC = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)


def _address(text: str) -> Address | None:
    """The address ``text`` names literally, in any form the resolver would read as one
    (``127.1``, ``2130706433``, ``0x7f.0.0.1`` are 127.0.0.1); None for a name."""
    try:
        ip = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        if not _NUMERIC.match(text):
            return None
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    # ::ffff:a.b.c.d is a.b.c.d on the wire: judge the IPv4 address.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _allow_item(item: str, source: str) -> str | Network | None:
    """One allow-list entry: a host name (lowercase, no trailing dot), an address or
    network, or None for a blank. Anything else would be kept as a name no URL ever
    matches (a wildcard, a mask on a name) or as a network wider than written (host bits
    under the mask), so it is refused: :class:`UsageError` naming ``source``."""
    item = item.strip().lower()
    if not item:
        return None
    bare = item.strip("[]")
    try:
        return ipaddress.ip_network(bare)
    except ValueError:
        pass
    try:
        wide = ipaddress.ip_network(bare, strict=False)
    except ValueError:
        if _NAME.match(item.rstrip(".")):
            return item.rstrip(".")
        raise UsageError(
            f"{source}: {item!r} is not a host name, address or network; give e.g. "
            "hooks.internal, 10.0.0.7 or 10.2.0.0/16 (names match exactly, no wildcards)"
        ) from None
    raise UsageError(
        f"{source}: {item!r} has bits set past its mask; give the network {wide} or the "
        f"address {bare.split('/')[0]}"
    )


def _inside(ip: Address) -> str | None:
    """Why ``ip`` is inside the network (None: globally routable)."""
    if isinstance(ip, ipaddress.IPv6Address):
        # 6to4 (2002::/16) and Teredo (its client part) carry an IPv4 address that a
        # relay forwards to: 2002:7f00:1:: is 127.0.0.1 at the relay. Judge that too.
        embedded = [ip.sixtofour, ip.teredo[1] if ip.teredo else None]
        for v4 in (a for a in embedded if a is not None):
            why = _inside(v4)
            if why is not None:
                return f"{why} ({v4} embedded)"
    for kind in ("loopback", "link_local", "multicast", "unspecified", "private", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if ip.is_global else "not globally routable"


@dataclass(frozen=True)
class Pinned:
    """One delivery's connection target: ``url`` names the address; ``headers`` and
    ``extensions`` carry the URL's own host for the receiver and for TLS."""

    url: httpx.URL
    headers: dict[str, str]
    extensions: dict[str, Any]


@dataclass(frozen=True)
class Egress:
    """The webhook target rule of one process (see the module docstring)."""

    allow: tuple[str, ...] = ()
    hosts: Mapping[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names, networks = set(), []
        for item in self.allow:
            parsed = _allow_item(item, f"{ALLOW_ENV} / --webhook-allow-host")
            if isinstance(parsed, str):
                names.add(parsed)
            elif parsed is not None:
                networks.append(parsed)
        object.__setattr__(self, "_names", frozenset(names))
        object.__setattr__(self, "_networks", tuple(networks))

    @classmethod
    def from_env(
        cls, allow: Iterable[str] = (), hosts: dict[str, list[str]] | None = None
    ) -> Egress:
        """``allow`` and ``hosts`` plus what ``AGENTLEDGER_WEBHOOK_ALLOW_HOSTS`` (comma or
        space separated) and ``AGENTLEDGER_WEBHOOK_HOSTS`` (``name=address,...``) add.

        Raises :class:`UsageError` naming the variable when a value is malformed."""
        env = envsettings.current()
        listed = env.webhook_allow_hosts
        # Each entry is checked against its own source, so the error names it.
        for item in allow:
            _allow_item(item, "--webhook-allow-host")
        for item in listed:
            _allow_item(item, ALLOW_ENV)
        table: dict[str, list[str]] = {}
        for item in env.webhook_hosts:
            name, sep, addr = item.partition("=")
            if not sep or not name or _address(addr) is None:
                raise UsageError(
                    f"{HOSTS_ENV}: {item!r}: give name=address, e.g. hooks.internal=10.0.0.7"
                )
            table.setdefault(name.lower(), []).append(addr)
        # A view, not a copy: the given table's later changes are seen (and win).
        given: dict[str, list[str]] = hosts if hosts is not None else {}
        return cls((*allow, *listed), ChainMap(given, table))

    def _allowed(self, host: str, ip: Address) -> bool:
        return host in self._names or any(ip in n for n in self._networks)  # type: ignore[attr-defined]

    async def _resolve(self, host: str, port: int) -> list[Address]:
        literal = _address(host)
        if literal is not None:
            return [literal]
        fixed = self.hosts.get(host)
        if fixed:
            return [a for a in map(_address, fixed) if a is not None]
        lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(_RESOLVER, lookup), RESOLVE_SECONDS
            )
        except TimeoutError:
            raise Unresolved(f"{host} did not resolve within {RESOLVE_SECONDS:g} s") from None
        except (OSError, UnicodeError) as exc:
            raise Unresolved(f"{host} does not resolve: {exc}") from None
        found = [_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        return list(dict.fromkeys(a for a in found if a is not None))

    async def choose(self, url: str | httpx.URL) -> tuple[httpx.URL, Address]:
        """The parsed URL and the address to connect to: the first resolved address
        that is outside the network or allowed. Raises :class:`Refused` when none is,
        :class:`Unresolved` when the name does not resolve."""
        import httpx

        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise Refused(f"{url!r} is not a URL: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise Refused(f"{url!r}: give an http or https URL with a host")
        host = parsed.host.rstrip(".")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        addresses = await self._resolve(host, port)
        if not addresses:
            raise Unresolved(f"{host} resolves to no address")
        reasons = []
        for ip in addresses:
            why = _inside(ip)
            if why is None or self._allowed(host, ip):
                return parsed, ip
            reasons.append(f"{ip} is {why}")
        raise Refused(
            f"webhook host {host} is inside the network ({', '.join(reasons)}); an operator "
            f"allows it with {ALLOW_ENV} or `serve --webhook-allow-host`"
        )

    async def check(self, url: str) -> None:
        """Raise :class:`Refused` when ``url`` may not be a webhook target now. A name
        that does not resolve yet passes: delivery checks again."""
        with contextlib.suppress(Unresolved):
            await self.choose(url)

    async def pin(self, url: str) -> Pinned:
        """The request target for a delivery to ``url``: its chosen address, with the
        URL's host as ``Host`` and as the TLS server name (certificates are checked
        against it)."""
        parsed, ip = await self.choose(url)
        host = parsed.host
        netloc = parsed.netloc.decode("ascii").rpartition("@")[2]
        headers, extensions = {"Host": netloc}, {}
        if parsed.scheme == "https" and _address(host) is None:
            extensions["sni_hostname"] = host
            # The client pools connections by address: a kept-alive connection whose
            # certificate was checked for one name must not carry another name's POST.
            headers["Connection"] = "close"
        return Pinned(parsed.copy_with(host=str(ip)), headers, extensions)
