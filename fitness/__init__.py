"""Scoring candidates: stages, the evaluator and isolated GPU workers.

API index (filled as the package grows):
    Stage, StageResult, StageContext, Job  the stage contract
"""

from fitness._stage import Job, Stage, StageContext, StageResult

__all__ = ["Job", "Stage", "StageContext", "StageResult"]
