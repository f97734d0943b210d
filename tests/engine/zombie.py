"""The zombie scenario: a stopped worker wakes up inside a write while its
successor is held mid-run, and its late journal write must be turned away.

The run is ``running`` under the successor's lease the whole time, so only the
epoch/owner comparison of the journal fence can reject the zombie's write (a test
in which the successor has already finished would pass on ``status='running'``
alone).
"""

from __future__ import annotations

import signal
from urllib.parse import urlsplit

from agentledger.records import RunStatus
from tests.engine.helpers import Env, tool_steps, wait_for
from tests.pgrelay import Relay, via


def relay_for(env: Env) -> Relay | None:
    """On PostgreSQL, a relay between the zombie and the server (closed with ``env``)."""
    if not env.url.startswith("postgresql"):
        return None
    parts = urlsplit(env.url)
    relay = Relay(("127.0.0.1", 0), (parts.hostname or "127.0.0.1", parts.port or 5432))
    env.on_close(relay.close)
    return relay


def zombie_write_is_fenced(env: Env, phase: str = "after_effect", lease: float = 3.0) -> str:
    """Stop worker A inside its first keyed write (at ``phase``), let its lease
    expire, let worker B take the run over and hold it inside step 4, wake A: its
    write must be rejected and B's journal left as it was. Returns the run id.

    ``phase``: ``after_started`` (A has not called the provider yet: B calls it
    with the same key, A's late call is deduplicated by the provider) or
    ``after_effect`` (the provider applied it; B finds it by a status check).
    """
    flag_a, flag_b = env.hold_flag(f"zombie-{phase}"), env.hold_flag(f"successor-{phase}")
    holds = [
        {"item": "i1", "phase": phase, "flag": str(flag_a), "once": True},
        {"item": "i2", "phase": "before_started", "flag": str(flag_b)},
    ]
    run_id = env.submit("five_writes", {"hold": holds})
    relay = relay_for(env)
    n_zombie = len(env.workers) + 1
    zombie = env.start_worker(
        lease=lease, extra=("-v",), db=relay and via(env.url, "127.0.0.1", relay.port)
    )
    env.wait_marker(flag_a)
    owner_a = env.run(run_id).lease_owner
    assert owner_a is not None
    env.stop_after_heartbeat(zombie, run_id)
    try:
        # The successor's lease is the long default: a stall of the loaded machine must
        # not hand the run to a third epoch (the successor itself, or the woken zombie).
        env.start_worker()
        env.wait_marker(flag_b)  # the successor owns the run and is held inside step 4
        taken = env.run(run_id)
        assert taken.status == RunStatus.RUNNING and taken.lease_epoch == 2
        assert taken.lease_owner not in (None, owner_a)
        journal_b = env.journal(run_id)
        by_a_before = [e.id for e in env.events(run_id) if e.actor == owner_a]
        flag_a.unlink()  # the zombie's tool call returns as soon as it runs again
        if relay is not None:
            # Its heartbeat is overdue when it wakes, and on PostgreSQL it travels on
            # another connection than the journal write: hold it back, so the write
            # reaches the fence first (the heartbeat is advisory; the fence is not).
            relay.hold(lambda name: not name.endswith(":journal"))
    finally:
        zombie.send_signal(signal.SIGCONT)
    # The successor is held and writes nothing: a changed journal can only be the zombie's.
    wait_for(
        lambda: env.lease_lost_by_fence(n_zombie) or env.journal(run_id) != journal_b,
        what=f"the zombie to try its late write; its log: {env.tmp}/worker{n_zombie}.log",
    )
    if relay is not None:
        relay.release()
    assert env.journal(run_id) == journal_b, "the zombie's late write was accepted"
    assert env.lease_lost_by_fence(n_zombie), env.worker_log(n_zombie)
    assert zombie.poll() is None  # the process lives on; it only stopped that run
    assert [e.id for e in env.events(run_id) if e.actor == owner_a] == by_a_before
    run = env.run(run_id)
    assert run.status == RunStatus.RUNNING and run.lease_epoch == 2

    flag_b.unlink()
    run = env.wait_status(run_id, RunStatus.COMPLETED)
    assert run.lease_epoch == 2
    journal = env.journal(run_id)
    # Step 1 is the local step A journaled before it was stopped; every later
    # entry (including the write A was inside) is B's.
    assert journal[0].name == "pre_i1" and journal[0].lease_epoch == 1
    assert all(s.lease_epoch == 2 for s in journal[1:]), [
        (s.step_no, s.lease_epoch) for s in journal
    ]
    writes = tool_steps(journal, "keyed_write")
    assert env.effects("keyed") == {s.idempotency_key: 1 for s in writes}
    calls = env.calls("keyed")
    first, *rest = [s.idempotency_key for s in writes]
    # after_started: B's call and A's late one (deduplicated by the key) reach the provider.
    assert calls[first] == (2 if phase == "after_started" else 1)
    assert all(calls[key] == 1 for key in rest)
    return run_id
