"""The subexpression check: is a candidate's abstract expression a subexpression of the target's?

``SubexpressionCheck(targets)`` saturates an e-graph of the target expressions **once** with the
axioms of ``egraph_rules.py`` (under explicit :class:`SaturationLimits`; the report says why it
stopped), then answers each query by lookup, caching the answer of every term it has seen.

**What a lookup accepts.**  A term ``t`` is accepted iff, for some ``k >= 1``, ``sum(k, t)`` is
represented in the saturated e-graph (``k = 1``: ``t`` itself).  The reductions of candidates are
often *partial* (a matmul over one tile, one block's share of a split reduction), so the lookup
computes, bottom-up and memoized, the set of pairs ``(e-class, k)`` with ``sum(k, t)`` in that
e-class, using only equivalence axioms:

* leaves and ``exp``/``sqrt``/opaque nodes: the node itself, found by hash-cons lookup (k = 1);
* ``sum(d, u)``: ``(C, k/d)`` for each pair ``(C, k)`` of ``u`` with ``d | k``   (axiom 10);
* ``a + b``: ``(C_a + C_b, k)`` for pairs of equal ``k``                          (sum-add);
* ``a * b``: ``(C_a * C_b, k_a * k_b)``                                             (sum-mul, 10);
* ``a / b``: ``(C_a / C_b, k_a)`` for ``k_b = 1``                                   (sum-div);
* and each pair ``(C, k)`` extends to ``(C', k*m)`` for every e-node ``sum(m, C)`` of ``C'``.

This replaces Mirage's factor-chain rewrite rules (``sum(n, x) = sum(p, sum(n/p, x))``) with
reasoning at lookup time; it accepts every split of every reduction, while the factor chains make
saturation blow up on targets with several large reductions (``docs/pruning.md`` has numbers).
They remain available as ``SubexpressionConfig(factor_chains=True)``.

>>> from mirage.generator import abstract_expr as ae
>>> q, k, v = ae.variable(0), ae.variable(1), ae.variable(2)
>>> scores = ae.exp(ae.sum_of(64, ae.mul(q, k)))
>>> target = ae.sum_of(4096, ae.mul(ae.div(scores, ae.sum_of(4096, scores)), v))
>>> check = SubexpressionCheck([target])
>>> check.saturation.stop_reason.name
'SATURATED'
>>> check(ae.sum_of(512, ae.mul(scores, v)))          # one block's partial numerator
True
>>> check(ae.div(ae.sum_of(4096, ae.mul(v, scores)), ae.sum_of(4096, scores)))
True
>>> check(ae.exp(ae.sum_of(32, ae.mul(q, k))))        # exp of a partial dot product
False
"""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from mirage.generator.abstract_expr import Term, TermOp
from mirage.generator.egraph import EGraph, SaturationLimits, SaturationReport
from mirage.generator.egraph_rules import AXIOMS, PatternNode, Rewrite, factor_chain_rules

logger = logging.getLogger(__name__)


class Backend(enum.Enum):
    """Which e-graph implementation saturates the target."""

    EGGLOG = "egglog"  # the Rust egglog library through its Python bindings (default: faster)
    PYTHON = "python"  # the small e-graph of egraph.py (no native dependency)


@dataclass(frozen=True)
class SubexpressionConfig:
    backend: Backend = Backend.EGGLOG
    limits: SaturationLimits = field(default_factory=SaturationLimits)
    rules: tuple[Rewrite, ...] = AXIOMS
    #: add Mirage's factor-chain rules for the target's reduction sizes (not needed, see above)
    factor_chains: bool = False


@dataclass
class SubexpressionStats:
    """Counters of one check: queries answered, how many came from the cache, time spent."""

    queries: int = 0
    cache_hits: int = 0
    accepted: int = 0
    seconds: float = 0.0


Pairs = frozenset  # of (e-class, k)


def _make_egraph(backend: Backend):
    match backend:
        case Backend.EGGLOG:
            from mirage.generator.egraph_egglog import EgglogEGraph

            try:
                return EgglogEGraph()
            except ModuleNotFoundError as error:
                if error.name != "egglog":
                    raise
                _warn_no_egglog()
                return EGraph()
        case Backend.PYTHON:
            return EGraph()


@functools.cache
def _warn_no_egglog() -> None:
    """Once a process: the same rules saturate in the built-in e-graph, which builds the same e-classes,
    only more slowly."""
    logger.warning(
        "egglog is not installed: the subexpression check runs on the built-in e-graph (same results, "
        "slower); pip install egglog for the fast back end")


def _pattern_sizes(pattern) -> set[int]:
    if not isinstance(pattern, PatternNode):
        return set()
    sizes = {pattern.parameter} if pattern.op is TermOp.SUM and isinstance(pattern.parameter, int) else set()
    for arg in pattern.args:
        sizes |= _pattern_sizes(arg)
    return sizes


class SubexpressionCheck:
    """Saturate the targets once; then ``check(term)`` says whether ``term`` may be kept."""

    def __init__(self, targets: Sequence[Term], config: SubexpressionConfig | None = None) -> None:
        self.config = config or SubexpressionConfig()
        self.targets = tuple(targets)
        target_sizes = {t.parameter for term in self.targets for t in term.subterms() if t.op is TermOp.SUM}
        rules = list(self.config.rules)
        if self.config.factor_chains:
            rules += factor_chain_rules(target_sizes)  # type: ignore[arg-type]
        # Rules copy sizes, never compute them, so these are all reduction sizes in the e-graph.
        sizes = set(target_sizes)
        for rule in rules:
            sizes |= _pattern_sizes(rule.lhs) | _pattern_sizes(rule.rhs)
        self.sizes: tuple[int, ...] = tuple(sorted(sizes))  # type: ignore[arg-type]
        # No candidate sums more elements than all target reductions together: a bound that stops
        # the closure below on an e-graph where some class contains a reduction of itself.
        self._largest_k = 1
        for size in self.sizes:
            self._largest_k *= size
        self.egraph = _make_egraph(self.config.backend)
        for term in self.targets:
            self.egraph.add_term(term)
        self.saturation: SaturationReport = self.egraph.saturate(rules, self.config.limits)
        logger.info("subexpression check: %s", self.saturation)
        self.stats = SubexpressionStats()
        self._pairs: dict[Term, Pairs] = {}
        self._answers: dict[Term, bool] = {}

    @property
    def report(self) -> str:
        """One line on the saturation (for logs and search statistics)."""
        return str(self.saturation)

    def __getstate__(self) -> dict:
        # An egglog handle does not pickle: a worker process saturates again (fast). The built-in
        # e-graph pickles, and goes as it is: saturating it again in every worker would cost each
        # as long as the first saturation (seconds for a LayerNorm), out of the search's budget.
        if isinstance(self.egraph, EGraph):
            return {**self.__dict__, "stats": SubexpressionStats(), "_pairs": {}, "_answers": {}}
        return {"targets": self.targets, "config": self.config}

    def __setstate__(self, state: dict) -> None:
        if "egraph" in state:
            self.__dict__.update(state)
            return
        self.__init__(state["targets"], state["config"])  # type: ignore[misc]

    def __call__(self, term: Term) -> bool:
        return self.contains(term)

    def contains(self, term: Term) -> bool:
        """Whether ``term`` is a subexpression of a target (cached)."""
        self.stats.queries += 1
        answer = self._answers.get(term)
        if answer is not None:
            self.stats.cache_hits += 1
            return answer
        start = time.perf_counter()
        answer = bool(self.pairs(term))
        self._answers[term] = answer
        self.stats.accepted += answer
        self.stats.seconds += time.perf_counter() - start
        return answer

    def pairs(self, term: Term) -> Pairs:
        """The pairs ``(e-class, k)`` such that ``sum(k, term)`` is represented (memoized)."""
        found = self._pairs.get(term)
        if found is None:
            found = self._close(self._base_pairs(term))
            self._pairs[term] = found
        return found

    def _base_pairs(self, term: Term) -> set[tuple[object, int]]:
        lookup, op = self.egraph.lookup_node, term.op
        if not term.args:
            eclass = lookup((op, term.parameter))
            return set() if eclass is None else {(eclass, 1)}
        first = self.pairs(term.args[0])
        if op is TermOp.SUM:
            size: int = term.parameter  # type: ignore[assignment]
            return {(eclass, k // size) for eclass, k in first if k % size == 0}
        result: set[tuple[object, int]] = set()
        if len(term.args) == 1:
            for child, k in first:
                if k == 1 and (eclass := lookup((op, term.parameter, child))) is not None:
                    result.add((eclass, 1))
            return result
        second = self.pairs(term.args[1])
        for left, k_left in first:
            for right, k_right in second:
                match op:
                    case TermOp.ADD if k_left == k_right:
                        k = k_left
                    case TermOp.MUL:
                        k = k_left * k_right
                    case TermOp.DIV if k_right == 1:
                        k = k_left
                    case _:
                        continue
                if (eclass := lookup((op, None, left, right))) is not None:
                    result.add((eclass, k))
        return result

    def _close(self, pairs: set[tuple[object, int]]) -> Pairs:
        """Extend every pair ``(C, k)`` by the reductions over ``C``: ``(sum(m, C), k*m)``."""
        todo = list(pairs)
        while todo:
            eclass, k = todo.pop()
            for size in self.sizes:
                parent = self.egraph.lookup_node((TermOp.SUM, size, eclass))
                if parent is not None and k * size <= self._largest_k and (parent, k * size) not in pairs:
                    pairs.add((parent, k * size))
                    todo.append((parent, k * size))
        return frozenset(pairs)
