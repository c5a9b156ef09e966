"""Crash safety: a writer process killed with SIGKILL at random moments loses nothing it reported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from archive import Archive
from archive._archive import _cell_of_key
from evo.codec import unpack_raw
from tests.archive.helpers import check_record, make_problem

ROOT = Path(__file__).resolve().parents[2]
KILLS = 50


def _verify(path: Path, side: Path, start: int) -> int:
    """Check the archive after a kill; records with seq < start were checked after an earlier kill."""
    problem = make_problem()
    with Archive(problem, path) as ar:
        reported = [line for line in side.read_text().splitlines() if len(line) == 32]
        n = len(ar)
        ids = [v.partition(b"\0")[0].decode() for _, v in ar.store.scan("index")]
        assert len(ids) == len(set(ids)) == n
        missing = [i for i in reported if i not in ar]
        assert not missing, f"{len(missing)} reported ids lost, e.g. {missing[:3]}"
        new = list(ar.records(start=start))
        assert [r.seq for r in new] == list(range(start, n))
        for rec in new:
            check_record(rec)
        assert sum(ar.counts().values()) == len(ar)
        for key, value in ar.store.scan("cells"):
            gid, fit, _ = unpack_raw(value)
            rec = ar.get(gid)
            assert rec is not None and rec.fitness == fit and rec.cell == _cell_of_key(key)
        for le in ar.lessons:
            assert le.child_id in ar
        return n


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("durability", ["full", "process"])
def test_sigkill_writer_loses_nothing(tmp_path: Path, durability: str) -> None:
    """Both durabilities keep every reported add across SIGKILL ("process" leaves the flush to the OS)."""
    rng = np.random.default_rng(1234)
    path, side = tmp_path / "arch", tmp_path / "reported.txt"
    side.touch()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    grew = []
    for k in range(KILLS):
        proc = subprocess.Popen([sys.executable, "-m", "tests.archive.helpers", "writer", str(path), str(side),
                                 str(k + 1), durability], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line.strip() == b"ready", (line, proc.stderr.read())  # type: ignore[union-attr]
            time.sleep(float(rng.uniform(0.02, 0.3)))
            assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        grew.append(_verify(path, side, grew[-1] if grew else 0))
    assert grew[-1] > grew[0] > 0  # the writers really wrote between kills
    assert _verify(path, side, 0) == grew[-1]  # everything once more, from the start
