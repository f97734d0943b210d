"""Attacks on the console's authorization: roles on every acting route, another
tenant's approval and run ids (one at a time and mixed into a bulk resume), four eyes,
a decision on arguments other than those shown, and resumes that must be refused; on
both backends."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from agentledger.service._console import sessions
from tests.service.conftest import Api, until
from tests.service.test_console_http import browser, csrf_of, live, parked

__all__ = ["live"]  # the fixture, used by name


async def _row(api: Api, run_id: str, key: dict[str, str]) -> dict[str, Any]:
    return dict((await api.client.get(f"/v1/runs/{run_id}", headers=key)).json())


async def _handed_over(api: Api, key: dict[str, str]) -> dict[str, Any]:
    run = (await api.client.post("/v1/runs", json={"agent": "over_budget"}, headers=key)).json()
    done = await api.client.get(f"/v1/runs/{run['id']}/result?wait=30", headers=key)
    assert done.json()["status"] == "needs_human"
    return await _row(api, run["id"], key)


async def test_another_tenants_approval_and_runs_are_404_and_untouched(live: Api) -> None:
    mine = await live.key("t1", "gina", ("guest",))
    t1_operator = await live.key("t1", "olga", ("operator",))
    theirs = await live.key("t2", "fred", ("admin",))
    run = await parked(live, mine)
    approval = run["pending_approval"]
    handed = await _handed_over(live, t1_operator)
    own = await _handed_over(live, await live.key("t2", "fred", ("operator",)))
    cause = (
        await live.store.read(
            lambda tx: tx.fetchall(
                "SELECT handover_reason FROM runs WHERE id = :i", {"i": handed["id"]}
            )
        )
    )[0]["handover_reason"]
    async with browser(live, theirs) as client:
        token = await csrf_of(client)
        for decision in ("approve", "reject"):
            r = await client.post(
                f"/ui/approvals/{approval['id']}/decision",
                data={"csrf": token, "decision": decision,
                      "arguments_hash": approval["arguments_hash"]},
            )  # fmt: skip
            assert r.status_code == 404 and "There is no such approval here" in r.text
            assert approval["id"] not in (await client.get("/ui/approvals")).text
        for path in (f"/ui/runs/{handed['id']}/resume", f"/ui/runs/{handed['id']}/events",
                     f"/ui/runs/{handed['id']}/story"):  # fmt: skip
            r = await client.get(path)
            assert r.status_code == 404 and "There is no" in r.text, path
        r = await client.post(
            f"/ui/runs/{handed['id']}/resume", data={"csrf": token, "from_step": "2"}
        )
        assert r.status_code == 404
        # A bulk resume of t2's own group with t1's run mixed in: refused as a whole.
        form = {"csrf": token, "status": "needs_human", "cause": cause}
        for runs in (f"{own['id']},{handed['id']}", handed["id"]):
            r = await client.post("/ui/attention/resume", data={**form, "runs": runs})
            assert r.status_code == 409 and "nothing was changed" in r.text, r.text[:400]
        assert handed["id"] not in (await client.get("/ui/attention/resume?" + _q(form))).text
    assert (await _row(live, handed["id"], t1_operator))["status"] == "needs_human"
    assert (await _row(live, own["id"], theirs))["status"] == "needs_human"
    pending = await _row(live, run["id"], mine)
    assert pending["pending_approval"] and pending["pending_approval"]["decision"] is None


def _q(form: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return urlencode({k: v for k, v in form.items() if k != "csrf"})


async def test_each_role_acts_only_within_its_role(live: Api) -> None:
    guest = await live.key("t1", "gina", ("guest",))
    viewer = await live.key("t1", "vera", ("viewer",))
    operator = await live.key("t1", "olga", ("operator",))
    manager = await live.key("t1", "mona", ("manager",))
    run = await parked(live, guest)
    approval = run["pending_approval"]
    handed = await _handed_over(live, guest)
    decide = {"decision": "approve", "arguments_hash": approval["arguments_hash"]}
    bulk = {"status": "needs_human", "cause": "x", "runs": ""}
    refused: dict[str, list[tuple[str, dict[str, str]]]] = {
        "viewer": [
            (f"/ui/runs/{run['id']}/cancel", {}),
            (f"/ui/runs/{handed['id']}/resume", {"from_step": "2"}),
            ("/ui/attention/resume", bulk),
            (f"/ui/approvals/{approval['id']}/decision", decide),
        ],
        "operator": [(f"/ui/approvals/{approval['id']}/decision", decide)],
        "manager": [
            (f"/ui/runs/{run['id']}/cancel", {}),  # another user's run
            (f"/ui/runs/{handed['id']}/resume", {"from_step": "2"}),
            ("/ui/attention/resume", bulk),
        ],
    }
    keys = {"viewer": viewer, "operator": operator, "manager": manager}
    for who, tries in refused.items():
        async with browser(live, keys[who]) as client:
            token = await csrf_of(client)
            for path, data in tries:
                r = await client.post(path, data={"csrf": token, **data})
                assert r.status_code == 403, (who, path, r.status_code, r.text[:300])
                assert r.headers["content-type"].startswith("text/html")
            if who != "viewer":
                assert (await client.get(f"/ui/runs/{handed['id']}/resume")).status_code == (
                    200 if who == "operator" else 403
                )
            numbers = await client.get("/ui/numbers")
            assert numbers.status_code == 403, who  # the five numbers: admins
    row = await _row(live, run["id"], guest)
    assert row["cancel_requested"] is None and row["pending_approval"]["decision"] is None
    assert (await _row(live, handed["id"], guest))["status"] == "needs_human"


async def test_four_eyes_the_requester_cannot_approve_their_own_run(live: Api) -> None:
    requester = await live.key("t1", "mona", ("manager",))
    other = await live.key("t1", "max", ("manager",))
    policy = {"role": "manager", "not_requester": True}
    body = {"agent": "payout", "input": {"amount": 99, "approval": policy}}
    run = (await live.client.post("/v1/runs", json=body, headers=requester)).json()

    async def waiting() -> bool:
        return bool((await _row(live, run["id"], requester))["pending_approval"])

    await until(waiting)
    approval = (await _row(live, run["id"], requester))["pending_approval"]
    async with browser(live, requester) as client:
        inbox = await client.get("/ui/approvals")
        assert approval["id"] not in inbox.text  # not offered to the requester
        token = await csrf_of(client)
        r = await client.post(
            f"/ui/approvals/{approval['id']}/decision",
            data={"csrf": token, "decision": "approve",
                  "arguments_hash": approval["arguments_hash"]},
        )  # fmt: skip
        assert r.status_code == 403 and "You may not decide this approval" in r.text
    assert (await _row(live, run["id"], requester))["pending_approval"]["decision"] is None
    async with browser(live, other) as client:
        token = await csrf_of(client, "/ui/approvals")
        r = await client.post(
            f"/ui/approvals/{approval['id']}/decision",
            data={"csrf": token, "decision": "approve",
                  "arguments_hash": approval["arguments_hash"]},
        )  # fmt: skip
        assert r.status_code == 303


async def test_a_decision_on_arguments_other_than_shown_is_refused(live: Api) -> None:
    guest = await live.key("t1", "gina", ("guest",))
    manager = await live.key("t1", "mona", ("manager",))
    run = await parked(live, guest, amount=500)
    approval = run["pending_approval"]
    async with browser(live, manager) as client:
        token = await csrf_of(client, "/ui/approvals")
        shown = approval["arguments_hash"]
        flipped = shown[:-1] + ("1" if shown[-1] != "1" else "2")
        for forged in ("0" * 64, flipped, shown.upper(), shown + " ", ""):
            r = await client.post(
                f"/ui/approvals/{approval['id']}/decision",
                data={"csrf": token, "decision": "approve", "arguments_hash": forged},
            )
            assert r.status_code in (400, 409), (forged, r.status_code)
            assert "look again" in r.text or "lacks the arguments" in r.text, r.text[:400]
    assert (await _row(live, run["id"], guest))["pending_approval"]["decision"] is None


async def test_a_run_that_is_not_resumable_is_not_resumed_nor_forced(live: Api) -> None:
    operator = await live.key("t1", "olga", ("operator",))
    done = (await live.client.post("/v1/runs", json={"agent": "payout", "input": {"amount": 5}},
                                   headers=operator)).json()  # fmt: skip
    result = await live.client.get(f"/v1/runs/{done['id']}/result?wait=30", headers=operator)
    assert result.json()["status"] == "completed"
    before = await live.client.get(
        f"/v1/runs/{done['id']}/events?format=json&limit=1000", headers=operator
    )
    handed = await _handed_over(live, operator)
    async with browser(live, operator) as client:
        token = await csrf_of(client)
        dry = await client.get(f"/ui/runs/{done['id']}/resume")
        assert dry.status_code == 200 and 'action="/ui/runs/' not in dry.text.split("<main")[1]
        for step in ("0", "1", "-1", "99"):
            r = await client.post(
                f"/ui/runs/{done['id']}/resume",
                data={"csrf": token, "from_step": step, "force": "yes", "reason": "again"},
            )
            assert r.status_code == 409 and "Nothing was changed" in r.text, (step, r.text[:300])
        # A handed-over run: only from the step its dry run shows, never an earlier one.
        for step in ("0", "1"):
            r = await client.post(
                f"/ui/runs/{handed['id']}/resume",
                data={"csrf": token, "from_step": step, "force": "yes", "reason": "again"},
            )
            assert r.status_code == 409, (step, r.status_code)
        # A force without a reason changes nothing either.
        r = await client.post(
            f"/ui/runs/{handed['id']}/resume",
            data={"csrf": token, "from_step": "2", "force": "yes"},
        )
        assert r.status_code == 400 and "needs a reason" in r.text
    after = await live.client.get(
        f"/v1/runs/{done['id']}/events?format=json&limit=1000", headers=operator
    )
    assert after.json()["events"] == before.json()["events"]  # the charge ran once
    assert (await _row(live, handed["id"], operator))["status"] == "needs_human"
    # A session is never a bearer key: the API refuses the console's cookie.
    async with browser(live, operator) as client:
        cookie = client.cookies.get(sessions.COOKIE)
    live.client.cookies.set(sessions.COOKIE, cookie or "")
    r = await live.client.get("/v1/runs")
    live.client.cookies.clear()
    assert r.status_code == 401


async def test_concurrent_resumes_and_cancels_of_one_run_act_once(api: Api) -> None:
    """Four resume forms posted at once (a double click, two tabs, two operators): one
    resumes, the others are refused in words; four cancels record one request."""
    operator = await api.key("t1", "olga", ("operator",))
    run = (
        await api.client.post("/v1/runs", json={"agent": "free", "input": 1}, headers=operator)
    ).json()
    await api.store.transact(
        lambda tx: tx.execute(
            "UPDATE runs SET status = 'needs_human', handover_reason = 'by hand' WHERE id = :i",
            {"i": run["id"]},
        )
    )
    async with browser(api, operator) as client:
        dry = await client.get(f"/ui/runs/{run['id']}/resume")
        step = re.search(r'name="from_step" value="(\d+)"', dry.text)
        assert step, dry.text
        token = await csrf_of(client)
        form = {"csrf": token, "from_step": step.group(1), "reason": "go"}
        answers = await asyncio.gather(
            *(client.post(f"/ui/runs/{run['id']}/resume", data=form) for _ in range(4))
        )
        codes = sorted(r.status_code for r in answers)
        assert codes == [303, 409, 409, 409], codes
        cancels = await asyncio.gather(
            *(client.post(f"/ui/runs/{run['id']}/cancel", data={"csrf": token, "reason": f"r{i}"})
              for i in range(4))
        )  # fmt: skip
        assert all(r.status_code in (303, 409) for r in cancels), [r.status_code for r in cancels]
    events = (
        await api.client.get(
            f"/v1/runs/{run['id']}/events?format=json&limit=1000", headers=operator
        )
    ).json()["events"]
    assert len([e for e in events if e["type"] == "run.resumed"]) == 1
    assert len([e for e in events if e["type"] in ("run.cancel_requested", "run.cancelled")]) == 1
