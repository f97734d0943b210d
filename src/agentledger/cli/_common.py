"""Shared CLI plumbing: the database option, async entry, clean one-line errors."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
from collections.abc import Awaitable, Callable, Coroutine
from functools import wraps
from typing import Any, TypeVar

import click

from agentledger._canonical import MAX_DEPTH, NotJournalable, journal_value
from agentledger.cli._guard import fail as fail  # the commands' one-line exit, re-exported
from agentledger.cli._text import json_safe
from agentledger.errors import UsageError
from agentledger.store import DEFAULT_URL, Store, open_store
from agentledger.store._sqlite import sqlite_path

T = TypeVar("T")


def _check_db_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value and "://" not in value:
        raise click.BadParameter(
            f"{value!r} is not a database URL; use sqlite:///{value} (a file) or "
            "postgresql://user@host/db"
        )
    return value


db_option = click.option(
    "--db",
    "db",
    envvar="AGENTLEDGER_DB",
    default=DEFAULT_URL,
    show_default=True,
    callback=_check_db_url,
    help="Database URL: sqlite:///file.db or postgresql://user@host/db (env AGENTLEDGER_DB).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def run_async(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async click command on a fresh event loop."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def with_store(
    url: str,
    fn: Callable[[Store], Awaitable[T]],
    *,
    create: bool = False,
    read_only: bool = False,
) -> T:
    """Open the store at ``url``, call ``fn`` with it, close it.

    Only commands that write runs or the schema pass ``create``: a read or a decision
    on a SQLite file that does not exist (a typo in --db) says so instead of creating it.
    Commands that only read pass ``read_only``: they can read a file they may not write.
    """
    if not create and url.startswith("sqlite:"):
        path = sqlite_path(url)[0]
        if path != ":memory:" and not os.path.exists(path):
            raise UsageError(
                f"no database at {path}; check --db, or create it with "
                f"`agentledger migrate --db {url}` (a worker or submit also creates it)"
            )
    store = open_store(url)
    # Only the commands that pass create (`worker`, `submit`, `migrate`, `keys create`,
    # `docs add`) create a schema: anything else on a database
    # without one (a server's `postgres` database, a typo) says so and changes nothing.
    await store.open(migrate=create, read_only=read_only)
    try:
        return await fn(store)
    finally:
        await store.close()


def check_port_free(
    host: str, port: int, option: str = "--port", host_option: str = "--host"
) -> None:
    """Refuse, in one line, an address this process cannot listen on (another process
    listens there, the address is not this host's), before anything starts: `sandbox`,
    `serve` and `worker --metrics-port` all call this first, so none of them starts a
    server, opens a database or prints a traceback for it. Port 0 (any free port) is
    bound too: the host is what can be wrong then."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"cannot listen on {host!r}: {exc}; check {host_option}") from None
    with socket.socket(family, kind, proto) as sock:
        # As the servers do: a port left in TIME_WAIT by a previous run is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"port {port} on {host} is in use; stop what listens there or pick "
                    f"another with {option}"
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UsageError(
                    f"cannot listen on {host}: it is not an address of this host; "
                    f"check {host_option}"
                ) from None
            raise UsageError(
                f"cannot listen on {host}:{port}: {exc.strerror}; pick another with {option}"
            ) from None


def print_json(value: Any) -> None:
    """Valid JSON whatever the rows hold (non-finite numbers become strings)."""
    click.echo(json.dumps(json_safe(value), indent=2, default=str, allow_nan=False))


class _NotJSONConstant(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJSONConstant(name)


def parse_json_input(text: str, option: str = "--input") -> Any:
    """The run input: strict JSON (no NaN/Infinity) that the journal can carry exactly."""
    check_text(text, option, limit=None)
    example = """example: --input '{"guest_id": "g-1"}'"""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise click.UsageError(
            f"{option} is not valid JSON ({exc.msg} at column {exc.colno}); {example}"
        ) from None
    except _NotJSONConstant as exc:
        raise click.UsageError(
            f"{option} contains {exc}, which JSON does not allow; use null or a string"
        ) from None
    except RecursionError:
        raise click.UsageError(
            f"{option} is nested too deeply (at most {MAX_DEPTH} levels)"
        ) from None
    try:
        return journal_value(value)
    except NotJournalable as exc:
        raise click.UsageError(f"{option}: {exc}") from None


def check_text(value: str | None, option: str, limit: int | None = 200) -> None:
    """Refuse text that is not valid UTF-8 (undecodable bytes in argv) or that holds
    control characters (identifiers only: ``limit`` set) before anything is written."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise click.UsageError(
            f"{option} is not valid UTF-8; check the terminal's or the script's encoding"
        ) from None
    if limit is None:
        return
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        raise click.UsageError(f"{option} must not contain control characters")
    if len(value) > limit:
        raise click.UsageError(f"{option} is longer than {limit} characters")
