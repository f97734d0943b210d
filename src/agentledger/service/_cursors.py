"""Keyset cursors for paged listings: an opaque token for (a time, an id)."""

from __future__ import annotations

import base64
import json
import math
import re

from agentledger.service._problems import Problem

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


def make_cursor(at: float, item_id: str) -> str:
    """The token of the position after (``at``, ``item_id``)."""
    raw = json.dumps([at, item_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_cursor(token: str | None) -> tuple[float, str] | None:
    """Only what :func:`make_cursor` writes: [a finite number, an id]. Anything else (an
    object, NaN, a NUL PostgreSQL refuses) is a forged cursor: 400 problem+json."""
    if not token:
        return None
    try:
        raw = json.loads(base64.urlsafe_b64decode(token.encode() + b"==").decode())
        if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[1], str)):
            raise ValueError(raw)
        at = float(raw[0])
        if not math.isfinite(at) or not _ID.match(raw[1]):
            raise ValueError(raw)
        return at, raw[1]
    except (ValueError, TypeError, UnicodeDecodeError):
        raise Problem("bad-request", "cursor: not a cursor this API returned") from None
