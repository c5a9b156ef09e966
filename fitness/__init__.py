"""Scoring candidates: stages, the evaluator and isolated GPU workers.

API index:
    Stage, StageResult, StageContext, Job, CudaFault,  the stage contract (``_stage``)
        INCUMBENTS
    StaticCheck, static_violations, check_genome       device-code-only policy gate (``_static``)
    Compile, compile_genome, compile_source,           nvcc / NVRTC / ptxas in limited subprocesses
        CompileResult, run_limited, toolkit_version,   (``_compile``)
        truncate_log
    CompileCache, cache_key, default_cache_dir         on-disk compile cache (``_cache``)
    Resources, parse_ptxas_report, ptxas_entries       registers, smem, stack, spills (``_resources``)
    Evaluator, HostScore, EvaluatorConfigError,        the local executor (``_evaluator``)
        default_stages, check_reference
    WorkerProcess, WorkerOutcome, is_cuda_fault,       isolated device workers (``_worker``)
        visible_devices
    Correctness, Timing, init_device                   device stages (``_gate``, ``_device``; imported lazily)
    random_normal, seed_from, normal_draw,             fast fresh inputs for make_inputs; a NormalDraw is
        NormalDraw, materialize                        drawn straight into the input buffer (``_inputs``)
    time_calls, CallTiming                             torch callables timed like Timing (``_torch_timing``)
    rotation_sets                                      input sets per timed case: a round > 3x L2 (``_plan``)
"""

from __future__ import annotations

from typing import Any

from fitness._cache import CompileCache, cache_key, default_cache_dir
from fitness._compile import (
    Compile,
    CompileResult,
    ProcResult,
    compile_genome,
    compile_source,
    run_limited,
    toolkit_version,
    truncate_log,
)
from fitness._evaluator import Evaluator, EvaluatorConfigError, HostScore, check_reference, default_stages
from fitness._inputs import NormalDraw, materialize, normal_draw, random_normal, seed_from
from fitness._plan import rotation_sets
from fitness._resources import Resources, parse_ptxas_report, ptxas_entries
from fitness._stage import INCUMBENTS, CudaFault, Job, Stage, StageContext, StageResult
from fitness._static import StaticCheck, check_genome, static_violations
from fitness._torch_timing import CallTiming, time_calls
from fitness._worker import WorkerOutcome, WorkerProcess, is_cuda_fault, set_parent_death_signal, visible_devices

__all__ = [
    "INCUMBENTS", "CudaFault", "Job", "Stage", "StageContext", "StageResult", "set_parent_death_signal",
    "StaticCheck", "check_genome", "static_violations",
    "Compile", "CompileResult", "ProcResult", "compile_genome", "compile_source", "run_limited", "toolkit_version",
    "truncate_log",
    "CompileCache", "cache_key", "default_cache_dir",
    "Resources", "parse_ptxas_report", "ptxas_entries",
    "Evaluator", "EvaluatorConfigError", "HostScore", "check_reference", "default_stages",
    "WorkerOutcome", "WorkerProcess", "is_cuda_fault", "visible_devices",
    "Correctness", "Timing", "init_device", "fit_resident", "resident_blocks",
    "random_normal", "seed_from", "NormalDraw", "materialize", "normal_draw", "CallTiming", "time_calls", "rotation_sets",
]

_LAZY = {"Correctness": "fitness._gate", "Timing": "fitness._gate", "init_device": "fitness._device",
         "fit_resident": "fitness._device", "resident_blocks": "fitness._device"}


def __getattr__(name: str) -> Any:
    """Device-side names, imported on first use (they may pull in CuPy)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fitness' has no attribute {name!r}")
