"""Attacks on the console's inputs: hostile filters, forged cursors, hostile ids in
paths and forms, hostile text in runs. Every answer is a page (or a redirect) in
words, never a 500, on both backends."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

from agentledger.service._console.headers import CSP
from tests.service.conftest import Api
from tests.service.test_console_http import browser, csrf_of

_HOSTILE = [
    "\x00",
    "a\x00b",
    "' OR 1=1 --",
    '"; DROP TABLE runs; --',
    "%",
    "_",
    "\\",
    "é\u202e\ufeff",
    "\ud800",  # a lone surrogate (sent percent-encoded as UTF-8 of U+FFFD by httpx? see below)
    "x" * 199,
    "x" * 5000,
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
]
_NUMBERS = ["-1", "NaN", "nan", "inf", "-inf", "1e400", "9" * 40, "99999999999", "1e12",
            "0x10", "1_000", "١٢", " 3 "]  # fmt: skip
_TIMES = ["0001-01-01", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
          "2026-13-45", "yesterday", "\x00", "2026-01-01T00:00:00+99:00"]  # fmt: skip


# The values each filter of the runs page is sent. The text filters and the status are
# strings compared as they are (service/_console/runs.py, ``filters_of``): the numbers
# and times are strings like the hostile ones to them. Those that parse their value
# (numbers, times, the cursor) get the values their parsers could choke on.
_PARSED = [*_HOSTILE, *_NUMBERS, *_TIMES]
_RUNS_FILTERS = {
    **{name: _HOSTILE for name in ("agent", "version", "user", "error_class",
                                   "idempotency_key", "status")},
    **{name: _PARSED for name in ("cursor", "min_retries", "cost_min", "cost_max",
                                  "from", "to")},
}  # fmt: skip


def _q(value: str) -> str:
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def _assert_page(r: object, path: str) -> None:
    status = r.status_code  # type: ignore[attr-defined]
    assert status < 500, (path, status, r.text[:500])  # type: ignore[attr-defined]
    # 405: a hostile id holding "/" names no console route at all.
    assert status in (200, 303, 400, 403, 404, 405, 409), (path, status)
    if status != 303:
        assert r.headers["content-type"].startswith("text/"), (path, r.headers)  # type: ignore[attr-defined]
        assert r.headers["content-security-policy"] == CSP, path  # type: ignore[attr-defined]


async def test_hostile_runs_filters_answer_in_words_never_500(api: Api) -> None:
    key = await api.key("t1", "olga", ("admin",))
    await api.client.post("/v1/runs", json={"agent": "echo", "input": {"text": "x"}}, headers=key)
    async with browser(api, key) as client:
        for name, values in _RUNS_FILTERS.items():
            for value in values:
                path = f"/ui/runs?{name}={_q(value)}"
                r = await client.get(path)
                _assert_page(r, path)
                assert "<script>alert" not in r.text and "<img src=x" not in r.text
        # The same value twice, and many parameters at once.
        many = "&".join(f"p{i}=x" for i in range(2000))
        _assert_page(await client.get(f"/ui/runs?status=failed&status=x&{many}"), "many")


@pytest.mark.parametrize("page", ["/ui/effects", "/ui/numbers", "/ui/attention/resume"])
async def test_hostile_parameters_of_other_pages(api: Api, page: str) -> None:
    key = await api.key("t1", "olga", ("admin",))
    async with browser(api, key) as client:
        for name in ("cursor", "since", "status", "cause"):
            for value in [*_HOSTILE, *_NUMBERS]:
                path = f"{page}?{name}={_q(value)}"
                if name == "cause":
                    path = f"{page}?status=failed&cause={_q(value)}"
                _assert_page(await client.get(path), path)


async def test_hostile_ids_in_paths_are_404_pages(api: Api) -> None:
    key = await api.key("t1", "olga", ("admin",))
    async with browser(api, key) as client:
        token = await csrf_of(client)
        for value in _HOSTILE:
            rid = _q(value)
            for path in (f"/ui/runs/{rid}", f"/ui/runs/{rid}/story", f"/ui/runs/{rid}/events",
                         f"/ui/runs/{rid}/resume"):  # fmt: skip
                _assert_page(await client.get(path), path)
            for path, data in (
                (f"/ui/runs/{rid}/cancel", {}),
                (f"/ui/runs/{rid}/resume", {"from_step": "1"}),
                (f"/ui/approvals/{rid}/decision", {"decision": "approve", "arguments_hash": "x"}),
            ):
                r = await client.post(path, data={"csrf": token, **data})
                _assert_page(r, path)
                assert r.status_code in (400, 404, 405), (path, r.status_code)


async def test_hostile_form_fields_answer_in_words(api: Api) -> None:
    key = await api.key("t1", "olga", ("admin",))
    async with browser(api, key) as client:
        token = await csrf_of(client)
        for value in [*_HOSTILE, *_NUMBERS]:
            for path, data in (
                ("/ui/attention/resume", {"status": "failed", "cause": value, "runs": value}),
                ("/ui/attention/resume", {"status": value, "cause": ""}),
                ("/ui/approvals/nope/decision", {"decision": value, "arguments_hash": value}),
                ("/ui/approvals/nope/decision", {"decision": "approve", "reason": value,
                                                 "arguments_hash": value}),
            ):  # fmt: skip
                body = "&".join(f"{k}={_q(v)}" for k, v in {"csrf": token, **data}.items())
                r = await client.post(
                    path, content=body,
                    headers={"content-type": "application/x-www-form-urlencoded"},
                )  # fmt: skip
                _assert_page(r, path)


async def test_sse_hostile_last_event_id_and_after(api: Api) -> None:
    key = await api.key("t1", "olga", ("operator",))
    run = (await api.client.post("/v1/runs", json={"agent": "free", "input": 1},
                                 headers=key)).json()  # fmt: skip
    async with browser(api, key) as client:
        url = f"/ui/runs/{run['id']}/events"
        for value in ("-1", "abc", "1e3", str(2**63), "9" * 400, "NaN", "0x10"):
            r = await client.get(url, headers={"Last-Event-ID": value})
            _assert_page(r, value)
            assert r.status_code == 400 and "Last-Event-ID" in r.text, (value, r.text[:300])
            r = await client.get(f"{url}?after={_q(value)}")
            _assert_page(r, f"after={value}")
            assert r.status_code == 400, (value, r.status_code)
    # No session: to the sign-in form, nothing streamed.
    r = await api.client.get(url)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/signin")


async def test_model_and_user_text_never_becomes_markup(api: Api) -> None:
    """Hostile text in every field a user or model controls: agent input and output,
    the run's user id, an idempotency key shown in the list."""
    hostile = '"><img src=x onerror=alert(1)><svg><script>alert(2)</script></svg>'
    user = '"><script>alert(3)</script>'
    key = await api.key("t1", user, ("admin",))
    body = {"agent": "free", "input": {"answer": hostile, "link": "javascript:alert(4)"}}
    r = await api.client.post(
        "/v1/runs", json=body, headers={**key, "Idempotency-Key": "k-<script>x</script>"}
    )
    assert r.status_code in (200, 201, 202), r.text
    run = r.json()
    async with browser(api, key) as client:
        for path in (f"/ui/runs/{run['id']}", f"/ui/runs/{run['id']}/story", "/ui/runs",
                     f"/ui/runs?user={_q(user)}", "/ui/effects",
                     "/ui/attention", "/ui/approvals", "/ui/numbers"):  # fmt: skip
            page = await client.get(path)
            assert page.status_code == 200, (path, page.status_code)
            assert "<img src=x" not in page.text and "<script>alert" not in page.text, path
            assert 'href="javascript:' not in page.text.lower(), path
            assert not re.search(r"<script(?![^>]*src=\"/ui/static/console.js\")", page.text), path


async def test_check_now_hostile_fields_and_another_tenants_run(api: Api) -> None:
    """``/ui/effects/check`` takes a run id and a step number from its form: another
    tenant's run is a 404 page, a viewer is refused, a hostile step number is a page in
    words (never a 500), on both backends."""
    mine = await api.key("t1", "olga", ("operator",))
    viewer = await api.key("t1", "vera", ("viewer",))
    theirs = await api.key("t2", "fred", ("admin",))
    run = (await api.client.post("/v1/runs", json={"agent": "free", "input": 1},
                                 headers=mine)).json()  # fmt: skip
    async with browser(api, theirs) as client:
        token = await csrf_of(client)
        form = {"csrf": token, "run_id": run["id"], "step_no": "0"}
        r = await client.post("/ui/effects/check", data=form)
        _assert_page(r, "foreign")
        assert r.status_code == 404
    async with browser(api, viewer) as client:
        token = await csrf_of(client)
        form = {"csrf": token, "run_id": run["id"], "step_no": "0"}
        r = await client.post("/ui/effects/check", data=form)
        assert r.status_code == 403
    async with browser(api, mine) as client:
        token = await csrf_of(client)
        for step in ["-1", "0", "9" * 40, str(2**63), str(2**31), "1e3", "NaN", "١٢", "", "\x00"]:
            for rid in (run["id"], "\x00", "x" * 500):
                body = f"csrf={token}&run_id={_q(rid)}&step_no={_q(step)}"
                r = await client.post(
                    "/ui/effects/check", content=body,
                    headers={"content-type": "application/x-www-form-urlencoded"},
                )  # fmt: skip
                _assert_page(r, f"check {rid[:10]!r} {step[:10]!r}")
