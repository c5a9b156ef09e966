"""LLM operators and backends.

API index:
    Completion, LLMBackend                       one answer with accounting; the backend protocol
    OpenAIBackend, AnthropicBackend, from_env    backends over the official SDKs (imported lazily)
    CostLedger, BudgetExceeded, LLMError         token/cost accounting, hard budget cap, call failures
    DEFAULT_PRICES, price_for                    USD per 1M tokens by model prefix
    LLMEnsemble                                  several backends, picked per call by a cost-aware bandit
    LLMOperator, LLMDiff, LLMRewrite,
    LLMCrossover, LLMRepair                      the operators (templates in ``templates/``)
    EditBlock, parse_blocks, apply_blocks,
    extract_code, extract_params                 answer parsing
    load_template, render                        prompt templates with bounded size

Importing this package does not import ``openai`` or ``anthropic``.
"""

from operators.llm._backends import (
    DEFAULT_PRICES,
    AnthropicBackend,
    BudgetExceeded,
    Completion,
    CostLedger,
    LLMBackend,
    LLMError,
    OpenAIBackend,
    from_env,
    price_for,
)
from operators.llm._diff import EditBlock, apply_blocks, extract_code, extract_params, parse_blocks
from operators.llm._ensemble import LLMEnsemble
from operators.llm._ops import LLMCrossover, LLMDiff, LLMOperator, LLMRepair, LLMRewrite
from operators.llm._prompts import load_template, render

__all__ = [
    "DEFAULT_PRICES",
    "AnthropicBackend",
    "BudgetExceeded",
    "Completion",
    "CostLedger",
    "EditBlock",
    "LLMBackend",
    "LLMCrossover",
    "LLMDiff",
    "LLMEnsemble",
    "LLMError",
    "LLMOperator",
    "LLMRepair",
    "LLMRewrite",
    "OpenAIBackend",
    "apply_blocks",
    "extract_code",
    "extract_params",
    "from_env",
    "load_template",
    "parse_blocks",
    "price_for",
    "render",
]
