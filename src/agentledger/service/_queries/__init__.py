"""The HTTP service's SQL: keys, quotas, webhooks, the audit chain, approvals and events views."""
