"""PostgreSQL's full-text index holds the tenant: a search scans only the tenant's entries."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.postgres


def test_the_full_text_index_leads_with_the_tenant(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET enable_seqscan = off")  # the plan an indexed table would get
        (indexdef,) = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'doc_chunks_tsv'"
        ).fetchone()  # type: ignore[misc]
        assert "gin (tenant_id, tsv)" in indexdef
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT c.id FROM doc_chunks c, "
                "websearch_to_tsquery('english', 'cancel or refund') query "
                "WHERE c.tenant_id = 'acme' AND c.tsv @@ query"
            )
        )
        index_cond = [ln for ln in plan.splitlines() if "Index Cond" in ln]
        assert index_cond and "tenant_id" in index_cond[0], plan
