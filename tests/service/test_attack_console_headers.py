"""Attacks on the console's answers themselves: the Content-Security-Policy and the
usual headers on every kind of answer (redirects, refusals, errors the framework
makes, assets, streams, an oversized body), and no page cached."""

from __future__ import annotations

import httpx
from fastapi.routing import APIRoute

from agentledger.service._console.headers import CSP
from tests.service.conftest import Api
from tests.service.test_console_http import browser, csrf_of, live

__all__ = ["live"]  # the fixture, used by name


def _guarded(r: httpx.Response, what: str) -> None:
    assert r.headers.get("content-security-policy") == CSP, (what, r.status_code, r.headers)
    assert r.headers["x-content-type-options"] == "nosniff", what
    assert r.headers["x-frame-options"] == "DENY", what
    assert "unsafe-inline" not in CSP and "unsafe-eval" not in CSP


async def test_every_kind_of_answer_carries_the_csp(live: Api) -> None:
    api = live
    admin = await api.key("t1", "ada", ("admin",))
    viewer = await api.key("t1", "vera", ("viewer",))
    run = (
        await api.client.post("/v1/runs", json={"agent": "free", "input": 1}, headers=admin)
    ).json()
    await api.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=admin)
    anonymous = [
        ("GET", "/ui", {}),
        ("GET", "/ui/runs", {}),  # 303 to sign in
        ("GET", "/ui/signin?next=//evil", {}),
        ("POST", "/ui/signin", {"data": {"key": "x"}}),  # 403 form expired
        ("GET", "/ui/static/console.css", {}),
        ("GET", "/ui/static/nothing.js", {}),  # the static mount's 404
        ("GET", "/ui/static/../templates/base.html", {}),
        ("GET", "/ui/static/%2e%2e/templates/base.html", {}),
        ("HEAD", "/ui/static/console.js", {}),
        ("PUT", "/ui/runs", {}),  # 405
        ("POST", "/ui/signout", {"content": b"x" * (17 * 1024 * 1024)}),  # over the body limit
    ]
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api.app), base_url="http://console"
    ) as client:
        for method, path, kwargs in anonymous:
            r = await client.request(method, path, **kwargs)  # type: ignore[arg-type]
            _guarded(r, f"{method} {path}")
            assert r.status_code != 200 or "base.html" not in path, path
    async with browser(api, viewer) as client:
        token = await csrf_of(client)
        signed = [
            ("GET", "/ui/runs?min_retries=x"),
            ("GET", "/ui/numbers"),  # 403 page
            ("GET", "/ui/runs/nope"),  # 404 page
            ("GET", "/ui/runs/x/events?after=abc"),  # 400 page
            ("GET", "/ui/nothing/here"),
            ("DELETE", f"/ui/runs/{run['id']}/cancel"),  # 405 page
        ]
        for method, path in signed:
            r = await client.request(method, path)
            _guarded(r, f"{method} {path}")
            if r.headers["content-type"].startswith("text/html"):
                assert r.headers.get("cache-control") == "no-store", path
        r = await client.post(f"/ui/runs/{run['id']}/cancel", data={"csrf": token})
        assert r.status_code == 403
        _guarded(r, "viewer cancel")
    async with browser(api, admin) as client:
        token = await csrf_of(client)
        async with client.stream("GET", f"/ui/runs/{run['id']}/events") as stream:
            _guarded(stream, "events")
        r = await client.post("/ui/signout", data={"csrf": token})
        assert r.status_code == 303
        _guarded(r, "sign out")


async def _crash() -> None:
    raise RuntimeError("a bug in a console page")


async def test_a_crash_under_ui_is_a_page_with_the_csp(api: Api) -> None:
    """The framework answers an unhandled error outside the middleware that adds the
    console's headers: that answer must carry them too (and say it in words)."""
    api.app.router.routes.insert(0, APIRoute("/ui/test-crash", _crash))
    transport = httpx.ASGITransport(app=api.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
        r = await client.get("/ui/test-crash")
    assert r.status_code == 500
    _guarded(r, "crash")
    assert r.headers["content-type"].startswith("text/html") and "server log" in r.text
    assert "a bug in a console page" not in r.text  # nothing of the error leaks
    # The API's crash answer is left as it was.
    api.app.router.routes.insert(0, APIRoute("/v1/test-crash", _crash))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        r = await client.get("/v1/test-crash")
    assert r.status_code == 500 and r.headers["content-type"] == "application/problem+json"
