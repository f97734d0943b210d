"""States, decisions and reasons are StrEnums whose values are the stored strings, and
the package gives each concept one name."""

from __future__ import annotations

import ast
from collections import defaultdict
from enum import StrEnum
from pathlib import Path

import pytest

from agentledger.engine._retries import RetryAction
from agentledger.engine._signals import HandoverReason
from agentledger.errors import FailureClass
from agentledger.models._base import FinishReason, UsageSource
from agentledger.records import (
    ApprovalDecision,
    DeliveryStatus,
    EffectStatus,
    RunStatus,
    StepStatus,
)
from agentledger.tools._contract import Delivery, EffectKind, Idempotency, tool

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "agentledger"

# The values are what the database, the journal and the API hold: they never change.
STORED = {
    RunStatus: "queued running waiting completed failed cancelled expired needs_human",
    StepStatus: " started succeeded failed unknown retrying waiting",
    EffectStatus: "claimed done failed",
    DeliveryStatus: "pending delivered dead",
    ApprovalDecision: "approve reject",
    RetryAction: "retry check fail give_up",
    HandoverReason: "budget unknown_outcome compensation model_error nondeterminism "
    "invalid_arguments outbox_key resumes",
    UsageSource: "reported estimated simulated none",
    EffectKind: "read write money notify",
    Idempotency: "none provider effects",
    Delivery: "direct outbox",
    FinishReason: "stop length tool_calls content_filter refusal",
}


@pytest.mark.parametrize("kind", list(STORED), ids=lambda k: k.__name__)
def test_states_are_str_enums_with_the_stored_values(kind: type[StrEnum]) -> None:
    assert issubclass(kind, StrEnum)
    assert [m.value for m in kind] == STORED[kind].split(" ")
    for member in kind:
        assert member == member.value and f"{member}" == member.value


def test_run_status_groups_are_not_members() -> None:
    assert len(RunStatus) == 8
    assert set(RunStatus.ALL) > RunStatus.TERMINAL and "completed" in RunStatus.TERMINAL
    assert RunStatus.QUEUED not in RunStatus.TERMINAL


def test_every_error_class_is_a_failure_class() -> None:
    from agentledger import _canonical as canonical
    from agentledger import errors
    from agentledger.engine import _approvals as approvals
    from agentledger.engine import _workflow_runner as workflow_runner
    from agentledger.models import _errors as model_errors

    found = [
        value.error_class
        for module in (errors, canonical, approvals, workflow_runner, model_errors)
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and "error_class" in vars(value)
    ]
    assert found and all(isinstance(c, FailureClass) for c in found)
    assert {str(c) for c in found} == {c.value for c in FailureClass}


def test_a_tool_contract_takes_the_words_and_refuses_others() -> None:
    async def pay(ctx: object) -> None: ...

    made = tool(effect="money", idempotency="provider", delivery="outbox")(pay)
    assert made.effect is EffectKind.MONEY and made.idempotency is Idempotency.PROVIDER
    assert made.delivery is Delivery.OUTBOX
    with pytest.raises(Exception, match="effect='spend'"):
        tool(effect="spend")(pay)


# Names that meant different things in different modules; each is now one concept.
ONE_CONCEPT = ("Decision", "decide", "settle")


def test_each_concept_has_one_name() -> None:
    defined: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names: list[str] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for name in names:
                if name in ONE_CONCEPT:
                    defined[name].append(str(path.relative_to(PACKAGE)))
    shared = {name: where for name, where in defined.items() if len(where) > 1}
    assert not shared, f"one name, several meanings: {shared}"
