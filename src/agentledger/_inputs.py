"""Declared run inputs: what an agent or a workflow accepts, checked at submit.

An agent or a workflow may declare its input as a pydantic model class or as a JSON
schema (a dict; the common subset is checked: ``type``, ``properties``, ``required``,
``additionalProperties: false``, ``items``, ``enum``, ``minimum``/``maximum``,
``minLength``/``maxLength``). ``submit`` refuses an input that does not fit with one
line naming the field (``input.day: field required``); the app lists the schema
(``agentledger describe``).

An agent without a declared input takes a string (the user's message) or an object
with a string ``"message"``; a workflow without one takes any JSON value.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from agentledger.errors import UsageError

AGENT_DEFAULT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
    ]
}
"""What an agent without a declared input accepts."""


class InvalidInput(UsageError):
    """A run's input does not fit what its agent or workflow declares."""


InputModel = type[BaseModel] | dict[str, Any] | None


def input_schema(model: InputModel) -> dict[str, Any] | None:
    """The JSON schema of a declared input (None: anything JSON)."""
    if model is None:
        return None
    if isinstance(model, dict):
        return model
    return model.model_json_schema()


def check_declaration(model: Any, owner: str) -> None:
    """Refuse at definition time what is neither a pydantic model class nor a dict."""
    if model is None or isinstance(model, dict):
        return
    if isinstance(model, type) and issubclass(model, BaseModel):
        return
    raise UsageError(
        f"{owner}: input_model must be a pydantic BaseModel subclass or a JSON schema "
        f"dict, not {type(model).__name__}"
    )


def validate_input(value: Any, model: InputModel, target: str) -> None:
    """Raise :class:`InvalidInput` (one line, naming the field) when ``value`` does not
    fit ``model``."""
    if model is None:
        return
    if isinstance(model, dict):
        problem = schema_problem(value, model, "input")
        if problem:
            raise InvalidInput(f"invalid input for {target}: {problem}")
        return
    try:
        model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(["input", *(str(p) for p in first["loc"])])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InvalidInput(
            f"invalid input for {target}: {where}: {first['msg'].lower()}{more}"
        ) from None


def validate_agent_input(value: Any, model: InputModel, target: str) -> None:
    """An agent's input: its declared model, else a string or ``{"message": "..."}``."""
    if model is not None:
        validate_input(value, model, target)
        return
    if isinstance(value, str):
        return
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        return
    raise InvalidInput(
        f"invalid input for {target}: an agent takes a string or an object with a string "
        f'"message", e.g. {{"message": "a room in Lisbon"}} (got {_kind(value)})'
    )


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    for name, types in _TYPES.items():
        if isinstance(value, types) and not (
            name in ("integer", "number") and isinstance(value, bool)
        ):
            return name
    return type(value).__name__


def _is(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(name, (object,)))


def schema_problem(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """The first way ``value`` misses ``schema`` ("input.day: field required"), or None."""
    if "anyOf" in schema or "oneOf" in schema:
        options = schema.get("anyOf") or schema.get("oneOf") or []
        problems = [schema_problem(value, s, where) for s in options]
        if all(problems):
            return problems[0]
    wanted = schema.get("type")
    if wanted is not None:
        names = wanted if isinstance(wanted, list) else [wanted]
        if not any(_is(value, n) for n in names):
            return f"{where}: expected {' or '.join(names)}, got {_kind(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: must be one of {', '.join(map(repr, schema['enum']))}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where}: must be at least {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where}: must be at most {schema['maximum']}"
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{where}: must be at least {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{where}: must be at most {schema['maxLength']} characters"
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                return f"{where}.{name}: field required"
        for name, item in value.items():
            if name in properties:
                problem = schema_problem(item, properties[name], f"{where}.{name}")
                if problem:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{where}.{name}: not an allowed field"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = schema_problem(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None
