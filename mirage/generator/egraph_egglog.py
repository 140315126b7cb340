"""The ``egglog`` back end of the subexpression check: same rules, same limits, same interface.

The rule table of ``egraph_rules.py`` is printed as an egglog program (one ``rewrite`` or
``birewrite`` per row), the target terms are added with ``let``, and the program is run one
iteration at a time so that the node, iteration and time limits of :class:`SaturationLimits` are
checked between iterations (egglog itself only bounds iterations).  Queries go through egglog's
``lookup_function``: the e-class of a constructor applied to e-classes, without inserting anything.

>>> from mirage.generator import abstract_expr as ae
>>> from mirage.generator.egraph_rules import AXIOMS
>>> x, y = ae.variable(0), ae.variable(1)
>>> graph = EgglogEGraph()
>>> root = graph.add_term(ae.mul(ae.add(x, y), x))
>>> graph.saturate(AXIOMS, SaturationLimits(iterations=4)).backend
'egglog'
>>> graph.lookup(ae.add(ae.mul(x, x), ae.mul(y, x))) == graph.find(root)
True
>>> graph.lookup(ae.exp(x)) is None
True
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from mirage.generator.abstract_expr import Term, TermOp, to_sexpr
from mirage.generator.egraph import ENode, SaturationLimits, SaturationReport, StopReason
from mirage.generator.egraph_rules import Pattern, PatternNode, PatternVariable, Rewrite, SizeVariable

logger = logging.getLogger(__name__)

#: egglog constructor of each operator.
CONSTRUCTORS = {
    TermOp.VARIABLE: "V",
    TermOp.CONSTANT: "C",
    TermOp.ADD: "Add",
    TermOp.MUL: "Mul",
    TermOp.DIV: "Div",
    TermOp.EXP: "Exp",
    TermOp.SQRT: "Sqrt",
    TermOp.SUM: "Sum",
    TermOp.OPAQUE: "Fn",
}
OPERATORS = {name: op for op, name in CONSTRUCTORS.items()}

DATATYPE = (
    "(datatype Expr (V i64) (C) (Add Expr Expr) (Mul Expr Expr) (Div Expr Expr) (Exp Expr) (Sqrt Expr)"
    " (Sum i64 Expr) (Fn String Expr))"
)


def _pattern_text(pattern: Pattern) -> str:
    if isinstance(pattern, PatternVariable):
        return pattern.name
    assert isinstance(pattern, PatternNode)
    parts = [CONSTRUCTORS[pattern.op]]
    if isinstance(pattern.parameter, SizeVariable):
        parts.append(pattern.parameter.name)
    elif isinstance(pattern.parameter, str):
        parts.append(f'"{pattern.parameter}"')
    elif pattern.parameter is not None:
        parts.append(str(pattern.parameter))
    parts.extend(_pattern_text(arg) for arg in pattern.args)
    return "(" + " ".join(parts) + ")"


def rule_text(rule: Rewrite) -> str:
    """The egglog command of one rule row."""
    keyword = "birewrite" if rule.bidirectional else "rewrite"
    return f"({keyword} {_pattern_text(rule.lhs)} {_pattern_text(rule.rhs)})"


def term_text(term: Term) -> str:
    """The egglog expression of a term (a nested constructor call)."""
    memo: dict[Term, str] = {}
    for node in term.subterms():
        parts = [CONSTRUCTORS[node.op]]
        if node.op is TermOp.OPAQUE:
            parts.append(f'"{node.parameter}"')
        elif node.parameter is not None:
            parts.append(str(node.parameter))
        parts.extend(memo[arg] for arg in node.args)
        memo[node] = "(" + " ".join(parts) + ")"
    return memo[term]


class EgglogEGraph:
    """An e-graph held by egglog; e-classes are egglog ``Value`` objects."""

    backend = "egglog"

    def __init__(self) -> None:
        from egglog import bindings  # imported here: loading the native library is not free

        # egglog logs every command it runs at INFO; keep that out of the search's logs unless the
        # user has configured egglog's logger.
        egglog_logger = logging.getLogger("egglog")
        if egglog_logger.level == logging.NOTSET:
            egglog_logger.setLevel(logging.WARNING)

        self._bindings = bindings
        self._egraph = bindings.EGraph()
        self._span = bindings.PanicSpan()
        self._literals: dict[int | str, Any] = {}
        self._roots = 0
        self._run(DATATYPE)

    def _run(self, text: str) -> list:
        return self._egraph.run_program(*self._egraph.parse_program(text))

    def _literal(self, value: int | str) -> Any:
        literal = self._literals.get(value)
        if literal is None:
            bindings = self._bindings
            raw = bindings.String(value) if isinstance(value, str) else bindings.Int(value)
            _, literal = self._egraph.eval_expr(bindings.Lit(self._span, raw))
            self._literals[value] = literal
        return literal

    def add_term(self, term: Term) -> Any:
        name = f"$root{self._roots}"
        self._roots += 1
        self._run(f"(let {name} {term_text(term)})")
        result = self.lookup(term)
        assert result is not None, f"egglog lost the term it was given: {to_sexpr(term)}"
        return result

    def find(self, eclass: Any) -> Any:
        return eclass  # lookup_function answers canonical values

    @property
    def node_count(self) -> int:
        output = self._run("(print-size)")[0]
        return sum(size for _, size in output.sizes)

    def saturate(self, rules: Iterable[Rewrite], limits: SaturationLimits | None = None) -> SaturationReport:
        limits = limits or SaturationLimits()
        start = time.perf_counter()
        self._run("\n".join(rule_text(rule) for rule in rules))
        reason, iteration, nodes = StopReason.ITERATION_LIMIT, 0, self.node_count
        while iteration < limits.iterations:
            iteration += 1
            report = self._run("(run 1)")[0].report
            previous, nodes = nodes, self.node_count
            if not report.updated:
                reason = StopReason.SATURATED
                break
            # An egglog iteration cannot be interrupted, so stop when the next one, growing like the
            # last, would pass the node limit (e-graphs of these rules grow about 3x per iteration).
            if nodes * nodes / max(previous, 1) > limits.nodes:
                reason = StopReason.NODE_LIMIT
                break
            if time.perf_counter() - start > limits.time_s:
                reason = StopReason.TIME_LIMIT
                break
        report = SaturationReport(self.backend, reason, iteration, nodes, None, time.perf_counter() - start)
        logger.debug("saturation: %s", report)
        return report

    def lookup_node(self, node: ENode) -> Any:
        op, parameter, *children = node
        key = [] if parameter is None else [self._literal(parameter)]
        return self._egraph.lookup_function(CONSTRUCTORS[op], key + children)

    def lookup(self, term: Term, memo: dict | None = None) -> Any:
        memo = {} if memo is None else memo
        if term in memo:
            return memo[term]
        children = []
        for arg in term.args:
            child = self.lookup(arg, memo)
            if child is None:
                memo[term] = None
                return None
            children.append(child)
        result = self.lookup_node((term.op, term.parameter, *children))
        memo[term] = result
        return result
