"""The audit chain: events sealed, per tenant, into a hash chain.

Events are appended by many processes whose transactions commit in any order, so the
chain is not built at insert time (that would serialize every journal write of a tenant
behind one row). A sealer -- every ``serve`` process and every worker, each second
(``agentledger/_sealer.py``), and ``agentledger audit verify`` -- takes the tenant's head
row lock, then gives each committed, unsealed event of the tenant the next ``chain_no``,
the previous record's hash and its own hash:

    hash = SHA-256(prev_hash || "\n" || canonical JSON of [tenant, chain_no, run_id, seq,
                                     type, actor, at, "sha256:" + SHA-256(data)])

in ``agentledger/_canonical.py``'s encoding (:func:`~agentledger._canonical.exact_json`:
sorted, compact, UTF-8, the time as a JSON number). A record says which encoding hashed
it (``hash_v``, :data:`HASH_CANONICAL`); records sealed before it (``hash_v`` NULL) were
hashed in their own encoding (ASCII-escaped text, the time as the string of its
``repr``) and are checked that way, so chains already stored keep verifying.

The data enters by its digest, so a record's data can be erased (``memory forget``
redacts a forgotten user's text) and the chain still checks: the redacting transaction
keeps the digest of the data as sealed in ``data_digest``, which then stands for the data.
A redacted record's position, type, actor and time are still verified; its data, by
design, no longer is. Records sealed before digests (migration 0090) were hashed over
their data's text, and are checked that way.

Each link is also signed under ``AGENTLEDGER_AUDIT_KEY`` when one is configured
(``sig``, see ``agentledger/_auditkey.py``): the hash function is public, so without the
key a writer of the database could rewrite a record and re-chain everything after it.
Editing, deleting or reordering a sealed record breaks the chain at that record, a
re-chained one fails its signature, and :func:`verify_chain` names it. Cutting the tail
(head moved back onto an earlier, genuinely signed record) or deleting a tenant's whole
chain leaves nothing in the database to compare with: :func:`against_checkpoint` compares
with heads the user kept elsewhere, and :func:`runs_without_records` names runs whose
records are gone. Concurrent sealers cannot fork or skip the chain: the head
lock serializes them (PostgreSQL: ``FOR UPDATE SKIP LOCKED`` -- a sealer skips a tenant
another is sealing -- and the events are read after it is taken, under READ COMMITTED;
SQLite: one writer), a record is chained only if still unsealed (else the
whole seal rolls back), and ``(tenant_id, chain_no)`` is unique. Until it is sealed, a
record is unprotected: :func:`unsealed_tail` measures that window.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from agentledger import _auditchain as auditchain
from agentledger import _auditkey as auditkey
from agentledger._auditkey import AuditKey
from agentledger._canonical import exact_json
from agentledger.errors import StoreError, UsageError
from agentledger.service._queries import webhooks as service_webhooks
from agentledger.store._dialect import CleanParams
from agentledger.store._queries.common import in_list
from agentledger.store._tx import Tx

GENESIS = "0" * 64

log = logging.getLogger(__name__)


def data_digest(data: str | None) -> str | None:
    """The SHA-256 of an event's stored data (None for none): what the chain hashes."""
    return None if data is None else text_digest(data)


def text_digest(data: str) -> str:
    """The SHA-256 of stored data, in hex. Raises :class:`TypeError` for a value that is
    not text (SQLite stores what a writer gives it: verify names such a record)."""
    if not isinstance(data, str):
        raise TypeError(f"data is {type(data).__name__}, not text")
    return hashlib.sha256(data.encode()).hexdigest()


#: ``events.hash_v`` of a record hashed in canonical JSON (what every sealer writes).
HASH_CANONICAL = 2


def record_hash(
    prev_hash: str,
    tenant_id: str,
    row: dict[str, Any],
    chain_no: int,
    *,
    by_text: bool = False,
    version: int | None = HASH_CANONICAL,
) -> str:
    """The hash of one audit record chained to ``prev_hash``: over its data's digest
    (the redacted record's ``data_digest``, else the digest of ``data``), or, with
    ``by_text``, over the data's text (records sealed before migration 0090).

    ``version`` is the record's ``hash_v``: :data:`HASH_CANONICAL`, or None for a record
    sealed before it (see the module docstring). Raises :class:`ValueError` for a time
    that is no number (NaN, infinite) in canonical JSON."""
    at = row["at"]
    if by_text:
        data = row["data"]
    else:
        digest = row.get("data_digest") or data_digest(row["data"])
        data = None if digest is None else "sha256:" + digest
    when = None if at is None else float(at)
    fields = [tenant_id, chain_no, row["run_id"], row["seq"], row["type"], row["actor"]]
    if version == HASH_CANONICAL:
        text = exact_json([*fields, when, data])
    elif version is None:
        stamp = None if when is None else repr(when)
        text = json.dumps([*fields, stamp, data], separators=(",", ":"), ensure_ascii=True)
    else:
        raise ValueError(f"unknown audit hash encoding {version!r}")
    return hashlib.sha256((prev_hash + "\n" + text).encode()).hexdigest()


def seal(tx: Tx, limit: int = 5000) -> int:
    """Seal up to ``limit`` committed events into their tenants' chains; return how many."""
    # The tenants of the oldest ``limit`` unsealed events (a partial-index range): a scan
    # of every unsealed event grows with the backlog and holds the connection. Events
    # under no run (``docs/<tenant>``, ``memory/<tenant>/<user>``) carry their tenant
    # from insert (``events.insert_tenant_event``) and are chained like a run's; one
    # with neither a run nor a tenant is never sealed, and not counted in the limit:
    # ``limit`` of them would hide every later event from every sealer for good.
    # The window's events are read per tenant by id below, never by tenant: a join on
    # the tenant's runs grows with the tenant's history (a hash join over every run of
    # the tenant held PostgreSQL's writer for 0.2-0.6 s per seal under load).
    key = auditkey.configured()
    by_tenant: dict[str, list[int]] = {}
    for event_id, tenant_id in _window(tx, limit):
        by_tenant.setdefault(tenant_id, []).append(event_id)
    return sum(_seal_tenant(tx, t, by_tenant[t], key) for t in sorted(by_tenant))


def may_extend(tenant_id: str, head: dict[str, Any], key: AuditKey | None) -> bool:
    """Whether this process may chain records after a tenant's ``head`` (its
    ``chain_no``, ``hash`` and ``sig``). Without a key: only an unsigned chain --
    unsigned records after a signed one fail ``audit verify``. With a key: an empty
    chain or one whose head is signed under it (the signature checked, not only the key
    id it names: the id is public); never an unsigned chain with records, since signing
    after it would vouch for whatever a writer of the database left there (its
    signatures stripped, its records rewritten): such a history is adopted only by an
    operator, with ``agentledger audit sign-unsigned``. Refused records wait, unsealed,
    and ``audit verify`` reports them."""
    head_no, head_sig = int(head["chain_no"]), head["sig"]
    if key is None:
        if head_sig is None:
            return True
        why = f"is signed under key id {auditkey.signer_of(head_sig)} but {auditkey.ENV} is not set"
    elif head_sig is None:
        if head_no == 0:
            return True
        why = (
            f"has {head_no} unsigned records: after checking them, sign them with "
            "`agentledger audit sign-unsigned`"
        )
    elif key.verifies(tenant_id, head_no, str(head["hash"]), head_sig):
        return True
    elif auditkey.signer_of(head_sig) == key.key_id:
        why = (
            "has a head whose signature does not match (the chain was rewritten): see "
            "`agentledger audit verify`"
        )
    else:
        why = (
            f"is signed under key id {auditkey.signer_of(head_sig)} but {auditkey.ENV} is "
            f"key id {key.key_id}"
        )
    if tenant_id not in _warned:
        _warned.add(tenant_id)
        log.error("the audit chain of tenant %s %s; its new records stay unsealed", tenant_id, why)
    return False


_warned: set[str] = set()  # tenants whose chain this process was refused (logged once)


def _window(tx: Tx, limit: int) -> list[tuple[int, str]]:
    """The oldest ``limit`` unsealed events with a tenant, and their tenants: pages of
    the unsealed index in id order, the tenant of an event under no run as inserted, of
    a run's event its run's by primary key. Two plain lookups rather than a join, whose
    plan a planner with stale statistics turns into a scan."""
    out: list[tuple[int, str]] = []
    after = -1
    while len(out) < limit:
        page = tx.fetchall(
            "SELECT id, run_id, tenant_id FROM events WHERE hash IS NULL AND id > :after "
            "ORDER BY id LIMIT :limit",
            {"after": after, "limit": limit},
        )
        if not page:
            break
        after = int(page[-1]["id"])
        tenants: dict[str, str] = {}
        of_runs = sorted({r["run_id"] for r in page if r["tenant_id"] is None})
        if of_runs:
            among, runs = tx.dialect.among("id", of_runs)
            sql = f"SELECT id, tenant_id FROM runs WHERE {among}"
            tenants = {r["id"]: r["tenant_id"] for r in tx.fetchall(sql, runs)}
        for r in page:
            tenant = r["tenant_id"] if r["tenant_id"] is not None else tenants.get(r["run_id"])
            if tenant is not None:
                out.append((int(r["id"]), tenant))
        if len(page) < limit:
            break
    return out[:limit]


def _seal_tenant(tx: Tx, tenant_id: str, event_ids: list[int], key: AuditKey | None) -> int:
    """Chain ``event_ids`` (the tenant's oldest unsealed events, as the window found
    them) after the tenant's head, signed under ``key`` when there is one; those
    another sealer chained meanwhile are skipped."""
    # The head row's lock serializes sealers of one tenant (PostgreSQL; SQLite has one
    # writer); the events are read after it is taken, so no two sealers chain one event.
    # A sealer finding it held skips the tenant (SKIP LOCKED) instead of waiting: the
    # holder is sealing those records, and a waiting sealer would hold a connection.
    skip_locked = tx.dialect.skip_locked
    lock = f"SELECT chain_no, hash, sig FROM audit_heads WHERE tenant_id = :t{skip_locked}"
    heads = tx.fetchall(lock, {"t": tenant_id})
    if not heads:
        # Held by another sealer, or the tenant has no head yet. Only then is it
        # inserted: an INSERT ... ON CONFLICT meeting the head of a sealer that has
        # moved it and not committed waits for that sealer, SKIP LOCKED or not.
        if tx.fetchall("SELECT 1 FROM audit_heads WHERE tenant_id = :t", {"t": tenant_id}):
            return 0
        tx.execute(
            "INSERT INTO audit_heads (tenant_id, chain_no, hash) VALUES (:t, 0, :g) "
            "ON CONFLICT (tenant_id) DO NOTHING",
            {"t": tenant_id, "g": GENESIS},
        )
        heads = tx.fetchall(lock, {"t": tenant_id})
        if not heads:
            return 0
    head = heads[0]
    if not may_extend(tenant_id, head, key):
        return 0
    chain_no, prev = int(head["chain_no"]), str(head["hash"])
    # Read again after the head's lock: a sealer holding it before us chained some.
    # The ids as one parameter (an array, a JSON list): the statement's text is the same
    # for any window, so the driver parses and prepares it once.
    among, ids = tx.dialect.among("id", event_ids, "BIGINT")
    # ``hash IS NULL`` keeps the read on the unsealed partial index even when stale
    # statistics make the primary key look no better than a scan of the table.
    found = tx.fetchall(
        "SELECT id, run_id, seq, type, actor, at, data, data_digest FROM events "
        f"WHERE hash IS NULL AND {among} ORDER BY id",
        ids,
    )
    links: list[_Link] = []
    sig = None
    for row in found:
        chain_no += 1
        digest = record_hash(prev, tenant_id, row, chain_no)
        sig = key.sign(tenant_id, chain_no, digest) if key is not None else None
        links.append((int(row["id"]), chain_no, prev, digest, sig))
        prev = digest
    for start in range(0, len(links), _LINKS_PER_UPDATE):
        _write_links(tx, tenant_id, links[start : start + _LINKS_PER_UPDATE])
    # The events' webhooks, enqueued once: sealing happens once per event.
    service_webhooks.enqueue_for_events(tx, tenant_id, found)
    if found:
        tx.execute(
            "UPDATE audit_heads SET chain_no = :n, hash = :h, sig = :s WHERE tenant_id = :t",
            {"n": chain_no, "h": prev, "s": sig, "t": tenant_id},
        )
    return len(found)


# Links written per statement (a seal's window is at most a sealer's batch; this bounds
# the arrays of one statement whatever the caller's limit).
_LINKS_PER_UPDATE = 500

# (event id, chain_no, prev_hash, hash, sig)
_Link = tuple[int, int, str, str, str | None]

# Each link only if its record is still unsealed. The statement's text is the same
# whatever the number of links, so the driver parses and prepares it once.
_LINK_SQL = (
    "UPDATE events SET tenant_id = :t, chain_no = :n, prev_hash = :p, hash = :h, "
    "sig = :s, hash_v = :v WHERE id = :id AND hash IS NULL"
)
_LINKS_SQL = (
    "UPDATE events SET tenant_id = :t, chain_no = v.chain_no, prev_hash = v.prev_hash, "
    "hash = v.hash, sig = v.sig, hash_v = :v FROM unnest(CAST(:ids AS BIGINT[]), "
    "CAST(:nos AS BIGINT[]), CAST(:prevs AS TEXT[]), CAST(:hashes AS TEXT[]), "
    "CAST(:sigs AS TEXT[])) AS v(id, chain_no, prev_hash, hash, sig) "
    "WHERE events.id = v.id AND events.hash IS NULL"
)


def _write_links(tx: Tx, tenant_id: str, links: list[_Link]) -> None:
    """Chain ``links`` (event id, chain_no, prev_hash, hash, sig), each only if still
    unsealed; every one must change, or the whole seal is rolled back. One UPDATE for
    all on a server, its columns as arrays (each one text, ``Dialect.array``), where a
    round trip per record would cost more than the write; on SQLite, in process, one
    statement run per record (``executemany``: compiled once): there the cost is the
    row and index writes, which one UPDATE ... FROM ``json_each`` pays the same. The
    texts are hex digests, signatures and a tenant id read from the database: clean as
    they are."""
    if tx.dialect.name == "sqlite":
        changed = tx.executemany(
            _LINK_SQL,
            [
                CleanParams(
                    t=tenant_id, n=number, p=prev, h=digest, s=sig, id=event_id, v=HASH_CANONICAL
                )
                for event_id, number, prev, digest, sig in links
            ],
        )
        _all_changed(tenant_id, len(links), changed)
        return
    ids, numbers, prevs, digests, sigs = (tx.dialect.array(c) for c in zip(*links, strict=True))
    params = CleanParams(
        t=tenant_id, v=HASH_CANONICAL, ids=ids, nos=numbers, prevs=prevs, hashes=digests, sigs=sigs
    )
    _all_changed(tenant_id, len(links), tx.execute(_LINKS_SQL, params))


def _all_changed(tenant_id: str, wanted: int, changed: int) -> None:
    if changed != wanted:
        # Another sealer chained one of them: going on would leave a gap in the chain.
        # Raising rolls everything back; the next seal starts from the head again.
        raise StoreError(
            f"{wanted - changed} audit events of tenant {tenant_id} were sealed "
            "concurrently; sealing is retried"
        )


# An unsealed event the sealer can chain: under no run with its tenant, or of a run.
_HAS_TENANT = "(e.tenant_id IS NOT NULL OR EXISTS (SELECT 1 FROM runs r WHERE r.id = e.run_id))"


def has_unsealed(tx: Tx) -> bool:
    """True when some committed event with a tenant is not sealed yet (a partial-index
    probe).

    An event with neither a run nor a tenant (written before events under no run
    carried theirs) is never chained (see :func:`seal`): counted here, one of them would
    make every sealer open a write transaction each period for nothing."""
    return bool(
        tx.fetchall(
            f"SELECT e.id FROM events e WHERE e.hash IS NULL AND {_HAS_TENANT} LIMIT 1",
        )
    )


def unsealed_tail(tx: Tx, tenant_id: str | None = None) -> tuple[int, float | None]:
    """The committed events not sealed yet (of ``tenant_id``, or of every tenant): how
    many, and when the oldest was written (None when there are none). An event with
    neither a run nor a tenant is never chained, so it is no unsealed tail (see
    :func:`seal`)."""
    if tenant_id is None:
        found = tx.fetchall(
            "SELECT COUNT(*) AS n, MIN(e.at) AS oldest FROM events e "
                           f"WHERE e.hash IS NULL AND {_HAS_TENANT}")  # fmt: skip
    else:
        # A run's event has no tenant until sealed: its run's; one under no run, its own.
        found = tx.fetchall(
            "SELECT COUNT(*) AS n, MIN(e.at) AS oldest FROM events e WHERE e.hash IS NULL "
            "AND (e.tenant_id = :t OR (e.tenant_id IS NULL AND EXISTS "
            "(SELECT 1 FROM runs r WHERE r.id = e.run_id AND r.tenant_id = :t)))",
            {"t": tenant_id},
        )
    n, oldest = int(found[0]["n"] or 0), found[0]["oldest"]
    return n, float(oldest) if oldest is not None else None


# The pruned span: what `agentledger prune` removed from the front of a tenant's chain
# (store/_queries/retention.py), in its place.


def pruned_summary(tx: Tx, tenant_id: str) -> dict[str, Any] | None:
    """The tenant's pruned-span summary, or None when nothing of its chain was pruned."""
    found = tx.fetchall(
        "SELECT tenant_id, last_chain_no, last_hash, records, runs, counts, digest, first_at, "
        "last_at, pruned_at, sig FROM audit_pruned WHERE tenant_id = :t",
        {"t": tenant_id},
    )
    return dict(found[0]) if found else None


def pruned_summaries(tx: Tx, tenant_id: str | None = None) -> list[dict[str, Any]]:
    """Every tenant's pruned-span summary (of ``tenant_id`` only, when given)."""
    where = "" if tenant_id is None else " WHERE tenant_id = :t"
    return [
        dict(r)
        for r in tx.fetchall(
            "SELECT tenant_id, last_chain_no, last_hash, records, runs, counts, digest, "
            f"first_at, last_at, pruned_at, sig FROM audit_pruned{where} ORDER BY tenant_id",
            {"t": tenant_id},
        )
    ]


def summary_fields(s: dict[str, Any]) -> list[object]:
    """The summary's signed fields, in order (times as their exact repr)."""

    def at(v: Any) -> str | None:
        return None if v is None else repr(float(v))

    return [
        int(s["last_chain_no"]), str(s["last_hash"]), int(s["records"]), int(s["runs"]),
        str(s["counts"]), str(s["digest"]), at(s["first_at"]), at(s["last_at"]),
    ]  # fmt: skip


def summary_problem(key: AuditKey | None, tenant_id: str, s: dict[str, Any]) -> str | None:
    """Why the summary ``s`` cannot stand for the records it replaced, or None. Without
    a key nothing is signed or checked (the chain is unsigned); with one, it must be
    signed under it."""
    if key is None:
        return None
    sig = s["sig"]
    if sig is None:
        return f"the pruned span's summary is not signed (pruned without {auditkey.ENV}?)"
    if auditkey.signer_of(sig) != key.key_id:
        return (
            f"the pruned span's summary is signed under another key (key id "
            f"{auditkey.signer_of(sig)}; {auditkey.ENV} is key id {key.key_id})"
        )
    try:
        fields = summary_fields(s)
    except (TypeError, ValueError) as exc:
        return f"the pruned span's summary's stored values are not of their types ({exc})"
    if not key.verifies_pruned(tenant_id, fields, sig):
        return "the pruned span's summary does not match its signature (forged or edited)"
    return None


def fold(digest: str, record_hash: str) -> str:
    """The summary's digest after one more removed record (its hash), in chain order."""
    return hashlib.sha256(f"{digest}\n{record_hash}".encode()).hexdigest()


@dataclass
class Broken:
    """Where a tenant's chain breaks."""

    tenant_id: str
    chain_no: int
    event_id: int | None
    run_id: str | None
    seq: int | None
    reason: str


def verify_chain(
    tx: Tx,
    tenant_id: str | None = None,
    key: AuditKey | None = None,
    adopting: bool = False,
) -> tuple[int, list[Broken]]:
    """Recompute every tenant's chain; return (records checked, the first break of each
    tenant whose chain is broken).

    Every tenant with sealed records is checked, with or without a head: a writer of
    the database deleting a tenant's head row must not take its records out of the
    check. With ``key``, every record must be signed under it (records sealed before the
    key was configured are signed once by ``agentledger audit sign-unsigned``; with
    ``adopting``, the check it makes, unsigned records are accepted before the first
    signed one only). Raises :class:`UsageError` when the chains are signed, but under
    another key only."""
    heads = {
        h["tenant_id"]: h
        for h in tx.fetchall(
            "SELECT tenant_id, chain_no, hash, sig FROM audit_heads ORDER BY tenant_id"
        )
        if tenant_id is None or h["tenant_id"] == tenant_id
    }
    if key is not None:
        _check_key(key, list(heads.values()))
    where = "" if tenant_id is None else " AND tenant_id = :t"
    chained = {
        str(r["tenant_id"])
        for r in tx.fetchall(
            "SELECT DISTINCT tenant_id FROM events WHERE chain_no IS NOT NULL "
            f"AND tenant_id IS NOT NULL{where}",
            {"t": tenant_id},
        )
    }
    checked = 0
    broken: list[Broken] = []
    for t in sorted(heads.keys() | chained):
        # A tenant first sealed after the heads were read has one now.
        head = heads.get(t) or _head(tx, t)
        n, problem = _verify_tenant(tx, t, head, key, adopting)
        checked += n
        if problem is not None:
            broken.append(problem)
    return checked, broken


def _head(tx: Tx, tenant_id: str) -> dict[str, Any] | None:
    found = tx.fetchall(
        "SELECT tenant_id, chain_no, hash, sig FROM audit_heads WHERE tenant_id = :t",
        {"t": tenant_id},
    )  # fmt: skip
    return found[0] if found else None


def _verify_tenant(
    tx: Tx,
    t: str,
    head: dict[str, Any] | None,
    key: AuditKey | None,
    adopting: bool,
) -> tuple[int, Broken | None]:
    """(records checked, the first break) of one tenant's chain against its ``head``
    (None: its head row is gone)."""
    # A pruned span (``agentledger prune``) stands for the chain's first records: the
    # chain goes on from its last record's hash, and a signed summary counts as signed.
    pruned = pruned_summary(tx, t)
    start, prev, signed_at = 0, GENESIS, None  # signed_at: the first signed position
    if pruned is not None:
        try:
            start, prev = int(pruned["last_chain_no"]), str(pruned["last_hash"])
        except (TypeError, ValueError) as exc:
            bad = f"the pruned span's summary's values are not of their types ({exc})"
            return 0, Broken(t, 1, None, None, None, bad)
        why = summary_problem(key, t, pruned) if not adopting or pruned["sig"] else None
        if why is not None:
            return 0, Broken(t, start, None, None, None, why)
        signed_at = start if pruned["sig"] is not None else None
    before = _before_start(tx, t, start, pruned is not None)
    if before is not None:
        return 0, before
    rows = tx.fetchall(
        "SELECT id, run_id, seq, type, actor, at, data, data_digest, redaction_sig, "
        "chain_no, prev_hash, hash, sig, hash_v FROM events WHERE tenant_id = :t "
        "AND chain_no > :start ORDER BY chain_no",
        {"t": t, "start": start},
    )
    head_no = int(head["chain_no"]) if head is not None else -1
    expected_no = start + 1
    at_head = prev if head_no == start else GENESIS
    checked = 0
    for row in rows:
        checked += 1
        try:
            problem = _check_record(key, t, row, prev, expected_no, signed_at, adopting)
        except (TypeError, ValueError) as exc:
            # Values of a type the column does not hold (SQLite stores what it is given).
            problem = Broken(t, expected_no, _int_or_none(row["id"]), row["run_id"], None,
                             f"record's stored values are not of their types ({exc})")  # fmt: skip
        if problem is not None:
            return checked, problem
        if signed_at is None and row["sig"] is not None:
            signed_at = expected_no
        prev = row["hash"]
        if expected_no == head_no:
            at_head = prev
        expected_no += 1
    last = expected_no - 1
    if head is None:
        return checked, Broken(
            t, last, None, None, None,
            f"the tenant's {last} records have no head (its audit_heads row was deleted)",
        )  # fmt: skip
    if not _ends_at_head(tx, t, last, prev, head_no, str(head["hash"]), at_head):
        return checked, Broken(
            t, expected_no, None, None, None,
            f"the chain ends at {last} but its head says {head_no} (records deleted)",
        )  # fmt: skip
    # Sealers check the head's signature before extending the chain (``may_extend``):
    # a head whose signature was replaced stops them, and its records would wait
    # unexplained.
    head_sig = head["sig"]
    if (
        key is not None
        and head_no > 0
        and not (adopting and head_sig is None)
        and not key.verifies(t, head_no, str(head["hash"]), head_sig)
    ):
        return checked, Broken(
            t, head_no, None, None, None,
            "the head's signature does not match its record (the head was rewritten); "
            "sealers do not extend this chain",
        )  # fmt: skip
    return checked, None


def _before_start(tx: Tx, t: str, start: int, pruned: bool) -> Broken | None:
    """A sealed record at a position the chain has none at, if any: 0 or before, or one
    of the pruned span's (through ``start``; a prune removes the span's records in the
    transaction that extends its summary). Such a record was put there, out of the reach
    of every check of the records after ``start``."""
    found = tx.fetchall(
        "SELECT id, run_id, seq, chain_no FROM events WHERE tenant_id = :t "
        "AND chain_no <= :start ORDER BY chain_no LIMIT 1",
        {"t": t, "start": start},
    )
    if not found:
        return None
    row = found[0]
    where = (
        f"inside the pruned span (through {start}), whose records were removed"
        if pruned and int(row["chain_no"]) > 0
        else "before the chain's first position"
    )
    return Broken(
        t, int(row["chain_no"]), int(row["id"]), row["run_id"], row["seq"],
        f"record {where} (inserted or renumbered)",
    )  # fmt: skip


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _check_record(
    key: AuditKey | None,
    t: str,
    row: dict[str, Any],
    prev: str,
    expected_no: int,
    signed_at: int | None,
    adopting: bool,
) -> Broken | None:
    """Why ``row``, expected at ``expected_no`` after ``prev``, breaks the chain, or None."""
    no = int(row["chain_no"])
    if no != expected_no:
        return Broken(t, expected_no, None, None, None, f"record {expected_no} is missing")
    # The previous hash is the record before's own: it enters this record's hash, which
    # is what is checked. A stored copy (``prev_hash``; NULL where a sealer left it out)
    # adds nothing a writer of the database could not set too, but must agree.
    stored = row["prev_hash"]
    if (stored is not None and stored != prev) or not _matches(prev, t, row, no):
        return Broken(
            t, no, int(row["id"]), row["run_id"], row["seq"],
            "record does not match its hash (edited)" if stored in (None, prev)
            else "record's previous hash does not match (reordered or edited)",
        )  # fmt: skip
    if key is None:
        return None
    return _bad_signature(key, t, row, signed_at, adopting) or _bad_redaction(key, t, row)


def _check_key(key: AuditKey, heads: list[dict[str, Any]]) -> None:
    """Refuse, in one clear sentence, a key no chain is signed under: otherwise every
    record would be reported as tampered."""
    signers = sorted({auditkey.signer_of(h["sig"]) for h in heads if h["sig"] is not None})
    if signers and key.key_id not in signers:
        raise UsageError(
            f"{auditkey.ENV} is key id {key.key_id}, but the audit chains are signed under "
            f"key id {', '.join(signers)}: verify with the key the sealers use (if it is "
            "that key, the heads' signatures were rewritten)"
        )


def _bad_signature(
    key: AuditKey, tenant_id: str, row: dict[str, Any], signed_at: int | None, adopting: bool
) -> Broken | None:
    """Why ``row``'s signature fails under ``key``, or None when it holds. ``signed_at``:
    the first signed record before it. An unsigned record after a signed one was not
    sealed before the key was configured (a sealer with no key never extends a signed
    chain): its signature was removed, and it is never adopted."""
    sig = row["sig"]
    if sig is None and signed_at is not None:
        reason = (
            f"record is not signed, but record {signed_at} before it is: its signature "
            "was removed (rewritten?), and it cannot be adopted"
        )
    elif sig is None:
        if adopting:
            return None
        reason = (
            f"record is not signed (sealed by a process without {auditkey.ENV} -- sign such "
            "records with `agentledger audit sign-unsigned` -- or its signature was removed)"
        )
    elif auditkey.signer_of(sig) != key.key_id:
        reason = (
            f"record is signed under another key (key id {auditkey.signer_of(sig)}; "
            f"{auditkey.ENV} is key id {key.key_id})"
        )
    elif not key.verifies(tenant_id, int(row["chain_no"]), row["hash"], sig):
        reason = (
            "record's signature does not match (rewritten and re-chained with the public "
            "hash function)"
        )
    else:
        return None
    return Broken(tenant_id, int(row["chain_no"]), int(row["id"]), row["run_id"], row["seq"],
                  reason)  # fmt: skip


def _bad_redaction(key: AuditKey, tenant_id: str, row: dict[str, Any]) -> Broken | None:
    """Why a record whose data differs from the digest it was chained by is not a
    redaction signed under ``key``, or None (not redacted, or a signed redaction): the
    digest alone would let whoever writes the database edit any record's data."""
    sealed = row["data_digest"]
    if sealed is None or row["data"] is None or text_digest(row["data"]) == sealed:
        return None
    rsig = row["redaction_sig"]
    if rsig is not None and key.verifies_redaction(
        tenant_id, int(row["id"]), sealed, text_digest(row["data"]), rsig
    ):
        return None
    return Broken(
        tenant_id, int(row["chain_no"]), int(row["id"]), row["run_id"], row["seq"],
        "record's data differs from the data it was sealed with and no redaction is "
        f"signed under {auditkey.ENV} (edited, or forgotten by a process without the key)",
    )  # fmt: skip


def redacted_count(tx: Tx, tenant_id: str | None = None) -> int:
    """How many records had data erased by ``memory forget`` (their position, type,
    actor and time are still chained; their data is vouched for only by a redaction
    signature, checked by :func:`verify_chain` with the key)."""
    where = "" if tenant_id is None else " AND tenant_id = :t"
    rows = tx.fetchall(
        f"SELECT COUNT(*) AS n FROM events WHERE data_digest IS NOT NULL{where}",
        {"t": tenant_id},
    )  # fmt: skip
    return int(rows[0]["n"])


def sign_unsigned(tx: Tx, tenant_id: str, key: AuditKey) -> int:
    """Sign the tenant's sealed, unsigned records under ``key`` once their chain is
    verified: an operator's adoption of a history sealed before the key was configured
    (it vouches for the records as they are now). Only unsigned records before the first
    signed one are such a history, and the signed ones must verify under ``key``: an
    unsigned record after a signed one had its signature removed. Refused, raising
    :class:`UsageError`, when the chain is broken or the head is being sealed; returns
    how many were signed."""
    head = tx.fetchall(
        f"SELECT chain_no FROM audit_heads WHERE tenant_id = :t{tx.dialect.skip_locked}",
        {"t": tenant_id},
    )  # fmt: skip
    if not head:
        raise UsageError(f"tenant {tenant_id} has no audit chain, or it is being sealed: retry")
    _, broken = verify_chain(tx, tenant_id, key, adopting=True)
    if broken:
        raise UsageError(
            f"tenant {tenant_id}: record {broken[0].chain_no}: {broken[0].reason}; nothing "
            "was signed"
        )
    rows = tx.fetchall(
        "SELECT id, chain_no, hash FROM events WHERE tenant_id = :t AND chain_no IS NOT NULL "
        "AND sig IS NULL ORDER BY chain_no",
        {"t": tenant_id},
    )
    for r in rows:
        sig = key.sign(tenant_id, int(r["chain_no"]), r["hash"])
        tx.execute("UPDATE events SET sig = :s WHERE id = :id", {"s": sig, "id": r["id"]})
    pruned = pruned_summary(tx, tenant_id)
    if pruned is not None and pruned["sig"] is None:
        sig = key.sign_pruned(tenant_id, summary_fields(pruned))
        tx.execute(
            "UPDATE audit_pruned SET sig = :s WHERE tenant_id = :t",
                  {"s": sig, "t": tenant_id})  # fmt: skip
    head_no = int(head[0]["chain_no"])
    last = [str(r["hash"]) for r in rows if int(r["chain_no"]) == head_no]
    if not last and pruned is not None and int(pruned["last_chain_no"]) == head_no:
        # Pruned whole: the head is the summary's last record (a keyed sealer extends
        # only a signed head).
        last = [str(pruned["last_hash"])]
    if last:
        tx.execute(
            "UPDATE audit_heads SET sig = :s WHERE tenant_id = :t",
            {"s": key.sign(tenant_id, head_no, last[0]), "t": tenant_id},
        )  # fmt: skip
    return len(rows)


def runs_without_records(
    tx: Tx, tenant_id: str | None = None, limit: int = 100
) -> list[tuple[str, str]]:
    """Runs (id, tenant) that have no audit record at all, up to ``limit``, oldest
    first. Every run is written with its ``run.submitted`` record in one transaction,
    so such a run's records were deleted -- the chain alone cannot tell when a tenant's
    whole chain went with them."""
    where = "" if tenant_id is None else "r.tenant_id = :t AND "
    found = tx.fetchall(
        f"SELECT r.id, r.tenant_id FROM runs r WHERE {where}NOT EXISTS "
        "(SELECT 1 FROM events e WHERE e.run_id = r.id) ORDER BY r.created_at, r.id "
        "LIMIT :limit",
        {"t": tenant_id, "limit": limit},
    )
    return [(str(r["id"]), str(r["tenant_id"])) for r in found]


def runs_in_other_chains(
    tx: Tx, tenant_id: str | None = None, limit: int = 100
) -> list[tuple[str, str | None, str]]:
    """Runs (id, tenant, the tenant whose chain holds its records) whose sealed records
    are in another tenant's chain, up to ``limit`` (of ``tenant_id``: as the run's
    tenant or the chain's). A run's records are sealed into its tenant's chain and no
    run changes tenant, so such a run was moved -- into the reach of another tenant's
    users -- and every chain is still intact."""
    select = (
        "SELECT r.id, r.tenant_id, e.tenant_id AS chained FROM runs r JOIN events e "
        "ON e.run_id = r.id WHERE {} e.chain_no IS NOT NULL "
        "AND (r.tenant_id IS NULL OR r.tenant_id <> e.tenant_id)"
    )
    if tenant_id is None:
        sql = select.format("")
    else:
        # Each side by its own index (the tenant's chain; the tenant's runs), not an OR
        # that joins every run with every sealed record.
        sql = (
            f"{select.format('e.tenant_id = :t AND')} UNION {select.format('r.tenant_id = :t AND')}"
        )
    found = tx.fetchall(
        f"SELECT DISTINCT id, tenant_id, chained FROM ({sql}) m ORDER BY id LIMIT :limit",
        {"t": tenant_id, "limit": limit},
    )
    return [(str(r["id"]), r["tenant_id"], str(r["chained"])) for r in found]


CHECKPOINT_FORMAT = "agentledger-audit-checkpoint/1"


def checkpoint(tx: Tx, tenant_id: str | None = None) -> list[dict[str, Any]]:
    """Every tenant's head with at least one record (``tenant_id``, ``chain_no``,
    ``hash``, ``sig``): what ``agentledger audit checkpoint`` prints for safekeeping."""
    where = "" if tenant_id is None else " AND tenant_id = :t"
    found = tx.fetchall(
        f"SELECT tenant_id, chain_no, hash, sig FROM audit_heads WHERE chain_no > 0{where} "
        "ORDER BY tenant_id",
        {"t": tenant_id},
    )
    return [
        {"tenant_id": h["tenant_id"], "chain_no": int(h["chain_no"]), "hash": h["hash"],
         "sig": h["sig"]}
        for h in found
    ]  # fmt: skip


def against_checkpoint(
    tx: Tx, heads: list[dict[str, Any]], key: AuditKey | None = None
) -> list[Broken]:
    """Where the database lost or changed what a checkpoint's ``heads`` (from
    :func:`checkpoint`, kept outside the database) recorded: each tenant's record at the
    checkpoint's position must still be there with the same hash. With the chain
    verified from its start (:func:`verify_chain`) that covers every record up to it, so
    a cut tail, a rewritten chain and a deleted tenant are each named. With ``key``, a
    checkpoint entry signed under it must verify (an edited checkpoint is refused)."""
    broken = []
    for h in heads:
        t, n, digest, sig = h["tenant_id"], int(h["chain_no"]), h["hash"], h.get("sig")
        if key is not None and sig is not None and not key.verifies(t, n, digest, sig):
            raise UsageError(
                f"the checkpoint's head of tenant {t} does not match its signature under "
                f"{auditkey.ENV} (key id {key.key_id}): the checkpoint was edited, or taken "
                "under another key"
            )
        found = tx.fetchall(
            "SELECT id, run_id, seq, hash FROM events WHERE tenant_id = :t AND chain_no = :n",
            {"t": t, "n": n},
        )
        if found and found[0]["hash"] == digest:
            continue
        pruned = pruned_summary(tx, t) if not found else None
        if pruned is not None and n <= int(pruned["last_chain_no"]):
            # Pruned: the summary keeps the last removed record's hash, which must be the
            # checkpoint's at that position (where a checkpoint taken after a tenant was
            # pruned whole sits); a position before it is vouched for by the summary (the
            # prune verified the chain through it) -- only when it is signed and checked
            # under the key: an unsigned summary is what anyone who deleted the front of
            # the chain could write.
            last = int(pruned["last_chain_no"])
            if n == last:
                if pruned["last_hash"] != digest:
                    broken.append(Broken(
                        t, n, None, None, None,
                        "the pruned span's summary ends at the checkpoint's position with "
                        "another hash (the chain was rewritten before it was pruned, or the "
                        "summary forged)",
                    ))  # fmt: skip
            elif key is None or pruned["sig"] is None or summary_problem(key, t, pruned):
                broken.append(Broken(
                    t, n, None, None, None,
                    f"the checkpoint's position {n} is inside the pruned span (through {last}) "
                    f"and nothing vouches for it: the summary is unsigned, or {auditkey.ENV} "
                    "is not set to check it; verify with the key, or take a checkpoint after "
                    "each prune",
                ))  # fmt: skip
            continue
        if found:
            row = found[0]
            broken.append(Broken(
                t, n, int(row["id"]), row["run_id"], row["seq"],
                "record differs from the checkpoint's (the chain was rewritten)",
            ))  # fmt: skip
            continue
        ends = tx.fetchall(
            "SELECT MAX(chain_no) AS n FROM events WHERE tenant_id = :t AND chain_no IS NOT NULL",
            {"t": t},
        )[0]["n"]
        reason = (
            f"the tenant's chain is gone (the checkpoint has {n} records)"
            if ends is None
            else f"the chain was truncated: it ends at {ends}, the checkpoint has {n} records"
        )
        broken.append(Broken(t, n, None, None, None, reason))
    return broken


def _matches(prev: str, tenant_id: str, row: dict[str, Any], chain_no: int) -> bool:
    """Whether a sealed record matches its hash, in the encoding it names (``hash_v``):
    by its data's digest, or (never redacted, sealed before digests and before canonical
    JSON) by its data's text."""
    version = _int_or_none(row["hash_v"])
    if record_hash(prev, tenant_id, row, chain_no, version=version) == row["hash"]:
        return True
    return (
        version is None
        and row.get("data_digest") is None
        and record_hash(prev, tenant_id, row, chain_no, by_text=True, version=None) == row["hash"]
    )


def _ends_at_head(
    tx: Tx, tenant_id: str, last: int, last_hash: str,
    head_no: int, head_hash: str, at_head: str,
) -> bool:  # fmt: skip
    """Whether a chain read up to ``last`` ends where the tenant's head says. The head
    was read before the records (each statement reads what is committed when it starts):
    records past it were sealed meanwhile if the head, read again, covers them now."""
    if last == head_no:
        return last_hash == head_hash
    if last < head_no or at_head != head_hash:
        return False  # records the head had counted are gone
    fresh = tx.fetchall(
        "SELECT chain_no, hash FROM audit_heads WHERE tenant_id = :t", {"t": tenant_id}
    )
    if not fresh or int(fresh[0]["chain_no"]) < last:
        return False  # records past any head: not chained by a sealer
    return int(fresh[0]["chain_no"]) > last or fresh[0]["hash"] == last_hash


def audit_records(
    tx: Tx, tenant_id: str, run_id: str | None, after: int, limit: int
) -> list[dict[str, Any]]:
    """Audit records of a tenant (or of one of its runs): by chain position for the
    tenant, by seq for a run (unsealed records included, with ``hash`` null)."""
    if run_id is not None:
        sql = (
            "SELECT e.id, e.run_id, e.seq, e.type, e.actor, e.at, e.data, e.chain_no, "
            "e.prev_hash, e.hash, e.tenant_id FROM events e JOIN runs r ON r.id = e.run_id "
            "WHERE e.run_id = :run AND r.tenant_id = :t AND e.seq > :after "
            "ORDER BY e.seq LIMIT :limit"
        )
    else:
        sql = (
            "SELECT id, run_id, seq, type, actor, at, data, chain_no, prev_hash, hash, "
            "tenant_id FROM events WHERE tenant_id = :t AND chain_no > :after "
            "ORDER BY chain_no LIMIT :limit"
        )
    found = tx.fetchall(sql, {"t": tenant_id, "run": run_id, "after": after, "limit": limit})
    out = []
    for r in found:
        row = dict(r)
        row["data"] = json.loads(row["data"]) if row["data"] is not None else None
        out.append(row)
    # Only records of the tenant's own chain have their previous hash derived, from that
    # chain: one of a run moved in from another tenant (``runs_in_other_chains``) sits
    # at a position of another chain, whose records are not the caller's to read.
    own = [r for r in out if r.pop("tenant_id") == tenant_id]
    previous = _previous_hashes(tx, tenant_id, own)
    for row in own:
        if row["prev_hash"] is None and row["chain_no"] is not None:
            row["prev_hash"] = previous.get(int(row["chain_no"]) - 1)
    return out


# Chain positions looked up per statement (under every backend's parameter limit).
_PER_LOOKUP = 500


def _previous_hashes(tx: Tx, tenant_id: str, records: list[dict[str, Any]]) -> dict[int, str]:
    """chain_no -> hash of the records before ``records`` whose ``prev_hash`` is not
    stored: the record before's own hash, read from the page itself, else from the
    chain, else (just after a pruned span) the span's last hash, or the genesis.

    A position inside a pruned span is the summary's, never a row's: the span's records
    were removed with it, so a row there is one a writer of the database put there
    (``audit verify`` names it)."""
    wanted = {
        int(r["chain_no"]) - 1
        for r in records
        if r["prev_hash"] is None and r["chain_no"] is not None
    }
    if not wanted:
        return {}
    pruned = pruned_summary(tx, tenant_id)
    start = int(pruned["last_chain_no"]) if pruned is not None else 0
    out = {start: str(pruned["last_hash"]) if pruned is not None else GENESIS}
    known = {int(r["chain_no"]): str(r["hash"]) for r in records if r["chain_no"] is not None}
    out.update({n: known[n] for n in wanted if n > start and n in known})
    missing = sorted(n for n in wanted.difference(out) if n > start)
    for at in range(0, len(missing), _PER_LOOKUP):
        marks, params = in_list("n", missing[at : at + _PER_LOOKUP])
        params["t"] = tenant_id
        found = tx.fetchall(
            f"SELECT chain_no, hash FROM events WHERE tenant_id = :t AND chain_no IN ({marks})",
            params,
        )
        out.update({int(r["chain_no"]): str(r["hash"]) for r in found})
    return out


# What prune (store/_queries/retention.py) asks of the chain, through the kernel's seam.


def check_record(
    key: AuditKey | None,
    tenant_id: str,
    row: dict[str, Any],
    prev: str,
    expected_no: int,
    signed_at: int | None,
) -> tuple[int, str] | None:
    """Why ``row``, expected at ``expected_no`` after ``prev``, breaks the chain, as
    ``(chain_no, reason)``, or None (a stored value not of its type breaks it too)."""
    try:
        problem = _check_record(key, tenant_id, row, prev, expected_no, signed_at, False)
    except (TypeError, ValueError) as exc:
        return expected_no, str(exc)
    return None if problem is None else (problem.chain_no, problem.reason)


def extend_pruned(
    tx: Tx,
    tenant_id: str,
    s: dict[str, Any] | None,
    taken: list[dict[str, Any]],
    runs: int,
    key: AuditKey | None,
) -> None:
    """Extend the tenant's pruned-span summary ``s`` (None: the first) over ``taken``,
    the records a prune removes in this transaction, and ``runs`` runs removed with
    them: their counts by type, the digest folded over their hashes, signed under
    ``key`` (store/_queries/retention.py)."""
    counts: dict[str, int] = json.loads(s["counts"]) if s else {}
    digest = str(s["digest"]) if s else GENESIS
    for r in taken:
        counts[str(r["type"])] = counts.get(str(r["type"]), 0) + 1
        digest = fold(digest, str(r["hash"]))
    new: dict[str, Any] = {
        "t": tenant_id,
        "last_chain_no": int(taken[-1]["chain_no"]),
        "last_hash": str(taken[-1]["hash"]),
        "records": (int(s["records"]) if s else 0) + len(taken),
        "runs": (int(s["runs"]) if s else 0) + runs,
        "counts": json.dumps(counts, sort_keys=True, separators=(",", ":")),
        "digest": digest,
        "first_at": s["first_at"] if s else taken[0]["at"],
        "last_at": taken[-1]["at"],
        "pruned_at": time.time(),
    }
    new["sig"] = key.sign_pruned(tenant_id, summary_fields(new)) if key is not None else None
    tx.execute(
        "INSERT INTO audit_pruned (tenant_id, last_chain_no, last_hash, records, runs, counts, "
        "digest, first_at, last_at, pruned_at, sig) VALUES (:t, :last_chain_no, :last_hash, "
        ":records, :runs, :counts, :digest, :first_at, :last_at, :pruned_at, :sig) "
        "ON CONFLICT (tenant_id) DO UPDATE SET last_chain_no = excluded.last_chain_no, "
        "last_hash = excluded.last_hash, records = excluded.records, runs = excluded.runs, "
        "counts = excluded.counts, digest = excluded.digest, first_at = excluded.first_at, "
        "last_at = excluded.last_at, pruned_at = excluded.pruned_at, sig = excluded.sig",
        new,
    )


# The kernel seals and prunes through this (agentledger/_auditchain.py): registered when
# this module is imported, which importing agentledger.service does.
auditchain.register(
    auditchain.AuditChain(
        has_unsealed=has_unsealed,
        seal=seal,
        genesis=GENESIS,
        pruned_summary=pruned_summary,
        summary_problem=summary_problem,
        may_extend=may_extend,
        check_record=check_record,
        extend_pruned=extend_pruned,
    )
)
