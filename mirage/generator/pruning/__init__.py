"""Pruning for the µGraph search: abstract-expression subexpression checks and a table of rules.

* :class:`Candidate` (``candidate.py``): one proposed op on a prefix graph, what rules judge.
* :class:`PruningTable` (``rules.py``): the named rules, switchable one by one, with per-rule
  counters (:class:`PruningStats`); :func:`pruning_rule` registers a new one.
* :func:`subexpression_oracle`: the saturated e-graph check of a reference's target expressions
  (``mirage.generator.egraph_subexpression``), the oracle of the ``abstract_expression`` rule.

``docs/pruning.md`` is the how-to for writing and measuring new rules.
"""

from __future__ import annotations

from collections.abc import Sequence

from mirage.generator.abstract_expr import Term
from mirage.generator.egraph_subexpression import (
    Backend,
    SubexpressionCheck,
    SubexpressionConfig,
    SubexpressionStats,
)
from mirage.generator.pruning.candidate import INPUT_ORDER, Candidate, Order, prefix_terms, tensor_terms
from mirage.generator.pruning.rules import (
    RULES,
    PruningContext,
    PruningRule,
    PruningRuleError,
    PruningStats,
    PruningTable,
    RuleStats,
    UnknownRuleError,
    pruning_rule,
)


def subexpression_oracle(
    targets: Sequence[Term], config: SubexpressionConfig | None = None
) -> SubexpressionCheck:
    """The subexpression check of ``targets`` (saturated once; ``.contains(term)`` per query)."""
    return SubexpressionCheck(targets, config)


def target_terms(reference) -> list[Term]:
    """The target expressions ``E_O`` of a reference kernel graph (one per output)."""
    from mirage.generator.expressions import output_terms

    return output_terms(reference)


__all__ = [
    "Backend",
    "Candidate",
    "INPUT_ORDER",
    "Order",
    "PruningContext",
    "PruningRule",
    "PruningRuleError",
    "PruningStats",
    "PruningTable",
    "RULES",
    "RuleStats",
    "SubexpressionCheck",
    "SubexpressionConfig",
    "SubexpressionStats",
    "UnknownRuleError",
    "prefix_terms",
    "pruning_rule",
    "subexpression_oracle",
    "target_terms",
    "tensor_terms",
]
