"""The expand/contract rule of migrations (CONTRIBUTING.md, "How to add a migration";
docs/architecture.md, "Upgrades with runs in flight"), checked on the migrations folder.

A migration is online unless it says ``-- offline: why``: the previous release's
workers keep serving while it runs and after it. So an online migration only expands
(new tables, new columns that are nullable or have a default, new indexes, backfills)
and contracts only what no code uses any more (``-- contract: NAME unused since
RELEASE``, and NAME appears nowhere in the code of this release). What this test
cannot see -- that the previous release did not use NAME either -- the reviewer checks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentledger.store._postgres import PostgresDialect
from agentledger.store._queries.migrations import offline_reason
from agentledger.store._sqlite import SQLiteDialect

SRC = Path(__file__).resolve().parents[2] / "src" / "agentledger"

_CONTRACT = re.compile(r"^\s*--\s*contract:\s*(\w+)\s+unused since\s+\S+", re.M | re.I)
_IDENT = r"[\"`]?(\w+)[\"`]?"


def _statements(script: str) -> list[str]:
    lines = [ln for ln in script.splitlines() if not ln.strip().startswith("--")]
    return [" ".join(s.split()) for s in "\n".join(lines).split(";") if s.strip()]


def violations(script: str, earlier: list[str], code: str) -> list[str]:
    """What in ``script`` the previous release's workers could not run beside, given
    the ``earlier`` migrations' scripts and the release's ``code`` (its source text).
    Empty when the migration says it is offline."""
    if offline_reason(script):
        return []
    contracted = set(_CONTRACT.findall(script))
    before = [s for e in earlier for s in _statements(e)]
    existing = {m.group(1).lower() for s in before
                for m in [re.match(rf"CREATE TABLE (?:IF NOT EXISTS )?{_IDENT}", s, re.I)]
                if m}  # fmt: skip
    unique_before = {m.group(1).lower() for s in before
                     for m in [re.match(rf"CREATE UNIQUE INDEX (?:IF NOT EXISTS )?{_IDENT}", s,
                                        re.I)]
                     if m}  # fmt: skip
    found = []
    statements = _statements(script)
    created_here = " ".join(statements).lower()
    added_nullable = {m.group(1).lower() for t in statements
                      for m in [re.search(rf"\bADD COLUMN {_IDENT} [^;]*", t, re.I)]
                      if m and "NOT NULL" not in m.group(0).upper()}  # fmt: skip
    for s in statements:
        upper = s.upper()

        def dropped(name: str, what: str, s: str = s) -> None:
            if name not in contracted:
                found.append(f"{what} {name} without `-- contract: {name} unused since R`: {s}")
            elif re.search(rf"\b{name}\b", code):
                found.append(f"{what} {name} is still used by this release's code: {s}")

        if m := re.match(rf"DROP TABLE (?:IF EXISTS )?{_IDENT}", s, re.I):
            dropped(m.group(1), "drops table", s)
        elif m := re.search(rf"\bDROP COLUMN (?:IF EXISTS )?{_IDENT}", s, re.I):
            dropped(m.group(1), "drops column", s)
        elif " RENAME " in f" {upper} ":
            found.append(f"renames (old workers still use the old name; add, copy, "
                         f"contract later): {s}")  # fmt: skip
        elif re.search(r"\bALTER COLUMN\b", upper):
            found.append(f"changes a column's type or constraints: {s}")
        elif re.search(r"\bADD CONSTRAINT\b", upper):
            found.append(f"adds a constraint old workers' writes may break: {s}")
        elif re.search(r"\bADD COLUMN\b.*\bNOT NULL\b", upper) and "DEFAULT" not in upper:
            found.append(f"adds a NOT NULL column without a default (old workers' "
                         f"INSERTs fail): {s}")  # fmt: skip
        elif m := re.match(
            rf"CREATE UNIQUE INDEX (?:IF NOT EXISTS )?{_IDENT} ON {_IDENT} \(([^)]*)\)", s, re.I
        ):
            table = m.group(2).lower()
            columns = {c.strip().lower() for c in m.group(3).split(",")}
            # Old workers write NULL in a column this migration adds as nullable, and a
            # key holding a NULL never collides: only a key of columns they all fill can
            # refuse their writes.
            if (
                table in existing
                and m.group(1).lower() not in unique_before
                and not columns & added_nullable
            ):
                found.append(f"a new unique index on {table}, which old workers write: {s}")
        elif m := re.match(rf"DROP INDEX (?:IF EXISTS )?{_IDENT}", s, re.I):
            name = m.group(1).lower()
            if name in unique_before and not re.search(
                rf"create unique index (?:if not exists )?{name}\b", created_here
            ):
                found.append(f"drops unique index {name} (an ON CONFLICT target) without "
                             f"creating it again in the same migration: {s}")  # fmt: skip
    return found


def _code() -> str:
    return "\n".join(p.read_text() for p in sorted(SRC.rglob("*.py")))


@pytest.mark.parametrize("dialect", [SQLiteDialect("sqlite:///x.db"), PostgresDialect("")],
                         ids=["sqlite", "postgres"])  # fmt: skip
def test_every_migration_is_online_or_says_it_is_not(dialect: object) -> None:
    code = _code()
    files = dialect.migration_files()  # type: ignore[attr-defined]
    found = {}
    for i, (version, name, script) in enumerate(files):
        bad = violations(script, [s for _, _, s in files[:i]], code)
        if bad:
            found[f"{version:04d}_{name}"] = bad
    assert not found, found


EARLIER = [
    "CREATE TABLE runs (id TEXT PRIMARY KEY, status TEXT);"
    "CREATE UNIQUE INDEX runs_key ON runs (status)"
]


@pytest.mark.parametrize(
    "script",
    [
        "ALTER TABLE runs DROP COLUMN status",
        "DROP TABLE runs",
        "ALTER TABLE runs RENAME COLUMN status TO state",
        "ALTER TABLE runs RENAME TO jobs",
        "ALTER TABLE runs ALTER COLUMN status TYPE INTEGER USING 0",
        "ALTER TABLE runs ALTER COLUMN status SET NOT NULL",
        "ALTER TABLE runs ADD COLUMN owner TEXT NOT NULL",
        "ALTER TABLE runs ADD CONSTRAINT runs_status CHECK (status <> '')",
        "CREATE UNIQUE INDEX runs_status ON runs (status, id)",
        "ALTER TABLE runs ADD COLUMN n INTEGER NOT NULL DEFAULT 0;"
        "CREATE UNIQUE INDEX runs_n ON runs (id, n)",
        "DROP INDEX runs_key",
        # A contract of a name this release still uses.
        "-- contract: status unused since 0.1.0\nALTER TABLE runs DROP COLUMN status",
    ],
)
def test_what_old_workers_cannot_run_beside_is_refused(script: str) -> None:
    assert violations(script, EARLIER, code="SELECT status FROM runs"), script


@pytest.mark.parametrize(
    "script",
    [
        "CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT NOT NULL)",
        "CREATE UNIQUE INDEX notes_body ON notes (body)",  # a table no old worker writes
        "ALTER TABLE runs ADD COLUMN owner TEXT",
        "ALTER TABLE runs ADD COLUMN tries INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX runs_owner ON runs (owner)",
        "ALTER TABLE runs ADD COLUMN ref TEXT;CREATE UNIQUE INDEX runs_ref ON runs (ref)",
        "UPDATE runs SET owner = 'x' WHERE owner IS NULL",
        "DROP INDEX runs_key;CREATE UNIQUE INDEX runs_key ON runs (status) WHERE status <> ''",
        "-- contract: legacy unused since 0.1.0\nALTER TABLE runs DROP COLUMN legacy",
        "-- offline: rewrites the run states\nALTER TABLE runs RENAME COLUMN status TO state",
    ],
)
def test_expand_contract_and_offline_migrations_pass(script: str) -> None:
    earlier = [*EARLIER, "CREATE TABLE notes_pre (id TEXT)"]
    if "notes_body" in script:
        script = "CREATE TABLE notes (id TEXT, body TEXT);" + script
    assert violations(script, earlier, code="SELECT status FROM runs") == [], script
