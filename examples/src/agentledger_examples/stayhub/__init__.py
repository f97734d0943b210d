"""StayHub: a hotel-booking agent, its providers as a local HTTP sandbox, and the
kill-the-worker demo.

``agentledger worker --app agentledger_examples.stayhub.app:app --db URL`` runs the agent;
the sandbox base URL comes from ``STAYHUB_URL`` (default ``http://127.0.0.1:8700``).
"""
