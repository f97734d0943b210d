"""Templates: Jinja2 with autoescaping on, so text from models, tools and users is
always shown as text, never read as markup."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined

HERE = Path(__file__).parent
STATIC = HERE / "static"
STATIC_URL = "/ui/static"

_env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def when(at: float | None) -> str:
    """A UNIX time as UTC text (``2026-12-02 10:51:32 UTC``)."""
    if at is None:
        return "-"
    stamp = dt.datetime.fromtimestamp(float(at), tz=dt.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(at: float | None) -> str:
    """A UNIX time as ISO 8601 (what ``<time datetime>`` and the script read)."""
    if at is None:
        return ""
    return dt.datetime.fromtimestamp(float(at), tz=dt.UTC).isoformat()


def seconds(value: float | None) -> str:
    """A duration in words a person reads at a glance."""
    if value is None:
        return "-"
    s = float(value)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def money(value: float | None) -> str:
    """US dollars, to the cent (fractions of a cent shown for model costs)."""
    v = float(value or 0)
    return f"${v:,.2f}" if v >= 0.01 or v == 0 else f"${v:.4f}"


def pretty(value: Any) -> str:
    """JSON for people (escaped by the template like any other text)."""
    try:
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


_env.filters.update(when=when, iso=iso, seconds=seconds, money=money, pretty=pretty)


def query(params: dict[str, Any], **changes: Any) -> str:
    """``params`` with ``changes`` as a URL query (empty values left out)."""
    merged = {**params, **changes}
    return urlencode({k: v for k, v in merged.items() if v not in (None, "")})


_env.globals.update(query=query, static=STATIC_URL)


def html(name: str, **context: Any) -> str:
    """The template ``name`` rendered with ``context``."""
    return _env.get_template(name).render(**context)


def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A console page. Never cached: it shows what a session may see."""
    session = getattr(request.state, "console_session", None)
    body = html(name, session=session, path=request.url.path, **context)
    return HTMLResponse(body, status_code=status, headers={"Cache-Control": "no-store"})
