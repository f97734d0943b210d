"""``agentledger chaos``: the user's own app under failure, and the invariants it must keep.

One job per module: :mod:`faults` (the fault grammar, shared with the StayHub sandbox),
:mod:`proxy` (an HTTP reverse proxy that injects faults and counts effects per key),
:mod:`counting` (effects per key, from the proxies and the tools' hook),
:mod:`runner` (worker processes, kills and freezes), :mod:`pgcluster` (a private
PostgreSQL cluster to restart), :mod:`session` (one session, start to end),
:mod:`invariants` (the checks), :mod:`report` (the tables).

``agentledger soak`` on the same parts: :mod:`soak` (the load, the approvals it decides,
the schedule, the leak rule), :mod:`sampling` (what it samples), :mod:`soakplot` (the SVG).
"""
