"""A small app to prove under ``agentledger chaos``: a checkout that charges a payments
provider over HTTP (``provider.py``) and records a receipt in a local file."""
