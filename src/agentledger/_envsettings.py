"""Every ``AGENTLEDGER_*`` environment variable, in one settings model.

:class:`EnvSettings` names each variable (its field, upper-cased, after
``AGENTLEDGER_``), its type, its default and what it does; :func:`current` reads the
environment as it is now, so a variable set after import (a test, a parent process
building a child's environment) is seen. An invalid value raises :class:`UsageError`
in one line naming the variable, what it accepts and how to get the default.

The README's table of variables is rendered from the model (:func:`render_table`;
``make env-table`` writes it into the README), and a test fails when they differ.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any, get_args, get_origin

from pydantic import BeforeValidator, Field, SecretStr, ValidationError, ValidationInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agentledger.errors import UsageError

PREFIX = "AGENTLEDGER_"

__all__ = [
    "PREFIX",
    "EnvSettings",
    "current",
    "default",
    "env_name",
    "render_table",
    "with_table",
]


def env_name(field: str) -> str:
    """The environment variable of a field: ``outbox_base_delay`` ->
    ``AGENTLEDGER_OUTBOX_BASE_DELAY``."""
    return PREFIX + field.upper()


class _Invalid(ValueError):
    """A value a field refuses; its message is the whole one-line error."""


def _default_of(info: ValidationInfo) -> Any:
    assert info.field_name is not None
    return EnvSettings.model_fields[info.field_name].default


def _seconds(
    minimum: float = 0.0, maximum: float = math.inf, *, above_minimum: bool = False
) -> Callable[[Any, ValidationInfo], Any]:
    """A finite number of seconds within the bounds (NaN, infinity and words refused)."""

    def parse(raw: Any, info: ValidationInfo) -> Any:
        if not isinstance(raw, str):
            return raw  # a value given in Python, not from the environment
        text = raw.strip()
        if not text:
            return _default_of(info)
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        low_ok = value > minimum if above_minimum else value >= minimum
        if math.isfinite(value) and low_ok and value <= maximum:
            return value
        if math.isinf(maximum):
            wanted = f"more than {minimum:g}" if above_minimum else f"{minimum:g} or more"
        else:
            wanted = f"from {minimum:g} to {maximum:g}"
        default = _default_of(info)
        shown = "none" if default is None else f"{default:g}"
        raise _Invalid(
            f"{env_name(str(info.field_name))} must be a number of seconds {wanted} "
            f"(got {raw!r}); unset it for the default ({shown})"
        )

    return parse


def _count(raw: Any, info: ValidationInfo) -> Any:
    """A whole number, 1 or more."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if not text:
        return _default_of(info)
    if text.isdigit() and int(text) >= 1:
        return int(text)
    default = _default_of(info)
    raise _Invalid(
        f"{env_name(str(info.field_name))} must be a whole number, 1 or more (got {raw!r}); "
        f"unset it for the default ({'none' if default is None else default})"
    )


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(raw: Any, info: ValidationInfo) -> Any:
    """On or off: 1/true/yes/on or 0/false/no/off (any case)."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip().lower()
    if not text:
        return _default_of(info)
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise _Invalid(
        f"{env_name(str(info.field_name))} must be 1, true, yes or on, or 0, false, no or "
        f"off (got {raw!r}); unset it for the default "
        f"({'on' if _default_of(info) else 'off'})"
    )


def _words(raw: Any, info: ValidationInfo) -> Any:
    """Items separated by commas or spaces."""
    if not isinstance(raw, str):
        return raw
    return tuple(raw.replace(",", " ").split())


def _text(raw: Any, info: ValidationInfo) -> Any:
    """Text, surrounding spaces dropped."""
    return raw.strip() if isinstance(raw, str) else raw


def _choice(*choices: str) -> Callable[[Any, ValidationInfo], Any]:
    """One of ``choices`` (any case)."""

    def parse(raw: Any, info: ValidationInfo) -> Any:
        if not isinstance(raw, str):
            return raw
        text = raw.strip().lower()
        if not text:
            return _default_of(info)
        if text not in choices:
            raise _Invalid(
                f"{env_name(str(info.field_name))} must be {' or '.join(choices)} "
                f"(got {raw!r}); unset it for the default ({_default_of(info)})"
            )
        return text

    return parse


Seconds = Annotated[float, BeforeValidator(_seconds())]
Flag = Annotated[bool, BeforeValidator(_flag)]
Text = Annotated[str, BeforeValidator(_text)]
# NoDecode: a list is words, not the JSON pydantic-settings expects by default.
Words = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_words)]


class EnvSettings(BaseSettings):
    """The process's settings from ``AGENTLEDGER_*`` environment variables.

    Unset or empty: the default. Secrets are :class:`~pydantic.SecretStr` so they
    never show in a repr or a log line. A value the model accepts may still be
    refused where it is used (a pepper shorter than 16 characters by the commands
    that need one, an audit key by :mod:`agentledger._auditkey`), with a message
    naming the variable there too.
    """

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        case_sensitive=False,
        env_ignore_empty=True,
        extra="ignore",
        frozen=True,
    )

    # The commands.
    db: Text = Field(
        default="sqlite:///agentledger.db",
        description="Database of every command without `--db`: `sqlite:///file.db` or "
        "`postgresql://user@host/db`.",
    )
    app: Text = Field(
        default="",
        description="App of the commands that take `--app`: `module:attribute` or "
        "`path/to/file.py:attribute`.",
    )
    debug: Flag = Field(default=False, description="Commands print a traceback with their error.")
    demo_keep: Flag = Field(
        default=False,
        description="`agentledger demo` keeps its temporary database and prints its path.",
    )
    chaos_effects: Text = Field(
        default="",
        description="File `agentledger chaos` sets in its workers: "
        "`agentledger.testing.chaos_effect` appends each side effect to it (unset: the hook "
        "does nothing).",
    )
    pg_bindir: Text = Field(
        default="",
        description="PostgreSQL's `bin` folder for `agentledger chaos --pg-private` (unset: "
        "the newest installed, else `initdb` on the `PATH`).",
    )
    # The service and the audit chain.
    key_pepper: SecretStr = Field(
        default=SecretStr(""),
        description="Secret that API keys are HMACed under, 16 characters or more: the same "
        "for `agentledger keys` and every `serve`.",
    )
    audit_key: SecretStr = Field(
        default=SecretStr(""),
        description="Secret audit seals are signed with, 32 characters or more (unset: "
        "unsigned seals); the same for every sealer and `audit verify`.",
    )
    audit_seal_every: Annotated[
        float, BeforeValidator(_seconds(0.01, 3600)), Field(ge=0.01, le=3600)
    ] = Field(default=1.0, description="Seconds between audit seals (0.01 to 3600).")
    console_session_idle: Annotated[
        float, BeforeValidator(_seconds(60, 86400)), Field(ge=60, le=86400)
    ] = Field(
        default=1800.0,
        description="Seconds a console session lasts without a request from its browser "
        "(60 to 86400; an open live page does not count).",
    )
    console_session_lifetime: Annotated[
        float, BeforeValidator(_seconds(60, 604800)), Field(ge=60, le=604800)
    ] = Field(
        default=28800.0,
        description="Seconds a console session lasts at most, however active (60 to 604800; "
        "never past its key's expiry).",
    )
    webhook_backoff: Annotated[
        float, BeforeValidator(_seconds(0.01, 3600)), Field(ge=0.01, le=3600)
    ] = Field(
        default=2.0,
        description="Seconds before a worker's first webhook retry, doubling (0.01 to 3600; "
        "`serve` has its own setting).",
    )
    webhook_allow_hosts: Words = Field(
        default=(),
        description="Webhook targets inside the network that are allowed: host names, "
        "addresses or networks, separated by commas or spaces.",
    )
    webhook_hosts: Words = Field(
        default=(),
        description="Fixed addresses of webhook hosts, consulted before DNS: "
        "`name=address` entries separated by commas or spaces.",
    )
    # The workers.
    outbox_base_delay: Annotated[float, BeforeValidator(_seconds(above_minimum=True))] = Field(
        default=1.0, gt=0, description="Seconds before an outbox delivery's first retry, doubling."
    )
    stuck_after: Annotated[float, BeforeValidator(_seconds(above_minimum=True))] = Field(
        default=900.0,
        gt=0,
        description="Seconds without progress after which a run counts as stuck.",
    )
    stuck_takeovers: Annotated[int, BeforeValidator(_count)] = Field(
        default=3,
        ge=1,
        description="Lease takeovers after which a run counts as stuck (a crash loop).",
    )
    stuck_check: Annotated[float | None, BeforeValidator(_seconds(above_minimum=True))] = Field(
        default=None,
        description="Seconds between a worker's looks for stuck runs (unset: 60 or a third "
        "of `AGENTLEDGER_STUCK_AFTER`, whichever is less).",
    )
    metrics_refresh: Seconds = Field(
        default=60.0,
        ge=0,
        description="Seconds a scrape's figures from the database are reused for "
        "(0: read on every scrape).",
    )
    otlp_encoder: Annotated[str, BeforeValidator(_choice("official", "fast"))] = Field(
        default="official",
        description="Encoder of `configure_otlp()`'s spans: `official` (the OpenTelemetry "
        "exporter's) or `fast` (the same bytes with less CPU, on the SDK versions it is "
        "tested with; elsewhere `official`, with a warning).",
    )
    # Models.
    model: Text = Field(
        default="",
        description="Model of every agent in this process, e.g. `openai:gpt-4.1-mini` or "
        "`openai:gpt-4.1-mini -> anthropic:claude-sonnet-4-5`.",
    )
    model_max_tokens: Annotated[int | None, BeforeValidator(_count)] = Field(
        default=None,
        description="Most output tokens of a model named by a string (unset: 1024).",
    )
    model_timeout: Annotated[float | None, BeforeValidator(_seconds(above_minimum=True))] = Field(
        default=None,
        description="Seconds a call to a model named by a string may take (unset: 60).",
    )
    model_stream: Flag = Field(
        default=False, description="Models named by a string stream their answers."
    )
    model_prices: Text = Field(
        default="",
        description="Prices overriding `genai-prices`: a JSON object keyed by model, or the "
        "path of a JSON file.",
    )
    embeddings: Flag = Field(
        default=True,
        description="Documents and memory get vectors when the `embeddings` extra is "
        "installed (off: full-text search only).",
    )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> EnvSettings:
        """The settings an environment other than this process's gives (empty values
        are unset, as in :func:`current`)."""
        given = {}
        for name in cls.model_fields:
            value = environ.get(env_name(name), "")
            if value:
                given[name] = value
        return _checked(lambda: cls.model_validate(given))


def _checked(build: Callable[[], EnvSettings]) -> EnvSettings:
    try:
        return build()
    except ValidationError as exc:
        raise UsageError(_one_line(exc)) from None


def _one_line(exc: ValidationError) -> str:
    error = exc.errors()[0]
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, _Invalid):
        return str(cause)
    field = str(error["loc"][0]) if error["loc"] else ""
    value = error.get("input")
    return (
        f"{env_name(field)}: {error['msg']} (got {value!r}); unset it for the default "
        f"({EnvSettings.model_fields[field].default})"
    )


def default(field: str) -> Any:
    """A field's default: what its variable gives when unset."""
    return EnvSettings.model_fields[field].default


def current() -> EnvSettings:
    """The settings of this process's environment as it is now.

    Cheap enough for every use: the variables are looked up on each call and the model
    is built again only when one of them changed.
    """
    return _built(tuple(os.environ.get(name) for name in _NAMES))


@functools.lru_cache(maxsize=8)
def _built(values: tuple[str | None, ...]) -> EnvSettings:
    # ``values`` is only the cache key: the model reads the environment itself.
    return _checked(lambda: EnvSettings())


_NAMES = tuple(env_name(name) for name in EnvSettings.model_fields)

TABLE_START = "<!-- environment variables: rendered from agentledger._envsettings -->"
TABLE_END = "<!-- end of environment variables -->"


def render_table() -> str:
    """The README's table of environment variables, as Markdown."""
    lines = ["| variable | type | default | what it does |", "| --- | --- | --- | --- |"]
    for name, field in EnvSettings.model_fields.items():
        lines.append(
            f"| `{env_name(name)}` | {_type_name(name)} | {_default_text(field.default)} "
            f"| {field.description} |"
        )
    return "\n".join(lines) + "\n"


def _type_name(name: str) -> str:
    annotation = EnvSettings.model_fields[name].annotation
    shown = {bool: "on/off", int: "count", float: "seconds", str: "text", SecretStr: "secret"}
    if get_origin(annotation) is tuple:
        return "list"
    for kind in get_args(annotation) or (annotation,):
        if kind in shown:
            return shown[kind]
    raise AssertionError(f"no table type for {name}: {annotation}")


def _default_text(default: Any) -> str:
    if default is None or default == () or default == "" or default == SecretStr(""):
        return "(unset)"
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, float):
        return f"`{default:g}`"
    return f"`{default}`"


def with_table(text: str) -> str:
    """``text`` (the README) with its table of variables rendered anew between the
    markers: ``make env-table`` writes it."""
    head, start, rest = text.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"no {TABLE_START!r} ... {TABLE_END!r} block")
    return f"{head}{TABLE_START}\n{render_table()}{TABLE_END}{tail}"
