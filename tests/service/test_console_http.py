"""The console over HTTP (in process): sessions, CSRF, roles, tenants, headers, escaping."""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from agentledger.service._console import sessions
from agentledger.service._queries import console as console_queries
from agentledger.store._queries import rollup
from tests.service.conftest import Api, in_process, pending_in_time, settings_for, until

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
_TOKEN = re.compile(r'name="token" value="([^"]+)"')


@pytest.fixture
async def live(store_url: str) -> AsyncIterator[Api]:
    """The service with one inline worker, on each backend."""
    async with in_process(settings_for(store_url, workers_inline=1)) as a:
        yield a


def _bearer(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


@contextlib.asynccontextmanager
async def browser(
    api: Api, key: dict[str, str], base: str = "http://console"
) -> AsyncIterator[httpx.AsyncClient]:
    """A client that signed in with ``key`` (its own cookie jar)."""
    transport = httpx.ASGITransport(app=api.app)
    async with httpx.AsyncClient(transport=transport, base_url=base) as client:
        r = await sign_in(client, key)
        assert r.status_code == 303 and r.headers["location"] == "/ui/runs", r.text
        yield client


async def sign_in(client: httpx.AsyncClient, key: dict[str, str]) -> httpx.Response:
    """Fill the sign-in form as a browser does (its token comes with the form)."""
    form = await client.get("/ui/signin")
    found = _TOKEN.search(form.text)
    assert found, form.text
    data = {"key": _bearer(key), "next": "/ui/runs", "token": found.group(1)}
    return await client.post("/ui/signin", data=data)


async def csrf_of(client: httpx.AsyncClient, path: str = "/ui/runs") -> str:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    found = _CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


async def parked(api: Api, headers: dict[str, str], amount: int = 120) -> dict[str, Any]:
    body = {"agent": "payout", "input": {"amount": amount, "approval": {"role": "manager"}}}
    run = (await api.client.post("/v1/runs", json=body, headers=headers)).json()

    async def waiting() -> bool:
        r = (await api.client.get(f"/v1/runs/{run['id']}", headers=headers)).json()
        return bool(r["pending_approval"]) and r["status"] == "waiting"

    await until(waiting)
    return dict((await api.client.get(f"/v1/runs/{run['id']}", headers=headers)).json())


async def test_a_session_cookie_is_strict_httponly_and_secure_over_https(sqlite_api: Api) -> None:
    key = await sqlite_api.key("t1", "vera", ("viewer",))
    anonymous = await sqlite_api.client.get("/ui/runs?status=failed")
    assert anonymous.status_code == 303
    assert anonymous.headers["location"] == "/ui/signin?next=/ui/runs%3Fstatus%3Dfailed"
    for base, secure in (("http://console", False), ("https://console", True)):
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=sqlite_api.app), base_url=base)
        async with client:
            r = await sign_in(client, key)
            cookies = [c for c in r.headers.get_list("set-cookie")
                       if c.startswith(f"{sessions.COOKIE}=")]  # fmt: skip
            (cookie,) = [c for c in cookies if "Max-Age=0" not in c]
            assert cookie.startswith(f"{sessions.COOKIE}=")
            assert "HttpOnly" in cookie and "SameSite=strict" in cookie
            # The console's paths only: the API's never receive the session.
            assert re.search(r"(?i)path=/ui(;|$)", cookie), cookie
            assert ("Secure" in cookie) is secure, cookie
            # A cookie an earlier version set for the whole site is expired, not left to
            # be sent beside the new one.
            (legacy,) = [c for c in cookies if "Max-Age=0" in c]
            assert re.search(r"(?i)path=/(;|$)", legacy), legacy
            # The client's jar holds it for /ui only.
            jar = [c for c in client.cookies.jar if c.name == sessions.COOKIE]
            assert [c.path for c in jar] == ["/ui"]
            assert (await client.get("/ui/runs")).status_code == 200
    # Only the session id's hash is stored, never the id itself.
    stored = await sqlite_api.store.read(
        lambda tx: tx.fetchall("SELECT id_hash, csrf FROM console_sessions")
    )
    session_id = cookie.split(";", 1)[0].split("=", 1)[1]
    assert len(stored) == 2 and all(session_id not in row["id_hash"] for row in stored)


async def test_a_wrong_key_does_not_sign_in_nor_a_form_from_elsewhere(sqlite_api: Api) -> None:
    client = sqlite_api.client
    r = await sign_in(client, {"Authorization": "Bearer al_000000000000_" + "x" * 30})
    assert r.status_code == 401 and "does not sign in" in r.text
    assert not [c for c in r.headers.get_list("set-cookie") if sessions.COOKIE + "=" in c]
    # A page elsewhere posting a key of its own: no form token, no session.
    key = await sqlite_api.key("t1", "mallory", ("viewer",))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=sqlite_api.app), base_url="http://console"
    ) as victim:
        forged = await victim.post("/ui/signin", data={"key": _bearer(key), "token": "x"})
        assert forged.status_code == 403 and sessions.COOKIE not in victim.cookies
    unknown = await client.get("/ui/no-such-page")
    assert unknown.status_code == 303  # signed out: to the sign-in form first


async def test_logout_revokes_the_session_on_the_server(sqlite_api: Api) -> None:
    key = await sqlite_api.key("t1", "vera", ("viewer",))
    async with browser(sqlite_api, key) as client:
        stolen = client.cookies.get(sessions.COOKIE)
        token = await csrf_of(client)
        out = await client.post("/ui/signout", data={"csrf": token})
        assert out.status_code == 303 and out.headers["location"] == "/ui/signin"
        # The cookie a copy kept no longer signs anyone in.
        client.cookies.set(sessions.COOKIE, stolen or "")
        again = await client.get("/ui/runs")
        assert again.status_code == 303 and again.headers["location"].startswith("/ui/signin")


async def test_a_session_expires_on_the_server_and_with_its_key(sqlite_api: Api) -> None:
    key = await sqlite_api.key("t1", "vera", ("viewer",))
    async with browser(sqlite_api, key) as client:
        assert (await client.get("/ui/runs")).status_code == 200
        await sqlite_api.store.transact(
            lambda tx: tx.execute("UPDATE console_sessions SET expires_at = 1")
        )
        assert (await client.get("/ui/runs")).status_code == 303
    # What serve's purge (beside the idempotency keys') then deletes.
    assert await sqlite_api.store.transact(console_queries.purge_sessions, time.time()) == 1
    async with browser(sqlite_api, key) as client:
        assert (await client.get("/ui/runs")).status_code == 200
        await sqlite_api.store.transact(lambda tx: tx.execute("UPDATE api_keys SET revoked_at = 1"))
        sqlite_api.app.state.keys._rows.clear()  # as after the key cache's few seconds
        assert (await client.get("/ui/runs")).status_code == 303


async def test_a_post_without_this_sessions_csrf_token_is_refused(live: Api) -> None:
    operator = await live.key("t1", "olga", ("operator",))
    run = await parked(live, operator)
    async with browser(live, operator) as client:
        url = f"/ui/runs/{run['id']}/cancel"
        # A form another site made: the cookie rides along, the token cannot.
        forged = await client.post(url, data={"reason": "forged"})
        assert forged.status_code == 403 and "security token" in forged.text
        wrong = await client.post(url, data={"reason": "x", "csrf": "not-the-token"})
        assert wrong.status_code == 403
        signout = await client.post("/ui/signout", data={})
        assert signout.status_code == 403
        assert (await client.get("/ui/runs")).status_code == 200  # still signed in
        row = (await live.client.get(f"/v1/runs/{run['id']}", headers=operator)).json()
        assert row["cancel_requested"] is None
        token = await csrf_of(client, f"/ui/runs/{run['id']}")
        ok = await client.post(url, data={"reason": "wrong hotel", "csrf": token})
        assert ok.status_code == 303
    row = (await live.client.get(f"/v1/runs/{run['id']}", headers=operator)).json()
    assert row["cancel_requested"] == "wrong hotel"
    events = (await live.client.get(f"/v1/runs/{run['id']}/events?format=json",
                                    headers=operator)).json()["events"]  # fmt: skip
    asked = [e for e in events if e["type"] in ("run.cancel_requested", "run.cancelled")]
    assert asked and asked[0]["actor"].endswith(", console)"), asked


async def test_a_viewer_sees_but_cannot_decide_and_an_approver_decides(live: Api) -> None:
    guest = await live.key("t1", "gina", ("guest",))
    viewer = await live.key("t1", "vera", ("viewer",))
    manager = await live.key("t1", "mona", ("manager",))
    run = await parked(live, guest, amount=240)
    approval = run["pending_approval"]
    async with browser(live, viewer) as client:
        inbox = await client.get("/ui/approvals")
        assert "Nothing waits for your decision" in inbox.text and "Approve" not in inbox.text
        page = await client.get(f"/ui/runs/{run['id']}")
        assert page.status_code == 200 and "Cancel this run" not in page.text
        token = await csrf_of(client)
        r = await client.post(
            f"/ui/approvals/{approval['id']}/decision",
            data={"csrf": token, "decision": "approve",
                  "arguments_hash": approval["arguments_hash"]},
        )  # fmt: skip
        assert r.status_code == 403 and "You may not decide this approval" in r.text
    async with browser(live, manager) as client:
        inbox = await client.get("/ui/approvals")
        assert '<dd class="arg-amount">240</dd>' in inbox.text
        token = await csrf_of(client, "/ui/approvals")
        r = await client.post(
            f"/ui/approvals/{approval['id']}/decision",
            data={"csrf": token, "decision": "approve", "reason": "within policy",
                  "arguments_hash": approval["arguments_hash"]},
        )  # fmt: skip
        assert r.status_code == 303 and r.headers["location"] == "/ui/approvals?done=approve"
        again = await client.post(
            f"/ui/approvals/{approval['id']}/decision",
            data={"csrf": token, "decision": "reject",
                  "arguments_hash": approval["arguments_hash"]},
        )  # fmt: skip
        assert again.status_code == 409
        assert "Already decided: mona approved it" in again.text
    done = await live.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=guest)
    assert done.json()["status"] == "completed"
    events = (await live.client.get(f"/v1/runs/{run['id']}/events?format=json&limit=1000",
                                    headers=guest)).json()["events"]  # fmt: skip
    (context,) = [e for e in events if e["type"] == "approval.decision_context"]
    assert context["actor"] == "mona" and context["data"]["via"] == "console"
    assert context["data"]["reason"] == "within policy"


async def test_another_tenants_run_is_a_plain_404_page(live: Api) -> None:
    mine = await live.key("t1", "olga", ("operator",))
    theirs = await live.key("t2", "fred", ("admin",))
    run = await parked(live, mine)
    async with browser(live, theirs) as client:
        for path in (f"/ui/runs/{run['id']}", f"/ui/runs/{run['id']}/story",
                     f"/ui/runs/{run['id']}/events", "/ui/runs/no-such-run"):  # fmt: skip
            r = await client.get(path)
            assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
            assert "There is no" in r.text and run["id"] not in r.text.split("<main", 1)[0]
        listed = await client.get("/ui/runs")
        assert run["id"] not in listed.text
        token = await csrf_of(client)
        r = await client.post(f"/ui/runs/{run['id']}/cancel", data={"csrf": token})
        assert r.status_code == 404


async def test_every_console_answer_carries_the_csp_and_the_usual_headers(live: Api) -> None:
    operator = await live.key("t1", "olga", ("operator",))
    run = await parked(live, operator)
    pages = ["/ui/signin", "/ui/static/console.css", "/ui/static/console.js"]
    async with browser(live, operator) as client:
        pages += ["/ui/runs", "/ui/runs?status=waiting_approval&min_retries=x",
                  f"/ui/runs/{run['id']}", f"/ui/runs/{run['id']}/story",
                  "/ui/approvals", "/ui/runs/missing", "/ui/nothing/here"]  # fmt: skip
        for path in pages:
            r = await client.get(path)
            assert r.status_code in (200, 404), path
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
            assert "unsafe-inline" not in csp and "form-action 'self'" in csp
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "same-origin"
            if r.headers["content-type"].startswith("text/html"):
                # No inline script: every <script> names a file of the console.
                for tag in re.findall(r"<script[^>]*>", r.text):
                    assert 'src="/ui/static/console.js"' in tag, (path, tag)
                assert " style=" not in r.text and "<style" not in r.text, path
                assert not re.search(r"\son[a-z]+=", r.text), path
    api_answer = await live.client.get("/v1/runs", headers=operator)
    assert "content-security-policy" not in api_answer.headers  # the API is left as it was


async def test_text_from_runs_is_shown_as_text(live: Api) -> None:
    operator = await live.key("t1", "olga", ("operator",))
    hostile = '<script>alert("x")</script><b onmouseover="x()">bold</b>'
    body = {"agent": "free", "input": {"answer": hostile}}
    run = (await live.client.post("/v1/runs", json=body, headers=operator)).json()
    done = await live.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=operator)
    assert done.json()["result"] == {"answer": hostile}
    async with browser(live, operator) as client:
        page = await client.get(f"/ui/runs/{run['id']}")
    assert "<script>alert" not in page.text and "<b onmouseover" not in page.text
    # Shown, as text (inside the result's JSON, whose quotes are escaped too).
    assert "&lt;script&gt;alert(" in page.text and "&lt;/script&gt;&lt;b onmouseover=" in page.text


async def test_a_session_ends_after_its_idle_time_and_a_request_restarts_the_clock(
    store_url: str,
) -> None:
    """``console_idle`` seconds without a request end a session on the server, well
    before its absolute expiry; a request restarts the clock (written at most every few
    seconds); an open stream does not, and ends with the session."""
    settings = settings_for(store_url, console_idle=600, console_lifetime=7200)
    async with in_process(settings) as api:
        key = await api.key("t1", "vera", ("viewer",))

        async def seen() -> float:
            (row,) = await api.store.read(
                lambda tx: tx.fetchall("SELECT last_seen_at, created_at, expires_at "
                                       "FROM console_sessions WHERE revoked_at IS NULL")
            )  # fmt: skip
            assert row["expires_at"] <= row["created_at"] + 7200 + 1  # console_lifetime
            return float(row["last_seen_at"] or row["created_at"])

        async def idle_for(seconds: float) -> None:
            await api.store.transact(
                lambda tx: tx.execute(
                    "UPDATE console_sessions SET last_seen_at = :t",
                    {"t": time.time() - seconds},
                )
            )

        async with browser(api, key) as client:
            await idle_for(590)  # nearly idle too long: a request keeps it
            assert (await client.get("/ui/runs")).status_code == 200
            assert time.time() - await seen() < 60
            # A stream (its opening included) is the page's, not the person's: it
            # leaves the idle clock alone, and ends with the session.
            await idle_for(100)
            tab = httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app),
                                    base_url="http://console", cookies=client.cookies)  # fmt: skip
            reading = asyncio.create_task(_read_all(tab, "/ui/runs/live"))

            async def opened() -> bool:
                return any(kind == "tenant" for kind, _ in api.app.state.hub._waiters)

            await until(opened)
            assert time.time() - await seen() >= 100
            await idle_for(601)
            status, text = await asyncio.wait_for(reading, 30)
            assert status == 200 and "retry:" in text  # it was open, then ended
            assert time.time() - await seen() > 600
            gone = await client.get("/ui/runs")
            assert gone.status_code == 303 and gone.headers["location"].startswith("/ui/signin")
        # A session idle for less than that but past its absolute expiry ends too.
        async with browser(api, key) as client:
            await api.store.transact(
                lambda tx: tx.execute(
                    "UPDATE console_sessions SET expires_at = :t WHERE revoked_at IS NULL",
                    {"t": time.time() - 1},
                )
            )
            assert (await client.get("/ui/runs")).status_code == 303


async def _read_all(client: httpx.AsyncClient, path: str) -> tuple[int, str]:
    async with client:
        r = await client.get(path)
        return r.status_code, r.text


def test_the_idle_time_and_lifetime_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentledger.errors import UsageError
    from agentledger.service import ServiceSettings

    monkeypatch.setenv("AGENTLEDGER_CONSOLE_SESSION_IDLE", "120")
    monkeypatch.setenv("AGENTLEDGER_CONSOLE_SESSION_LIFETIME", "3600")
    made = ServiceSettings(db_url="sqlite://", pepper=b"x" * 16)
    assert (made.console_idle, made.console_lifetime) == (120.0, 3600.0)
    monkeypatch.setenv("AGENTLEDGER_CONSOLE_SESSION_IDLE", "5")
    with pytest.raises(UsageError, match="AGENTLEDGER_CONSOLE_SESSION_IDLE must be"):
        ServiceSettings(db_url="sqlite://", pepper=b"x" * 16)


async def test_an_operator_resumes_after_the_dry_run_a_viewer_cannot(live: Api) -> None:
    operator = await live.key("t1", "olga", ("operator",))
    viewer = await live.key("t1", "vera", ("viewer",))
    run = (await live.client.post("/v1/runs", json={"agent": "over_budget"},
                                  headers=operator)).json()  # fmt: skip
    done = await live.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=operator)
    assert done.json()["status"] == "needs_human"
    url = f"/ui/runs/{run['id']}/resume"
    async with browser(live, viewer) as client:
        assert "Resume this run" not in (await client.get(f"/ui/runs/{run['id']}")).text
        assert (await client.get(url)).status_code == 403
        token = await csrf_of(client)
        assert (await client.post(url, data={"csrf": token, "from_step": "2"})).status_code == 403
    async with browser(live, operator) as client:
        assert "Resume this run" in (await client.get(f"/ui/runs/{run['id']}")).text
        dry = await client.get(url)
        assert dry.status_code == 200 and "Resume from step 2" in dry.text, dry.text
        assert "No side effect is repeated or in doubt" in dry.text
        token = _CSRF.search(dry.text).group(1)  # type: ignore[union-attr]
        assert (await client.post(url, data={"from_step": "2"})).status_code == 403
        stale = await client.post(url, data={"csrf": token, "from_step": "1"})
        assert stale.status_code == 409 and "changed since you looked" in stale.text
        row = (await live.client.get(f"/v1/runs/{run['id']}", headers=operator)).json()
        assert row["status"] == "needs_human"  # the refused resume changed nothing
        ok = await client.post(url, data={"csrf": token, "from_step": "2", "reason": "budget up"})
        assert ok.status_code == 303
    events = (await live.client.get(f"/v1/runs/{run['id']}/events?format=json&limit=1000",
                                    headers=operator)).json()["events"]  # fmt: skip
    (resumed,) = [e for e in events if e["type"] == "run.resumed"]
    assert resumed["actor"].endswith(", console)") and resumed["data"]["reason"] == "budget up"


async def test_a_runs_events_resume_after_last_event_id(live: Api) -> None:
    operator = await live.key("t1", "olga", ("operator",))
    body = {"agent": "echo", "input": {"text": "hi", "steps": 2}}
    run = (await live.client.post("/v1/runs", json=body, headers=operator)).json()
    await live.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=operator)
    async with browser(live, operator) as client:
        r = await client.get(f"/ui/runs/{run['id']}/events", headers={"Last-Event-ID": "3"})
    ids = [int(line[4:]) for line in r.text.splitlines() if line.startswith("id: ")]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert ids and ids[0] == 4 and ids == list(range(4, ids[-1] + 1))
    assert "event: run.completed" in r.text


async def test_the_numbers_page_is_the_apis_stats_for_admins(live: Api) -> None:
    admin = await live.key("t1", "ada", ("admin",))
    viewer = await live.key("t1", "vera", ("viewer",))
    for text in ("a", "b", "c"):
        r = await live.client.post("/v1/runs", json={"agent": "echo", "input": {"text": text}},
                                   headers=admin)  # fmt: skip
        await live.client.get(f"/v1/runs/{r.json()['id']}/result?wait=30", headers=admin)
    r = await live.client.post("/v1/runs", json={"agent": "over_budget"}, headers=admin)
    await live.client.get(f"/v1/runs/{r.json()['id']}/result?wait=30", headers=admin)
    api_figures = (await live.client.get("/v1/stats?since=7d", headers=admin)).json()
    assert api_figures["completion_rate"] == 0.75
    # Two runs a moment apart across a UTC midnight land on two days (rounded down).
    ids = [e["id"] for e in (await live.client.get("/v1/runs", headers=admin)).json()["runs"]]
    midnight = (int(time.time() // 86400) - 2) * 86400
    for run_id, at in ((ids[0], midnight - 0.1), (ids[1], midnight + 0.1)):
        # Out of the daily rollup first, should a worker have folded it already.
        await live.store.transact(
            lambda tx, r=run_id, a=at: (
                rollup.unfold_run(tx, r, rollup.FINAL),
                tx.execute("UPDATE runs SET created_at = :a WHERE id = :id", {"a": a, "id": r}),
            )
        )
    day = time.strftime("%Y-%m-%d", time.gmtime(midnight))
    before = time.strftime("%Y-%m-%d", time.gmtime(midnight - 1))
    async with browser(live, admin) as client:
        page = await client.get("/ui/numbers?since=7d")
        assert page.status_code == 200
        assert '<dd id="completion-rate">75.0 %</dd>' in page.text
        for date in (before, day):
            assert f'<td data-label="Day">{date}</td><td data-label="Runs">1</td>' in page.text
        assert 'href="/ui/runs?agent=over_budget"' in page.text and ">(no step)<" in page.text
        # Per agent and version: the table, and a chart per figure with its table.
        assert '<td data-label="Agent"><a href="/ui/runs?agent=echo">echo</a></td>' in page.text
        assert 'href="/ui/runs?agent=echo&amp;version=1">1</a>' in page.text
        for title in ("Completion rate per day", "Cost per run per day", "Duration p95 per day"):
            assert f"<summary>{title} as a table</summary>" in page.text
        assert page.text.count('role="img" aria-labelledby="chart-') == 3
        assert '<th scope="col">echo@1</th>' in page.text
        # The failing step's class (the hand-over's reason, as the runs filter reads it).
        assert ">step budget reached (1 of 1 steps)</a>" in page.text
    by_day = (await live.client.get("/v1/stats?since=7d&bucket=day&agent=echo&version=1",
                                    headers=admin)).json()  # fmt: skip
    assert by_day["version"] == "1" and by_day["runs"] == 3
    assert {(g["agent"], g["version"]) for g in by_day["series"]} == {("echo", "1")}
    assert sum(g["runs"] for g in by_day["series"]) == 3
    assert len({g["day"] for g in by_day["series"]}) == 2  # the moved runs, two days
    bad = await live.client.get("/v1/stats?bucket=week", headers=admin)
    assert bad.status_code in (400, 422)
    async with browser(live, viewer) as client:
        refused = await client.get("/ui/numbers")
        assert refused.status_code == 403 and "needs one of the roles admin" in refused.text


async def test_what_needs_a_human_is_grouped_by_cause(live: Api) -> None:
    operator = await live.key("t1", "olga", ("operator",))
    theirs = await live.key("t2", "fred", ("operator",))
    handed = []
    for headers in (operator, operator, theirs):
        r = await live.client.post("/v1/runs", json={"agent": "over_budget"}, headers=headers)
        await live.client.get(f"/v1/runs/{r.json()['id']}/result?wait=30", headers=headers)
        handed.append(r.json()["id"])
    await live.store.transact(
        lambda tx: tx.execute(
            "INSERT INTO outbox (key, run_id, step_no, tool, attempts, next_attempt_at, status, "
            "last_error, created_at, updated_at) VALUES ('ob-1', :r, 1, 'email', 5, 0, 'dead', "
            "'<b>smtp</b> refused', 0, 0)",
            {"r": handed[0]},
        )
    )  # fmt: skip
    async with browser(live, operator) as client:
        page = await client.get("/ui/attention")
        assert page.status_code == 200
        # needs_human runs record their handover's words as the cause.
        cause = "step budget reached (1 of 1 steps)"
        link = "/ui/runs?" + urlencode({"status": "needs_human", "error_class": cause})
        assert f'<a href="{link}">2 runs</a>' in page.text.replace("&amp;", "&")
        assert "&lt;b&gt;smtp&lt;/b&gt; refused" in page.text and "ob-1" in page.text
        listed = await client.get(link)
        assert sorted(re.findall(r'<tr data-run="([^"]+)">', listed.text)) == sorted(handed[:2])
        # Resume the group: its dry run's count first, then exactly those runs.
        dry = await client.get("/ui/attention/resume?" + urlencode(
            {"status": "needs_human", "cause": cause}))  # fmt: skip
        assert (
            "Dry run: 2 runs would resume, 0 only if forced (0 confirmed effects would "
            "run again), 0 would be refused"
        ) in dry.text
        shown = re.search(r'name="runs" value="([^"]+)"', dry.text)
        assert shown and sorted(shown.group(1).split(",")) == sorted(handed[:2])
        token = _CSRF.search(dry.text).group(1)  # type: ignore[union-attr]
        form = {"csrf": token, "status": "needs_human", "cause": cause}
        stale = await client.post("/ui/attention/resume", data={**form, "runs": handed[0]})
        assert stale.status_code == 409 and "changed since you looked" in stale.text
        done = await client.post("/ui/attention/resume", data={**form, "runs": shown.group(1)})
        assert done.status_code == 200 and done.text.count(": resumed</li>") == 2
    for run_id, headers in ((handed[0], operator), (handed[1], operator), (handed[2], theirs)):
        events = (await live.client.get(f"/v1/runs/{run_id}/events?format=json&limit=1000",
                                        headers=headers)).json()["events"]  # fmt: skip
        resumed = [e["actor"] for e in events if e["type"] == "run.resumed"]
        assert resumed == ([] if headers is theirs else [resumed[0]])
        assert all(a.startswith("olga (key ") and a.endswith(", console)") for a in resumed)


async def test_an_expired_approval_is_said_in_words(live: Api) -> None:
    guest = await live.key("t1", "gina", ("guest",))
    manager = await live.key("t1", "mona", ("manager",))

    async def start(ttl: float) -> str:
        ask = {"role": "manager", "expires_in": ttl}
        body = {"agent": "payout", "input": {"amount": 5, "approval": ask}}
        return str((await live.client.post("/v1/runs", json=body, headers=guest)).json()["id"])

    # The result below waits for the expiry itself.
    run = await pending_in_time(live, guest, start)
    approval = run["pending_approval"]
    async with browser(live, manager) as client:
        token = await csrf_of(client, "/ui/approvals")
        done = await live.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=guest)
        assert done.json()["status"] == "failed"  # the default (reject) was applied
        r = await client.post(
            f"/ui/approvals/{approval['id']}/decision",
            data={"csrf": token, "decision": "approve",
                  "arguments_hash": approval["arguments_hash"]},
        )  # fmt: skip
    assert r.status_code == 410, r.text
    assert "This approval expired; the default (reject) was applied. Nothing was decided." in r.text


async def test_the_side_effects_ledger_lists_open_outcomes_first(live: Api) -> None:
    operator = await live.key("t1", "olga", ("operator",))
    theirs = await live.key("t2", "fred", ("operator",))
    ids = []
    for body, headers in (({"agent": "payout", "input": {"amount": 9}}, operator),
                          ({"agent": "over_budget"}, operator),
                          ({"agent": "payout", "input": {"amount": 8}}, theirs)):  # fmt: skip
        r = await live.client.post("/v1/runs", json=body, headers=headers)
        await live.client.get(f"/v1/runs/{r.json()['id']}/result?wait=30", headers=headers)
        ids.append(r.json()["id"])
    await live.store.transact(
        lambda tx: tx.execute(
            "INSERT INTO steps (run_id, step_no, kind, name, status, attempts, lease_epoch, "
            "idempotency_key) VALUES (:id, 7, 'tool', 'pay', 'unknown', 1, 1, 'k-unknown')",
            {"id": ids[1]},
        )
    )  # fmt: skip
    async with browser(live, operator) as client:
        page = (await client.get("/ui/effects")).text
        run_page = (await client.get(f"/ui/runs/{ids[0]}")).text
    open_part, all_part = page.split("All writes", 1)
    assert "k-unknown" in open_part and "outcome unknown: handed over to a person" in open_part
    assert ids[0] in all_part and "confirmed" in all_part
    assert ids[2] not in page  # another tenant's writes
    assert "Writes, each under its key" in run_page and ">confirmed</td>" in run_page


async def test_check_now_shows_the_providers_answer_beside_the_journals(live: Api) -> None:
    """An open write whose tool has a status check: an operator's "Check now" asks the
    provider (this process serves the app) and shows both answers; nothing changes;
    a viewer has no button and is refused; a form without the CSRF token too."""
    operator = await live.key("t1", "olga", ("operator",))
    viewer = await live.key("t1", "vera", ("viewer",))
    r = await live.client.post("/v1/runs", json={"agent": "free", "input": {}}, headers=operator)
    run_id = r.json()["id"]
    await live.client.get(f"/v1/runs/{run_id}/result?wait=30", headers=operator)

    def unknown_shipment(tx: Any) -> None:
        tx.execute("UPDATE runs SET status = 'needs_human' WHERE id = :id", {"id": run_id})
        tx.execute(
            "INSERT INTO steps (run_id, step_no, kind, name, status, input, attempts, "
            "lease_epoch, idempotency_key) VALUES (:id, 4, 'tool', 'ship', 'unknown', :i, 1, "
            "1, 'k-ship')",
            {"id": run_id, "i": '{"args": {"parcel": "p-7"}, "status_check": true}'},
        )

    await live.store.transact(unknown_shipment)
    form = {"run_id": run_id, "step_no": "4"}
    async with browser(live, viewer) as client:
        page = await client.get("/ui/effects")
        assert "k-ship" in page.text and "Check now" not in page.text
        token = _CSRF.search((await client.get("/ui/runs")).text)
        assert token is not None
        refused = await client.post("/ui/effects/check", data={**form, "csrf": token.group(1)})
        assert refused.status_code == 403
    async with browser(live, operator) as client:
        page = await client.get("/ui/effects")
        assert "Check now: ask the provider about k-ship" in page.text
        token = _CSRF.search(page.text)
        assert token is not None
        assert (await client.post("/ui/effects/check", data=form)).status_code == 403
        checked = await client.post("/ui/effects/check", data={**form, "csrf": token.group(1)})
        assert checked.status_code == 200, checked.text
        assert (
            '<td data-label="Says" id="journal-says">outcome unknown: handed over to a '
            "person</td>" in checked.text
        )
        assert 'id="provider-says">succeeded: it happened</td>' in checked.text
        assert '"shipped": "p-7"' in html.unescape(checked.text)
        assert "asked again in 30 seconds" in checked.text
        # At most once every 30 s per write, said in words; two asks at once: one asks.
        again = await client.post("/ui/effects/check", data={**form, "csrf": token.group(1)})
        assert again.status_code == 429 and "at most once every 30 s" in again.text
        assert "Ask again in" in again.text and "olga (key " in again.text
        await live.store.transact(
            lambda tx: tx.execute(
                "UPDATE events SET at = at - 60 WHERE run_id = :id AND type LIKE 'effect.%'",
                {"id": run_id},
            )
        )
        both = await asyncio.gather(*(
            client.post("/ui/effects/check", data={**form, "csrf": token.group(1)})
            for _ in range(2)
        ))  # fmt: skip
        assert sorted(r.status_code for r in both) == [200, 429]
    events = (await live.client.get(f"/v1/runs/{run_id}/events?format=json&limit=1000",
                                    headers=operator)).json()["events"]  # fmt: skip
    asked = [e for e in events if e["type"] == "effect.check_asked"]
    answered = [e for e in events if e["type"] == "effect.checked"]
    assert len(asked) == len(answered) == 2  # the refused asks are not recorded as asks
    for e in asked + answered:
        assert e["actor"].startswith("olga (key ") and e["actor"].endswith(", console)")
        assert e["data"]["key"] == "k-ship" and e["data"]["step_no"] == 4
    assert answered[0]["data"]["provider"] == "succeeded: it happened"
    assert answered[0]["data"]["journal"] == "outcome unknown: handed over to a person"
    assert answered[0]["data"]["result"] == {"shipped": "p-7", "key": "k-ship"}
    steps = await live.store.read(
        lambda tx: tx.fetchall(
            "SELECT status FROM steps WHERE run_id = :id AND step_no = 4", {"id": run_id}
        )
    )
    assert steps[0]["status"] == "unknown"  # the journal keeps its word
