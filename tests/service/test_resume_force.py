"""A resume that would re-execute a confirmed effect needs an explicit force with a
reason, the same through the API, the console (one run and a group) and the command
line; the audit trail records who forced it, why and the effects, on both backends."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.service.conftest import Api, in_process, settings_for
from tests.service.test_console_http import _CSRF, browser

CAUSE = "step budget reached (1 of 1 steps)"


@pytest.fixture
async def live(store_url: str) -> AsyncIterator[Api]:
    async with in_process(settings_for(store_url, workers_inline=1)) as a:
        yield a


async def _handed_over(api: Api, headers: dict[str, str], confirmed: bool) -> str:
    """A needs_human run; with ``confirmed``, its journal says step 2 failed and step 3,
    a payment under key ``k-<run>``, succeeded: resuming from step 2 calls it again."""
    r = await api.client.post("/v1/runs", json={"agent": "over_budget"}, headers=headers)
    run_id = str(r.json()["id"])
    done = await api.client.get(f"/v1/runs/{run_id}/result?wait=30", headers=headers)
    assert done.json()["status"] == "needs_human"
    if confirmed:
        for no, kind, name, status, key in (
            (2, "step", "second", "failed", None),
            (3, "tool", "pay", "succeeded", f"k-{run_id}"),
        ):
            await api.store.transact(
                lambda tx, no=no, kind=kind, name=name, status=status, key=key: tx.execute(
                    "INSERT INTO steps (run_id, step_no, kind, name, status, input, attempts, "
                    "lease_epoch, idempotency_key) VALUES (:id, :no, :kind, :name, :status, "
                    "'{}', 1, 1, :key)",
                    {"id": run_id, "no": no, "kind": kind, "name": name, "status": status,
                     "key": key},
                )
            )  # fmt: skip
    return run_id


async def _resumed(api: Api, run_id: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    r = await api.client.get(f"/v1/runs/{run_id}/events?format=json&limit=1000", headers=headers)
    return [e for e in r.json()["events"] if e["type"] == "run.resumed"]


async def _status(api: Api, run_id: str, headers: dict[str, str]) -> str:
    return str((await api.client.get(f"/v1/runs/{run_id}", headers=headers)).json()["status"])


async def test_the_api_refuses_without_force_and_records_a_forced_resume(live: Api) -> None:
    olga = await live.key("t1", "olga", ("operator",))
    vera = await live.key("t1", "vera", ("viewer",))
    fred = await live.key("t2", "fred", ("operator",))
    run_id = await _handed_over(live, olga, confirmed=True)
    url = f"/v1/runs/{run_id}/resume"
    dry = await live.client.post(url, json={"dry_run": True}, headers=olga)
    assert dry.status_code == 200, dry.text
    plan = dry.json()
    assert plan["from_step"] == 2 and plan["needs_force"] and not plan["refused"]
    assert plan["forced"] == [{"step_no": 3, "kind": "tool", "name": "pay",
                               "status": "succeeded", "idempotency_key": f"k-{run_id}",
                               "state": "confirmed", "key": f"k-{run_id}"}]  # fmt: skip
    refused = await live.client.post(url, json={}, headers=olga)
    assert refused.status_code == 409, refused.text
    problem = refused.json()
    assert problem["type"].endswith("/resume-needs-force")
    assert f"k-{run_id}" in problem["detail"] and "force" in problem["detail"]
    no_reason = await live.client.post(url, json={"force": True, "reason": " "}, headers=olga)
    assert no_reason.status_code == 422 and "force needs a reason" in no_reason.text
    assert (await live.client.post(url, json={"force": True, "reason": "x"},
                                   headers=vera)).status_code == 403  # fmt: skip
    assert (await live.client.post(url, json={"force": True, "reason": "x"},
                                   headers=fred)).status_code == 404  # fmt: skip
    assert await _resumed(live, run_id, olga) == []  # nothing of that changed anything
    assert await _status(live, run_id, olga) == "needs_human"
    forced = await live.client.post(
        url, json={"force": True, "reason": "the provider refunded it"}, headers=olga
    )
    assert forced.status_code == 200, forced.text
    (event,) = await _resumed(live, run_id, olga)
    assert event["actor"].startswith("olga (key ") and event["actor"].endswith(")")
    assert event["data"]["reason"] == "the provider refunded it"
    assert event["data"]["forced"] == plan["forced"]
    # A plain run (nothing confirmed after its step): resumed without force.
    plain = await _handed_over(live, olga, confirmed=False)
    ok = await live.client.post(f"/v1/runs/{plain}/resume", json={}, headers=olga)
    assert ok.status_code == 200 and ok.json()["forced"] == [], ok.text
    (event,) = await _resumed(live, plain, olga)
    assert event["data"]["forced"] is None


async def test_the_console_needs_the_force_option_and_a_reason(live: Api) -> None:
    olga = await live.key("t1", "olga", ("operator",))
    run_id = await _handed_over(live, olga, confirmed=True)
    url = f"/ui/runs/{run_id}/resume"
    async with browser(live, olga) as client:
        dry = await client.get(url)
        assert "1 confirmed effect would run again" in dry.text, dry.text
        assert f"key <code>k-{run_id}</code>" in dry.text
        assert 'name="force" value="yes"' in dry.text
        token = _CSRF.search(dry.text).group(1)  # type: ignore[union-attr]
        form = {"csrf": token, "from_step": "2", "forced": "3", "reason": "refunded"}
        unticked = await client.post(url, data=form)
        assert unticked.status_code == 409 and "tick the force option" in unticked.text
        no_reason = await client.post(url, data={**form, "force": "yes", "reason": ""})
        assert no_reason.status_code == 400 and "needs a reason" in no_reason.text
        other = await client.post(url, data={**form, "force": "yes", "forced": "2"})
        assert other.status_code == 409 and "not the ones you were shown" in other.text
        assert await _resumed(live, run_id, olga) == []
        ok = await client.post(url, data={**form, "force": "yes"})
        assert ok.status_code == 303, ok.text
    (event,) = await _resumed(live, run_id, olga)
    assert event["actor"].endswith(", console)") and event["data"]["reason"] == "refunded"
    assert [e["key"] for e in event["data"]["forced"]] == [f"k-{run_id}"]


async def test_a_bulk_resume_counts_and_forces_only_when_asked(live: Api) -> None:
    olga = await live.key("t1", "olga", ("operator",))
    plain = await _handed_over(live, olga, confirmed=False)
    confirmed = await _handed_over(live, olga, confirmed=True)
    query = urlencode({"status": "needs_human", "cause": CAUSE})
    async with browser(live, olga) as client:
        dry = await client.get(f"/ui/attention/resume?{query}")
        assert ("Dry run: 1 run would resume, 1 only if forced (1 confirmed effect would run "
                "again), 0 would be refused") in dry.text, dry.text  # fmt: skip
        token = _CSRF.search(dry.text).group(1)  # type: ignore[union-attr]
        runs = re.search(r'name="runs" value="([^"]*)"', dry.text).group(1)  # type: ignore[union-attr]
        forced = re.search(r'name="forced_runs" value="([^"]*)"', dry.text).group(1)  # type: ignore[union-attr]
        assert (runs, forced) == (plain, confirmed)
        mark = re.search(r'name="forced_effects" value="([^"]+)"', dry.text).group(1)  # type: ignore[union-attr]
        form = {"csrf": token, "status": "needs_human", "cause": CAUSE, "runs": runs,
                "forced_runs": forced, "forced_effects": mark,
                "reason": "after the fix"}  # fmt: skip
        other = await client.post("/ui/attention/resume",
                                  data={**form, "force": "yes", "forced_effects": "1"})  # fmt: skip
        assert other.status_code == 409 and "changed since you looked" in other.text
        no_reason = await client.post("/ui/attention/resume",
                                      data={**form, "force": "yes", "reason": ""})  # fmt: skip
        assert no_reason.status_code == 400
        done = await client.post("/ui/attention/resume", data={**form, "force": "yes"})
        assert done.status_code == 200, done.text
        assert done.text.count(": resumed</li>") == 1
        assert done.text.count(": resumed, forced</li>") == 1
    (event,) = await _resumed(live, confirmed, olga)
    assert event["data"]["forced"] and event["data"]["reason"] == "after the fix"
    (event,) = await _resumed(live, plain, olga)
    assert event["data"]["forced"] is None


async def test_a_bulk_resume_without_the_force_leaves_the_confirmed_run(live: Api) -> None:
    olga = await live.key("t1", "olga", ("operator",))
    plain = await _handed_over(live, olga, confirmed=False)
    confirmed = await _handed_over(live, olga, confirmed=True)
    query = urlencode({"status": "needs_human", "cause": CAUSE})
    async with browser(live, olga) as client:
        dry = await client.get(f"/ui/attention/resume?{query}")
        token = _CSRF.search(dry.text).group(1)  # type: ignore[union-attr]
        form = {"csrf": token, "status": "needs_human", "cause": CAUSE, "runs": plain,
                "forced_runs": confirmed,
                "reason": "after the fix"}  # fmt: skip
        done = await client.post("/ui/attention/resume", data=form)
        assert done.status_code == 200 and done.text.count(": resumed</li>") == 1
        assert "the force option was not ticked" in done.text
    assert await _resumed(live, confirmed, olga) == []
    assert await _status(live, confirmed, olga) == "needs_human"


async def _write_step(api: Api, run_id: str, no: int, key: str | None) -> None:
    """An executed payment at step ``no`` of ``run_id`` (``key`` None: none there)."""

    def change(tx: Any) -> None:
        tx.execute("DELETE FROM steps WHERE run_id = :id AND step_no = :no",
                   {"id": run_id, "no": no})  # fmt: skip
        if key is not None:
            tx.execute(
                "INSERT INTO steps (run_id, step_no, kind, name, status, input, attempts, "
                "lease_epoch, idempotency_key) VALUES (:id, :no, 'tool', 'pay', 'succeeded', "
                "'{}', 1, 1, :key)",
                {"id": run_id, "no": no, "key": key},
            )

    await api.store.transact(change)


async def test_a_bulk_force_refuses_other_confirmed_effects_than_the_dry_run_showed(
    live: Api,
) -> None:
    """Between the dry run and the POST, one forced run gains a confirmed effect and
    another loses one: the same runs, the same count, other effects (keys the person
    was never shown). The force re-executes nothing."""
    olga = await live.key("t1", "olga", ("operator",))
    one = await _handed_over(live, olga, confirmed=True)
    two = await _handed_over(live, olga, confirmed=True)
    await _write_step(live, two, 4, f"k2-{two}")
    query = urlencode({"status": "needs_human", "cause": CAUSE})
    async with browser(live, olga) as client:
        dry = await client.get(f"/ui/attention/resume?{query}")
        assert "(3 confirmed effects would run again)" in dry.text, dry.text
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', dry.text))
        await _write_step(live, one, 4, f"k-new-{one}")
        await _write_step(live, two, 4, None)
        done = await client.post(
            "/ui/attention/resume", data={**fields, "force": "yes", "reason": "refunded"}
        )
        assert done.status_code == 409 and "changed since you looked" in done.text
    assert await _resumed(live, one, olga) == await _resumed(live, two, olga) == []


async def test_the_api_takes_a_resumes_fields_only_as_their_own_json_types(live: Api) -> None:
    """``"force": "yes"``, ``"dry_run": "false"`` (which would resume for real) or
    ``"from_step": true`` (step 1: the whole run again) are refused as they are, not
    read as a bool or a number; nothing is resumed."""
    olga = await live.key("t1", "olga", ("operator",))
    run_id = await _handed_over(live, olga, confirmed=False)
    url = f"/v1/runs/{run_id}/resume"
    for body in (
        {"force": "yes", "reason": "x"},
        {"force": 1, "reason": "x"},
        {"dry_run": "false"},
        {"dry_run": 0},
        {"from_step": True},
        {"from_step": "2"},
        {"from_step": 2.0},
    ):
        r = await live.client.post(url, json=body, headers=olga)
        assert r.status_code == 422, (body, r.text)
    assert await _resumed(live, run_id, olga) == []
    assert await _status(live, run_id, olga) == "needs_human"
    ok = await live.client.post(url, json={"dry_run": True, "from_step": 2}, headers=olga)
    assert ok.status_code == 200 and ok.json()["from_step"] == 2, ok.text


async def test_the_api_dry_run_names_a_failed_compensation_checked_first(live: Api) -> None:
    """A needs_human run whose refund (step 4) failed after it was called, its tool with
    a status check: the API's dry run lists it as status-checked first, with its key."""
    olga = await live.key("t1", "olga", ("operator",))
    run_id = await _handed_over(live, olga, confirmed=False)
    decision = '{"status": "failed", "plan": [[2, 4]]}'
    for no, kind, name, status, key, input_, output in (
        (2, "tool", "pay", "succeeded", f"k-{run_id}", "{}", "{}"),
        (3, "decision", "compensate", "succeeded", None, "{}", decision),
        (4, "compensation", "refund", "failed", f"r-{run_id}",
         '{"args": {}, "compensates": 2, "status_check": true}', "null"),
    ):  # fmt: skip
        await live.store.transact(
            lambda tx, no=no, kind=kind, name=name, status=status, key=key, i=input_, o=output: (
                tx.execute(
                    "INSERT INTO steps (run_id, step_no, kind, name, status, input, output, "
                    "attempts, lease_epoch, idempotency_key) VALUES (:id, :no, :kind, :name, "
                    ":status, :i, :o, 1, 1, :key)",
                    {"id": run_id, "no": no, "kind": kind, "name": name, "status": status,
                     "key": key, "i": i, "o": o},
                )
            )
        )  # fmt: skip
    dry = await live.client.post(f"/v1/runs/{run_id}/resume", json={"dry_run": True}, headers=olga)
    assert dry.status_code == 200, dry.text
    plan = dry.json()
    assert plan["compensations_checked"] == [4] and plan["compensations_again"] == [], plan
    (effect,) = [e for e in plan["effects"] if e["step_no"] == 4]
    assert effect["key"] == f"r-{run_id}" and "status-checked" in effect["action"], effect
