"""The --faults spec parser and the fault injector (no HTTP needed)."""

from __future__ import annotations

import pytest

from agentledger_examples.stayhub.sandbox import FaultConfig, parse_faults
from agentledger_examples.stayhub.sandbox.faults import EXAMPLE_SPEC, Fault, FaultInjector


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_parse_example_spec() -> None:
    config = parse_faults(EXAMPLE_SPEC)
    assert config.seed == 7
    assert config.faults == (
        Fault("payments.create", "timeout_after_commit", probability=0.1, hold=30.0),
        Fault("search", "rate_limit", probability=0.5, retry_after=1),
        Fault("email", "outage", duration=20.0),
    )


def test_spec_round_trips_through_text_and_dict() -> None:
    spec = (
        "bookings.create:error,status=502,count=2;*:latency@0.25,ms=40;"
        "payments.create:error_after_commit@0.1,status=504,save=1;email:keyless;"
        "status:lag,lag=1.5;seed=11"
    )
    config = parse_faults(spec)
    assert parse_faults(config.to_spec()) == config
    assert FaultConfig.from_dict(config.to_dict()) == config
    assert FaultConfig.from_dict({"spec": spec}) == config
    assert parse_faults("") == FaultConfig()
    assert parse_faults(" search:hold , hold = 0.5 ; ").faults[0].hold == 0.5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nowhere:error", "unknown endpoint 'nowhere'"),
        ("search:explode", "unknown fault kind 'explode'"),
        ("search:error@1.5", "not in [0, 1]"),
        ("search:error@x", "is not a number"),
        ("search:rate_limit,ms=5", "takes no parameter 'ms'"),
        ("search:error,status=404", "must be 500-599"),
        ("search:error,count=1.5", "must be an integer"),
        ("search:error,count", "expected NAME=VALUE"),
        ("search:decline", "payments.create only"),
        ("seed=abc", "seed"),
        ("search", "ENDPOINT:KIND"),
        ("email:outage,end=3,duration=2", "not both"),
        ("search:error_after_commit", "write endpoints only"),
        ("payments.create:error_after_commit,status=503", "500, 502 or 504"),
        ("payments.create:error_after_commit,save=2", "save=2 must be 0 or 1"),
        ("email:keyless@0.5", "no probability"),
        ("email:keyless,count=1", "no count"),
        ("availability:keyless", "write endpoints only"),
        ("payments.status:lag,hold=1", "takes no parameter 'hold'"),
    ],
)
def test_bad_spec_raises_one_line_error_with_example(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match="bad fault spec") as info:
        parse_faults(spec)
    text = str(info.value)
    assert message in text
    assert "example:" in text
    assert "\n" not in text


def test_bad_dict_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown fault field"):
        FaultConfig.from_dict({"faults": [{"endpoint": "search", "kind": "error", "foo": 1}]})
    with pytest.raises(ValueError, match="not a number"):
        FaultConfig.from_dict({"faults": [{"endpoint": "search", "kind": "error", "count": "x"}]})


def test_same_seed_same_rolls_and_endpoints_do_not_perturb_each_other() -> None:
    spec = "search:error@0.5;availability:error@0.5;seed=3"

    def rolls(injector: FaultInjector, interleave: bool) -> list[bool]:
        out = []
        for _ in range(40):
            if interleave:
                injector.failure("availability")
            out.append(injector.failure("search") is not None)
        return out

    first = rolls(FaultInjector(parse_faults(spec)), interleave=False)
    assert first == rolls(FaultInjector(parse_faults(spec)), interleave=True)
    assert 5 < sum(first) < 35
    other_seed = rolls(FaultInjector(parse_faults(spec.replace("seed=3", "seed=4"))), False)
    assert other_seed != first


def test_count_limits_firing() -> None:
    injector = FaultInjector(parse_faults("bookings.create:error,count=2"))
    results = [injector.failure("bookings.create") for _ in range(4)]
    assert [r.status_code if r else None for r in results] == [503, 503, None, None]
    injector.install(injector.config)  # reinstalling resets the counters
    assert injector.failure("bookings.create") is not None


def test_failure_kinds_and_wildcard() -> None:
    injector = FaultInjector(parse_faults("*:rate_limit,retry_after=3;crm:error,status=500"))
    limited = injector.failure("guests")
    assert limited is not None
    assert (limited.status_code, limited.headers["Retry-After"]) == (429, "3")
    assert injector.failure("search") is not None
    assert injector.latency("search") == 0.0
    assert FaultInjector(parse_faults("*:latency,ms=40;search:latency")).latency("search") == 0.14
    error = FaultInjector(parse_faults("crm:error,status=500")).failure("crm")
    assert error is not None and error.status_code == 500
    assert FaultInjector(parse_faults("payments.create:decline")).declines("payments.create")
    holds = FaultInjector(parse_faults("email:hold,hold=2;email:timeout_after_commit"))
    assert (holds.hold_before("email"), holds.hold_after_commit("email")) == (2.0, 30.0)


def test_outage_window_is_relative_to_installation() -> None:
    clock = FakeClock()
    injector = FaultInjector(parse_faults("email:outage,start=5,end=10"), clock=clock)
    assert injector.failure("email") is None
    clock.now += 5
    outage = injector.failure("email")
    assert outage is not None and outage.status_code == 503
    assert outage.headers["Retry-After"] == "5"
    clock.now += 5
    assert injector.failure("email") is None
    injector.install(parse_faults("email:outage,duration=1"))
    assert injector.failure("email") is not None
    clock.now += 1
    assert injector.failure("email") is None
