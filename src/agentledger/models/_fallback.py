"""A fallback chain: primary -> fallback -> ... behind the one :class:`Model` interface.

Inside the engine the chain is walked by :mod:`agentledger.engine._model_step`, which
retries each model by failure class, journals every attempt, skips cooled-down models
and moves on only on the classes in
:data:`~agentledger.models._errors.FALLBACK_CLASSES`. :meth:`FallbackModel.complete` is
the same walk without retries or journal, for use outside a run.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentledger.errors import ToolError
from agentledger.models._base import Model, ModelRequest, ModelResponse
from agentledger.models._errors import FALLBACK_CLASSES


class FallbackModel(Model):
    """``FallbackModel([primary, fallback, ...])``: the next model answers when one fails
    with a class worth falling back on (rate limits, 5xx, timeouts, context window
    exceeded, unusable answers), never on a rejected request or a refusal."""

    def __init__(self, models: Sequence[Model]) -> None:
        if not models:
            raise ValueError("a fallback chain needs at least one model")
        self.models = list(models)
        self.name = " -> ".join(m.name for m in self.models)

    def chain(self) -> list[Model]:
        """The models in the order they are tried."""
        return list(self.models)

    async def aclose(self) -> None:
        """Close every model's connections."""
        for model in self.models:
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Try each model once, in order."""
        last: ToolError | None = None
        for model in self.models:
            try:
                return await model.complete(request)
            except ToolError as exc:
                if exc.error_class not in FALLBACK_CLASSES:
                    raise
                last = exc
        assert last is not None
        raise last


def chain_of(model: Model) -> list[Model]:
    """The models a model step may try, in order (one for a plain model)."""
    if isinstance(model, FallbackModel):
        return model.chain()
    return [model]
