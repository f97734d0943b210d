"""The model gateway's shared state: cooldowns of failing models, tenant period budgets,
and the live stream of model tokens (in process, and to other processes on PostgreSQL).
The call protocol itself (reserve, send, journal, retry, fall back) is
:mod:`agentledger.engine._model_step`; importing this package installs the gateway's
part of it as the engine's hooks (``engine/_hooks.py``). Without it a priced model call
is refused, not sent unchecked against its tenant's budget."""

from agentledger.gateway import _engine as _engine

_engine.install()
