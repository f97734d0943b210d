"""`audit verify` while another process seals: a record sealed between verify's reads
is not a break (the head and the records are judged as of one moment)."""

from __future__ import annotations

from typing import Any

from agentledger.service._queries import audit as service_audit
from agentledger.store import open_store
from agentledger.store._tx import Tx
from tests.service import service_app


class _SealsBetweenReads:
    """The store's dialect, with a seal committed by another connection right after the
    first read verify makes (the heads): a sealer in another process at that moment."""

    def __init__(self, dialect: Any) -> None:
        self._d = dialect
        self._other = dialect.connect()
        self._reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._d, name)

    def fetchall(self, conn: Any, sql: str, params: Any = None) -> Any:
        found = self._d.fetchall(conn, sql, params)
        self._reads += 1
        if self._reads == 1:
            self._d.begin_write(self._other)
            assert service_audit.seal(Tx(self._d, self._other)) == 1
            self._d.commit(self._other)
            self._d.close(self._other)
        return found


async def test_verify_does_not_report_records_sealed_while_it_reads(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        run_id = await service_app.app.submit(store, "echo", {"text": "x"}, tenant_id="t1")
        assert await store.transact(service_audit.seal) >= 1
        await store.append_event(run_id, "note", "test", {"n": 1})  # one unsealed record
        racing = _SealsBetweenReads(store.dialect)

        def verify(tx: Tx) -> Any:
            return service_audit.verify_chain(Tx(racing, tx.conn))  # type: ignore[arg-type]

        checked, broken = await store.read(verify)
        assert broken == [], broken  # nothing was deleted: one record was sealed meanwhile
        # And a real deletion is still reported.
        checked, broken = await store.read(service_audit.verify_chain)
        assert broken == []
        await store.transact(
            lambda tx: tx.execute("DELETE FROM events WHERE id = (SELECT MAX(id) FROM events)")
        )
        checked, broken = await store.read(service_audit.verify_chain)
        assert [b.reason for b in broken] == [
            f"the chain ends at {checked} but its head says {checked + 1} (records deleted)"
        ]
    finally:
        await store.close()
