"""The journal fence on a private PostgreSQL cluster: a worker stopped (SIGSTOP) in
the middle of a write, at each point of it, wakes up while the worker that took
its run over is held mid-step; its late write is rejected, every effect happens
once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.helpers import Env
from tests.engine.zombie import zombie_write_is_fenced
from tests.pgcluster import PrivateCluster

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.mark.parametrize("phase", ["after_started", "after_effect"])
def test_stopped_writer_is_fenced_at_every_point_of_its_write(
    pg_cluster: PrivateCluster, tmp_path: Path, phase: str
) -> None:
    env = Env(tmp_path, pg_cluster.create_database("agentledger"))
    try:
        zombie_write_is_fenced(env, phase)
    finally:
        env.close()
