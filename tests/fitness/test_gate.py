"""The correctness gate and the timing stage.

CPU tests drive the real stages through a numpy :class:`Backend` whose "kernels" are
Python functions acting on the harness's own buffers (cheats included); GPU tests run
the same stages on cupy with nvcc-compiled cubins.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess
import time
import types
from pathlib import Path

import numpy as np
import pytest

from evo.types import ArgSpec, Case, DeviceInfo, Genome, Launch, ProblemError, Status
from fitness._device import (
    BACKEND_KEY,
    Backend,
    GuardedBuffer,
    KernelHandle,
    LaunchConfigError,
    allocate_buffers,
    fit_resident,
    make_canary,
    needs_dyn_shared_optin,
    validate_launch,
)
from fitness._dtypes import from_storage, to_storage
from fitness._gate import (
    Correctness,
    Timing,
    aggregate_fitness,
    compare,
    derive_seed,
    format_mismatch,
    geomean,
    timing_summary,
)
from fitness._stage import INCUMBENTS, Job, StageContext
from tests.fitness.adversarial import problem as rp
from tests.marks import needs_gpu

CPU_DEVICE = DeviceInfo("cpu-standin", "0.0", sm_count=1, l2_bytes=1 << 16, shared_per_block_optin=48 * 1024,
                        copy_gbps=10.0)


# --------------------------------------------------------------------------- numpy backend


class NumpyBackend(Backend):
    """Runs Python "kernels" ``fn(launch, args, state)`` on numpy buffers."""

    xp = np

    def __init__(self, kernels, max_threads: int = 1024):
        self.kernels = kernels
        self.max_threads = max_threads
        self.state: dict = {}
        self.launches = 0

    def device_info(self, scratch):
        return CPU_DEVICE

    def load(self, job, scratch):
        if job.genome.entry not in self.kernels:
            raise LaunchConfigError(f"the kernel entry point {job.genome.entry!r} was not found in the cubin")
        return KernelHandle(self.kernels[job.genome.entry], job.genome.entry, max_threads=self.max_threads)

    def launch(self, kernel, launch, args, device):
        validate_launch(kernel, launch, device)
        self.launches += 1
        kernel.function(launch, args, self.state)

    def event(self):
        return time.perf_counter()

    def elapsed_ms(self, start, end):
        return (end - start) * 1e3


def _rowscale(args):
    x, w, y, m, n, eps, bf16 = args
    m, n = int(m), int(n)
    dtype = "bfloat16" if int(bf16) else "float32"
    xf = from_storage(x, dtype, np).reshape(m, n).astype(np.float32)
    r = (1.0 / np.sqrt(np.mean(xf.astype(np.float64) ** 2, axis=1) + float(eps))).astype(np.float32)
    return to_storage((xf * r[:, None] * w[None, :]).reshape(-1), dtype, np), dtype


def k_good(launch, args, state):
    out, _ = _rowscale(args)
    args[2][...] = out


def k_noop(launch, args, state):
    pass


def k_zeros(launch, args, state):
    args[2][...] = 0


def k_partial(launch, args, state):
    out, _ = _rowscale(args)
    n = int(args[4])
    y = args[2].reshape(-1, n)
    y[:, : n // 2] = out.reshape(-1, n)[:, : n // 2]


def k_mutate(launch, args, state):
    k_good(launch, args, state)
    args[0][:1] = 0


def k_oob_after(launch, args, state):
    k_good(launch, args, state)
    y = args[2]
    past = np.lib.stride_tricks.as_strided(y, shape=(y.size + 16,), strides=y.strides, writeable=True)
    past[-1] = 1


def k_oob_before(launch, args, state):
    k_good(launch, args, state)
    y = args[2]
    raw = y.base if y.base is not None else y
    while getattr(raw, "base", None) is not None:
        raw = raw.base
    raw[GUARD_OFFSET - 3] ^= 0xFF  # 3 bytes before the start of y


def k_nondeterministic(launch, args, state):
    k_good(launch, args, state)
    state["calls"] = state.get("calls", 0) + 1
    if state["calls"] % 2 == 0:
        bits = args[2].view(np.uint32 if args[2].itemsize == 4 else np.uint16)
        bits[-1] ^= 1  # one low bit, far inside the tolerance


def k_cache(launch, args, state):
    # computes for the first 40 launches, then "replays" (leaves y alone)
    state["calls"] = state.get("calls", 0) + 1
    if state["calls"] <= 40:
        k_good(launch, args, state)


def k_replay(launch, args, state):
    # skips the work whenever the output already looks written (not poisoned)
    y = args[2].view(np.uint32 if args[2].itemsize == 4 else np.uint16)
    if int(y[-1]) != (1 << (8 * args[2].itemsize)) - 1:
        return
    k_good(launch, args, state)


def k_half(launch, args, state):
    x = args[0]
    if x.dtype == np.float32:
        saved = x.copy()
        x[...] = x.astype(np.float16).astype(np.float32)
        k_good(launch, args, state)
        x[...] = saved
    else:
        k_good(launch, args, state)


KERNELS = {f.__name__[2:]: f for f in (k_good, k_noop, k_zeros, k_partial, k_mutate, k_oob_after, k_oob_before,
                                         k_nondeterministic, k_cache, k_half, k_replay)}
GUARD_OFFSET = 64 * 1024


def small_problem(**kw):
    kw.setdefault("check_shapes", rp.CHECK_SHAPES)
    kw.setdefault("timed_shapes", ({"M": 64, "N": 256},))
    return rp.make_problem(**kw)


def run_stage(stage, entry, problem=None, seed=1234, backend=None, options=None, data=None):
    backend = backend or NumpyBackend(KERNELS)
    problem = problem or small_problem()
    job = Job(Genome("// python stand-in", {"THREADS": 256}, entry=entry), problem, {"cubin": b"", **(data or {})})
    ctx = StageContext(device=CPU_DEVICE, seed=seed, scratch={BACKEND_KEY: backend},
                       options=options or {"warmup_ms": 1.0, "min_batch_ms": 0.5, "timing_target_ms": 5.0})
    return stage.run(job, ctx), backend


# --------------------------------------------------------------------------- workspace buffers


def _ws_signature(case):
    return list(rp.signature(case)) + [ArgSpec("ws", 96, "int32", "workspace")]


def ws_problem():
    """The row-scale problem with a workspace buffer after y (kernel args: x, w, y, ws, scalars)."""
    return dataclasses.replace(small_problem(), signature=_ws_signature)


def _ws_args(args):
    return args[:3] + args[4:], args[3]


def k_ws_good(launch, args, state):
    plain, ws = _ws_args(args)
    state.setdefault("ws_at_entry", []).append(int(np.count_nonzero(ws)))
    ws[:] = np.arange(1, ws.size + 1)  # per-CTA partials, a ticket ...
    k_good(launch, plain, state)
    ws[:] = 0  # ... cleared by the last CTA


def k_ws_dirty(launch, args, state):
    plain, ws = _ws_args(args)
    k_good(launch, plain, state)
    ws[5] = 7  # a ticket never reset


def k_ws_cache(launch, args, state):
    # keeps "already computed" in the workspace and skips the work when it is set
    plain, ws = _ws_args(args)
    if ws[0] == 0:
        k_good(launch, plain, state)
        ws[0] = 1


WS_KERNELS = {"ws_good": k_ws_good, "ws_dirty": k_ws_dirty, "ws_cache": k_ws_cache}


def test_argspec_roles():
    assert ArgSpec("ws", 4, "int32", "workspace").role == "workspace"
    with pytest.raises(ProblemError, match="role must be one of 'in', 'out', 'workspace'"):
        ArgSpec("t", 4, "int32", "temp")


@pytest.mark.parametrize("stage", [Correctness(), Timing()], ids=["correctness", "timing"])
def test_workspace_is_handed_over_zeroed_and_may_be_used(stage):
    backend = NumpyBackend(WS_KERNELS)
    res, _ = run_stage(stage, "ws_good", problem=ws_problem(), backend=backend)
    assert res.ok, res.artifacts
    seen = backend.state["ws_at_entry"]
    assert len(seen) == backend.launches and set(seen) == {0}


@pytest.mark.parametrize("stage", [Correctness(), Timing()], ids=["correctness", "timing"])
@pytest.mark.parametrize("entry", ["ws_dirty", "ws_cache"])
def test_workspace_left_dirty_is_incorrect(stage, entry):
    res, _ = run_stage(stage, entry, problem=ws_problem(), backend=NumpyBackend(WS_KERNELS))
    assert not res.ok and res.status is Status.INCORRECT
    assert "non-zero byte(s) in its workspace 'ws'" in res.artifacts["mismatch"], res.artifacts["mismatch"]


# --------------------------------------------------------------------------- a build per dtype


def bf16_build(params, dtype):
    """The row-scale Problem's dtype_defines: a build per dtype (the flag fixed at compile time)."""
    return {"BF16": int(dtype == "bfloat16")}


class BuildBackend(NumpyBackend):
    """Each build's "kernel" computes for the dtype it was built for, whatever the runtime flag says
    (as a -DDTYPE_CODE build does); ``swap`` hands out the other dtype's build."""

    def __init__(self, swap=False):
        super().__init__({})
        self.swap = swap
        self.loaded: list[str] = []

    def load(self, job, scratch, build=""):
        self.loaded.append(build)
        built = {"float32": "bfloat16", "bfloat16": "float32"}[build] if self.swap else build

        def fn(launch, args, state):
            state.setdefault("ran", []).append((built, int(args[6])))
            k_good(launch, list(args[:6]) + [np.int32(built == "bfloat16")], state)

        return KernelHandle(fn, job.genome.entry, max_threads=self.max_threads)


@pytest.mark.parametrize("stage", [Correctness(), Timing()], ids=["correctness", "timing"])
def test_each_case_runs_the_build_of_its_dtype(stage):
    prob = dataclasses.replace(small_problem(), dtype_defines=bf16_build)
    data = {"cubins": {"float32": b"", "bfloat16": b""}}
    backend = BuildBackend()
    res, _ = run_stage(stage, "built", problem=prob, backend=backend, data=data)
    assert res.ok, res.artifacts
    assert backend.loaded == ["float32", "bfloat16"]
    ran = backend.state["ran"]
    assert {b for b, _ in ran} == {"float32", "bfloat16"} and all((b == "bfloat16") == f for b, f in ran)
    # the wrong build for a dtype computes garbage, and the gate says so
    with np.errstate(all="ignore"):
        res, _ = run_stage(stage, "built", problem=prob, backend=BuildBackend(swap=True), data=data)
    assert not res.ok and res.status is Status.INCORRECT


# --------------------------------------------------------------------------- correctness on the CPU


def test_good_kernel_passes_the_gate():
    res, backend = run_stage(Correctness(), "good")
    assert res.ok, res.artifacts
    n_cases = len(small_problem().check_cases())
    assert res.metrics["correctness"]["cases"] == n_cases
    assert backend.launches == 2 * n_cases  # every case run twice (determinism)
    assert 0 <= res.metrics["correctness"]["worst_error_ratio"] < 1


@pytest.mark.parametrize("entry, needle", [
    ("noop", "non-finite"),
    ("zeros", "rel error 1 >"),
    ("partial", "rows affected"),
    ("mutate", "modified its input 'x'"),
    ("oob_after", "out-of-bounds write after buffer 'y'"),
    ("oob_before", "out-of-bounds write before buffer 'y': 1 guard bytes changed, 3 to 3 bytes before its start"),
    ("nondeterministic", "not deterministic"),
    ("half", "rel error"),
])
def test_cheats_are_incorrect(entry, needle):
    res, _ = run_stage(Correctness(), entry)
    assert not res.ok and res.status is Status.INCORRECT
    assert needle in res.artifacts["mismatch"], res.artifacts["mismatch"]
    assert needle in res.artifacts["mismatch"] and res.artifacts["reason"]


def test_mismatch_report_is_short_and_names_the_case():
    res, _ = run_stage(Correctness(), "partial")
    text = res.artifacts["mismatch"]
    assert text.startswith("case M=1,N=1024:float32, output 'y'")
    assert "got nan, expected" in text and "(row 0, col 512)" in text
    assert len(text.splitlines()) <= 6 and len(text) < 1200


def test_launch_config_error_is_runtime_error():
    res, _ = run_stage(Correctness(), "good", backend=NumpyBackend(KERNELS, max_threads=128))
    assert res.status is Status.RUNTIME_ERROR
    assert "256 threads" in res.artifacts["reason"] and "at most 128" in res.artifacts["reason"]
    res, _ = run_stage(Correctness(), "missing_entry")
    assert res.status is Status.RUNTIME_ERROR and "not found" in res.artifacts["reason"]


def test_inputs_come_from_the_secret_seed():
    seen = {}

    def k_spy(launch, args, state):
        seen.setdefault(state["seed"], args[0].copy())
        k_good(launch, args, state)

    for seed in (1, 2):
        b = NumpyBackend({"spy": k_spy})
        b.state["seed"] = seed
        res, _ = run_stage(Correctness(), "spy", seed=seed, backend=b)
        assert res.ok
    assert not np.array_equal(seen[1], seen[2])
    b = NumpyBackend({"spy": k_spy})
    b.state["seed"] = 3
    run_stage(Correctness(), "spy", seed=1, backend=b)
    assert np.array_equal(seen[3], seen[1])  # same secret seed -> same inputs


def test_problem_errors_are_raised_not_blamed_on_the_genome():
    def bad_inputs(case, rng, xp):
        return {"x": xp.zeros(3, dtype=xp.float32)}

    p = small_problem()
    import dataclasses
    p = dataclasses.replace(p, make_inputs=bad_inputs)
    with pytest.raises(ProblemError, match="make_inputs"):
        run_stage(Correctness(), "good", problem=p)


def _drawn_inputs(case, rng, xp):
    from fitness import normal_draw

    m, n = case["M"], case["N"]
    return {"x": normal_draw(rng, (m, n), scale=np.full(m, 2.0, dtype=np.float32)),
            "w": xp.ones(n, dtype=xp.float32)}


def _short_draw(case, rng, xp):
    from fitness import normal_draw

    return {"x": normal_draw(rng, (case["M"] * case["N"] - 1,)), "w": xp.ones(case["N"], dtype=xp.float32)}


def test_deferred_draw_inputs_are_stored_and_checked_like_arrays():
    p = dataclasses.replace(small_problem(), make_inputs=_drawn_inputs)
    res, _ = run_stage(Correctness(), "good", problem=p)
    assert res.ok, res.artifacts
    res, _ = run_stage(Correctness(), "zeros", problem=p)
    assert not res.ok and res.status == Status.INCORRECT
    res, _ = run_stage(Correctness(), "mutate", problem=p)  # the stored draw's checksum guards it
    assert not res.ok and "modified its input 'x'" in res.artifacts["mismatch"]
    res, _ = run_stage(Timing(), "good", problem=p)
    assert res.ok, res.artifacts
    with pytest.raises(ProblemError, match=r"draws \d+ values, signature says \d+"):
        run_stage(Correctness(), "good", problem=dataclasses.replace(p, make_inputs=_short_draw))


# --------------------------------------------------------------------------- timing on the CPU


def test_timing_scores_a_good_kernel():
    res, backend = run_stage(Timing(), "good")
    assert res.ok, res.artifacts
    case = res.metrics["cases"]["M=64,N=256:float32"]
    assert case["time_ms"] > 0 and case["spread"] >= 0 and case["batches"] >= 10
    assert case["sets"] >= 2 and case["launches_per_batch"] % case["sets"] == 0
    assert case["gbps"] == pytest.approx(rp.bytes_moved(Case.from_key("M=64,N=256:float32")) / case["time_ms"] / 1e6)
    assert case["fraction"] == pytest.approx(case["gbps"] / CPU_DEVICE.copy_gbps)
    assert res.fitness == pytest.approx(res.metrics["fraction"])
    assert set(res.metrics["cases"]) == {"M=64,N=256:float32", "M=64,N=256:bfloat16"}


class _BusyRecorder(NumpyBackend):
    def __init__(self, kernels):
        super().__init__(kernels)
        self.calls: list[tuple[float, int]] = []

    def hold_busy(self, ms):
        self.calls.append((ms, self.launches))  # launches so far: 0 means before any timed case
        return ms


def test_timing_warms_the_device_once_before_the_first_case():
    backend = _BusyRecorder(KERNELS)
    opts = {"warmup_ms": 1.0, "min_batch_ms": 0.5, "timing_target_ms": 5.0}
    res, _ = run_stage(Timing(), "good", backend=backend, options=opts)
    assert res.ok and backend.calls == [(25.0, 0)] and res.metrics["device_warmup_ms"] == 25.0
    off = _BusyRecorder(KERNELS)
    res, _ = run_stage(Timing(device_warmup_ms=0.0), "good", backend=off, options=opts)
    assert res.ok and off.calls == [(0.0, 0)] and res.metrics["device_warmup_ms"] == 0.0
    assert NumpyBackend(KERNELS).hold_busy(10.0) == 0.0  # no device: nothing to warm


def test_timing_catches_a_result_cache():
    # passes correctness (fewer than 40 launches) but stops computing during warm-up
    res, _ = run_stage(Correctness(), "cache", problem=small_problem(check_shapes=rp.CHECK_SHAPES[:2]))
    assert res.ok
    res, _ = run_stage(Timing(), "cache")
    assert res.status is Status.INCORRECT
    assert "timed launches" in res.artifacts["mismatch"] or "relaunch" in res.artifacts["mismatch"]


def test_correctness_can_leave_timed_cases_to_timing():
    problem = small_problem(check_shapes=rp.CHECK_SHAPES[:2])
    full, _ = run_stage(Correctness(), "good", problem=problem)
    lean, _ = run_stage(Correctness(skip_timed=True), "good", problem=problem)
    n_timed = len(problem.timed_cases())
    assert full.ok and lean.ok
    assert lean.metrics["correctness"]["cases"] == full.metrics["correctness"]["cases"] - n_timed
    assert "skip_timed=True" in repr(Correctness(skip_timed=True))


def test_default_stages_leave_timed_cases_to_timing():
    from fitness import default_stages

    stages = default_stages()
    names = [s.name for s in stages]
    assert names.index("correctness") < names.index("timing")
    assert stages[names.index("correctness")].skip_timed is True


def test_timing_uses_one_set_when_it_alone_exceeds_three_l2():
    res, _ = run_stage(Timing(), "good", problem=small_problem(timed_shapes=({"M": 256, "N": 256},)))
    assert res.ok, res.artifacts
    assert res.metrics["cases"]["M=256,N=256:float32"]["sets"] == 1  # 512 KiB > 3 x 64 KiB of L2
    small, _ = run_stage(Timing(), "good")
    assert small.metrics["cases"]["M=64,N=256:float32"]["sets"] == 2  # 128 KiB per set


def test_timing_rejects_a_kernel_faster_than_memory():
    # correct on every set, but skips the work on repeated launches: only the speed gives it away
    res, _ = run_stage(Timing(), "replay")
    assert res.status is Status.INCORRECT
    assert "faster than the memory system allows" in res.artifacts["mismatch"]


def test_timing_relaunch_catches_nondeterminism():
    res, _ = run_stage(Timing(), "nondeterministic")
    assert res.status is Status.INCORRECT
    assert "not deterministic" in res.artifacts["mismatch"]


def test_timing_reports_phases():
    res, _ = run_stage(Timing(), "good")
    case = next(iter(res.metrics["cases"].values()))
    ph = case["phases_s"]
    parts = {"inputs/alloc", "inputs/draw", "inputs/store", "inputs/sums", "inputs/poison"}
    assert set(ph) == {"inputs", "warmup", "timed", "reference", "verify", "determinism"} | parts
    assert all(v >= 0 for v in ph.values())
    assert sum(ph[p] for p in parts) <= ph["inputs"]  # the parts are timed inside their phase
    assert case["graph"] is False  # the numpy backend records no batches


def test_timing_poisons_and_sums_only_what_is_checked(monkeypatch):
    """The warm-up's outputs are never checked and its inputs are replaced: the Timing stage
    poisons each set's outputs once before the timed launches and once for the relaunch, and
    checksums the inputs of the timed contents only."""
    import fitness._gate as gate

    calls = {"poison": 0, "fill": [], "sums": 0}
    poison, fill = gate._poison_outputs, gate._fill_inputs

    def counting_poison(backend, cs):
        calls["poison"] += 1
        poison(backend, cs)

    def counting_fill(*args, **kw):
        calls["fill"].append(kw.get("sums", True))
        fill(*args, **kw)
        calls["sums"] += bool(args[3].in_sums)

    monkeypatch.setattr(gate, "_poison_outputs", counting_poison)
    monkeypatch.setattr(gate, "_fill_inputs", counting_fill)
    res, _ = run_stage(Timing(), "good")
    assert res.ok, res.artifacts
    sets = [c["sets"] for c in res.metrics["cases"].values()]
    assert sets == [2, 3]  # float32, bfloat16
    # per case, the warm-up's contents and then the timed ones
    assert calls["fill"] == [False] * 2 + [True] * 2 + [False] * 3 + [True] * 3
    assert calls["sums"] == sum(sets)
    assert calls["poison"] == sum(sets) + len(sets)


def test_integrity_without_input_checksums_is_a_harness_error():
    from fitness._device import GUARD_BYTES
    from fitness._gate import _fill_inputs, _integrity, _new_set

    backend = NumpyBackend(KERNELS)
    problem = small_problem()
    case = problem.timed_cases()[0]
    specs = list(problem.signature(case))
    cs = _new_set(backend, specs, [], make_canary(4, GUARD_BYTES, np))
    _fill_inputs(backend, problem, case, cs, 7, sums=False)
    assert cs.in_sums == {}
    with pytest.raises(RuntimeError, match="without its checksum"):
        _integrity(backend, cs)
    _fill_inputs(backend, problem, case, cs, 7)
    assert set(cs.in_sums) == {"x", "w"} and _integrity(backend, cs) is None


def test_timing_catches_out_of_bounds_writes():
    res, _ = run_stage(Timing(), "oob_after")
    assert res.status is Status.INCORRECT and "out-of-bounds" in res.artifacts["mismatch"]


def test_timing_options_fix_the_batch_count():
    res, _ = run_stage(Timing(), "good", options={"timing_batches": 12, "warmup_ms": 0.5, "min_batch_ms": 0.1})
    assert all(c["batches"] == 12 for c in res.metrics["cases"].values())


RACE_OPTS = {"timing_batches": 12, "warmup_ms": 0.5, "min_batch_ms": 0.1}
BOTH = ("M=64,N=256:float32", "M=64,N=256:bfloat16")


def test_timing_races_a_case_far_slower_than_its_incumbent():
    fast = {INCUMBENTS: {BOTH[0]: 1e-9}}  # nothing on a CPU is this fast: the float32 case stops early
    res, _ = run_stage(Timing(race_batches=2), "good", options=RACE_OPTS, data=fast)
    assert res.ok, res.artifacts
    raced, full = res.metrics["cases"][BOTH[0]], res.metrics["cases"][BOTH[1]]
    assert raced["raced"] is True and raced["batches"] == 2 and raced["incumbent_ms"] == 1e-9
    assert full["raced"] is False and full["batches"] == 12 and "incumbent_ms" not in full
    assert res.metrics["raced_cases"] == 1
    assert raced["time_ms"] > 0 and set(raced["phases_s"]) >= {"timed", "verify", "determinism"}
    slow = {INCUMBENTS: {k: 1e9 for k in BOTH}}  # far slower incumbents: every case is timed in full
    res, _ = run_stage(Timing(), "good", options=RACE_OPTS, data=slow)
    assert res.metrics["raced_cases"] == 0 and all(c["batches"] == 12 for c in res.metrics["cases"].values())


def test_racing_is_off_without_incumbents_or_margin():
    res, _ = run_stage(Timing(), "good", options=RACE_OPTS)
    assert res.metrics["raced_cases"] == 0 and all(c["batches"] == 12 for c in res.metrics["cases"].values())
    fast = {INCUMBENTS: {k: 1e-9 for k in BOTH}}
    res, _ = run_stage(Timing(race_margin=None), "good", options=RACE_OPTS, data=fast)
    assert res.metrics["raced_cases"] == 0
    res, _ = run_stage(Timing(), "good", options={**RACE_OPTS, "race_margin": 0}, data=fast)  # an evaluator's "off"
    assert res.metrics["raced_cases"] == 0
    with pytest.raises(ValueError, match="race_margin"):
        Timing(race_margin=0.9)
    with pytest.raises(ValueError, match="race_batches"):
        Timing(race_batches=0)


def _k_lazy(launch, args, state):
    """Computes for its first two launches only (a result cache that outlives warm-up's first round)."""
    state["calls"] = state.get("calls", 0) + 1
    if state["calls"] <= 2:
        k_good(launch, args, state)


def test_a_raced_case_is_still_verified():
    # racing shortens the timed phase, never the checks of the timed launches' outputs
    fast = {INCUMBENTS: {k: 1e-9 for k in BOTH}}
    res, _ = run_stage(Timing(), "lazy", options=RACE_OPTS, data=fast, backend=NumpyBackend({"lazy": _k_lazy}))
    assert res.status is Status.INCORRECT and "timed launches" in res.artifacts["mismatch"]


def test_timing_speed_objective_and_callable():
    res, _ = run_stage(Timing(), "good", problem=small_problem(objective="geomean_speed"))
    assert res.fitness == pytest.approx(1.0 / res.metrics["time_ms_geomean"])
    res, _ = run_stage(Timing(), "good", problem=small_problem(objective=_objective))
    assert res.fitness == 42.0


def _objective(metrics):
    return 42.0 if "cases" in metrics else 0.0


# --------------------------------------------------------------------------- pure helpers


def test_compare_counts_rows_and_nonfinite():
    ref = np.ones((4, 5), dtype=np.float32)
    out = ref.copy()
    out[1, 2] = np.nan
    out[3, 0] = 2.0
    c = compare("y", out, ref, 1e-3, np, row_len=5, chunk=3)
    assert c.nonfinite == 1 and c.bad == 2 and c.rows_bad == 2 and c.first_bad_rows == [1, 3]
    assert not c.ok and math.isinf(c.rel_error)
    assert [i for i, _, _ in c.first_bad] == [7, 15]
    text = format_mismatch(Case({"M": 4, "N": 5}, "float32"), c)
    assert "y[7] (row 1, col 2): got nan, expected 1" in text


def test_compare_relative_error_in_float64():
    ref = np.full(1000, 1e-3, dtype=np.float32)
    out = ref * np.float32(1 + 2e-6)
    c = compare("y", out, ref, 1e-5, np)
    assert c.ok and c.rel_error == pytest.approx(2e-6, rel=0.05)
    zero = compare("y", np.zeros(3), np.zeros(3), 0.0, np)
    assert zero.ok and zero.rel_error == 0.0
    nan_ref = compare("y", np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), 0.0, np)
    assert nan_ref.ok
    assert not compare("y", np.array([0.0, 1.0]), np.array([np.nan, 1.0]), 0.0, np).ok


def test_guarded_buffer_layout_and_checks():
    from evo.types import ArgSpec

    canary = make_canary(7, 256, np)
    assert len(np.unique(canary)) > 100
    bufs = allocate_buffers([ArgSpec("a", 10, "bfloat16"), ArgSpec("b", 3, "float32", "out")], canary, np, guard=256)
    a = bufs["a"]
    assert isinstance(a, GuardedBuffer) and a.array.dtype == np.uint16 and a.array.size == 10
    a.array[...] = 0xFFFF
    assert a.check(np) is None
    a.raw[256 + 20] ^= 1  # first byte after the data
    assert "1 guard bytes changed, 0 to 0 bytes past its end" in a.check(np)
    with pytest.raises(ValueError, match="multiple of 256"):
        allocate_buffers([ArgSpec("a", 1, "float32")], canary, np, guard=100)


def test_validate_launch_messages():
    k = KernelHandle(None, "k", max_threads=256, static_shared=1024, registers=128)
    validate_launch(k, Launch((4, 1, 1), (256, 1, 1)), CPU_DEVICE)
    with pytest.raises(LaunchConfigError, match="at most 256 .*128 registers"):
        validate_launch(k, Launch((4, 1, 1), (512, 1, 1)), CPU_DEVICE)
    with pytest.raises(LaunchConfigError, match="shared memory"):
        validate_launch(k, Launch((4, 1, 1), (32, 1, 1), shared_mem=48 * 1024), CPU_DEVICE)
    with pytest.raises(LaunchConfigError, match="declares none: add __cluster_dims__"):
        validate_launch(k, Launch((4, 1, 1), (32, 1, 1), cluster=(2, 1, 1)), CPU_DEVICE)
    kc = KernelHandle(None, "k", cluster=(1, 8, 1))
    validate_launch(kc, Launch((4, 16, 1), (32, 1, 1)), CPU_DEVICE)
    with pytest.raises(LaunchConfigError, match="whole number of clusters"):
        validate_launch(kc, Launch((4, 12, 1), (32, 1, 1)), CPU_DEVICE)


def test_fit_resident_caps_a_persistent_grid_at_whole_clusters_that_fit():
    plain = Launch((1000, 1, 1), (128, 1, 1))
    assert fit_resident(plain, 10) is plain  # not resident: never changed
    res = Launch((1000, 1, 1), (128, 1, 1), resident=True)
    assert fit_resident(res, None) is res  # unknown: the grid stays
    assert fit_resident(res, 264).grid == (264, 1, 1)
    assert fit_resident(res, 5000) is res  # already fits
    cl = Launch((528, 1, 1), (128, 1, 1), cluster=(16, 1, 1), resident=True, shared_mem=32768)
    capped = fit_resident(cl, 7 * 16 + 5)  # whole clusters only
    assert capped.grid == (112, 1, 1) and capped.cluster == (16, 1, 1) and capped.shared_mem == 32768
    assert capped.resident and capped.block == (128, 1, 1)
    assert fit_resident(cl, 0).grid == (16, 1, 1)  # at least one cluster: the driver then says why not


def test_resident_launches_run_with_the_grid_that_fits(monkeypatch):
    """The gate asks the backend how many CTAs fit and launches that many (Correctness and Timing);
    Timing records the grid it ran per case; a backend that cannot tell keeps the Problem's grid."""
    grids = []

    def k_grid(launch, args, state):
        grids.append(launch.grid[0])
        k_good(launch, args, state)

    def resident_launch(params, case, device):
        return Launch(grid=(case["M"] * 4, 1, 1), block=(int(params["THREADS"]), 1, 1), resident=True)

    class Fits(NumpyBackend):
        def resident_blocks(self, kernel, launch, device):
            return 8

    problem = dataclasses.replace(small_problem(), launch=resident_launch)
    res, _ = run_stage(Correctness(), "grid", problem=problem, backend=Fits({"grid": k_grid}))
    assert res.ok and set(grids) == {min(4 * c["M"], 8) for c in rp.CHECK_SHAPES}  # a grid that fits stays
    grids.clear()
    res, _ = run_stage(Timing(), "grid", problem=problem, backend=Fits({"grid": k_grid}))
    assert res.ok and set(grids) == {8}
    assert [c["grid"] for c in res.metrics["cases"].values()] == [8, 8]  # float32 and bfloat16
    grids.clear()
    res, _ = run_stage(Timing(), "grid", problem=problem, backend=NumpyBackend({"grid": k_grid}))
    assert res.ok and set(grids) == {64 * 4} and res.metrics["cases"]["M=64,N=256:float32"]["grid"] == 256

    class Refuses(NumpyBackend):
        def resident_blocks(self, kernel, launch, device):
            raise LaunchConfigError("cuOccupancyMaxActiveClusters refused block (256, 1, 1): CUDA error 1")

    res, _ = run_stage(Correctness(), "grid", problem=problem, backend=Refuses({"grid": k_grid}))
    assert res.status is Status.RUNTIME_ERROR and "CUDA error 1" in res.artifacts["reason"]


def test_a_resident_launch_keeps_its_grid_where_the_driver_cannot_be_asked(caplog):
    """No CUDA driver library (this CPU machine): the real backend's occupancy query fails to load
    it, warns once, and the resident launch keeps the Problem's grid (an upper bound the kernel is
    correct with) instead of failing the genome."""
    import ctypes

    from fitness._device import CupyBackend

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver library is present: the GPU tests cover the query")
    except OSError:
        pass
    backend = object.__new__(CupyBackend)  # no device to make a stream on; the query needs none
    kernel = KernelHandle(types.SimpleNamespace(ptr=1), "k", cluster=(16, 1, 1))
    la = Launch((528, 1, 1), (128, 1, 1), cluster=(16, 1, 1), resident=True)
    with caplog.at_level("WARNING", logger="fitness"):
        assert backend.fit(kernel, la, CPU_DEVICE) is la
        assert backend.fit(kernel, la, CPU_DEVICE) is la  # asked once per launch shape
    assert kernel.resident == {((128, 1, 1), 0, (16, 1, 1)): None}
    assert sum("cannot ask the driver" in r.getMessage() for r in caplog.records) == 1


def test_the_occupancy_query_struct_matches_the_cuda_header(tmp_path):
    """``_CULaunchConfig`` (passed to cuOccupancyMaxActiveClusters through ctypes) has the size and
    field offsets of ``CUlaunchConfig`` in the toolkit's cuda.h, as the host compiler lays it out."""
    import ctypes

    from fitness._device import _CULaunchConfig

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    fields = [f for f, _ in _CULaunchConfig._fields_]
    src = tmp_path / "layout.cpp"
    src.write_text("#include <cuda.h>\n#include <cstddef>\n#include <cstdio>\nint main() {\n"
                   '  printf("%zu\\n", sizeof(CUlaunchConfig));\n'
                   + "".join(f'  printf("%zu\\n", offsetof(CUlaunchConfig, {f}));\n' for f in fields) + "}\n")
    exe = tmp_path / "layout"
    subprocess.run([nvcc, "-o", str(exe), str(src)], check=True, capture_output=True, timeout=300)
    out = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert out[0] == ctypes.sizeof(_CULaunchConfig)
    assert out[1:] == [getattr(_CULaunchConfig, f).offset for f in fields]


def test_dynamic_shared_optin_counts_static_memory():
    """48 KB in all without the attribute: 48 KB dynamic plus any static array needs it."""
    k = KernelHandle(None, "k", static_shared=128)
    assert not needs_dyn_shared_optin(k, Launch((1, 1, 1), (32, 1, 1), shared_mem=48 * 1024 - 128))
    assert needs_dyn_shared_optin(k, Launch((1, 1, 1), (32, 1, 1), shared_mem=48 * 1024))
    assert not needs_dyn_shared_optin(KernelHandle(None, "k"), Launch((1, 1, 1), (32, 1, 1), shared_mem=48 * 1024))
    k.dyn_shared_set = 100 * 1024  # already raised: nothing to do up to that size
    assert not needs_dyn_shared_optin(k, Launch((1, 1, 1), (32, 1, 1), shared_mem=100 * 1024))
    assert needs_dyn_shared_optin(k, Launch((1, 1, 1), (32, 1, 1), shared_mem=100 * 1024 + 16))


def test_aggregation_helpers():
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean([0.0, 4.0]) == 0.0 and math.isnan(geomean([]))
    med, spread = timing_summary([1.0, 2.0, 3.0, 4.0, 5.0])
    assert med == 3.0 and spread == pytest.approx(2.0 / 3.0)
    metrics = {"cases": {"a": {"time_ms": 2.0, "fraction": 0.5}, "b": {"time_ms": 8.0, "fraction": 0.8}}}
    assert aggregate_fitness("geomean_fraction", metrics) == pytest.approx(math.sqrt(0.4))
    assert aggregate_fitness("geomean_speed", metrics) == pytest.approx(0.25)
    with pytest.raises(ProblemError):
        aggregate_fitness("geomean_fraction", {"cases": {"a": {"time_ms": 1.0, "fraction": None}}})
    assert derive_seed(1, 0, "check") != derive_seed(1, 1, "check") != derive_seed(2, 0, "check")
    assert 0 <= derive_seed(2**70, "x") < 2**63


# --------------------------------------------------------------------------- GPU


KERNEL_DIR = Path(rp.__file__).with_name("kernels")


def _cubin(tmp_path, name, threads=256):
    out = tmp_path / f"{name}.cubin"
    subprocess.run([shutil.which("nvcc") or "nvcc", "-cubin", "-arch=sm_90a", "-O3", f"-DTHREADS={threads}",
                    "-o", str(out), str(KERNEL_DIR / f"{name}.cu")], check=True, capture_output=True, timeout=300)
    return out.read_bytes()


def _gpu_job(tmp_path, name, threads=256, problem=None):
    return Job(rp.genome(name, threads), problem or rp.problem(), {"cubin": _cubin(tmp_path, name, threads)})


@pytest.mark.gpu
@needs_gpu
def test_gpu_init_device_measures_bandwidth():
    from fitness._device import init_device

    scratch: dict = {}
    info = init_device(scratch)
    assert info.compute_capability.count(".") == 1 and info.sm_count > 0 and info.l2_bytes > 0
    assert info.copy_gbps > 100 and info.shared_per_block_optin >= 48 * 1024
    assert init_device(scratch) is info  # cached


@pytest.mark.gpu
@needs_gpu
def test_gpu_baseline_passes_and_is_timed(tmp_path):
    from fitness._device import init_device

    scratch: dict = {}
    device = init_device(scratch)
    job = _gpu_job(tmp_path, "baseline")
    ctx = StageContext(device=device, seed=99, scratch=scratch, options={})
    res = Correctness().run(job, ctx)
    assert res.ok, res.artifacts
    res = Timing().run(job, ctx)
    assert res.ok, res.artifacts
    for c in res.metrics["cases"].values():
        assert 0.05 < c["fraction"] < 1.5 and c["spread"] < 0.2
    assert res.fitness == pytest.approx(res.metrics["fraction"])


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", ["noop", "zeros", "nan", "mutate_input", "partial", "fixed_shape", "oob_write",
                                  "half_precision", "racy"])
def test_gpu_cheats_fail_the_gate(tmp_path, name):
    from fitness._device import init_device

    scratch: dict = {}
    ctx = StageContext(device=init_device(scratch), seed=5, scratch=scratch, options={})
    res = Correctness().run(_gpu_job(tmp_path, name), ctx)
    assert res.status is Status.INCORRECT, res.artifacts


@pytest.mark.gpu
@needs_gpu
def test_gpu_result_cache_caught_by_timing(tmp_path):
    from fitness._device import init_device

    scratch: dict = {}
    ctx = StageContext(device=init_device(scratch), seed=5, scratch=scratch, options={})
    job = _gpu_job(tmp_path, "result_cache")
    assert Correctness().run(job, ctx).ok
    res = Timing().run(job, ctx)
    assert res.status is Status.INCORRECT and "timed launches" in res.artifacts["mismatch"]


@pytest.mark.gpu
@needs_gpu
def test_gpu_block_too_big_for_registers_is_runtime_error(tmp_path):
    from fitness._device import init_device

    scratch: dict = {}
    ctx = StageContext(device=init_device(scratch), seed=5, scratch=scratch, options={})
    # compiled for 64 threads (__launch_bounds__(64)) but launched with 1024
    job = Job(rp.genome("baseline", 1024), rp.problem(), {"cubin": _cubin(tmp_path, "baseline", threads=64)})
    res = Correctness().run(job, ctx)
    assert res.status is Status.RUNTIME_ERROR, res.artifacts


def test_phase_parts_synchronise_and_stay_beside_their_phase():
    from fitness._gate import _Phases

    calls = []
    ph = _Phases(sync=lambda: calls.append(1))
    with ph("inputs"):
        with ph("inputs/draw", sync=True):
            pass
        with ph("inputs/draw", sync=True):  # spans of one name add up
            pass
    assert len(calls) == 4  # both ends of each synchronised span, none for the plain one
    assert set(ph.seconds) == {"inputs", "inputs/draw"} and ph.seconds["inputs/draw"] <= ph.seconds["inputs"]
    with _Phases()("x", sync=True):  # no sync callable: nothing to wait for
        pass
