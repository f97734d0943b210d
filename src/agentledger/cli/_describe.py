"""``agentledger describe``: what an app declares (agents, workflows, inputs, tools)."""

from __future__ import annotations

import json
from typing import Any

import click

from agentledger._app import App, load_app
from agentledger.cli._common import print_json
from agentledger.cli._text import console, markup_safe
from agentledger.tools._contract import Tool


def tool_contract(t: Tool) -> dict[str, Any]:
    """A tool's contract as data: what it changes and how it is made safe."""
    return {
        "name": t.name,
        "description": t.description,
        "effect": t.effect,
        "timeout": t.timeout,
        "idempotency": t.idempotency,
        "status_check": getattr(t.status_check, "__name__", None) if t.status_check else None,
        "approval": t.approval,
        "server_args": sorted(t.server_args),
        "compensation": t.compensation.tool if t.compensation else None,
        "delivery": t.delivery,
        "arguments": t.args_model.model_json_schema(),
    }


def describe_app(app: App) -> dict[str, Any]:
    """Agents and workflows (with their input schema) and tools (with their contracts)."""
    definitions = []
    for target, d in sorted(app.definitions.items()):
        entry: dict[str, Any] = {
            "target": target,
            "kind": d.kind,
            "name": d.name,
            "version": d.version,
            "input_schema": d.input_schema(),
        }
        if d.kind == "agent":
            entry["tools"] = [t.name for t in getattr(d, "tools", [])]
        definitions.append(entry)
    return {
        "app": app.name,
        "definitions": definitions,
        "tools": [tool_contract(t) for _, t in sorted(app.tools.items())],
    }


def _type_of(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        return " | ".join(_type_of(s) for s in schema["anyOf"])
    return str(schema.get("type", "any"))


def schema_summary(schema: dict[str, Any] | None) -> str:
    """One line per field of an object schema (``nights: integer = 1``), else JSON."""
    if schema is None:
        return "any JSON value"
    if "anyOf" in schema and len(schema) == 1:
        return " or ".join(schema_summary(s) for s in schema["anyOf"])
    if set(schema) == {"type"}:
        return str(schema["type"])
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict) or not properties:
        return json.dumps(schema, sort_keys=True)
    required = set(schema.get("required", []))
    fields = []
    for name, spec in properties.items():
        text = f"{name}: {_type_of(spec)}"
        if name in required:
            text += " (required)"
        elif "default" in spec:
            text += f" = {json.dumps(spec['default'])}"
        fields.append(text)
    return "{" + ", ".join(fields) + "}"


@click.command("describe")
@click.option(
    "--app",
    "app_path",
    envvar="AGENTLEDGER_APP",
    required=True,
    help="module:attr of the App to describe, e.g. agentledger_examples.stayhub.app:app",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def describe(app_path: str, as_json: bool) -> None:
    """List an app's agents and workflows (versions, input schema) and its tools with
    their contracts: what `submit` accepts and what each tool may change."""
    info = describe_app(load_app(app_path))
    if as_json:
        print_json(info)
        return
    out = console()
    out.print(f"[bold]app {markup_safe(info['app'])}[/]")
    for d in info["definitions"]:
        schema = d["input_schema"]
        shown = schema_summary(schema)
        out.print(f"\n[bold]{d['kind']} {markup_safe(d['target'])}[/]")
        out.print(f"  input: {markup_safe(shown)}")
        if "tools" in d:
            out.print(f"  tools: {markup_safe(', '.join(d['tools']) or 'none')}")
    out.print("\n[bold]tools[/]")
    for t in info["tools"]:
        parts = [f"effect={t['effect']}", f"timeout={t['timeout']:g}s"]
        for key in ("idempotency", "status_check", "approval", "compensation"):
            if t[key] and t[key] != "none":
                parts.append(f"{key}={t[key]}")
        if t["server_args"]:
            parts.append("server_args=" + ",".join(t["server_args"]))
        if t["delivery"] != "direct":
            parts.append(f"delivery={t['delivery']}")
        params = ", ".join(t["arguments"].get("properties", {}))
        out.print(f"  {markup_safe(t['name'])}({markup_safe(params)}): {' '.join(parts)}")
