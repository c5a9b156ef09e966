"""Operators: how new genomes are proposed.

API index (filled as the package grows):
    Operator, OperatorContext, OperatorError, Proposal  the operator contract
"""

from operators._base import Operator, OperatorContext, OperatorError, Proposal

__all__ = ["Operator", "OperatorContext", "OperatorError", "Proposal"]
