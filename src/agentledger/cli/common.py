"""Shared CLI plumbing: the database option, async entry, clean one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from functools import wraps
from typing import Any, TypeVar

import click

from agentledger.errors import AgentLedgerError
from agentledger.store import DEFAULT_URL, SQLStore, open_store

T = TypeVar("T")

db_option = click.option(
    "--db",
    "db",
    envvar="AGENTLEDGER_DB",
    default=DEFAULT_URL,
    show_default=True,
    help="Database URL: sqlite:///file.db or postgresql://user@host/db (env AGENTLEDGER_DB).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def run_async(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async click command on a fresh event loop."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def with_store(url: str, fn: Callable[[SQLStore], Awaitable[T]]) -> T:
    store = open_store(url)
    await store.open()
    try:
        return await fn(store)
    finally:
        await store.close()


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def parse_json_input(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.UsageError(
            f"--input is not valid JSON ({exc.msg} at column {exc.colno}); "
            """example: --input '{"guest_id": "g-1"}'"""
        ) from None


def debug_enabled() -> bool:
    return os.environ.get("AGENTLEDGER_DEBUG", "") not in ("", "0")


def fail(message: str, code: int = 2) -> None:
    click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(code)


def guarded(main: Callable[[], Any]) -> Callable[[], Any]:
    """Turn known errors into one line on stderr and a non-zero exit."""

    @wraps(main)
    def wrapper() -> Any:
        try:
            return main()
        except AgentLedgerError as exc:
            if debug_enabled():
                raise
            fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper
