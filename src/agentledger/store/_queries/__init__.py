"""The kernel's SQL, written once for every dialect, one module per concern.

Each function is a store operation ``op(tx, ...)`` (:class:`agentledger.store._tx.Tx`):
it runs inside a transaction the store manages. Placeholders are ``:name``.
"""
