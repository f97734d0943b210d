"""Shared fixtures: every store test runs on each backend.

* ``store_url`` -- parametrized over ``sqlite`` (a file in ``tmp_path``, a copy of a
  per-session template file with the schema migrated) and ``postgres`` (a fresh
  database per test, cloned from a per-session template with the schema migrated,
  dropped after the test; marked ``postgres``).
* ``sqlite_template`` -- that migrated SQLite file; :func:`migrated_sqlite` copies it.
* ``store`` -- an opened store on ``store_url``, closed after the test.
* ``pg_url`` -- PostgreSQL only, for PostgreSQL-specific tests.
* ``env`` -- an engine test world (database, external ledger, worker processes) on
  SQLite; ``backend_env`` -- the same on each backend.
* ``pg_cluster`` -- a private PostgreSQL cluster (tests/pgcluster.py), started, for
  tests that restart, stop or break the server: the machine's shared server is
  never restarted or reconfigured. Removed after the test, pass or fail.

At the end of the session, no database this session created may be left on the
shared server (``_no_leftover_databases``).

PostgreSQL comes from ``AGENTLEDGER_TEST_PG`` (see tests/dbutil.py). When it is
not reachable, postgres tests are skipped -- unless ``CI`` is set (non-empty),
where they fail: CI must never go green by skipping the production backend.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

# The suite's workers are production workers: the features that register the kernel's
# required hooks (tenant budgets, the audit chain) are imported, as the CLI does.
import agentledger.gateway
import agentledger.service  # noqa: F401
from agentledger.store import Store, open_store
from tests import dbutil, netguard
from tests import sqlite_template as sqlite_files
from tests.engine.helpers import Env
from tests.pgcluster import ClusterUnavailable, PrivateCluster
from tests.store.pgproxy import LossyProxy

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def require_pg() -> None:
    """Skip (locally) or fail (CI) when the test PostgreSQL server is not reachable."""
    if dbutil.pg_available():
        return
    _skip_or_fail(
        f"PostgreSQL not reachable at {dbutil.admin_url()}; start it or set "
        "AGENTLEDGER_TEST_PG=postgresql://user@host:port/postgres"
    )


def _skip_or_fail(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


# Directories whose tests run whole stacks of processes (many seconds each), and those
# whose tests run in process (a fraction of a second each). Not observe: its resume and
# fold tests kill command processes (tens of seconds each on a busy machine), which at
# the very end would hold up the suite.
FIRST = ("stayhub", "docs", "chaos")
LAST = ("unit", "fast", "memory", "sandbox", "testing")


def _turn(item: pytest.Item) -> tuple[bool, int]:
    parts = item.path.relative_to(item.config.rootpath).parts
    place = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return (
        item.get_closest_marker("long") is None,
        0 if place in FIRST else 2 if place in LAST else 1,
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``long`` (tens of seconds each) go first, then the directories of
    :data:`FIRST`, the others, and the in-process ones of :data:`LAST` (each keeping its
    order): handed out one by one to the test processes (``--maxschedchunk 1`` in
    pyproject.toml), the long ones run side by side at the start and quick ones fill the
    end, instead of one long test holding up the end of the suite."""
    items.sort(key=_turn)


@pytest.fixture(scope="session", autouse=True)
def _no_external_network() -> None:
    """No test ever reaches a host off this machine (a real model provider included)."""
    netguard.install()


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_databases() -> Iterator[None]:
    """Fail the session if any database it created is still on the shared server.

    Set up before (so torn down after) ``_pg_session``, which hands the template to
    the background drops that this waits for.
    Names carry the session's tag (tests/dbutil.py), so suites running at the same
    time on the same server do not see each other's databases.
    """
    yield
    if not dbutil.pg_available():
        return
    dbutil.finish_drops()  # the drops handed to the background are done
    left = dbutil.leftover_databases()
    for name in left:
        dbutil.drop_database(name)
    assert left == [], f"tests left databases behind on the shared server: {left}"


@pytest.fixture
def pg_cluster() -> Iterator[PrivateCluster]:
    """A private PostgreSQL cluster, started; stopped and removed after the test."""
    try:
        cluster = PrivateCluster()
    except ClusterUnavailable as exc:
        _skip_or_fail(f"cannot make a private PostgreSQL cluster: {exc}")
        raise  # not reached
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def _pg_session() -> Iterator[None]:
    """Makes sure the server is there; drops the template database at session end (with
    the last tests' databases, in ``_no_leftover_databases``)."""
    require_pg()
    yield
    dbutil.drop_template()


@pytest.fixture
def pg_url(_pg_session: None) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test."""
    url = dbutil.make_pg_database()
    try:
        yield url
    finally:
        dbutil.drop_pg_database(url)


@pytest.fixture(scope="session")
def sqlite_template() -> Path:
    """A SQLite file with the current schema, migrated once per test process
    (tests/sqlite_template.py); :func:`migrated_sqlite` copies it. The tests of migrating
    a fresh file make their own (``empty_url``, their own paths)."""
    return sqlite_files.template()


def migrated_sqlite(template: Path, path: Path) -> str:
    """Copy the migrated ``template`` to ``path`` (a new file) and return its URL: the
    database as a first ``store.open()`` leaves it."""
    return sqlite_files.migrated_copy(path, template)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL on each backend; the database is fresh (migrated, unused) for every
    test."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return migrated_sqlite(request.getfixturevalue("sqlite_template"), tmp_path / "agentledger.db")


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    """An opened store on ``store_url``."""
    opened = open_store(store_url)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def proxy(pg_url: str) -> Iterator[LossyProxy]:
    """A loopback proxy in front of a fresh PostgreSQL database that can lose a reply."""
    lossy = LossyProxy(pg_url)
    try:
        yield lossy
    finally:
        lossy.close()


@pytest.fixture
def env(tmp_path: Path, sqlite_template: Path) -> Iterator[Env]:
    """An engine test world on SQLite (the file migrated, as after a first start)."""
    migrated_sqlite(sqlite_template, tmp_path / "agentledger.db")
    world = Env(tmp_path)
    try:
        yield world
    finally:
        world.close()


@pytest.fixture
def pg_env(pg_url: str, tmp_path: Path) -> Iterator[Env]:
    """An engine test world on a fresh PostgreSQL database."""
    world = Env(tmp_path, pg_url)
    try:
        yield world
    finally:
        world.close()


@pytest.fixture
def backend_env(store_url: str, tmp_path: Path) -> Iterator[Env]:
    """An engine test world on each backend: same engine, same guarantees."""
    world = Env(tmp_path, store_url)
    try:
        yield world
    finally:
        world.close()
