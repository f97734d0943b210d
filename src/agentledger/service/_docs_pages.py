"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with their scripts and styles served by
the service itself (``service/static/``, shipped in the wheel), not from a CDN: the
pages work on a host without internet access. FastAPI's own pages load them from
jsDelivr and their favicon and fonts from other hosts, so they are switched off
(``docs_url=None``, ``redoc_url=None``) and these routes take their paths."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
ASSETS = "/static/api-docs"  # where the files of STATIC are served


def install(api: FastAPI) -> None:
    """Serve the assets and the two pages on ``api`` (created with ``docs_url=None``
    and ``redoc_url=None``)."""
    api.mount(ASSETS, StaticFiles(directory=STATIC), name="api-docs-assets")

    @api.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        base = _base(request)
        return get_swagger_ui_html(
            openapi_url=f"{base}{api.openapi_url}",
            title=f"{api.title} - API",
            swagger_js_url=f"{base}{ASSETS}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{base}{ASSETS}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{base}{ASSETS}/swagger-ui/favicon-32x32.png",
            # Else Swagger UI sends the document to validator.swagger.io for its badge.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @api.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        base = _base(request)
        return get_redoc_html(
            openapi_url=f"{base}{api.openapi_url}",
            title=f"{api.title} - API",
            redoc_js_url=f"{base}{ASSETS}/redoc/redoc.standalone.js",
            redoc_favicon_url=f"{base}{ASSETS}/swagger-ui/favicon-32x32.png",
            with_google_fonts=False,
        )


def _base(request: Request) -> str:
    """The prefix a proxy serves the app under (``root_path``), as FastAPI's pages use."""
    return str(request.scope.get("root_path", "")).rstrip("/")
