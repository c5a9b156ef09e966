"""The on-disk compile cache: keys, atomic writes, corruption, sharing across processes."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from evo.types import Genome
from fitness import CompileCache, cache_key, compile_genome, default_cache_dir
from tests.fitness.conftest import SIMPLE_KERNEL, host_problem, needs_nvcc

BASE = dict(source="src", defines=["-DA=1"], options=["-O3"], target="sm_90a", backend="nvcc", toolkit="13.0")


def test_key_depends_on_every_field():
    k = cache_key(**BASE)
    assert len(k) == 64 and k == cache_key(**BASE)
    for field, value in [("source", "src "), ("defines", ["-DA=2"]), ("options", []), ("target", "sm_80"),
                         ("backend", "nvrtc"), ("toolkit", "12.8")]:
        assert cache_key(**{**BASE, field: value}) != k, field


def test_roundtrip_atomic_and_corrupt(tmp_path):
    cache = CompileCache(tmp_path)
    k = cache_key(**BASE)
    assert cache.get(k) is None and k not in cache
    cache.put(k, {"ok": True, "cubin": b"\x7fELF\x00", "log": "x", "resources": {"registers": 8}, "ptx": None})
    got = cache.get(k)
    assert got == {"ok": True, "cubin": b"\x7fELF\x00", "log": "x", "resources": {"registers": 8}, "ptx": None}
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [f"{k}.msgpack"]  # no temp files left
    path = next(tmp_path.rglob("*.msgpack"))
    path.write_bytes(b"\x93garbage")
    assert cache.get(k) is None and not path.exists()  # dropped
    assert cache.clear() == 0


def test_default_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EVO_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("EVO_CACHE_DIR")
    assert default_cache_dir().parts[-2:] == ("ptx-kernel-factory", "compile")


def test_bad_key_rejected(tmp_path):
    with pytest.raises(ValueError):
        CompileCache(tmp_path).get("../../etc/passwd")


def _writer(root: str, n: int, tag: int) -> None:
    cache = CompileCache(root)
    for i in range(n):
        k = cache_key(**{**BASE, "source": f"shared-{i % 5}"})
        cache.put(k, {"ok": True, "cubin": bytes([i % 256]) * 4096, "log": f"w{tag}", "i": i % 5})


def test_concurrent_writers_across_processes(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 40, t)) for t in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = CompileCache(tmp_path)
    for i in range(5):
        got = cache.get(cache_key(**{**BASE, "source": f"shared-{i}"}))
        assert got is not None and got["i"] == i and len(got["cubin"]) == 4096
    assert not list(tmp_path.rglob("*.part"))


@needs_nvcc
def test_failed_compile_is_cached_and_hit_skips_the_compiler(tmp_path):
    cache = CompileCache(tmp_path)
    bad = Genome('extern "C" __global__ void kernel(float* y) { y[0] = ; }')
    first = compile_genome(bad, host_problem(), cache=cache)
    t0 = time.perf_counter()
    second = compile_genome(bad, host_problem(), cache=cache)
    assert not first.ok and not second.ok and second.cache_hit and second.reason == first.reason
    assert time.perf_counter() - t0 < 0.2
    good = compile_genome(Genome(SIMPLE_KERNEL), host_problem(), cache=cache)
    again = compile_genome(Genome(SIMPLE_KERNEL), host_problem(), cache=cache)
    assert good.ok and not good.cache_hit and again.cache_hit and again.cubin == good.cubin
    assert again.resources == good.resources and again.seconds == 0.0
    # keep_ptx on a cached entry without PTX compiles again (and then stores the PTX)
    with_ptx = compile_genome(Genome(SIMPLE_KERNEL), host_problem(), cache=cache, keep_ptx=True)
    assert not with_ptx.cache_hit and with_ptx.ptx
    assert compile_genome(Genome(SIMPLE_KERNEL), host_problem(), cache=cache, keep_ptx=True).cache_hit
