"""The console in a real headless Chromium (the system's, driven by Playwright), with
every host but the service unreachable: an approver signs in, approves a booking from
the inbox and the run's page turns completed live; a stale approval says so in words;
axe-core finds no serious or critical violation; screenshots at two widths."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import html
import http.server
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentledger.service._auth import create_key
from agentledger.store import open_store
from tests.conftest import _skip_or_fail
from tests.service.conftest import PEPPER, served, settings_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: Where screenshots go when asked (``make screenshots`` sets it to docs/screenshots);
#: otherwise into the test's temporary directory, so a test run leaves the tree clean.
SHOTS_ENV = "AGENTLEDGER_SCREENSHOTS"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
    # Offline but for the service: any other host does not resolve.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]  # fmt: skip
WIDTHS = (1280, 390)


@dataclass
class Console:
    """The served app, its database and the keys of its people."""

    base: str
    db_url: str
    keys: dict[str, str]
    browser: Any

    def api(self, who: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.base, headers={"Authorization": f"Bearer {self.keys[who]}"}
        )

    def sql(self, statement: str, params: dict[str, Any]) -> None:
        async def run() -> None:
            store = open_store(self.db_url)
            await store.open()
            try:
                await store.transact(lambda tx: tx.execute(statement, params))
            finally:
                await store.close()

        # Playwright's sync API runs a loop on this thread: the store gets one of its own.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, run()).result()


PEOPLE = {
    "gina": ("t1", ("guest",)),
    "mona": ("t1", ("manager",)),
    "olga": ("t1", ("admin",)),
    "vera": ("t1", ("viewer",)),
    "tara": ("t2", ("guest",)),  # another tenant
}


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """One server (with an inline worker) and one browser for the module."""
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        _skip_or_fail("chromium not installed (apt-get install chromium)")
    try:
        from playwright import sync_api
    except ImportError:
        _skip_or_fail("playwright not installed (pip install -e '.[dev]')")
        raise
    url = f"sqlite:///{tmp_path_factory.mktemp('console') / 'ui.db'}"

    async def mint() -> dict[str, str]:
        store = open_store(url)
        await store.open()
        try:
            out = {}
            for who, (tenant, roles) in PEOPLE.items():
                out[who], _ = await create_key(store, PEPPER, tenant, who, list(roles), 3600)
            return out
        finally:
            await store.close()

    keys = asyncio.run(mint())
    with served(settings_for(url, workers_inline=1)) as srv, sync_api.sync_playwright() as p:
        executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=executable, args=ARGS)
        try:
            yield Console(srv.base_url, url, keys, browser)
        finally:
            browser.close()


def parked(c: Console, amount: int) -> dict[str, Any]:
    """A booking-like run: its payment waits for a manager's approval."""
    with c.api("gina") as api:
        body = {"agent": "payout", "input": {"amount": amount, "approval": {"role": "manager"}}}
        run = api.post("/v1/runs", json=body).json()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = api.get(f"/v1/runs/{run['id']}").json()
            if row["status"] == "waiting" and row["pending_approval"]:
                return dict(row)
            time.sleep(0.05)
    raise AssertionError("the run never waited for its approval")


def signed_in(c: Console, who: str, width: int = 1280) -> Any:
    """A page of a new browser context (its own cookies) signed in as ``who``, by
    keyboard: the key typed into the labelled field and Enter."""
    context = c.browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.goto(f"{c.base}/ui/runs")
    assert "/ui/signin" in page.url
    page.get_by_label("API key").fill(c.keys[who])
    page.keyboard.press("Enter")
    page.wait_for_url(f"{c.base}/ui/runs")
    return page


def test_an_approver_approves_and_the_runs_page_turns_completed_live(console: Console) -> None:
    from playwright.sync_api import expect

    manager = signed_in(console, "mona")  # on the runs list
    run = parked(console, 480)
    # The list takes the new run in without a reload.
    row = manager.locator(f"tr[data-run='{run['id']}']")
    expect(row).to_contain_text("waiting for approval", timeout=15_000)
    watcher = signed_in(console, "gina")
    watcher.goto(f"{console.base}/ui/runs/{run['id']}")
    expect(watcher.locator("#run-status")).to_have_text("waiting")

    manager.get_by_role("link", name="Approvals").click()
    card = manager.locator(f"#approval-{run['pending_approval']['id']}")
    expect(card.locator("dd.arg-amount")).to_have_text("480")
    expect(card).to_contain_text("Asked by gina")
    # By keyboard: the reason field, then Tab to Approve and Enter.
    card.get_by_label("Reason (recorded with your decision)").fill("corporate rate")
    manager.keyboard.press("Tab")
    expect(card.get_by_role("button", name="Approve")).to_be_focused()
    manager.keyboard.press("Enter")
    expect(manager.get_by_role("status")).to_have_text("Approved: the run goes on.")

    # The watcher never reloads: the event stream brings the run's end to its page.
    expect(watcher.locator("#run-status")).to_have_text("completed", timeout=30_000)
    effects = watcher.locator("table:has(caption:text('Effects table')) tbody tr")
    expect(effects).to_have_count(1)
    expect(effects.first).to_contain_text("done")
    expect(watcher.locator("#run-result")).to_contain_text('"paid": 480')
    writes = watcher.locator("table:has(caption:text('Writes')) tbody tr")
    expect(writes).to_have_count(1)  # one charge, under its key
    expect(writes.first).to_contain_text("pay")
    expect(writes.first).to_contain_text("confirmed")
    key = writes.first.locator("code").first.inner_text()
    assert key.strip(), "the write shows its key"
    # The ledger across runs says the same of this run: one write, confirmed, that key.
    watcher.goto(f"{console.base}/ui/effects")
    ledger = watcher.locator(
        f"table:has(caption:text('All writes')) tbody tr:has(a[href^='/ui/runs/{run['id']}'])"
    )
    expect(ledger).to_have_count(1)
    expect(ledger.first).to_contain_text("confirmed")
    expect(ledger.first.locator("code")).to_have_text(key)
    watcher.context.close()
    manager.context.close()


def test_the_runs_list_takes_in_and_changes_runs_without_a_reload(console: Console) -> None:
    """A run submitted while the list is open appears, and turns completed when it is
    approved elsewhere: the page is never loaded again, and it makes no request of its
    own (no polling): the server's stream brings the rows."""
    from playwright.sync_api import expect

    page = signed_in(console, "olga")
    page.evaluate("window.loadedOnce = true")
    fetched: list[str] = []
    page.on("request", lambda r: fetched.append(r.url))
    run = parked(console, 64)
    row = page.locator(f"tr[data-run='{run['id']}']")
    expect(row).to_contain_text("waiting for approval", timeout=15_000)
    approval = run["pending_approval"]
    with console.api("mona") as api:
        decided = api.post(
            f"/v1/approvals/{approval['id']}/decision",
            json={"decision": "approve", "arguments_hash": approval["arguments_hash"]},
        )
        assert decided.status_code == 200, decided.text
    expect(row.locator(".status")).to_have_text("completed", timeout=30_000)
    assert page.evaluate("window.loadedOnce === true")  # the same document throughout
    assert fetched == [], fetched  # the stream was opened before; nothing asked since
    page.context.close()


def test_a_stale_approval_says_the_arguments_changed(console: Console) -> None:
    from playwright.sync_api import expect

    run = parked(console, 75)
    approval = run["pending_approval"]
    manager = signed_in(console, "mona")
    manager.goto(f"{console.base}/ui/approvals")
    card = manager.locator(f"#approval-{approval['id']}")
    expect(card.locator("dd.arg-amount")).to_have_text("75")
    # The proposal changes after the manager was shown it.
    console.sql(
        "UPDATE approvals SET arguments = :a WHERE id = :id",
        {"a": '{"amount": 7500}', "id": approval["id"]},
    )
    card.get_by_role("button", name="Approve").click()
    expect(manager.get_by_role("alert")).to_contain_text("The arguments changed, look again")
    # Shown again, with what it proposes now; nothing was decided.
    expect(manager.locator(f"#approval-{approval['id']} dd.arg-amount")).to_have_text("7500")
    with console.api("gina") as api:
        assert api.get(f"/v1/runs/{run['id']}").json()["pending_approval"]["decision"] is None
    manager.context.close()


def test_a_viewer_cannot_decide_a_forged_post_is_refused_a_foreign_run_is_404(
    console: Console,
) -> None:
    """No approve button for a viewer; an approver's browser made to POST a decision
    without the session's CSRF token (by a script on the console's page, and by a form
    on another origin of the same site, whose requests carry the cookie) is refused and
    nothing is decided; another tenant's run id is the plain 404 page."""
    from playwright.sync_api import expect

    run = parked(console, 33)
    approval = run["pending_approval"]
    viewer = signed_in(console, "vera")
    viewer.goto(f"{console.base}/ui/approvals")
    expect(viewer.locator("main")).to_contain_text("Nothing waits for your decision.")
    expect(viewer.get_by_role("button", name="Approve")).to_have_count(0)
    viewer.goto(f"{console.base}/ui/runs/{run['id']}")
    expect(viewer.locator("#run-status")).to_have_text("waiting")
    expect(viewer.locator("main button")).to_have_count(0)  # nor cancel, nor resume

    with console.api("tara") as theirs:
        foreign = theirs.post("/v1/runs", json={"agent": "free", "input": {"x": 1}}).json()
    response = viewer.goto(f"{console.base}/ui/runs/{foreign['id']}")
    assert response is not None and response.status == 404
    expect(viewer.locator("main h1")).to_have_text("Not found")
    expect(viewer.locator("main")).not_to_contain_text("free")  # not even the agent's name
    viewer.context.close()

    manager = signed_in(console, "mona")
    decision = f"{console.base}/ui/approvals/{approval['id']}/decision"
    fields = {"decision": "approve", "arguments_hash": approval["arguments_hash"],
              "reason": "forged"}  # fmt: skip
    status = manager.evaluate(
        "async ([url, fields]) => (await fetch(url, {method: 'POST', "
        "body: new URLSearchParams(fields), credentials: 'include'})).status",
        [decision, fields],
    )
    assert status == 403
    with attacker_page(decision, fields) as evil, manager.expect_response(decision) as answer:
        manager.goto(evil)
    assert answer.value.status == 403
    expect(manager.locator("main h1")).to_have_text("Refused")
    with console.api("gina") as api:
        assert api.get(f"/v1/runs/{run['id']}").json()["pending_approval"]["decision"] is None
    manager.context.close()


@contextlib.contextmanager
def attacker_page(action: str, fields: dict[str, str]) -> Iterator[str]:
    """A page on a second loopback server (another origin, the same site: the browser
    sends the console's SameSite cookie with its form) that posts ``fields`` to
    ``action`` as soon as it loads; yields its URL."""
    inputs = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
        for k, v in fields.items()
    )
    body = (
        f'<!doctype html><form method="post" action="{html.escape(action)}">{inputs}</form>'
        "<script>document.forms[0].submit()</script>"
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/offer"
    finally:
        server.shutdown()
        server.server_close()


def handed_over(c: Console, journal: list[tuple[int, str, str, str, str, str]]) -> str:
    """A run handed to a person (over its step budget), with ``journal`` rows (step,
    kind, name, status, key, input JSON) written after its own first step."""
    with c.api("olga") as api:
        run = api.post("/v1/runs", json={"agent": "over_budget"}).json()
        assert api.get(f"/v1/runs/{run['id']}/result?wait=30").json()["status"] == "needs_human"
    for no, kind, name, status, key, data in journal:
        c.sql(
            "INSERT INTO steps (run_id, step_no, kind, name, status, input, attempts, "
            "lease_epoch, idempotency_key) VALUES (:id, :no, :kind, :name, :status, :input, "
            "1, 1, :key)",
            {"id": run["id"], "no": no, "kind": kind, "name": name, "status": status,
             "input": data, "key": key or None},
        )  # fmt: skip
    return str(run["id"])


def test_a_resume_shows_its_dry_run_before_the_button(console: Console) -> None:
    """The resume page lists the side effects from the resume's step on, each with its
    state and key (a confirmed charge, its compensation, an unknown payment) before any
    button: a plan that would repeat confirmed effects resumes only with the force
    option ticked and a reason (the audit trail then names who, why and the effects);
    one that only status-checks an unknown write has the button after the list."""
    from playwright.sync_api import expect

    refused = handed_over(console, [
        (2, "step", "second", "failed", "", "{}"),
        (3, "tool", "charge", "succeeded", "k-charge", '{"amount": 5}'),
        (4, "compensation", "refund", "succeeded", "k-refund", '{"compensates": 3}'),
        (5, "tool", "pay", "unknown", "k-pay", '{"status_check": true}'),
    ])  # fmt: skip
    resumable = handed_over(console, [
        (2, "tool", "pay", "unknown", "k-pay-2", '{"status_check": true}'),
    ])  # fmt: skip
    page = signed_in(console, "olga")
    page.goto(f"{console.base}/ui/runs/{refused}/resume")
    dry = page.locator("table:has(caption:text('dry run')) tbody tr")
    expect(dry).to_have_count(3)
    states = {row.locator("code").inner_text(): row.inner_text() for row in dry.all()}
    assert "confirmed" in states["k-charge"] and "compensated" in states["k-charge"]
    assert "confirmed" in states["k-refund"] and "compensated" in states["k-refund"]
    assert "unknown" in states["k-pay"] and "status-checked" in states["k-pay"]
    warning = page.locator("#force-needed")
    expect(warning).to_contain_text("2 confirmed effects would run again")
    force = page.get_by_label(re.compile("Force: re-execute these 2 confirmed effects"))
    expect(force).not_to_be_checked()
    button = page.get_by_role("button", name="Resume from step 2")
    # Its list and the force option come before the button (reading and Tab order).
    for before in (dry.first, force):
        assert page.evaluate(
            "([a, b]) => !!(a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING)",
            [before.element_handle(), button.element_handle()],
        )
    from axe_playwright_python.sync_playwright import Axe

    found = Axe().run(page).response["violations"]
    assert not [v["id"] for v in found if v["impact"] in ("serious", "critical")]
    page.get_by_label(re.compile("^Reason")).fill("charged by hand twice, refunded")
    button.click()  # without the force option: refused in words, nothing changed
    expect(page.locator("main h1")).to_have_text("Not resumed")
    expect(page.locator("main")).to_contain_text("tick the force option and give a reason")
    with console.api("olga") as api:
        assert api.get(f"/v1/runs/{refused}").json()["status"] == "needs_human"
    page.goto(f"{console.base}/ui/runs/{refused}/resume")
    page.get_by_label(re.compile("Force: re-execute")).check()
    page.get_by_label(re.compile("^Reason")).fill("charged by hand twice, refunded")
    page.get_by_role("button", name="Resume from step 2").click()
    page.wait_for_url(f"{console.base}/ui/runs/{refused}")
    with console.api("olga") as api:
        events = api.get(f"/v1/runs/{refused}/events?format=json&limit=1000").json()["events"]
    (resumed,) = [e for e in events if e["type"] == "run.resumed"]
    assert resumed["actor"].startswith("olga (key ") and resumed["actor"].endswith(", console)")
    assert resumed["data"]["reason"] == "charged by hand twice, refunded"
    assert sorted(e["key"] for e in resumed["data"]["forced"]) == ["k-charge", "k-refund"]

    page.goto(f"{console.base}/ui/runs/{resumable}/resume")
    row = page.locator("table:has(caption:text('dry run')) tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("unknown")
    expect(row.locator("code")).to_have_text("k-pay-2")
    button = page.get_by_role("button", name="Resume from step 3")
    expect(button).to_be_visible()
    # The list comes first in the page's order (what a screen reader and Tab reach first).
    follows = page.evaluate(
        "([t, b]) => !!(t.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING)",
        [row.element_handle(), button.element_handle()],
    )
    assert follows
    page.context.close()


def shots_dir(tmp_path: Path) -> Path:
    """The folder screenshots are written to: ``$AGENTLEDGER_SCREENSHOTS`` (relative to
    the project's root) when set, else ``tmp_path``."""
    asked = os.environ.get(SHOTS_ENV, "").strip()
    return (ROOT / asked) if asked else tmp_path


def test_pages_pass_axe_and_are_shot_at_two_widths(console: Console, tmp_path: Path) -> None:
    from axe_playwright_python.sync_playwright import Axe

    run = parked(console, 120)
    with console.api("olga") as api:
        handed = api.post("/v1/runs", json={"agent": "over_budget"}).json()
        # A few days of history, so the numbers page's charts have lines to draw: the
        # runs submitted together (the worker runs them side by side), each finished one
        # then moved back by its days.
        history = [
            (day, n, api.post("/v1/runs", json={"agent": "free", "input": {"n": n}}).json())
            for day in range(1, 5)
            for n in range(day % 3 + 1)
        ]
        assert api.get(f"/v1/runs/{handed['id']}/result?wait=30").json()["status"] == "needs_human"
        for day, n, done in history:
            assert api.get(f"/v1/runs/{done['id']}/result?wait=30").status_code == 200
            console.sql(
                "UPDATE runs SET created_at = created_at - :back, "
                "updated_at = updated_at - :back, cost_usd = :cost WHERE id = :id",
                {"back": day * 86400, "cost": 0.01 * (day + n), "id": done["id"]},
            )
    shots = shots_dir(tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    axe = Axe()
    pages = {
        "runs": "/ui/runs",
        "run": f"/ui/runs/{run['id']}",
        "approvals": "/ui/approvals",
        "resume": f"/ui/runs/{handed['id']}/resume",
        "numbers": "/ui/numbers",
        "attention": "/ui/attention",
        "effects": "/ui/effects",
    }
    page = signed_in(console, "olga", WIDTHS[0])  # every button shows
    for width in WIDTHS:
        # Each page is loaded anew at this width: laid out for it from the start.
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in pages.items():
            page.goto(f"{console.base}{path}")
            page.locator("main h1").wait_for()
            results = axe.run(page)
            bad = [
                (v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3])
                for v in results.response["violations"]
                if v["impact"] in ("serious", "critical")
            ]
            assert not bad, (name, width, bad)
            # Nothing wider than the window: usable without scrolling sideways.
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            wide = page.evaluate(
                "Array.from(document.querySelectorAll('body *')).filter(e => "
                "e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)"
                ".slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' + "
                "Math.round(e.getBoundingClientRect().right))"
            )
            assert overflow <= 1, (name, width, overflow, wide)
            page.screenshot(path=str(shots / f"console-{name}-{width}.png"), full_page=True)
    page.context.close()
