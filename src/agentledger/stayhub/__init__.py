"""StayHub: a hotel-booking agent on the sandbox providers, and the kill-the-worker demo.

``agentledger worker --app agentledger.stayhub.app:app --db URL`` runs it; the sandbox
base URL comes from ``STAYHUB_URL`` (default ``http://127.0.0.1:8700``).
"""
