"""The model gateway's shared state: cooldowns of failing models, tenant period budgets,
and the live stream of model tokens (in process, and to other processes on PostgreSQL).
The call protocol itself (reserve, send, journal, retry, fall back) is
:mod:`agentledger.engine._model_step`."""
