"""Webhook targets inside the deployment's network are refused (issue 19, point 9):
at submit (422 problem+json) and again at delivery, after name resolution, with the
resolved address pinned for the connection; an operator allows hosts by configuration."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agentledger.errors import UsageError
from agentledger.service._egress import Egress, Refused
from agentledger.service._queries import webhooks as service_webhooks
from tests.loopback_http import QuietHandler, serving
from tests.service.conftest import Api, in_process, settings_for, until

INTERNAL = [
    "http://127.0.0.1:9/hook",
    "http://127.1/hook",  # short forms the resolver reads as 127.0.0.1
    "http://2130706433/hook",
    "http://0x7f.0.0.1/hook",
    "http://localhost:5432/",  # a name that resolves to loopback
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]:6379/",
    "http://[::ffff:127.0.0.1]/hook",
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",
    "http://0.0.0.0:8000/hook",
    "http://224.0.0.1/hook",
    "https://[fe80::1]/hook",
    "http://[fd00::1]/hook",
    # IPv6 forms that carry an IPv4 address a relay forwards to: judged by that address.
    "http://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
    "http://[2002:a9fe:a9fe::1]/latest/meta-data/",  # 6to4 of 169.254.169.254
    "http://[2002:a00:1::]/hook",  # 6to4 of 10.0.0.1
    "http://[64:ff9b::a00:1]/hook",  # NAT64 of 10.0.0.1
    "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/hook",  # Teredo, client 10.0.0.1
]
FAST = {"workers_inline": 1, "audit_seal_every": 0.05, "webhook_poll": 0.05,
        "webhook_backoff": 0.05}  # fmt: skip


class Posts:
    """What a loopback receiver was sent."""

    def __init__(self) -> None:
        self.hosts: list[str] = []
        self.targets: list[str] = []
        self.lock = threading.Lock()


@contextlib.contextmanager
def _receiving(location: str | None = None) -> Iterator[tuple[Posts, int]]:
    """A loopback receiver recording each POST's Host (and, for a proxy, its target);
    it answers 200, or 307 to ``location``."""
    posts = Posts()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with posts.lock:
                posts.hosts.append(self.headers.get("Host", ""))
                posts.targets.append(self.path)
            self.send_response(200 if location is None else 307)
            if location is not None:
                self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler) as url:
        yield posts, int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.fixture
def receiver() -> Iterator[tuple[Posts, int]]:
    with _receiving() as got:
        yield got


async def _submit(api: Api, headers: dict[str, str], webhook: str | None, **inp: Any) -> Any:
    body: dict[str, Any] = {"agent": "echo", "input": {"text": "hi", **inp}}
    if webhook is not None:
        body["webhook"] = webhook
    return await api.client.post("/v1/runs", json=body, headers=headers)


async def test_internal_targets_are_refused_at_submit(store_url: str) -> None:
    async with in_process(settings_for(store_url, webhook_allow_hosts=())) as api:
        h = await api.key()
        for url in INTERNAL:
            reply = await _submit(api, h, url)
            assert reply.status_code == 422, (url, reply.text)
            assert reply.headers["content-type"].startswith("application/problem+json")
            problem = reply.json()
            assert problem["type"].endswith("/webhook-refused"), problem
            assert "AGENTLEDGER_WEBHOOK_ALLOW_HOSTS" in problem["detail"]
        # Nothing was accepted; a public address literal is (nothing is sent at submit).
        assert (await api.client.get("/v1/runs", headers=h)).json()["runs"] == []
        assert (await _submit(api, h, "http://93.184.216.34/hook")).status_code == 202
        # ...and so is the 6to4 form of a public address.
        assert (await _submit(api, h, "http://[2002:5db8:d822::1]/hook")).status_code == 202


async def test_an_allowed_host_is_accepted_and_delivered_to(
    tmp_path: Path, receiver: tuple[Posts, int]
) -> None:
    """Allowing the name ``localhost`` admits it (not 127.0.0.1 under another name); the
    POST goes to the resolved address with the URL's own Host header."""
    posts, port = receiver
    db = f"sqlite:///{tmp_path / 'allowed.db'}"
    async with in_process(settings_for(db, webhook_allow_hosts=("localhost",), **FAST)) as api:
        h = await api.key()
        assert (await _submit(api, h, f"http://127.0.0.1:{port}/hook")).status_code == 422
        assert (await _submit(api, h, f"http://LOCALHOST:{port}/hook")).status_code == 202

        async def delivered() -> bool:
            return bool(posts.hosts)

        await until(delivered, 30)
        assert posts.hosts == [f"localhost:{port}"]


async def test_a_redirect_to_an_inside_target_is_not_followed(tmp_path: Path) -> None:
    """An allowed receiver answers 307 to loopback: the delivery fails (and is retried
    to the same receiver), nothing is posted where the redirect points."""
    db = f"sqlite:///{tmp_path / 'redirect.db'}"
    # (the second receiver's Location names the first's port: entered in order)
    with (
        _receiving() as (inside, inside_port),
        _receiving(f"http://127.0.0.1:{inside_port}/hook") as (front, port),
    ):
        settings = settings_for(db, webhook_allow_hosts=("localhost",), **FAST)
        async with in_process(settings) as api:
            h = await api.key()
            assert (await _submit(api, h, f"http://localhost:{port}/hook")).status_code == 202

            async def answered_307_twice() -> bool:
                rows = await api.store.transact(service_webhooks.deliveries)
                return any(r["attempts"] >= 2 and r["last_error"] == "HTTP 307" for r in rows)

            await until(answered_307_twice, 30)
    assert len(front.hosts) >= 2 and inside.hosts == []


async def test_deliveries_do_not_go_through_a_proxy_from_the_environment(
    tmp_path: Path, receiver: tuple[Posts, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy would make the connection the check did not look at (and over HTTPS it
    cannot carry the pinned server name): deliveries connect directly."""
    posts, port = receiver
    with _receiving() as (proxy, proxy_port):
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy_port}")
        db = f"sqlite:///{tmp_path / 'proxy.db'}"
        settings = settings_for(db, webhook_allow_hosts=("localhost",), **FAST)
        async with in_process(settings) as api:
            h = await api.key()
            assert (await _submit(api, h, f"http://localhost:{port}/hook")).status_code == 202

            async def delivered() -> bool:
                return bool(posts.hosts)

            await until(delivered, 30)
    assert posts.hosts == [f"localhost:{port}"] and proxy.hosts == []


async def _dead(api: Api) -> list[dict[str, Any]]:
    async def settled() -> bool:
        rows = await api.store.transact(service_webhooks.deliveries)
        return bool(rows) and all(r["status"] == "dead" for r in rows)

    await until(settled, 30)
    rows: list[dict[str, Any]] = await api.store.transact(service_webhooks.deliveries)
    return rows


async def test_a_configured_url_resolving_inside_is_refused_at_delivery(
    tmp_path: Path, receiver: tuple[Posts, int]
) -> None:
    """A deployment's agent webhook is not checked at submit; its name resolves to
    loopback at delivery, so nothing is sent and the delivery is dead at once."""
    posts, port = receiver
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    hooks = {"echo": f"http://localhost:{port}/hook"}
    settings = settings_for(db, webhook_allow_hosts=(), agent_webhooks=hooks, **FAST)
    async with in_process(settings) as api:
        h = await api.key()
        assert (await _submit(api, h, None)).status_code == 202
        rows = await _dead(api)
        assert "127.0.0.1 is loopback" in rows[0]["last_error"], rows[0]
        assert rows[0]["attempts"] == 1
        assert posts.hosts == []


async def test_a_name_rebound_inside_after_submit_is_refused_at_delivery(
    tmp_path: Path, receiver: tuple[Posts, int]
) -> None:
    """The name resolved to a public address when the run was accepted and to loopback
    when its event is delivered (the ``webhook_hosts`` table answers like a resolver)."""
    posts, port = receiver
    db = f"sqlite:///{tmp_path / 'rebind.db'}"
    hosts = {"hooks.example.com": ["93.184.216.34"]}
    flag = tmp_path / "hold"
    flag.touch()
    settings = settings_for(db, webhook_allow_hosts=(), webhook_hosts=hosts, **FAST)
    async with in_process(settings) as api:
        h = await api.key()
        url = f"http://hooks.example.com:{port}/hook"
        reply = await _submit(api, h, url, steps=1, flag=str(flag))
        assert reply.status_code == 202, reply.text
        hosts["hooks.example.com"] = ["127.0.0.1"]  # rebound before the run ends
        flag.unlink()
        rows = await _dead(api)
        assert "127.0.0.1 is loopback" in rows[0]["last_error"], rows[0]
        assert posts.hosts == []


@pytest.mark.parametrize(
    "item",
    ["10.0.0.7/8", "10.0.0.0/33", "hooks.internal/8", "*.internal", "a,b", "http://h.internal"],
)
def test_an_allow_list_item_that_names_nothing_is_refused(
    item: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item that is neither a host name nor an address or network (a wildcard, a mask
    on a name, a network with host bits that would silently widen it) would be kept as
    a name no URL ever matches, or as a wider network than written: refused instead."""
    with pytest.raises(UsageError, match="webhook-allow-host"):
        Egress.from_env((item,))
    if "," not in item:  # the variable's separator: there "a,b" is two names
        monkeypatch.setenv("AGENTLEDGER_WEBHOOK_ALLOW_HOSTS", f"hooks.internal {item}")
        with pytest.raises(UsageError, match="AGENTLEDGER_WEBHOOK_ALLOW_HOSTS"):
            Egress.from_env()
        monkeypatch.delenv("AGENTLEDGER_WEBHOOK_ALLOW_HOSTS")
    # Exact names, addresses and networks as written are taken.
    Egress.from_env(("hooks.internal", "HOOKS-2.internal.", "10.0.0.7", "10.2.0.0/16", "[::1]"))


async def test_names_resolve_beside_a_busy_default_executor() -> None:
    """Webhook names resolve on threads of their own: with the loop's default executor
    (which also runs the store's blocking calls) held, a check still answers."""
    loop = asyncio.get_running_loop()
    held = threading.Event()
    busy = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(busy)
    blocker = loop.run_in_executor(None, held.wait)
    try:
        with pytest.raises(Refused, match="inside the network"):
            await asyncio.wait_for(Egress().check("http://localhost:9/hook"), 60)
    finally:
        held.set()
        await blocker
