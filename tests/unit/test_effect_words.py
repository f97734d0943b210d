"""The side effects ledger's words for a failed write: a failed compensation whose tool
has a status check may have applied (the resume asks before calling it again), so it is
not shown as one that applied nothing."""

from __future__ import annotations

from agentledger.records import Step, StepStatus
from agentledger.service._console.story import effect_words


def _failed(kind: str, checked: bool, settled_not_applied: bool = False) -> Step:
    given: dict[str, object] = {"args": {"amount": 20}, "status_check": checked}
    if settled_not_applied:
        given["settled"] = {"applied": False, "by": "ops:amy"}
    return Step(
        run_id="r1", step_no=5, kind=kind, name="refund", status=StepStatus.FAILED,
        input=given, idempotency_key="r1:5", error_class="business_error",
    )  # fmt: skip


def test_a_failed_compensation_with_a_status_check_may_have_applied() -> None:
    words = effect_words(_failed("compensation", checked=True), "needs_human")
    assert words.startswith("failed, may have applied"), words


def test_failed_writes_that_provably_applied_nothing_say_so() -> None:
    for step in (
        _failed("compensation", checked=False),  # no check: called again with its key
        _failed("compensation", checked=True, settled_not_applied=True),  # a person looked
        _failed("tool", checked=True),  # a forward write that failed applied nothing
    ):
        assert effect_words(step, "needs_human") == "failed, applied nothing", step
