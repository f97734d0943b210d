"""The PostgreSQL relay of model deltas: payloads fit one NOTIFY each whatever the text,
deltas of one step are joined in order, a process ignores its own, and a real LISTEN
receives what another relay sent."""

from __future__ import annotations

import json
import threading

import pytest

from agentledger.gateway import _relay as relay
from agentledger.gateway._stream import delta

NOTIFY_LIMIT = 8000  # PostgreSQL refuses a payload of this many bytes or more


def test_payloads_join_a_steps_deltas_and_each_fits_one_notify() -> None:
    hostile = '\x01"\\\n' + "😀" * 3000 + "\x00end"  # escapes and 4-byte characters
    events = [
        delta("r1", 1, "Three "),
        delta("r1", 1, "hotels."),
        delta("r1", 3, hostile),
        delta("r2", 1, "x"),
    ]
    sent = relay.payloads(events)
    assert all(len(p.encode()) < NOTIFY_LIMIT for p in sent)
    data = [json.loads(p) for p in sent]
    assert data[0]["t"] == "Three hotels." and data[0]["s"] == 1
    assert "".join(d["t"] for d in data if (d["r"], d["s"]) == ("r1", 3)) == hostile
    assert [(d["r"], d["s"]) for d in data][-1] == ("r2", 1)
    # The sender's own payloads come back as nothing; another process's as events.
    assert all(relay.parse(p) is None for p in sent)
    other = json.dumps({"o": "another", "r": "r1", "s": 1, "t": "hi"})
    assert relay.parse(other) == delta("r1", 1, "hi")
    assert relay.parse("not json") is None and relay.parse('{"o": "x"}') is None


@pytest.mark.postgres
def test_a_relay_reaches_a_listener_on_another_connection(pg_url: str) -> None:
    from agentledger.store._postgres.listen import RunListener

    got: list[str] = []
    done = threading.Event()
    long_text = "é" * 2500  # more than one notification
    expected = "Free " + long_text

    def received(payload: str) -> None:
        got.append(payload)
        if sum(len(json.loads(p)["t"]) for p in got) >= len(expected):
            done.set()

    listener = RunListener(pg_url, received, channel=relay.DELTA_CHANNEL)
    listener.start()
    try:
        assert listener.wait_listening(10)
        sender = relay.DeltaRelay(pg_url)
        sender.send(delta("run-1", 2, "Free "))
        sender.send(delta("run-1", 2, long_text))
        assert done.wait(20), got
    finally:
        listener.stop()
    assert "".join(json.loads(p)["t"] for p in got) == expected
    assert len(got) >= 3  # cut to fit: 2,505 characters in chunks of 1,000
    assert {json.loads(p)["o"] for p in got} == {relay.ORIGIN}


def test_deltas_of_different_attempts_are_never_joined() -> None:
    """A step's first attempt broke off and its second answered: a listener in another
    process gets the two apart, each with its attempt, and drops the first's text."""
    events = [delta("r1", 3, "Your refund of 240 ", 1), delta("r1", 3, "Your refund of", 2)]
    events.append(delta("r1", 3, " 240 EUR was NOT approved.", 2))
    other = [json.loads(p) | {"o": "another"} for p in relay.payloads(events)]
    got = [relay.parse(json.dumps(p)) for p in other]
    assert got == [
        delta("r1", 3, "Your refund of 240 ", 1),
        delta("r1", 3, "Your refund of 240 EUR was NOT approved.", 2),
    ]
