"""Forgetting a user erases every copy of their remembered text the store can find --
the facts, the journal's inputs and outputs, the events, the run rows -- replacing it
with a redaction marker; the audit event names what was forgotten only by count and
digest; the audit chain still verifies; a forget that matches nothing fails and names
the tenants where the user does have facts. Both backends."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from click.testing import CliRunner

from agentledger import _auditkey as auditkey
from agentledger.cli._main import cli
from agentledger.memory import _queries as memory_facts
from agentledger.memory._queries import memory_audit_id
from agentledger.records import RunStatus
from agentledger.service._queries import audit as service_audit
from agentledger.store import Store, open_store
from agentledger.store._sqlite import sqlite_path
from tests.cli.helpers import cli_here
from tests.memory.runs import count, run_to_rest
from tests.memory.test_agents import help_app

SECRET = "diagnosis hiv positive"
REDACTED = "[forgotten]"
COPIES = [
    "SELECT COUNT(*) FROM steps WHERE {pos}(input, ?) > 0 OR {pos}(output, ?) > 0",
    "SELECT COUNT(*) FROM events WHERE {pos}(data, ?) > 0 OR {pos}(data, ?) > 0",
    "SELECT COUNT(*) FROM runs WHERE {pos}(input, ?) > 0 OR {pos}(result, ?) > 0",
    "SELECT COUNT(*) FROM memory_facts WHERE {pos}(fact, ?) > 0 OR {pos}(fact_key, ?) > 0",
]


def copies(store_url: str, text: str) -> int:
    """Rows anywhere holding ``text`` (a plain substring test: LIKE's ``_`` is a wildcard)."""
    pos = "instr" if store_url.startswith("sqlite") else "strpos"
    return sum(count(store_url, sql.format(pos=pos), (text, text)) for sql in COPIES)


async def seal_and_verify(store: Store) -> tuple[int, list[service_audit.Broken]]:
    await store.transact(service_audit.seal)
    return await store.read(service_audit.verify_chain)


async def test_forget_erases_the_journal_events_and_runs_copies_and_the_chain_verifies(
    store: Store, store_url: str
) -> None:
    app, _ = help_app()
    for user in ("g-1", "g-2"):
        run = await run_to_rest(
            store, app, "stayhub_help", {"remember": SECRET}, tenant_id="acme", user_id=user
        )
        assert run.status == RunStatus.COMPLETED, run.error
    # A recall run: the fact is in the model's context and the tool's output too.
    await run_to_rest(
        store, app, "stayhub_help", {"recall": "diagnosis"}, tenant_id="acme", user_id="g-1"
    )
    await store.transact(
        memory_facts.upsert_fact, "acme", "g-1", "diagnosis_hiv_positive", "yes", None, None
    )
    assert copies(store_url, SECRET) > 3
    checked, broken = await seal_and_verify(store)
    assert checked > 0 and broken == []

    forgotten = await store.transact(memory_facts.forget_facts, "acme", "g-1", None, "cli:ops")
    assert forgotten == (2, 0)
    # g-1's copies are gone (g-2's own runs and fact are not g-1's to forget).
    g2 = await store.read(memory_facts.list_facts, "acme", "g-2")
    assert [f.fact for f in g2] == [SECRET]
    g1_runs = "SELECT COUNT(*) FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.user_id = ? "
    like = f"%{SECRET}%"
    both = g1_runs + "AND (s.input LIKE ? OR s.output LIKE ?)"
    assert count(store_url, both, ("g-1", like, like)) == 0
    assert count(store_url, g1_runs + "AND s.output LIKE ?", ("g-1", f"%{REDACTED}%")) > 0
    events = (
        "SELECT COUNT(*) FROM events e JOIN runs r ON r.id = e.run_id "
        "WHERE r.user_id = ? AND e.data LIKE ?"
    )
    assert count(store_url, events, ("g-1", like)) == 0
    runs = "SELECT COUNT(*) FROM runs WHERE user_id = ? AND (input LIKE ? OR result LIKE ?)"
    assert count(store_url, runs, ("g-1", like, like)) == 0
    assert copies(store_url, "diagnosis_hiv_positive") == 0
    # The audit event: a count and a digest, never a key or a fact.
    audit = await store.list_events(memory_audit_id("acme", "g-1"))
    assert [e.type for e in audit] == ["memory.forgotten"]
    data = audit[0].data
    assert data["deleted"] == 2 and len(data["digest"]) == 64
    assert "keys" not in data and "diagnosis" not in str(data)
    # Sealed records were redacted, and the chain still verifies.
    assert count(store_url, "SELECT COUNT(*) FROM events WHERE data_digest IS NOT NULL") > 0
    checked_after, broken = await seal_and_verify(store)
    assert checked_after > checked and broken == []


async def test_a_redacted_record_edited_again_still_breaks_the_chain(
    store: Store, store_url: str
) -> None:
    app, _ = help_app()
    await run_to_rest(
        store, app, "stayhub_help", {"remember": SECRET}, tenant_id="acme", user_id="g-1"
    )
    await seal_and_verify(store)
    await store.transact(memory_facts.forget_facts, "acme", "g-1", None, "cli")
    assert (await seal_and_verify(store))[1] == []

    def edit(tx):  # type: ignore[no-untyped-def]
        tx.execute("UPDATE events SET actor = 'mallory' WHERE data_digest IS NOT NULL")

    await store.transact(edit)
    assert (await seal_and_verify(store))[1] != []


def test_forget_matching_nothing_fails_and_names_the_users_tenants(store_url: str) -> None:
    async def seed() -> None:
        store = open_store(store_url)
        await store.open()
        try:
            await store.transact(
                memory_facts.upsert_fact, "acme", "g-1", "room", "likes views", "r2", "r2:2"
            )
            await store.transact(
                memory_facts.upsert_fact, "globex", "g-1", "diet", "vegan", "r3", "r3:2"
            )
        finally:
            await store.close()

    asyncio.run(seed())
    result = CliRunner().invoke(cli, ["memory", "forget", "--user", "g-1", "--db", store_url])
    assert result.exit_code != 0
    assert "nothing" in result.output and "acme, globex" in result.output
    assert "--tenant" in result.output
    sql = "SELECT COUNT(*) FROM memory_facts WHERE user_id = ?"
    assert count(store_url, sql, ("g-1",)) == 2
    result = CliRunner().invoke(
        cli, ["memory", "forget", "--user", "g-1", "--tenant", "acme", "--db", store_url]
    )
    assert result.exit_code == 0 and "1 deleted" in result.output, result.output


async def test_sqlite_deletes_overwrite_the_freed_content(store: Store, store_url: str) -> None:
    if not store_url.startswith("sqlite"):
        return
    await store.transact(memory_facts.upsert_fact, "acme", "g-1", "k", "x" * 2000, None, None)

    def pragma(tx):  # type: ignore[no-untyped-def]
        return tx.fetchall("PRAGMA secure_delete")[0]

    row = await store.read(pragma)
    assert list(dict(row).values()) == [1]
    await store.transact(memory_facts.forget_facts, "acme", "g-1", None, "cli")
    await store.close()
    conn = sqlite3.connect(sqlite_path(store_url)[0])
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(sqlite_path(store_url)[0], "rb") as f:
        assert b"x" * 2000 not in f.read()


async def test_records_sealed_over_their_text_before_digests_still_verify(
    store: Store,
) -> None:
    await store.transact(memory_facts.upsert_fact, "acme", "g-1", "k", "a fact", None, None)
    await store.transact(memory_facts.forget_facts, "acme", "g-1", "k", "cli")
    await store.transact(memory_facts.forget_facts, "acme", "g-1", "k", "cli")
    await store.transact(service_audit.seal)

    def rehash_by_text(tx):  # type: ignore[no-untyped-def]
        # The chain as a release before digests sealed it: hashed over the data's text.
        rows = tx.fetchall("SELECT * FROM events WHERE tenant_id = 'acme' ORDER BY chain_no")
        prev = service_audit.GENESIS
        for row in rows:
            digest = service_audit.record_hash(
                prev, "acme", row, row["chain_no"], by_text=True, version=None
            )
            tx.execute(
                "UPDATE events SET prev_hash = :p, hash = :h, hash_v = NULL "
                      "WHERE id = :i", {"p": prev, "h": digest, "i": row["id"]})  # fmt: skip
            prev = digest
        tx.execute("UPDATE audit_heads SET hash = :h WHERE tenant_id = 'acme'", {"h": prev})
        return len(rows)

    assert await store.transact(rehash_by_text) == 2
    checked, broken = await store.read(service_audit.verify_chain)
    assert checked == 2 and broken == []


async def test_an_edit_disguised_as_a_redaction_fails_verify_with_the_key(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redacted record is chained by the digest of its data as sealed. Whoever writes
    the database could set that digest on any record and rewrite its data: with the
    audit key, a redaction is signed by ``forget`` and verify refuses one that is not."""
    monkeypatch.setenv(auditkey.ENV, "k" * 40)
    key = auditkey.configured()
    app, _ = help_app()
    await run_to_rest(
        store, app, "stayhub_help", {"remember": SECRET}, tenant_id="acme", user_id="g-1"
    )
    await seal_and_verify(store)
    # A forget under the key: its redactions verify, and are counted.
    await store.transact(memory_facts.forget_facts, "acme", "g-1", None, "cli", key)
    await store.transact(service_audit.seal)
    checked, broken = await store.read(service_audit.verify_chain, None, key)
    assert checked > 0 and broken == []
    assert await store.read(service_audit.redacted_count) > 0

    def disguise(tx):  # type: ignore[no-untyped-def]
        row = tx.fetchall(
            "SELECT id, data FROM events WHERE data_digest IS NULL AND chain_no IS NOT NULL "
            "AND tenant_id = 'acme' AND data IS NOT NULL ORDER BY chain_no LIMIT 1",
        )[0]  # fmt: skip
        tx.execute(
            "UPDATE events SET data_digest = :g, data = :d WHERE id = :i",
            {"g": service_audit.text_digest(row["data"]), "d": '{"amount": 1}', "i": row["id"]},
        )  # fmt: skip
        return int(row["id"])

    edited = await store.transact(disguise)
    _, without_key = await store.read(service_audit.verify_chain)
    assert without_key == []  # the digest alone cannot tell: hence the signature
    _, broken = await store.read(service_audit.verify_chain, None, key)
    assert [b.event_id for b in broken] == [edited]
    assert "no redaction is signed" in broken[0].reason


async def test_forget_reaches_delivered_outbox_rows_and_settled_effects_not_pending_ones(
    store: Store, store_url: str
) -> None:
    """An email the outbox delivered, its attempts' history and a key-less write's
    settled result are copies in the user's runs too: erased. A delivery not made yet is
    left as queued (a resend under its key must carry what the first attempt carried)
    and counted, so the operator knows to forget again once it is delivered."""
    from agentledger.records import DeliveryStatus, Effect, OutboxItem
    from tests.store.test_contract import batch, step

    await store.transact(memory_facts.upsert_fact, "acme", "g-1", "health", SECRET, None, None)
    run_id = await help_app()[0].submit(
        store, "stayhub_help", {"message": "hi"}, tenant_id="acme", user_id="g-1"
    )
    (run,) = await store.claim_runs("w1", ["stayhub_help@1"], 1, 30)
    assert run.id == run_id
    body = {"to": "g-1@example.com", "body": f"noted: {SECRET}"}
    await store.commit(
        batch(
            run,
            steps=[step(run, 1), step(run, 2), step(run, 3)],
            outbox=[
                OutboxItem(key="mail:sent", run_id=run.id, step_no=1, tool="email", payload=body),
                OutboxItem(key="mail:queued", run_id=run.id, step_no=2, tool="email", payload=body),
            ],
            effects=[Effect(key="crm:1", run_id=run.id, step_no=3, status="claimed")],
        )
    )
    done = Effect(key="crm:1", run_id=run.id, step_no=3, status="done", result={"echo": SECRET})
    await store.commit(batch(run, effects=[done]))  # the call returned: the claim settled
    claimed = await store.claim_outbox("dispatch", 10, 30)
    sent = next(item for item in claimed if item.key == "mail:sent")
    sent.status, sent.attempts = DeliveryStatus.DELIVERED, 2
    sent.history = [{"error": f"mailbox full for {SECRET}"}]
    assert await store.settle_outbox(sent)

    said = cli_here("memory", "forget", "--user", "g-1", "--tenant", "acme", "--db", store_url)
    assert said.returncode == 0, said.stderr
    assert said.stdout.splitlines() == [
        "forgot every fact of g-1 in tenant acme: 1 deleted",
        "1 outbox deliveries of g-1's runs not made yet still hold the text (a resend must "
        "carry what was queued); run this again once they are delivered (`agentledger "
        "outbox dead` lists those that gave up)",
    ]
    rows = {row.key: row for row in await store.list_outbox()}
    assert SECRET not in str(rows["mail:sent"].payload) + str(rows["mail:sent"].history)
    assert REDACTED in rows["mail:sent"].payload["body"]
    assert rows["mail:queued"].payload == body  # goes out as the run queued it
    effect = await store.get_effect("crm:1")
    assert effect is not None and effect.result == {"echo": REDACTED}
    (event,) = await store.list_events(memory_audit_id("acme", "g-1"))
    assert event.data["redacted"]["outbox"] >= 2 and event.data["redacted"]["effects"] == 1
    assert event.data["undelivered"] == 1


async def test_forget_reaches_approval_arguments_decided_and_pending(
    store: Store, store_url: str
) -> None:
    """An approval shows its call's arguments to the approver: a forgotten text there is
    a copy too. Erased in a decided approval and in a pending one alike, as in the
    journal that call was read from, so the approved call and the approval still agree
    (the engine runs an approved call only when its arguments equal the approval's)."""
    import time

    from agentledger.records import Approval
    from agentledger.store import RunUpdate
    from tests.store.test_contract import batch, step

    await store.transact(memory_facts.upsert_fact, "acme", "g-1", "health", SECRET, None, None)
    app = help_app()[0]
    ids = [
        await app.submit(store, "stayhub_help", {"message": "hi"}, tenant_id="acme", user_id=u)
        for u in ("g-1", "g-2")
    ]
    now = time.time()
    for _ in ids:
        (run,) = await store.claim_runs("w1", ["stayhub_help@1"], 1, 30)
        approvals = [
            Approval(
                id=f"{run.id}:{n}",
                run_id=run.id,
                step_no=n,
                tool="email",
                arguments={"body": f"noted: {SECRET}"},
                required_role="manager",
                requested_at=now,
                expires_at=now + 3600,
                default_decision="reject",
            )
            for n in (1, 2)
        ]
        await store.commit(
            batch(
                run,
                steps=[step(run, 1), step(run, 2)],
                approvals=approvals,
                run=RunUpdate(status="waiting", available_at=None),
            )
        )
        await store.decide_approval(f"{run.id}:1", "approve", "alice")

    await store.transact(memory_facts.forget_facts, "acme", "g-1", None, "cli:ops")
    found = {a.id: a for a in await store.get_approvals()}
    for n in (1, 2):
        assert found[f"{ids[0]}:{n}"].arguments == {"body": f"noted: {REDACTED}"}
        assert found[f"{ids[1]}:{n}"].arguments == {"body": f"noted: {SECRET}"}  # not g-1's
    (event,) = await store.list_events(memory_audit_id("acme", "g-1"))
    assert event.data["redacted"]["approvals"] == 2
