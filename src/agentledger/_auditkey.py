"""The key audit seals are signed with (``AGENTLEDGER_AUDIT_KEY``): a secret the
database never holds.

A hash chain alone proves nothing to someone who can write the database: the hash
function is public, so a rewritten record is re-chained and the head moved to match.
Each sealed record therefore also carries ``sig`` = HMAC-SHA256 under this key of its
chain link (tenant, chain position, hash), so a rewritten chain fails at the first
rewritten record for anyone verifying with the key. The signature is written as
``<key id>:<hex>``: the key id (derived from the key, revealing nothing of it) lets
``audit verify`` say "wrong key" instead of calling every record tampered.

With no key configured, records are sealed unsigned (an embedded install works out of
the box) and ``audit verify`` says the chain is unsigned; ``--require-signed`` makes
that a failure. A sealer never extends a chain signed under a key it does not hold
(see ``service_audit._seal_tenant``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from dataclasses import dataclass, field

from agentledger import _envsettings as envsettings
from agentledger.errors import UsageError

ENV = "AGENTLEDGER_AUDIT_KEY"
MIN_LENGTH = 32
_ID_LENGTH = 16  # hex characters of the key id


@dataclass(frozen=True)
class AuditKey:
    """A signing key for audit seals."""

    secret: bytes = field(repr=False)  # never in a log line or a captured traceback
    key_id: str

    def sign(self, tenant_id: str, chain_no: int, digest: str) -> str:
        """The signature of one chain link (also of a head: a head is its last link)."""
        return self._mac(["agentledger-audit-seal", tenant_id, chain_no, digest])

    def verifies(self, tenant_id: str, chain_no: int, digest: str, sig: object) -> bool:
        """Whether ``sig`` is this key's signature of the link (constant-time).

        ``sig`` is whatever a writer of the database stored: anything but this key's
        signature (another type, non-ASCII text) is False, never an exception."""
        if not isinstance(sig, str):
            return False
        expected = self.sign(tenant_id, chain_no, digest).encode()
        return hmac.compare_digest(expected, sig.encode("utf-8", "replace"))

    def sign_redaction(self, tenant_id: str, event_id: int, sealed: str, redacted: str) -> str:
        """The signature of a redaction: event ``event_id``'s data, chained by its digest
        ``sealed``, now reads as the data of digest ``redacted``. Without it, whoever
        writes the database could edit any record's data and claim a redaction."""
        return self._mac(["agentledger-audit-redaction", tenant_id, event_id, sealed, redacted])

    def verifies_redaction(
        self, tenant_id: str, event_id: int, sealed: str, redacted: str, sig: str
    ) -> bool:
        """Whether ``sig`` is this key's signature of the redaction (constant-time)."""
        return hmac.compare_digest(self.sign_redaction(tenant_id, event_id, sealed, redacted), sig)

    def sign_pruned(self, tenant_id: str, summary: list[object]) -> str:
        """The signature of a pruned span's summary (``summary``: its fields in a fixed
        order, see ``store/_queries/retention.summary_fields``): without it, whoever writes
        the database could delete the front of a chain and write a summary of their own."""
        return self._mac(["agentledger-audit-pruned", tenant_id, *summary])

    def verifies_pruned(self, tenant_id: str, summary: list[object], sig: object) -> bool:
        """Whether ``sig`` is this key's signature of the summary (constant-time; any
        stored value that is not one is False, never an exception)."""
        if not isinstance(sig, str):
            return False
        expected = self.sign_pruned(tenant_id, summary).encode()
        return hmac.compare_digest(expected, sig.encode("utf-8", "replace"))

    def _mac(self, parts: list[object]) -> str:
        # JSON of a list: an unambiguous encoding of the parts, whatever text they hold.
        mac = hmac.new(self.secret, json.dumps(parts).encode(), hashlib.sha256).hexdigest()
        return f"{self.key_id}:{mac}"


def signer_of(sig: object) -> str:
    """The key id a stored signature names (``?`` for a value that is not text)."""
    return sig.split(":", 1)[0] if isinstance(sig, str) else "?"


def key_from_text(text: str) -> AuditKey:
    """An :class:`AuditKey` from its secret text (surrounding whitespace ignored: a key
    read from a file keeps its newline). Raises :class:`UsageError` for a short key."""
    secret = text.strip().encode()
    if len(secret) < MIN_LENGTH:
        raise UsageError(
            f"{ENV} must be a secret of at least {MIN_LENGTH} characters (got "
            f"{len(secret)}); generate one with "
            "`python -c 'import secrets; print(secrets.token_hex(32))'`, or unset it to "
            "seal unsigned"
        )
    key_id = hmac.new(secret, b"agentledger-audit-key-id", hashlib.sha256).hexdigest()
    return AuditKey(secret, key_id[:_ID_LENGTH])


def configured() -> AuditKey | None:
    """This process's key from ``$AGENTLEDGER_AUDIT_KEY``, or None when unset or empty.

    Read on every call (cached per value), so a process and the commands it runs agree;
    raises :class:`UsageError` naming the variable when it is unusable."""
    raw = envsettings.current().audit_key.get_secret_value()
    return _parsed(raw) if raw.strip() else None


@functools.lru_cache(maxsize=4)
def _parsed(raw: str) -> AuditKey:
    return key_from_text(raw)
