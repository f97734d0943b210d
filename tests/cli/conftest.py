from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.helpers import Env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    world = Env(tmp_path)
    try:
        yield world
    finally:
        world.close()
