"""Attacks on the console's sessions and CSRF: fixation, reuse after sign-out, a key
revoked or expired, server-side expiry, concurrent sign-outs, the session id's
entropy, and every state-changing route of the router without (or with a wrong)
CSRF token, on both backends."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
from fastapi.routing import APIRoute

from agentledger.service._console import sessions
from tests.service.conftest import Api, mint, served, settings_for
from tests.service.test_console_http import browser, csrf_of, sign_in

_URLSAFE = re.compile(r"^[A-Za-z0-9_-]+$")


def _issued(r: httpx.Response) -> str | None:
    """The session id a response sets, if any."""
    for c in r.headers.get_list("set-cookie"):
        if c.startswith(f"{sessions.COOKIE}=") and "Max-Age=0" not in c:
            return c.split(";", 1)[0].split("=", 1)[1]
    return None


def _client(api: Api, base: str = "http://console") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app), base_url=base)


def _routes(routes: list[Any]) -> list[APIRoute]:
    """Every route under ``routes``, through included routers of any FastAPI version."""
    out: list[APIRoute] = []
    for r in routes:
        if isinstance(r, APIRoute):
            out.append(r)
        elif hasattr(r, "original_router"):  # an included router, resolved lazily
            out.extend(_routes(r.original_router.routes))
    return out


def _console_routes(api: Api, method: str) -> list[str]:
    """The console's routes taking ``method``, read from the app's router (not the
    templates), with ``{params}`` as they are."""
    return sorted(
        r.path for r in _routes(api.app.routes) if r.path.startswith("/ui") and method in r.methods
    )


async def _events(api: Api, run_id: str, key: dict[str, str]) -> list[dict[str, Any]]:
    r = await api.client.get(f"/v1/runs/{run_id}/events?format=json&limit=1000", headers=key)
    return list(r.json()["events"])


async def test_fixation_an_id_chosen_by_the_attacker_never_becomes_a_session(api: Api) -> None:
    key = await api.key("t1", "vera", ("viewer",))
    chosen = "A" * 43
    async with _client(api) as victim:
        victim.cookies.set(sessions.COOKIE, chosen)
        assert (await victim.get("/ui/runs")).status_code == 303
        r = await sign_in(victim, key)
        assert r.status_code == 303
        issued = _issued(r)
        assert issued and issued != chosen
    async with _client(api) as attacker:
        attacker.cookies.set(sessions.COOKIE, chosen)
        assert (await attacker.get("/ui/runs")).status_code == 303
    # An attacker's own live session planted in a victim's browser is replaced at sign-in.
    mallory = await api.key("t1", "mallory", ("viewer",))
    async with browser(api, mallory) as attacker:
        planted = attacker.cookies.get(sessions.COOKIE)
    async with _client(api) as victim:
        victim.cookies.set(sessions.COOKIE, planted or "")
        issued = _issued(await sign_in(victim, key))
        assert issued and issued != planted
    async with _client(api) as victim:
        victim.cookies.set(sessions.COOKIE, issued)
        page = await victim.get("/ui/runs")
        assert "vera" in page.text and "mallory" not in page.text


async def test_session_ids_and_csrf_tokens_are_long_random_and_distinct(api: Api) -> None:
    key = await api.key("t1", "vera", ("viewer",))
    ids, tokens = set(), set()
    for _ in range(8):
        async with browser(api, key) as client:
            sid = client.cookies.get(sessions.COOKIE) or ""
            token = await csrf_of(client)
            assert len(sid) >= 43 and _URLSAFE.match(sid), sid  # 256 bits of secrets
            assert len(token) >= 43 and token != sid
            ids.add(sid)
            tokens.add(token)
    assert len(ids) == 8 and len(tokens) == 8
    # The store holds neither the id nor anything that reveals it beyond its SHA-256.
    rows = await api.store.read(lambda tx: tx.fetchall("SELECT * FROM console_sessions"))
    flat = " ".join(str(v) for r in rows for v in dict(r).values())
    assert not any(sid in flat for sid in ids)


async def test_reuse_after_sign_out_and_two_concurrent_sign_outs(api: Api) -> None:
    key = await api.key("t1", "vera", ("viewer",))
    async with browser(api, key) as client:
        sid = client.cookies.get(sessions.COOKIE) or ""
        token = await csrf_of(client)
        outs = await asyncio.gather(
            *(client.post("/ui/signout", data={"csrf": token}) for _ in range(4))
        )
        assert all(r.status_code == 303 for r in outs), [r.status_code for r in outs]
        assert all(r.headers["location"].startswith("/ui/signin") for r in outs)
    async with _client(api) as thief:
        thief.cookies.set(sessions.COOKIE, sid)
        assert (await thief.get("/ui/runs")).status_code == 303
        assert (await thief.post("/ui/signout", data={"csrf": token})).status_code == 303
    rows = await api.store.read(lambda tx: tx.fetchall("SELECT revoked_at FROM console_sessions"))
    assert len(rows) == 1 and rows[0]["revoked_at"] is not None


async def test_concurrent_sign_ins_each_get_their_own_session(api: Api) -> None:
    key = await api.key("t1", "vera", ("viewer",))
    async with _client(api) as client:
        form = await client.get("/ui/signin")
        token = re.search(r'name="token" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
        bearer = key["Authorization"].removeprefix("Bearer ")
        data = {"key": bearer, "next": "/ui/runs", "token": token}
        answers = await asyncio.gather(*(client.post("/ui/signin", data=data) for _ in range(4)))
    made = [
        c.split(";", 1)[0].split("=", 1)[1]
        for r in answers
        for c in r.headers.get_list("set-cookie")
        if c.startswith(f"{sessions.COOKIE}=") and "Max-Age=0" not in c
    ]
    assert len(made) == len(set(made)) == sum(r.status_code == 303 for r in answers) >= 1


async def test_a_session_ends_with_its_key_revoked_or_expired_and_at_its_own_expiry(
    api: Api,
) -> None:
    short = await api.key("t1", "vera", ("viewer",), expires_in=600)
    async with browser(api, short) as client:
        (row,) = await api.store.read(
            lambda tx: tx.fetchall("SELECT expires_at FROM console_sessions")
        )
        # Never past its key's expiry (the cookie's Max-Age is only a hint to the browser).
        assert row["expires_at"] <= time.time() + 600
        await api.store.transact(lambda tx: tx.execute("UPDATE api_keys SET expires_at = 1"))
        api.app.state.keys._rows.clear()  # as after the key cache's few seconds
        assert (await client.get("/ui/runs")).status_code == 303
    key = await api.key("t1", "vera", ("viewer",))
    async with browser(api, key) as client:
        sid = client.cookies.get(sessions.COOKIE) or ""
        await api.store.transact(
            lambda tx: tx.execute("UPDATE console_sessions SET expires_at = :t", {"t": time.time()})
        )
        # The browser still sends the cookie: the server says no.
        client.cookies.set(sessions.COOKIE, sid)
        assert (await client.get("/ui/runs")).status_code == 303
        assert (await client.get("/ui/runs/live")).status_code == 303
        assert (await client.get("/ui/runs/x/events")).status_code == 303


async def test_every_post_route_refuses_a_missing_wrong_or_misplaced_csrf_token(
    api: Api,
) -> None:
    """Every state-changing route the router has (not only those the templates show):
    no token, another session's token, the token in the query string, in a JSON body,
    or under a method-override; a GET/PUT/DELETE to it changes nothing either."""
    admin = await api.key("t1", "ada", ("admin",))
    posts = _console_routes(api, "POST")
    assert {"/ui/signout", "/ui/runs/{run_id}/cancel", "/ui/runs/{run_id}/resume",
            "/ui/approvals/{approval_id}/decision", "/ui/attention/resume",
            "/ui/signin", "/ui/effects/check"} == set(posts), posts  # fmt: skip
    run = (
        await api.client.post("/v1/runs", json={"agent": "free", "input": 1}, headers=admin)
    ).json()
    async with browser(api, admin) as other:
        theirs = await csrf_of(other)
    async with browser(api, admin) as client:
        mine = await csrf_of(client)
        form = {"decision": "approve", "arguments_hash": "h", "from_step": "0",
                "status": "failed", "cause": "", "runs": "", "key": "x", "token": "x",
                "run_id": run["id"], "step_no": "0"}  # fmt: skip
        for route in posts:
            url = route.format(run_id=run["id"], approval_id="ap")
            tries = [
                ("POST", url, {"data": form}),
                ("POST", url, {"data": {**form, "csrf": theirs}}),
                ("POST", f"{url}?csrf={mine}", {"data": form}),
                ("POST", url, {"json": {**form, "csrf": mine}}),
                (
                    "POST",
                    url,
                    {
                        "data": {**form, "_method": "GET"},
                        "headers": {"X-HTTP-Method-Override": "GET"},
                    },
                ),
                ("POST", url, {"data": {**form, "csrf": mine.upper()}}),
                ("POST", url, {"data": {**form, "csrf": mine[:-1]}}),
            ]
            for method, target, kwargs in tries:
                r = await client.request(method, target, **kwargs)
                assert r.status_code == 403, (route, kwargs, r.status_code, r.text[:300])
                assert r.headers["content-type"].startswith("text/html")
            for method in ("PUT", "DELETE", "PATCH"):
                r = await client.request(method, url, data={**form, "csrf": mine})
                assert r.status_code == 405 and r.headers["content-type"].startswith("text/html")
        # Still signed in, nothing was cancelled, nothing decided.
        assert (await client.get("/ui/runs")).status_code == 200
    row = (await api.client.get(f"/v1/runs/{run['id']}", headers=admin)).json()
    assert row["cancel_requested"] is None and row["status"] == "queued"


async def test_no_get_route_changes_state(api: Api) -> None:
    """Every GET route of the console, with the parameters a state change would need,
    leaves the run and the sessions as they were (no GET acts)."""
    admin = await api.key("t1", "ada", ("admin",))
    run = (
        await api.client.post("/v1/runs", json={"agent": "free", "input": 1}, headers=admin)
    ).json()
    before = await _events(api, run["id"], admin)
    async with browser(api, admin) as client:
        token = await csrf_of(client)
        extra = (f"?csrf={token}&decision=approve&reason=x&from_step=0&runs={run['id']}"
                 "&status=failed&cause=")  # fmt: skip
        for route in _console_routes(api, "GET"):
            if route.endswith("/events") or route.endswith("/live"):
                continue  # streams: read-only by construction, and they never end
            url = route.replace("{rest:path}", "x").format(run_id=run["id"], approval_id="ap")
            r = await client.get(url + extra)
            assert r.status_code < 500, (route, r.status_code)
        assert (await client.get("/ui/runs")).status_code == 200  # not signed out by a GET
    assert await _events(api, run["id"], admin) == before
    row = (await api.client.get(f"/v1/runs/{run['id']}", headers=admin)).json()
    assert row["cancel_requested"] is None and row["status"] == "queued"


async def test_login_csrf_a_token_travels_only_with_its_own_cookie(api: Api) -> None:
    mallory = await api.key("t1", "mallory", ("viewer",))
    bearer = mallory["Authorization"].removeprefix("Bearer ")
    async with _client(api) as attacker:
        form = await attacker.get("/ui/signin")
        token = re.search(r'name="token" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
    async with _client(api) as victim:
        await victim.get("/ui/signin")  # the victim holds a token cookie of their own
        for tries in ({"data": {"key": bearer, "token": token}},
                      {"data": {"key": bearer}, "params": {"token": token}}):  # fmt: skip
            r = await victim.post("/ui/signin", **tries)  # type: ignore[arg-type]
            assert r.status_code == 403 and sessions.COOKIE not in victim.cookies


async def test_sign_in_never_redirects_off_the_console(api: Api) -> None:
    key = await api.key("t1", "vera", ("viewer",))
    bearer = key["Authorization"].removeprefix("Bearer ")
    hostile = ("https://evil.example/", "//evil.example/", "/\\evil.example", "/ui/\\evil",
               "javascript:alert(1)", "/ui//evil.example", "/ui/\r\nSet-Cookie: a=b",
               "/ui/%0d%0aSet-Cookie:%20a=b", "\t//evil.example",
               "/ui/../..//evil.example")  # fmt: skip
    for nxt in hostile:
        async with _client(api) as client:
            form = await client.get("/ui/signin", params={"next": nxt})
            assert form.status_code == 200 and "javascript:" not in form.text.split("<main", 1)[1]
            token = re.search(r'name="token" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
            r = await client.post("/ui/signin", data={"key": bearer, "token": token, "next": nxt})
            assert r.status_code == 303, (nxt, r.status_code)
            where = r.headers["location"]
            assert where.startswith("/ui/") and not where.startswith("//"), (nxt, where)
            assert "\r" not in where and "\n" not in where and "\\" not in where, (nxt, where)
            assert "set-cookie: a=b" not in str(r.headers).lower()


async def test_secure_follows_the_scheme_a_trusted_proxy_reports(tmp_path: Any) -> None:
    """Over real HTTP: ``X-Forwarded-Proto`` is believed only from the proxies uvicorn
    trusts (loopback by default); believing "https" only adds ``Secure`` (the browser
    then keeps the cookie off plain http), and "http" from a client cannot take it off
    a connection that really is https (TLS ends before the header is read)."""
    with served(settings_for(f"sqlite:///{tmp_path / 'svc.db'}")) as server:
        key = await mint(server.app, "t1", "vera", ["viewer"], 3600)
        bearer = key["Authorization"].removeprefix("Bearer ")
        seen: dict[str, list[str]] = {}
        for proto in ("", "https"):
            async with httpx.AsyncClient(base_url=server.base_url) as client:
                headers = {"X-Forwarded-Proto": proto} if proto else {}
                form = await client.get("/ui/signin", headers=headers)
                seen[proto] = form.headers.get_list("set-cookie")
                token = re.search(r'name="token" value="([^"]+)"', form.text)
                assert token
                r = await client.post(
                    "/ui/signin", headers=headers,
                    data={"key": bearer, "token": token.group(1), "next": "/ui/runs"},
                )  # fmt: skip
                if proto:  # the token cookie was Secure: plain http did not send it back
                    assert r.status_code == 403 and _issued(r) is None
                else:
                    assert r.status_code == 303 and "Secure" not in str(
                        r.headers.get_list("set-cookie")
                    )
        assert all("Secure" in c for c in seen["https"]) and seen["https"]
        assert not any("Secure" in c for c in seen[""])


async def test_signing_in_again_ends_the_session_the_browser_held(api: Api) -> None:
    """A second sign-in in the same browser (another person at a shared desk, another
    key) ends the session whose cookie it replaces: a copy of the old cookie signs no
    one in afterwards."""
    first = await api.key("t1", "vera", ("viewer",))
    second = await api.key("t1", "olga", ("operator",))
    async with browser(api, first) as client:
        old = client.cookies.get(sessions.COOKIE) or ""
        r = await sign_in(client, second)
        assert r.status_code == 303
    async with _client(api) as thief:
        thief.cookies.set(sessions.COOKIE, old)
        assert (await thief.get("/ui/runs")).status_code == 303
