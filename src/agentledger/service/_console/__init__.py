"""The web console at ``/ui``: server-rendered pages over the same store, keys, roles
and decision paths as the API.

Everything it serves ships in the package (``templates/``, ``static/``): no CDN, no
build step. Every page carries a Content-Security-Policy without inline script
(``headers.py``). A person signs in by pasting an API key once and then holds a
server-side session (``sessions.py``); every state-changing form carries the session's
CSRF token. Modules: ``render.py`` (templates), ``story.py`` (a run's waterfall and
step outcomes); the routes: ``signin.py``, ``runs.py``, ``resume.py``, ``approvals.py``,
``attention.py``,
``effects.py``, ``numbers.py``.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from agentledger.service._console import (
    approvals,
    attention,
    effects,
    errors,
    numbers,
    resume,
    runs,
    signin,
)
from agentledger.service._console.headers import ConsoleHeaders
from agentledger.service._console.render import STATIC, STATIC_URL


def install(api: FastAPI) -> None:
    """Serve the console under ``/ui`` on ``api``."""
    api.add_middleware(ConsoleHeaders)
    errors.install(api)
    api.mount(STATIC_URL, StaticFiles(directory=STATIC), name="console-assets")
    for module in (signin, runs, resume, approvals, attention, effects, numbers):
        api.include_router(module.router)
    api.include_router(resume.bulk)
    api.include_router(signin.fallback)
