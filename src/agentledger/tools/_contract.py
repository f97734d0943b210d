"""Tool contracts: what a tool changes and how the runtime must call it.

    @tool(effect="money", timeout=10, idempotency="provider",
          status_check=payment_status, server_args={"amount": price_of_booking})
    async def create_payment(ctx: ToolContext, booking_id: str, amount: int = 0) -> dict:
        ...

The argument schema comes from the type hints (validated with pydantic); the
JSON schema a model sees leaves out the server-computed arguments, and any value
the model passes for one is dropped and recorded.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from agentledger.errors import InvalidArguments, UsageError
from agentledger.models._base import ToolSchema
from agentledger.tools._context import ToolContext
from agentledger.tools._status import Status


class EffectKind(StrEnum):
    """What a tool changes: anything but ``read`` is a write."""

    READ = "read"
    WRITE = "write"
    MONEY = "money"
    NOTIFY = "notify"


class Idempotency(StrEnum):
    """What keeps a write from applying twice."""

    NONE = "none"
    PROVIDER = "provider"  # the provider dedupes the step's key
    EFFECTS = "effects"  # the effects table guards the call


class Delivery(StrEnum):
    """When a tool is called: in its step, or later by the outbox."""

    DIRECT = "direct"
    OUTBOX = "outbox"


E = TypeVar("E", bound=StrEnum)


def _member(kind: type[E], value: str, tool: str, option: str) -> E:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise UsageError(f"tool {tool}: {option}={value!r}; give one of {allowed}") from None


ToolFn = Callable[..., Awaitable[Any]]
StatusCheck = Callable[[ToolContext, dict[str, Any]], Awaitable[Status]]
ServerArg = Callable[[ToolContext, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries by failure class (docs/architecture.md, "Retry by failure class")."""

    rate_limited: int = 3
    provider_error: int = 2  # for a write: same-key resends after an unknown 5xx
    timeout: int = 1  # reads only; a write's timeout is an unknown outcome
    in_progress: int = 5  # waits for "409 request in progress" before handing over
    base_delay: float = 0.2
    max_delay: float = 30.0
    #: The longest Retry-After honoured (seconds). A longer (or infinite) one is the
    #: rate-limit class's failure: no further retry, rather than a run parked for years.
    max_retry_after: float = 300.0


@dataclass(frozen=True)
class Compensation:
    """How to undo a tool's effect: another tool, with arguments built from the result."""

    tool: str
    arguments: Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass
class Tool:
    """A callable with a contract. Build with :func:`tool`."""

    name: str
    fn: ToolFn
    description: str
    effect: EffectKind | str = EffectKind.READ
    timeout: float = 10.0
    idempotency: Idempotency | str = Idempotency.NONE
    status_check: StatusCheck | None = None
    compensation: Compensation | None = None
    approval: str | None = None
    server_args: dict[str, ServerArg] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    delivery: Delivery | str = Delivery.DIRECT
    outbox_attempts: int = 5
    outbox_key: Callable[[dict[str, Any], ToolContext], str] | None = None
    effect_key: Callable[[dict[str, Any], ToolContext], str] | None = None
    args_model: type[BaseModel] = field(init=False)
    _schema: ToolSchema | None = field(default=None, init=False, repr=False)
    # The arguments model's own validator and serializer (what model_validate and
    # model_dump call), taken once: each lookup on a model class goes through its
    # metaclass.
    _validate: Callable[[Any], BaseModel] = field(init=False, repr=False, compare=False)
    _dump: Callable[[BaseModel], dict[str, Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.effect = _member(EffectKind, self.effect, self.name, "effect")
        self.idempotency = _member(Idempotency, self.idempotency, self.name, "idempotency")
        self.delivery = _member(Delivery, self.delivery, self.name, "delivery")
        if self.effect != "read" and self.idempotency == "none":
            # A write with no declared guard is guarded by the effects table.
            self.idempotency = Idempotency.EFFECTS
        if self.effect_key is not None and self.idempotency != "effects":
            raise UsageError(
                f"tool {self.name}: effect_key needs idempotency='effects' (the effects table)"
            )
        self.args_model = _args_model(self.name, self.fn)
        self._validate = self.args_model.__pydantic_validator__.validate_python
        self._dump = self.args_model.__pydantic_serializer__.to_python
        unknown = set(self.server_args) - set(self.args_model.model_fields)
        if unknown:
            raise UsageError(
                f"tool {self.name}: server_args {sorted(unknown)} are not parameters of the tool"
            )

    @property
    def writes(self) -> bool:
        """True for a tool that changes something outside the run."""
        return self.effect != "read"

    def schema(self) -> ToolSchema:
        """The schema a model sees: server-computed arguments left out (built once)."""
        if self._schema is None:
            self._schema = self._build_schema()
        return self._schema

    def _build_schema(self) -> ToolSchema:
        full = self.args_model.model_json_schema()
        props = {k: v for k, v in full.get("properties", {}).items() if k not in self.server_args}
        required = [r for r in full.get("required", []) if r not in self.server_args]
        params: dict[str, Any] = {"type": "object", "properties": props, "required": required}
        if "$defs" in full:
            params["$defs"] = full["$defs"]
        return ToolSchema(name=self.name, description=self.description, parameters=params)

    def validate(self, raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Validate model arguments. Returns (valid args, ignored server-arg values)."""
        ignored, given = {}, raw
        if self.server_args:
            ignored = {k: raw[k] for k in self.server_args if k in raw}
            given = {k: v for k, v in raw.items() if k not in self.server_args}
        try:
            # Without model_validate's and model_dump's keyword handling per call.
            model = self._validate(given)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidArguments(f"invalid arguments for {self.name}: {problems}") from None
        values = self._dump(model)
        for name in self.server_args:
            values.pop(name, None)
        return values, ignored

    async def fill_server_args(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        """Compute the server's arguments from the validated ones."""
        filled = dict(args)
        for name, compute in self.server_args.items():
            filled[name] = await compute(ctx, args)
        return filled

    async def call(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        return await self.fn(ctx, **args)


def _args_model(name: str, fn: ToolFn) -> type[BaseModel]:
    signature = inspect.signature(fn)
    hints = get_type_hints(fn)
    params = list(signature.parameters.values())
    if not params:
        raise UsageError(f"tool {name}: the first parameter must be the ToolContext")
    fields: dict[str, Any] = {}
    for param in params[1:]:
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    config = ConfigDict(extra="forbid")
    model: type[BaseModel] = create_model(f"{name}_args", __config__=config, **fields)
    return model


def tool(
    fn: ToolFn | None = None,
    *,
    name: str | None = None,
    effect: EffectKind | str = EffectKind.READ,
    timeout: float = 10.0,
    idempotency: Idempotency | str = Idempotency.NONE,
    status_check: StatusCheck | None = None,
    compensation: Compensation | None = None,
    approval: str | None = None,
    server_args: dict[str, ServerArg] | None = None,
    retry: RetryPolicy | None = None,
    delivery: Delivery | str = Delivery.DIRECT,
    outbox_attempts: int = 5,
    outbox_key: Callable[[dict[str, Any], ToolContext], str] | None = None,
    effect_key: Callable[[dict[str, Any], ToolContext], str] | None = None,
    description: str | None = None,
) -> Any:
    """Declare a tool with its contract. Usable bare (``@tool``) or with arguments."""

    def wrap(f: ToolFn) -> Tool:
        if not inspect.iscoroutinefunction(f):
            raise UsageError(f"tool {f.__name__} must be an async function")
        return Tool(
            name=name or f.__name__,
            fn=f,
            description=description or inspect.getdoc(f) or f.__name__,
            effect=effect,
            timeout=timeout,
            idempotency=idempotency,
            status_check=status_check,
            compensation=compensation,
            approval=approval,
            server_args=dict(server_args or {}),
            retry=retry or RetryPolicy(),
            delivery=delivery,
            outbox_attempts=outbox_attempts,
            outbox_key=outbox_key,
            effect_key=effect_key,
        )

    return wrap(fn) if fn is not None else wrap
