"""Fixtures for archive tests: a small Problem, record builders, archives over both stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from archive import Archive
from evo.types import Problem
from tests.archive.helpers import make_problem


@pytest.fixture
def problem() -> Problem:
    return make_problem()


@pytest.fixture(params=["memory", "lmdb"])
def archive(request: pytest.FixtureRequest, problem: Problem, tmp_path: Path) -> Iterator[Archive]:
    store = None if request.param == "memory" else tmp_path / "arch"
    ar = Archive(problem, store)
    yield ar
    ar.close()
