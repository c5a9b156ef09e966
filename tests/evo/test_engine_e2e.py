"""End-to-end engine runs with the real compiler: nvcc for sm_90a, real LMDB, real processes.

Fitness comes from ``ptxas -v`` through ``fitness.HostScore`` (see ``cpu_problem``), so
no GPU is needed. A module-wide compile cache keeps repeated genomes cheap.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from archive import Archive
from evo.engine import Budget, Engine, EngineConfig
from operators import ParamMutation
from tests.evo.cpu_problem import make_evaluator, make_problem, seed_genome

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "nvcc"], capture_output=True).returncode != 0, reason="nvcc not installed")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compile-cache")


def test_end_to_end_run_improves_on_the_seed(tmp_path: Path, cache_dir: Path) -> None:
    problem = make_problem()
    ev = make_evaluator(problem, cache_dir, compile_workers=2)
    try:
        cfg = EngineConfig(islands=2, in_flight=3, migration_interval=4)
        with Engine(problem, str(tmp_path / "run"), evaluator=ev, config=cfg, seed=0) as eng:
            best = eng.run(Budget(evaluations=10), progress=False)
            seed = eng.archive.get(seed_genome().id)
            assert seed is not None and seed.evaluation.ok and seed.evaluation.resources["registers"] > 0
            assert best is not None and best.fitness > seed.fitness
            assert len(eng.archive) == eng.evaluations == 10
            st = ev.stats()
            # every evaluation compiled exactly one new genome: nothing evaluated twice
            assert st["evaluations"] == 10
            assert st["compiles"] + st["compile_cache_hits"] == 10
            assert eng.archive.lessons.all()
            assert eng.archive.coverage > 0
    finally:
        ev.close()


def test_duplicates_never_reach_the_compiler(tmp_path: Path, cache_dir: Path) -> None:
    def echo(parents, ctx):  # type: ignore[no-untyped-def]
        return [parents[0].genome, *ParamMutation().propose(parents, ctx)]

    problem = make_problem()
    ev = make_evaluator(problem, cache_dir, compile_workers=2)
    try:
        with Engine(problem, str(tmp_path / "run"), [echo], ev, config=EngineConfig(islands=1, in_flight=2)) as eng:
            eng.run(Budget(evaluations=5), progress=False)
            st = ev.stats()
            assert eng.stats()["duplicates"] >= 4
            assert st["evaluations"] == len(eng.archive) == 5
            assert st["compiles"] + st["compile_cache_hits"] == 5
    finally:
        ev.close()


_CHILD = r"""
import json, sys
from evo.engine import Budget, Engine, EngineConfig
from tests.evo.cpu_problem import make_evaluator, make_problem

path, cache, total = sys.argv[1], sys.argv[2], int(sys.argv[3])


class Loud(Engine):
    def tell(self, cid, ev):
        r = super().tell(cid, ev)
        print(json.dumps({"told": self.evaluations, "id": r.record.id, "generation": self.generation}), flush=True)
        return r


problem = make_problem()
ev = make_evaluator(problem, cache, compile_workers=2)
eng = Loud(problem, path, evaluator=ev, config=EngineConfig(islands=2, in_flight=3, migration_interval=3), seed=5)
print(json.dumps({"start": True, "resumed": eng.resumed, "evaluations": eng.evaluations,
                  "generation": eng.generation, "pending": len(eng.pending)}), flush=True)
eng.run(Budget(evaluations=total), progress=False)
print(json.dumps({"done": True, "evaluations": eng.evaluations, "generation": eng.generation}), flush=True)
eng.close()
ev.close()
"""


def _spawn(script: Path, archive: Path, cache: Path, total: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, str(script), str(archive), str(cache), str(total)], cwd=str(REPO),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(proc: subprocess.Popen[str], deadline: float):  # type: ignore[no-untyped-def]
    assert proc.stdout is not None
    for line in proc.stdout:
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("child run took too long")
        if line.startswith("{"):
            yield json.loads(line)


def test_kill9_mid_run_then_resume(tmp_path: Path, cache_dir: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    arch = tmp_path / "run"
    total = 10

    proc = _spawn(script, arch, cache_dir, total)
    told_before: list[str] = []
    gen_before = 0
    try:
        for msg in _lines(proc, time.monotonic() + 120):
            if "told" in msg:
                told_before.append(msg["id"])
                gen_before = max(gen_before, msg["generation"])
                if len(told_before) >= 4:
                    os.kill(proc.pid, signal.SIGKILL)  # in the middle: candidates are still compiling
                    break
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    assert len(told_before) >= 4

    proc = _spawn(script, arch, cache_dir, total)
    start = done = None
    told_after: list[str] = []
    for msg in _lines(proc, time.monotonic() + 120):
        if msg.get("start"):
            start = msg
        elif "told" in msg:
            told_after.append(msg["id"])
        elif msg.get("done"):
            done = msg
    proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert start is not None and done is not None
    assert start["resumed"] is True
    assert start["evaluations"] >= len(told_before)
    assert start["generation"] >= gen_before  # the counter continues, it does not restart
    assert done["generation"] > start["generation"]
    assert done["evaluations"] == total

    a = Archive.open_readonly(str(arch))
    try:
        records = list(a.records())
        ids = [r.id for r in records]
        assert len(ids) == len(set(ids)) == total  # none recorded twice, none lost
        seqs = sorted(r.seq for r in records)
        assert seqs == list(range(seqs[0], seqs[0] + total))  # no gap, no repeat
        assert set(told_before) <= set(ids)
        assert not set(told_before) & set(told_after)  # nothing evaluated again after the resume
        for r in records:
            assert all(p in a for p in r.parents)
        state = a.load_state()
        assert state is not None and state["evaluations"] == total and state["pending"] == []
    finally:
        a.close()
