"""The device stages: the correctness gate and the timing stage.

Both run inside a GPU worker and reach the GPU through the worker's
:class:`~fitness._device.Backend` (``ctx.scratch["fitness.backend"]``). The array logic
(comparison, mismatch reports, fitness aggregation) takes an ``xp`` module and is
tested on the CPU with numpy.

Correctness, per check case (:meth:`Problem.check_cases`):

1. fresh inputs from a Generator seeded by the secret ``ctx.seed`` (never by the genome),
   rounded to the storage dtype, each buffer in its own guarded allocation;
2. outputs poisoned (all-ones bits: NaN), input checksums taken;
3. launch, synchronise; guards intact, inputs unchanged;
4. outputs copied aside, re-poisoned, launched again on the same inputs;
5. only now the reference, from the stored inputs upcast to float32, so the expected
   output is never resident while the candidate runs;
6. any non-finite output where the reference is finite fails; ``||out-ref||/||ref||``
   (float64 accumulation) must be within the dtype's tolerance; the second run must be
   bitwise identical to the first.

Timing first keeps the device busy with copies for ``device_warmup_ms`` (25 ms), so the
first case does not start from an idle card's clocks; then, per timed case: K input/output
sets larger together than 3x L2 (K = 1 when one
set is), warm-up (on contents nothing checks: no checksums, no poison), then NEW input
contents in every set and poisoned outputs, then R
batches of B launches rotating across the sets (each batch one CUDA graph where the
backend can record it), each batch between a start event and an end event on the stream,
then a device-wide synchronise and a second end event that counts instead when it is later
by more than the slack of ``fitness._plan`` (work that escaped the stream is never left
out; the host's wake-up after the synchronise stays out of the figure, counted batches in
``escaped_batches``); median time per launch and its spread. Afterwards the outputs of
the timed launches are checked against references of each set's inputs, a relaunch
on one set must reproduce them bit for bit, and a bandwidth above ``max_fraction`` of
the measured copy ceiling fails (work skipped on repeated launches). With
``Correctness(skip_timed=True)`` (the default stages) this is the only check of the
timed cases.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evo.types import ArgSpec, Case, DeviceInfo, Launch, Problem, ProblemError, Status
from fitness._device import (
    GUARD_BYTES,
    Backend,
    GuardedBuffer,
    KernelHandle,
    LaunchConfigError,
    allocate_buffers,
    get_backend,
    make_canary,
    scalar_args,
)
from fitness._dtypes import checksum, from_storage, is_float, poison, store_into, upcast
from fitness._fused import FUSED_DTYPES, fused_for
from fitness._inputs import NormalDraw
from fitness._plan import batch_count, batch_size, batch_time, raced_out, rotation_sets
from fitness._stage import INCUMBENTS, Job, Stage, StageContext, StageResult

__all__ = [
    "Comparison",
    "Correctness",
    "Timing",
    "aggregate_fitness",
    "compare",
    "derive_seed",
    "format_mismatch",
    "geomean",
    "timing_summary",
]

log = logging.getLogger(__name__)

_REPORT_ELEMENTS = 5
_COMPARE_CHUNK = 1 << 26


def derive_seed(seed: int, *parts: int | str) -> int:
    """A 63-bit seed derived from the secret ``seed`` and labels (case index, purpose)."""
    words = [int(seed) & (2**64 - 1)]
    for p in parts:
        if isinstance(p, str):
            words.extend(p.encode())
        else:
            words.append(int(p) & (2**64 - 1))
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive values (``0.0`` if any is zero, NaN if empty)."""
    vals = [float(v) for v in values]
    if not vals:
        return math.nan
    if any(v <= 0 for v in vals):
        return 0.0
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# --------------------------------------------------------------------------- comparison


@dataclass
class Comparison:
    """How one output buffer compares with its reference.

    Attributes:
        name: Output buffer name.
        numel: Elements compared.
        rel_error: ``||out-ref||_2 / ||ref||_2`` over elements where the reference is
            finite (absolute error norm when the reference norm is zero).
        nonfinite: Outputs that are NaN/Inf where the reference is finite.
        special_mismatch: Elements where the reference is NaN/Inf and the output differs.
        bad: Elements off by more than the tolerance (relative to ``max(|ref|, rms(ref))``)
            or non-finite where the reference is finite; counted only when the
            comparison fails (0 for a passing one).
        first_bad: Up to five ``(index, got, expected)`` of bad elements.
        rows_bad: Rows (of length ``row_len``) with any bad element.
        rows: Number of rows.
        first_bad_rows: Up to five bad row indices.
        tolerance: The dtype's tolerance.
    """

    name: str
    numel: int
    rel_error: float
    nonfinite: int
    special_mismatch: int
    bad: int
    first_bad: list[tuple[int, float, float]]
    rows_bad: int
    rows: int
    first_bad_rows: list[int]
    tolerance: float
    row_len: int = 1
    err_norm: float = 0.0
    ref_norm: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.nonfinite == 0 and self.special_mismatch == 0 and math.isfinite(self.rel_error)
                and self.rel_error <= self.tolerance)


def compare(name: str, out: Any, ref: Any, tolerance: float, xp: Any, *, row_len: int = 1,
            chunk: int = _COMPARE_CHUNK, norms: tuple[float, float, int, int] | None = None) -> Comparison:
    """Compare a widened kernel output with its reference, chunk by chunk.

    Args:
        name: Output name (for the report).
        out: Kernel output, widened to float32/float64 (see :func:`fitness._dtypes.from_storage`).
        ref: Reference values (any real dtype); same number of elements as ``out``.
        tolerance: Max ``||out-ref||/||ref||``.
        xp: ``numpy`` or ``cupy``.
        row_len: Elements per row, for the "rows affected" count (1 = no rows).
        chunk: Elements per step (bounds float64 temporaries).
        norms: Pass 1's result computed elsewhere (``(sum of squared errors, sum of
            squared references, non-finite count, special mismatches)``, e.g. by the fused
            device kernel): pass 1 is skipped.

    Returns:
        A :class:`Comparison`.
    """
    out = out.reshape(-1)
    ref = ref.reshape(-1)
    if out.size != ref.size:
        raise ProblemError(f"reference for {name!r} has {ref.size} elements but the buffer has {out.size}")
    n = int(out.size)
    row_len = max(1, int(row_len)) if n % max(1, int(row_len)) == 0 else 1
    rows = n // row_len
    if norms is not None:
        err_sq, ref_sq, nonfinite, special = norms
    else:
        err_sq, ref_sq, nonfinite, special = _norms(out, ref, xp, chunk)
    return _finish(name, out, ref, tolerance, xp, n, row_len, rows, chunk, err_sq, ref_sq, nonfinite, special)


def _norms(out: Any, ref: Any, xp: Any, chunk: int) -> tuple[float, float, int, int]:
    """Pass 1: norms (float64 accumulation) over finite-reference elements, and counts."""
    n = int(out.size)
    err_sq = 0.0
    ref_sq = 0.0
    nonfinite = 0
    special = 0
    for s in range(0, n, chunk):
        o = out[s:s + chunk].astype(xp.float64)
        r = ref[s:s + chunk].astype(xp.float64)
        rfin = xp.isfinite(r)
        ofin = xp.isfinite(o)
        nonfinite += int(xp.count_nonzero(rfin & ~ofin))
        # reference NaN -> output must be NaN; reference +-Inf -> output must equal it
        rnan = xp.isnan(r)
        special += int(xp.count_nonzero(rnan & ~xp.isnan(o)))
        rinf = xp.isinf(r)
        special += int(xp.count_nonzero(rinf & (o != r)))
        both = rfin & ofin
        d = xp.where(both, o - r, 0.0)
        rr = xp.where(rfin, r, 0.0)
        err_sq += float(xp.sum(d * d))
        ref_sq += float(xp.sum(rr * rr))
    return err_sq, ref_sq, nonfinite, special


def _finish(name: str, out: Any, ref: Any, tolerance: float, xp: Any, n: int, row_len: int, rows: int, chunk: int,
            err_sq: float, ref_sq: float, nonfinite: int, special: int) -> Comparison:
    """The Comparison from pass 1's sums; pass 2 (locating bad elements) only on failure."""
    err_norm = math.sqrt(err_sq)
    ref_norm = math.sqrt(ref_sq)
    if nonfinite:
        rel = math.inf
    elif ref_norm > 0:
        rel = err_norm / ref_norm
    else:
        rel = err_norm
    rms = ref_norm / math.sqrt(max(1, n))
    if nonfinite == 0 and special == 0 and rel <= tolerance:  # passed: no report needed, skip pass 2
        return Comparison(name=name, numel=n, rel_error=rel, nonfinite=0, special_mismatch=0, bad=0, first_bad=[],
                          rows_bad=0, rows=rows, first_bad_rows=[], tolerance=float(tolerance), row_len=row_len,
                          err_norm=err_norm, ref_norm=ref_norm)
    # Pass 2 (failures only): locate bad elements for the report.
    bad = 0
    first_bad: list[tuple[int, float, float]] = []
    rows_bad = 0
    first_rows: list[int] = []
    last_row = -1
    for s in range(0, n, chunk):
        o = out[s:s + chunk].astype(xp.float64)
        r = ref[s:s + chunk].astype(xp.float64)
        rfin = xp.isfinite(r)
        scale = xp.maximum(xp.abs(r), rms if rms > 0 else 1.0)
        with np.errstate(invalid="ignore"):
            off = rfin & ~(xp.abs(o - r) <= tolerance * scale)  # NaN output counts as off
        off = off | (xp.isnan(r) & ~xp.isnan(o)) | (xp.isinf(r) & (o != r))
        nb = int(xp.count_nonzero(off))
        if not nb:
            continue
        bad += nb
        idx = xp.nonzero(off)[0]
        if len(first_bad) < _REPORT_ELEMENTS:
            take = idx[: _REPORT_ELEMENTS - len(first_bad)]
            got = o[take].tolist()
            exp = r[take].tolist()
            for i, g, e in zip((int(t) + s for t in take.tolist()), got, exp, strict=True):
                first_bad.append((i, float(g), float(e)))
        if row_len > 1:
            brows = xp.unique((idx + s) // row_len).tolist()
            brows = [int(b) for b in brows if int(b) != last_row]
            rows_bad += len(brows)
            if brows:
                last_row = brows[-1]
            first_rows.extend(brows[: max(0, _REPORT_ELEMENTS - len(first_rows))])
    return Comparison(name=name, numel=n, rel_error=rel, nonfinite=nonfinite, special_mismatch=special, bad=bad,
                      first_bad=first_bad, rows_bad=rows_bad, rows=rows, first_bad_rows=first_rows,
                      tolerance=float(tolerance), row_len=row_len, err_norm=err_norm, ref_norm=ref_norm)


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.6g}"


def format_mismatch(case: Case, cmp: Comparison, *, context: str = "") -> str:
    """A short report of a failed comparison, meant for a person or an LLM to read.

    Example::

        case M=7,N=777:float32, output 'y': rel error inf > tolerance 1e-05; 9 non-finite
        values where the reference is finite; 5439 of 5439 elements off; rows affected 7 of 7 (first: 0, 1, 2, 3, 4)
          y[0] (row 0, col 0): got nan, expected 0.31
    """
    head = f"case {case.key}{', ' + context if context else ''}, output {cmp.name!r}: "
    parts = [f"rel error {_fmt(cmp.rel_error)} {'>' if not cmp.ok else '<='} tolerance {cmp.tolerance:g}"]
    if cmp.nonfinite:
        parts.append(f"{cmp.nonfinite} non-finite values where the reference is finite "
                     "(NaN = poisoned element never written, or NaN/Inf computed)")
    if cmp.special_mismatch:
        parts.append(f"{cmp.special_mismatch} elements differ where the reference is NaN/Inf")
    parts.append(f"{cmp.bad} of {cmp.numel} elements off")
    if cmp.row_len > 1:
        rows = ", ".join(str(r) for r in cmp.first_bad_rows)
        parts.append(f"rows affected {cmp.rows_bad} of {cmp.rows} (row length {cmp.row_len}; first: {rows})")
    lines = [head + "; ".join(parts)]
    for i, got, exp in cmp.first_bad:
        where = f" (row {i // cmp.row_len}, col {i % cmp.row_len})" if cmp.row_len > 1 else ""
        lines.append(f"  {cmp.name}[{i}]{where}: got {_fmt(got)}, expected {_fmt(exp)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- case plumbing


def _row_len(case: Case) -> int:
    vals = list(case.shape.values())
    return int(vals[-1]) if vals else 1


@dataclass
class _CaseSet:
    """One set of guarded buffers for a case, with its launch arguments."""

    buffers: dict[str, GuardedBuffer]
    args: list[Any]
    in_sums: dict[str, int] = field(default_factory=dict)


def _specs(problem: Problem, case: Case) -> list[ArgSpec]:
    if problem.signature is None:
        raise ProblemError(f"Problem {problem.name!r} has no signature(case): the harness cannot allocate buffers")
    specs = list(problem.signature(case))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ProblemError(f"signature({case.key}) repeats buffer names: {names}")
    if not any(s.role == "out" for s in specs):
        raise ProblemError(f"signature({case.key}) has no 'out' buffer")
    return specs


def _new_set(backend: Backend, specs: Sequence[ArgSpec], scalars: Sequence[Any], canary: Any) -> _CaseSet:
    bufs = allocate_buffers(specs, canary, backend.xp, GUARD_BYTES)
    for b in bufs.values():
        if b.spec.role == "workspace":  # handed over all zeros; the kernel must return it so
            b.array.fill(0)
    args = [bufs[s.name].array for s in specs] + list(scalars)
    return _CaseSet(bufs, args)


def _fill_inputs(backend: Backend, problem: Problem, case: Case, cs: _CaseSet, seed: int,
                 phases: _Phases | None = None, *, sums: bool = True) -> None:
    """New contents for the set's inputs from ``problem.make_inputs`` and their checksums.

    With ``phases``, the three parts are timed apart (device-synchronised): ``inputs/draw``
    (make_inputs), ``inputs/store`` (the values converted to the buffers' storage types and
    written in; a :class:`~fitness.NormalDraw` is drawn here, straight into its buffer) and
    ``inputs/sums`` (the checksums :func:`_integrity` compares after launches).
    ``sums=False`` leaves the checksums out (and clears the set's old ones) for contents that
    no integrity check will read: the Timing stage's warm-up inputs.
    """
    xp = backend.xp
    if problem.make_inputs is None:
        raise ProblemError(f"Problem {problem.name!r} has no make_inputs(case, rng, xp)")
    part = phases if phases is not None else _Phases()
    with part("inputs/draw", sync=True):
        values = problem.make_inputs(case, backend.rng(seed), xp)
    with part("inputs/store", sync=True):
        for name, buf in cs.buffers.items():
            if buf.spec.role != "in":
                continue
            if name not in values:
                raise ProblemError(f"make_inputs({case.key}) returned no array for input {name!r} "
                                   f"(got {sorted(values)})")
            value = values[name]
            if isinstance(value, NormalDraw):  # drawn now, straight into the buffer's storage
                if value.size != buf.spec.numel:
                    raise ProblemError(f"make_inputs({case.key})[{name!r}] draws {value.size} values, "
                                       f"signature says {buf.spec.numel}")
                value.store_into(buf.array, buf.spec.dtype, xp)
                continue
            arr = xp.asarray(value).reshape(-1)
            if arr.size != buf.spec.numel:
                raise ProblemError(f"make_inputs({case.key})[{name!r}] has {arr.size} elements, "
                                   f"signature says {buf.spec.numel}")
            store_into(buf.array, arr, buf.spec.dtype, xp)
        del values
    if not sums:
        cs.in_sums = {}
        return
    with part("inputs/sums", sync=True):
        cs.in_sums = {n: checksum(b.array, xp) for n, b in cs.buffers.items() if b.spec.role == "in"}


def _poison_outputs(backend: Backend, cs: _CaseSet) -> None:
    for b in cs.buffers.values():
        if b.spec.role == "out":
            poison(b.array, backend.xp)


def _integrity(backend: Backend, cs: _CaseSet) -> str | None:
    """Guards intact, inputs unchanged and workspaces back to all zeros; else the reason."""
    xp = backend.xp
    problems = [r for r in (b.check(xp) for b in cs.buffers.values()) if r]
    for name, b in cs.buffers.items():
        if b.spec.role == "workspace":
            dirty = int(xp.count_nonzero(b.array.view(xp.uint8)))
            if dirty:
                problems.append(f"the kernel left {dirty} non-zero byte(s) in its workspace {name!r} (a workspace "
                                "is handed over all zeros and must be returned all zeros, e.g. the last CTA "
                                "that reads the partial sums clears them and resets its ticket counter)")
    for name, b in cs.buffers.items():
        if b.spec.role != "in":
            continue
        expected = cs.in_sums.get(name)
        if expected is None:  # a harness bug, not the candidate's: contents filled with sums=False
            raise RuntimeError(f"integrity check of input {name!r} without its checksum")
        if checksum(b.array, xp) != expected:
            problems.append(f"the kernel modified its input {name!r} (inputs are read-only; "
                            "write only to the output buffers)")
    return "; ".join(problems) or None


def _references(problem: Problem, case: Case, cs: _CaseSet, xp: Any) -> dict[str, Any]:
    if problem.reference is None:
        raise ProblemError(f"Problem {problem.name!r} has no reference(inputs, case, xp)")
    inputs = {n: upcast(b.array, b.spec.dtype, xp) for n, b in cs.buffers.items() if b.spec.role == "in"}
    refs = dict(problem.reference(inputs, case, xp))
    del inputs
    missing = [n for n, b in cs.buffers.items() if b.spec.role == "out" and n not in refs]
    if missing:
        raise ProblemError(f"reference({case.key}) returned nothing for outputs {missing}")
    return refs


def _compare_buffer(name: str, buf: GuardedBuffer, ref: Any, tol: float, xp: Any, row_len: int) -> Comparison:
    """Compare one output buffer with its reference: pass 1 fused on the device when possible."""
    dtype = buf.spec.dtype
    fused = fused_for(xp) if dtype in FUSED_DTYPES and ref.size == buf.spec.numel else None
    norms = fused.compare_norms(buf.array, dtype, ref) if fused is not None else None
    if norms is not None:
        c = compare(name, buf.array, ref, tol, xp, row_len=row_len, norms=norms)  # a pass reads only the sums
        if c.ok:
            return c
    got = from_storage(buf.array, dtype, xp) if is_float(dtype) else buf.array
    return compare(name, got, ref, tol, xp, row_len=row_len, norms=norms)


def _check_outputs(problem: Problem, case: Case, cs: _CaseSet, xp: Any, *, context: str = "",
                   phases: _Phases | None = None, sync: Callable[[], None] | None = None,
                   ) -> tuple[list[Comparison], str | None]:
    """Compare every output with the reference of this set's inputs; (comparisons, report or None).

    With ``phases`` (and ``sync``, the device synchronisation that makes a phase's wall time
    its device time), the reference's computation is booked under ``"reference"`` and the
    comparison under ``"verify"``.
    """
    if phases is None:
        return _check_outputs_now(problem, case, cs, xp, context, _references(problem, case, cs, xp))
    with phases("reference"):
        refs = _references(problem, case, cs, xp)
        if sync is not None:
            sync()
    with phases("verify"):
        return _check_outputs_now(problem, case, cs, xp, context, refs)


def _check_outputs_now(problem: Problem, case: Case, cs: _CaseSet, xp: Any, context: str,
                       refs: dict[str, Any]) -> tuple[list[Comparison], str | None]:
    """:func:`_check_outputs` with the references already computed (they are zeroed after)."""
    tol = float(problem.tolerances.get(case.dtype, 0.0))
    cmps: list[Comparison] = []
    reports = []
    try:
        for n, b in cs.buffers.items():
            if b.spec.role != "out":
                continue
            c = _compare_buffer(n, b, xp.asarray(refs[n]), float(problem.tolerances.get(b.spec.dtype, tol)), xp,
                                _row_len(case))
            cmps.append(c)
            if not c.ok:
                reports.append(format_mismatch(case, c, context=context))
    finally:
        for r in refs.values():  # the expected output does not outlive the check
            try:
                r.fill(0)
            except (AttributeError, ValueError):
                pass
        del refs
    return cmps, ("\n".join(reports) or None)


def _describe_diff(name: str, a: Any, b: Any, xp: Any, row_len: int) -> str | None:
    bits_a = a.view(xp.uint8).reshape(-1)
    bits_b = b.view(xp.uint8).reshape(-1)
    diff = bits_a != bits_b
    if not bool(diff.any()):
        return None
    isz = a.dtype.itemsize
    elem = xp.nonzero(diff.reshape(-1, isz).any(axis=1))[0]
    n = int(elem.size)
    first = [int(i) for i in elem[:_REPORT_ELEMENTS].tolist()]
    where = ", ".join(f"{i} (row {i // row_len})" if row_len > 1 else str(i) for i in first)
    return (f"output {name!r} is not deterministic: {n} of {a.size} elements differ bitwise between two runs on "
            f"the same inputs (first at {where}); races, uninitialised memory or order-dependent atomics")


# --------------------------------------------------------------------------- stages


def _device(ctx: StageContext, backend: Backend) -> DeviceInfo:
    return ctx.device if ctx.device is not None else backend.device_info(ctx.scratch)


def _launch_for(problem: Problem, job: Job, case: Case, device: DeviceInfo, backend: Backend,
                kernel: KernelHandle) -> Launch:
    """The launch to run for ``case``: the Problem's, a resident one fitted to the device (:meth:`Backend.fit`).

    Raises:
        LaunchConfigError: the device could not size a resident launch.
    """
    if problem.launch is None:
        raise ProblemError(f"Problem {problem.name!r} has no launch(params, case, device)")
    launch = problem.launch(job.genome.params, case, device)
    if not isinstance(launch, Launch):
        raise ProblemError(f"launch({case.key}) returned {type(launch).__name__}, expected evo.types.Launch")
    return backend.fit(kernel, launch, device)


def _kernels_by_dtype(backend: Backend, job: Job, ctx: StageContext) -> dict[str, KernelHandle]:
    """Dtype -> the kernel its cases run: every build of ``job`` loaded once (one build, ``""``,
    unless the Problem builds per dtype).

    Raises:
        LaunchConfigError: a build does not load or lacks the entry point.
    """
    problem, params = job.problem, job.genome.params
    builds = problem.builds(params)
    if list(builds) == [""]:
        kernel = backend.load(job, ctx.scratch)
        return dict.fromkeys(problem.dtypes, kernel)
    loaded = {name: backend.load(job, ctx.scratch, name) for name in builds}
    return {d: loaded[problem.build_for(params, d)] for d in problem.dtypes}


def _scalars(problem: Problem, case: Case) -> list[Any]:
    return scalar_args(problem.scalars(case)) if problem.scalars is not None else []


class Correctness(Stage):
    """Device gate: every check case, fresh secret inputs, poisoned outputs, two runs.

    Fails INCORRECT (with a ``"mismatch"`` artifact) for wrong, partial, non-finite or
    nondeterministic output, a modified input or an out-of-bounds write; RUNTIME_ERROR
    for a launch the driver refuses. Sticky CUDA errors raise :class:`~fitness.CudaFault`.

    Args:
        skip_timed: Leave the timed cases to a :class:`Timing` stage that follows. Timing
            checks those cases in full anyway (guards, inputs unchanged, every timed set
            against its reference, a bitwise relaunch), so checking them here as well only
            doubles the cost of the largest buffers. Keep ``False`` when no Timing stage
            follows.
    """

    name = "correctness"
    where = "device"
    needs_gpu = True

    def __init__(self, *, skip_timed: bool = False) -> None:
        self.skip_timed = bool(skip_timed)

    def __repr__(self) -> str:
        return f"Correctness(skip_timed={self.skip_timed})"

    def run(self, job: Job, ctx: StageContext) -> StageResult:
        backend = get_backend(ctx.scratch)
        xp = backend.xp
        problem = job.problem
        device = _device(ctx, backend)
        try:
            kernels = _kernels_by_dtype(backend, job, ctx)
        except LaunchConfigError as exc:
            return StageResult.fail(Status.RUNTIME_ERROR, str(exc))
        canary = make_canary(derive_seed(ctx.seed, "canary"), GUARD_BYTES, xp)
        worst = 0.0
        cases = problem.check_cases()
        if getattr(self, "skip_timed", False):
            timed = {c.key for c in problem.timed_cases()}
            cases = [c for c in cases if c.key not in timed] or cases[:1]
        for ci, case in enumerate(cases):
            specs = _specs(problem, case)
            kernel = kernels[case.dtype]
            try:
                launch = _launch_for(problem, job, case, device, backend, kernel)
            except LaunchConfigError as exc:
                return StageResult.fail(Status.RUNTIME_ERROR, f"case {case.key}: {exc}")
            cs = _new_set(backend, specs, _scalars(problem, case), canary)
            _fill_inputs(backend, problem, case, cs, derive_seed(ctx.seed, ci, "check"))
            outputs: list[tuple[str, Any]] = []
            for attempt in (1, 2):
                _poison_outputs(backend, cs)
                try:
                    backend.launch(kernel, launch, cs.args, device)
                    backend.synchronize()
                except LaunchConfigError as exc:
                    return StageResult.fail(Status.RUNTIME_ERROR, f"case {case.key}: {exc}")
                bad = _integrity(backend, cs)
                if bad:
                    return StageResult.fail(Status.INCORRECT, f"case {case.key}: {bad}",
                                            mismatch=f"case {case.key} (run {attempt}): {bad}")
                if attempt == 1:
                    outputs = [(n, b.array.copy()) for n, b in cs.buffers.items() if b.spec.role == "out"]
            # Reference only now, for the second run's output; the first run must match it bitwise.
            cmps, report = _check_outputs(problem, case, cs, xp)
            if report:
                return StageResult.fail(Status.INCORRECT, report.splitlines()[0], mismatch=report)
            for n, first in outputs:
                diff = _describe_diff(n, first, cs.buffers[n].array, xp, _row_len(case))
                if diff:
                    msg = f"case {case.key}: {diff}"
                    return StageResult.fail(Status.INCORRECT, msg, mismatch=msg)
            worst = max([worst] + [c.rel_error / c.tolerance if c.tolerance else c.rel_error for c in cmps])
            del cs, outputs
        return StageResult(ok=True, metrics={"correctness": {"cases": len(cases), "worst_error_ratio": worst}})


_MAX_BATCH = 8192


class _Phases:
    """Wall seconds spent per named phase (``with phases("inputs"): ...``).

    A name with a slash is a part of the phase before the slash, timed inside it
    (``with phases("inputs/draw", sync=True)``): the parts are kept beside their phase,
    not added to it. With ``sync=True`` and a ``sync`` callable (the device
    synchronisation), the part starts and ends on an idle device, so its wall time is the
    device time of the work issued inside it.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._sync = sync

    def __call__(self, name: str, *, sync: bool = False) -> _Phase:
        return _Phase(self, name, self._sync if sync else None)


class _Phase:
    """One timed span of a :class:`_Phases` (a context manager; spans of one name add up)."""

    def __init__(self, owner: _Phases, name: str, sync: Callable[[], None] | None) -> None:
        self._owner = owner
        self._name = name
        self._sync = sync
        self._t0 = 0.0

    def __enter__(self) -> None:
        if self._sync is not None:
            self._sync()
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self._sync is not None:
            self._sync()
        secs = self._owner.seconds
        secs[self._name] = secs.get(self._name, 0.0) + time.perf_counter() - self._t0


@dataclass
class _Timed:
    times_ms: list[float]
    launches_per_batch: int
    sets: int


def timing_summary(times_ms: Sequence[float]) -> tuple[float, float]:
    """(median, (p75 - p25) / median) of per-launch times."""
    arr = np.asarray(times_ms, dtype=np.float64)
    med = float(np.median(arr))
    p25, p75 = np.percentile(arr, [25, 75])
    return med, float((p75 - p25) / med) if med > 0 else math.inf


def aggregate_fitness(objective: str | Callable[[Mapping[str, Any]], float], metrics: Mapping[str, Any]) -> float:
    """Fitness from timing metrics per the Problem's objective (higher is better).

    ``"geomean_fraction"``: geometric mean of per-case fractions of the copy ceiling;
    ``"geomean_speed"``: geometric mean of ``1/time_ms``; a callable gets the metrics.
    """
    cases = metrics.get("cases", {})
    if callable(objective):
        return float(objective(metrics))
    if objective == "geomean_fraction":
        fr = [c.get("fraction") for c in cases.values()]
        if not fr or any(f is None for f in fr):
            raise ProblemError("objective 'geomean_fraction' needs bytes_moved(case) and a measured copy bandwidth")
        return geomean(fr)
    if objective == "geomean_speed":
        return geomean([1.0 / c["time_ms"] for c in cases.values()])
    raise ProblemError(f"objective {objective!r} unknown: use 'geomean_fraction', 'geomean_speed' or a callable")


class Timing(Stage):
    """Device stage that times every timed case and scores the genome.

    Args:
        timing_batches: R, batches per case (>= 10); ``None``: adaptive, 10..100.
        min_batch_ms: Shortest batch; B launches per batch are chosen to reach it. A
            batch is recorded once as a CUDA graph where the backend can, so short
            kernels run back to back rather than at the host's launch rate.
        warmup_ms: Warm-up per case (one round over the sets, then at least two batches).
        timing_target_ms: Total timed milliseconds per case the adaptive R aims for.
        max_sets: Most input/output sets rotated per case (one round exceeds 3x L2; a
            single set when one set alone does).
        max_fraction: Highest credible fraction of the measured copy bandwidth; a case
            measured faster fails INCORRECT (the kernel skips work on repeated launches,
            or the Problem's ``bytes_moved`` overstates the traffic).
        device_warmup_ms: A steady copy load on the device before the first timed case
            of each evaluation (0: none), so that case does not start from an idle
            card's clocks (the GPU may have waited on a compile).
        race_margin: Racing. Where the job carries the case's incumbent (``Job.data
            [INCUMBENTS]``, handed over by ``Evaluator.submit(..., incumbents=)``; the
            engine does), a case whose first ``race_batches`` timed batches have a median
            slower than ``race_margin`` x the incumbent stops there: it cannot take the
            case, so its time is that median (``"raced": True`` in the case's metrics).
            Everything else (new inputs after warm-up, every output verified, the
            relaunch check) is the same. ``None``: time every batch.
        race_batches: Timed batches before the race decision (>= 1).

    Each can also come from ``ctx.options`` under the same name, which wins over the
    constructor (so an Evaluator can set them for all stages).
    """

    name = "timing"
    where = "device"
    needs_gpu = True

    def __init__(self, *, timing_batches: int | None = None, min_batch_ms: float = 2.0, warmup_ms: float = 10.0,
                 timing_target_ms: float = 50.0, max_sets: int = 64, max_fraction: float = 1.1,
                 device_warmup_ms: float = 25.0, race_margin: float | None = 1.15, race_batches: int = 3) -> None:
        if race_margin is not None and not (math.isfinite(race_margin) and race_margin > 1.0):
            raise ValueError(f"Timing(race_margin={race_margin!r}): give a factor above 1 (e.g. 1.15), or None "
                             "to time every batch")
        if int(race_batches) < 1:
            raise ValueError(f"Timing(race_batches={race_batches!r}): give at least 1")
        self.defaults: dict[str, Any] = {"timing_batches": timing_batches, "min_batch_ms": min_batch_ms,
                                         "warmup_ms": warmup_ms, "timing_target_ms": timing_target_ms,
                                         "max_sets": max_sets, "max_fraction": max_fraction,
                                         "device_warmup_ms": device_warmup_ms, "race_margin": race_margin,
                                         "race_batches": int(race_batches)}

    def __repr__(self) -> str:
        return f"Timing({', '.join(f'{k}={v!r}' for k, v in self.defaults.items())})"

    def run(self, job: Job, ctx: StageContext) -> StageResult:
        backend = get_backend(ctx.scratch)
        xp = backend.xp
        problem = job.problem
        device = _device(ctx, backend)
        cases = problem.timed_cases()
        if not cases:
            raise ProblemError(f"Problem {problem.name!r} has no timed shapes: add timed_shapes to score genomes")
        try:
            kernels = _kernels_by_dtype(backend, job, ctx)
        except LaunchConfigError as exc:
            return StageResult.fail(Status.RUNTIME_ERROR, str(exc))
        opts = dict(getattr(self, "defaults", {}))
        opts.update({k: v for k, v in (ctx.options or {}).items() if k in opts and v is not None})
        incumbents = job.data.get(INCUMBENTS) or {}
        canary = make_canary(derive_seed(ctx.seed, "time-canary"), GUARD_BYTES, xp)
        per_case: dict[str, dict[str, Any]] = {}
        busy_ms = backend.hold_busy(float(opts.get("device_warmup_ms") or 0.0))
        for ci, case in enumerate(cases):
            specs = _specs(problem, case)
            inc = incumbents.get(case.key) if isinstance(incumbents, Mapping) else None
            kernel = kernels[case.dtype]
            try:
                launch = _launch_for(problem, job, case, device, backend, kernel)
                res = self._time_case(backend, problem, job, case, ci, kernel, launch, specs, canary, device, ctx, opts,
                                      inc)
            except LaunchConfigError as exc:
                return StageResult.fail(Status.RUNTIME_ERROR, f"case {case.key}: {exc}")
            if isinstance(res, StageResult):
                return res
            if launch.resident:
                res["grid"] = launch.grid[0]  # the CTAs a resident launch ran with on this device
            per_case[case.key] = res
            backend.release()
        metrics: dict[str, Any] = {"cases": per_case, "device_warmup_ms": busy_ms,
                                   "raced_cases": sum(1 for c in per_case.values() if c.get("raced")),
                                   "time_ms_geomean": geomean([c["time_ms"] for c in per_case.values()])}
        fractions = [c.get("fraction") for c in per_case.values()]
        if fractions and all(f is not None for f in fractions):
            metrics["fraction"] = geomean(fractions)
        fitness = aggregate_fitness(problem.objective, metrics)
        return StageResult(ok=True, fitness=fitness, metrics=metrics)

    def _time_case(self, backend: Backend, problem: Problem, job: Job, case: Case, ci: int, kernel: KernelHandle,
                   launch: Launch, specs: Sequence[ArgSpec], canary: Any, device: DeviceInfo, ctx: StageContext,
                   opts: Mapping[str, Any], incumbent: float | None = None) -> dict[str, Any] | StageResult:
        xp = backend.xp
        phases = _Phases(sync=backend.synchronize)
        scalars = _scalars(problem, case)
        set_bytes = sum(s.nbytes + 2 * GUARD_BYTES for s in specs)
        data_bytes = sum(s.nbytes for s in specs)  # what the kernel touches (guards are not read)
        # Enough sets that one round exceeds 3x L2 (every launch reads from HBM); one set
        # when it alone does (a result reused across launches is caught by the new
        # contents after warm-up and by the bandwidth ceiling below).
        room = int(0.6 * backend.free_bytes()) // max(1, 3 * set_bytes)  # inputs' temporaries and refs too
        k = rotation_sets(device.l2_bytes, data_bytes, most=int(opts.get("max_sets", 64)), fit=room)
        with phases("inputs", sync=True):
            with phases("inputs/alloc", sync=True):
                sets = [_new_set(backend, specs, scalars, canary) for _ in range(k)]
            # The warm-up's outputs are never checked, and its inputs are replaced before the
            # timed launches: no poison and no checksums here (those of the timed contents are).
            for si, cs in enumerate(sets):
                _fill_inputs(backend, problem, case, cs, derive_seed(ctx.seed, ci, si, "warm"), phases, sums=False)
        # Warm-up: a first round over the sets (launch by launch) estimates the time per
        # launch; then the batch of B launches is recorded once (a CUDA graph where the
        # backend can) and replayed until warmup_ms have passed and at least twice.
        min_batch = float(opts.get("min_batch_ms", 2.0))
        warm_ms = float(opts.get("warmup_ms", 10.0))
        with phases("warmup"):
            start = backend.event()
            for i in range(k):
                backend.launch(kernel, launch, sets[i].args, device)
            backend.synchronize()
            per_launch = max(backend.elapsed_ms(start, backend.event()) / k, 1e-6)
            batch, b = self._batch(backend, kernel, launch, sets, device, min_batch, per_launch)
            t0 = time.perf_counter()
            rounds = 0
            while rounds < 2 or (time.perf_counter() - t0) * 1e3 < warm_ms:
                ms, _ = self._run_batch(backend, kernel, launch, sets, device, batch, b)
                per_launch = max(ms / b, 1e-6)
                rounds += 1
                if rounds == 1 and batch is not None and b * per_launch < 0.5 * min_batch and b < _MAX_BATCH:
                    batch, b = self._batch(backend, kernel, launch, sets, device, min_batch, per_launch)
                if rounds >= 1000:
                    break
        # New contents everywhere: a result cached during warm-up is now wrong.
        with phases("inputs", sync=True):
            for si, cs in enumerate(sets):
                _fill_inputs(backend, problem, case, cs, derive_seed(ctx.seed, ci, si, "timed"), phases)
                with phases("inputs/poison", sync=True):
                    _poison_outputs(backend, cs)
        if "timing_batches" in opts and opts["timing_batches"]:
            r = max(10, int(opts["timing_batches"]))
        else:
            r = batch_count(float(opts.get("timing_target_ms", 50.0)), b * per_launch)
        margin = opts.get("race_margin")
        first = max(1, int(opts.get("race_batches", 3)))
        racing = incumbent is not None and margin is not None and r > first
        with phases("timed"):
            runs = [self._run_batch(backend, kernel, launch, sets, device, batch, b) for _ in range(first if racing else r)]
            raced = racing and raced_out([ms / b for ms, _ in runs], incumbent, margin)
            if not raced:
                runs += [self._run_batch(backend, kernel, launch, sets, device, batch, b) for _ in range(r - len(runs))]
        r = len(runs)
        times = [ms / b for ms, _ in runs]
        escaped = sum(e for _, e in runs)
        med, spread = timing_summary(times)
        # The timed launches must have computed the right thing for every set ("verify"; the
        # reference's own computation is booked apart as "reference") ...
        for si, cs in enumerate(sets):
            with phases("verify"):
                bad = _integrity(backend, cs)
            if bad:
                msg = f"case {case.key}, timed set {si + 1} of {k}: {bad}"
                return StageResult.fail(Status.INCORRECT, msg, mismatch=msg)
            _cmps, report = _check_outputs(problem, case, cs, xp, context=f"timed launches, set {si + 1} of {k}",
                                           phases=phases, sync=backend.synchronize)
            if report:
                return StageResult.fail(Status.INCORRECT, report.splitlines()[0], mismatch=report)
        # ... and again, bit for bit, when launched once more on the same inputs ("determinism";
        # the Correctness stage has run every check shape twice already, so one relaunch here).
        with phases("determinism"):
            cs = sets[0]
            before = {n: checksum(b_.array, xp) for n, b_ in cs.buffers.items() if b_.spec.role == "out"}
            _poison_outputs(backend, cs)
            backend.launch(kernel, launch, cs.args, device)
            backend.synchronize()
            bad = _integrity(backend, cs)
            if bad:
                msg = f"case {case.key}, relaunch on timed set 1: {bad}"
                return StageResult.fail(Status.INCORRECT, msg, mismatch=msg)
            for n, want_sum in before.items():
                if checksum(cs.buffers[n].array, xp) != want_sum:
                    msg = (f"case {case.key}: output {n!r} is not deterministic: a relaunch on the same inputs "
                           "changed it (races, uninitialised memory or order-dependent atomics)")
                    return StageResult.fail(Status.INCORRECT, msg, mismatch=msg)
        out: dict[str, Any] = {"time_ms": med, "spread": spread, "sets": k, "launches_per_batch": b, "batches": r,
                               "escaped_batches": escaped, "graph": batch is not None, "raced": raced,
                               "phases_s": phases.seconds}
        if incumbent is not None:
            out["incumbent_ms"] = float(incumbent)
        if problem.bytes_moved is not None:
            moved = int(problem.bytes_moved(case))
            gbps = moved / (med * 1e-3) / 1e9 if med > 0 else math.inf
            out["bytes_moved"] = moved
            out["gbps"] = gbps
            out["fraction"] = gbps / device.copy_gbps if device.copy_gbps > 0 else None
            limit = float(opts.get("max_fraction", 1.1))
            if out["fraction"] is not None and out["fraction"] > limit:
                msg = (f"case {case.key}: measured {gbps:.0f} GB/s, {out['fraction']:.2f}x the copy bandwidth this "
                       f"worker measured ({device.copy_gbps:.0f} GB/s): faster than the memory system allows, so "
                       "the kernel skips work on repeated launches (e.g. returns early when its output already "
                       "looks written), or the Problem's bytes_moved overstates the traffic")
                return StageResult.fail(Status.INCORRECT, msg, mismatch=msg)
        del sets
        return out

    @staticmethod
    def _batch(backend: Backend, kernel: KernelHandle, launch: Launch, sets: Sequence[_CaseSet], device: DeviceInfo,
               min_batch: float, per_launch: float) -> tuple[Any, int]:
        """(recorded batch or None, B): B launches rotating over the sets, lasting >= min_batch."""
        k = len(sets)
        b = batch_size(k, per_launch, min_batch, _MAX_BATCH)
        batch = backend.capture(kernel, launch, [sets[i % k].args for i in range(b)], device)
        return batch, b

    @staticmethod
    def _run_batch(backend: Backend, kernel: KernelHandle, launch: Launch, sets: Sequence[_CaseSet],
                   device: DeviceInfo, batch: Any, b: int) -> tuple[float, bool]:
        """(milliseconds, escaped) of one batch of ``b`` launches (see :mod:`fitness._plan`).

        The end event on the stream gives the time; a second end event after a device-wide
        synchronise counts instead when it is later by more than the slack (work escaped
        the stream).
        """
        k = len(sets)
        start = backend.event()
        if batch is not None:
            batch.launch()
        else:
            for i in range(b):
                backend.launch(kernel, launch, sets[i % k].args, device)
        end = backend.event()
        backend.synchronize()  # device-wide: work escaping to another stream is counted
        synced = backend.event()
        return batch_time(backend.elapsed_ms(start, end), backend.elapsed_ms(start, synced))
