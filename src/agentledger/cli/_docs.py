"""``agentledger docs``: documents indexed for retrieval (add, list, remove, search)."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich import box
from rich.table import Table

from agentledger.cli._common import (
    check_text,
    db_option,
    json_option,
    print_json,
    run_async,
    with_store,
)
from agentledger.cli._memory import default_actor
from agentledger.cli._text import cell, console
from agentledger.errors import UsageError
from agentledger.retrieval import _queries as retrieval_docs
from agentledger.retrieval._embeddings import embedder
from agentledger.retrieval._ingest import index_path, load_document
from agentledger.retrieval._queries import ChunkHit
from agentledger.retrieval._search import search as search_chunks
from agentledger.store import Store

tenant_option = click.option(
    "--tenant",
    "tenant_id",
    default="default",
    show_default=True,
    help="The tenant the documents belong to.",
)


@click.group("docs")
def docs() -> None:
    """Documents agents search (policies, FAQs): Markdown, text and HTML."""


@docs.command("add")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@tenant_option
@db_option
@run_async
async def add(paths: tuple[Path, ...], tenant_id: str, db: str) -> None:
    """Chunk and index files for a tenant (the same file again: updated in place)."""
    check_text(tenant_id, "--tenant")
    for path in paths:  # read every file first: a bad one fails before anything is written
        load_document(path)
    actor = default_actor()

    model = embedder()  # the embeddings extra, when installed: chunks get vectors too
    vectors = f", embedded by {model.name}" if model is not None else ""

    async def go(store: Store) -> None:
        for path in paths:
            doc, changed = await index_path(store, path, tenant_id, actor=actor)
            state = "indexed" if changed else "unchanged"
            chunks = f"{doc.chunks} chunk{'' if doc.chunks == 1 else 's'}"
            click.echo(f"{state} {doc.id} {doc.title!r}: {chunks}{vectors} ({doc.source})")

    await with_store(db, go, create=True)


@docs.command("list")
@click.option("--tenant", "tenant_id", default=None, help="Only this tenant [default: all].")
@db_option
@json_option
@run_async
async def list_docs(tenant_id: str | None, db: str, as_json: bool) -> None:
    """List indexed documents."""
    check_text(tenant_id, "--tenant")
    found = await with_store(db, lambda s: s.read(retrieval_docs.list_documents, tenant_id))
    if as_json:
        print_json([d.__dict__ for d in found])
        return
    if not found:
        click.echo("no documents")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("document", no_wrap=True)
    for header in ("tenant", "title", "kind", "chunks", "added", "source"):
        table.add_column(header, overflow="fold")
    for d in found:
        table.add_row(
            cell(d.id),
            cell(d.tenant_id),
            cell(d.title),
            d.kind,
            str(d.chunks),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(d.created_at)),
            cell(d.source),
        )
    console().print(table)


@docs.command("remove")
@click.argument("refs", nargs=-1, required=True)
@tenant_option
@db_option
@run_async
async def remove(refs: tuple[str, ...], tenant_id: str, db: str) -> None:
    """Remove documents (by id, or by source: the path they were added from)."""
    check_text(tenant_id, "--tenant")
    actor = default_actor()

    async def go(store: Store) -> list[tuple[str, int]]:
        out = []
        for ref in refs:
            removed = await store.transact(retrieval_docs.remove_document, tenant_id, ref, actor)
            if not removed and Path(ref).exists():  # a path given as typed: try it resolved
                removed = await store.transact(
                    retrieval_docs.remove_document, tenant_id, str(Path(ref).resolve()), actor
                )
            out.append((ref, removed))
        return out

    missing = []
    for ref, removed in await with_store(db, go):
        if removed:
            click.echo(f"removed {ref}")
        else:
            missing.append(ref)
    if missing:
        raise click.ClickException(
            f"no document {', '.join(missing)} in tenant {tenant_id}; see `agentledger docs list`"
        )


@docs.command("search")
@click.argument("query")
@click.option(
    "--tenant",
    "tenant_id",
    default=None,
    help="The tenant whose documents to search [default: the only tenant with documents].",
)
@click.option("-k", "k", default=4, show_default=True, help="At most this many chunks.")
@db_option
@json_option
@run_async
async def search(query: str, tenant_id: str | None, k: int, db: str, as_json: bool) -> None:
    """Search one tenant's documents as an agent's search_docs tool would.

    Tenants are never mixed: without --tenant the only tenant that has documents is
    searched; when several have, the command names them and asks for --tenant.
    """
    check_text(tenant_id, "--tenant")

    async def go(store: Store) -> tuple[str, list[str], list[ChunkHit]]:
        tenants = sorted(
            {d.tenant_id for d in await store.read(retrieval_docs.list_documents, None)}
        )
        chosen = tenant_id
        if chosen is None:
            if not tenants:
                raise UsageError("no documents; add some with `agentledger docs add PATH`")
            if len(tenants) > 1:
                raise UsageError(
                    f"documents are in tenants {', '.join(tenants)}; pass --tenant "
                    "(a search covers one tenant)"
                )
            chosen = tenants[0]
        return chosen, tenants, await search_chunks(store, chosen, query, k)

    chosen, tenants, hits = await with_store(db, go, read_only=True)
    if as_json:
        print_json([h.to_dict() for h in hits])
        return
    if tenant_id is None:
        click.echo(f"tenant {chosen} (the only one with documents)")
    if not hits and chosen not in tenants:
        others = ", ".join(tenants) or "none"
        click.echo(f"tenant {chosen} has no documents (tenants with documents: {others})")
    elif not hits:
        click.echo(f"no match in tenant {chosen}'s documents")
    for h in hits:
        click.echo(f"[{h.chunk_id}] {hit_heading(h.title, h.heading)}  (score {h.score:.3g})")
        click.echo("    " + h.text[:300].replace("\n", " "))


def hit_heading(title: str, heading: str) -> str:
    """Where a chunk sits: its document's title, then the headings under it. A title
    taken from the first heading starts the heading path already: said once."""
    if not heading or heading == title:
        return title
    if heading.startswith(f"{title} > "):
        return heading
    return f"{title} > {heading}"
