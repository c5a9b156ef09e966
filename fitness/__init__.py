"""Scoring candidates: stages, the evaluator and isolated GPU workers.

API index (filled as the package grows):
    Stage, StageResult, StageContext, Job  the stage contract
"""

from fitness._stage import CudaFault, Job, Stage, StageContext, StageResult

__all__ = ["CudaFault", "Job", "Stage", "StageContext", "StageResult"]
