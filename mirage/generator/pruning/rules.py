"""Pruning rules: a table of named predicates over candidates, each switchable and counted.

A rule is a row (:class:`PruningRule`): a name, a one-line statement, the levels it applies to and
a predicate ``(candidate, context) -> bool`` that is ``True`` when the candidate may be kept.
:class:`PruningTable` runs the enabled rules in table order; the first rule that rejects a
candidate cuts it, and :class:`PruningStats` records, per rule, how many candidates it judged, how
many it cut and the time it spent.

Registering a rule is a decorator on its predicate (``docs/pruning.md`` has a worked example):

>>> from mirage.generator.abstract_expr import TermOp
>>> from mirage.mugraph.ops import Op
>>> mine = {}
>>> @pruning_rule("no_exp_of_exp", "exp is never applied to an exp", registry=mine)
... def no_exp_of_exp(candidate, context):
...     return not (candidate.op is Op.EXP and candidate.term is not None
...                 and candidate.term.args[0].op is TermOp.EXP)
>>> mine["no_exp_of_exp"].predicate is no_exp_of_exp, mine["no_exp_of_exp"].enabled_by_default
(True, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mirage.errors import MirageError
from mirage.generator.abstract_expr import Term
from mirage.generator.pruning.candidate import Candidate
from mirage.mugraph.graph import Level
from mirage.mugraph.ops import Op

Predicate = Callable[[Candidate, "PruningContext"], bool]
BOTH_LEVELS = frozenset({Level.KERNEL, Level.BLOCK})


class UnknownRuleError(MirageError, KeyError):
    """A rule name that no registered rule has."""


class PruningRuleError(MirageError):
    """A rule's predicate raised: ``rule`` names it, the original exception is the cause."""

    def __init__(self, rule: str, candidate: Candidate, error: BaseException) -> None:
        self.rule = rule
        operands = ", ".join(str(t.shape) for t in candidate.input_types)
        super().__init__(
            f"pruning rule {rule!r} raised {type(error).__name__}: {error} (judging {candidate.op.value} "
            f"at the {candidate.level.value} level on operands of shapes {operands or 'none'}); fix the "
            f"rule, or switch it off with disabled_rules=[{rule!r}]")


def judge(rule: PruningRule, candidate: Candidate, context: PruningContext) -> bool:
    """``rule``'s verdict on ``candidate`` (True: kept); an exception it raises becomes a
    :class:`PruningRuleError` that names it."""
    try:
        return bool(rule.predicate(candidate, context))
    except Exception as error:
        raise PruningRuleError(rule.name, candidate, error) from error


@dataclass(frozen=True)
class PruningRule:
    """One row of the table: ``predicate(candidate, context)`` is True when the candidate is kept."""

    name: str
    statement: str
    predicate: Predicate
    levels: frozenset[Level] = BOTH_LEVELS
    enabled_by_default: bool = True


class SubexpressionOracle(Protocol):
    """What the abstract-expression rule asks (``SubexpressionCheck`` implements it)."""

    def contains(self, term: Term) -> bool: ...


@dataclass(frozen=True)
class PruningContext:
    """What rules may consult besides the candidate: the target check and the memory budgets."""

    oracle: SubexpressionOracle | None = None  # None: the abstract-expression rule keeps everything
    shared_memory_bytes: int = 96 * 1024  # Mirage's MAX_SMEM_SIZE during search
    device_memory_bytes: int = 2 << 30  # Mirage's MAX_DMEM_SIZE (offset accounting)
    max_exps_on_a_path: int = 1  # the LAX fragment allows one


#: The default registry: rule name -> row, in the order the table runs them (cheap rules first).
RULES: dict[str, PruningRule] = {}


def pruning_rule(
    name: str,
    statement: str,
    *,
    levels: Iterable[Level] = BOTH_LEVELS,
    enabled: bool = True,
    registry: dict[str, PruningRule] | None = None,
) -> Callable[[Predicate], Predicate]:
    """Decorator: register ``predicate`` as a rule called ``name`` (appended to the table).

    The function itself is returned unchanged, so it stays importable by name and tables that
    hold it pickle (parallel searches send their table to worker processes).
    """
    target = RULES if registry is None else registry

    def register(predicate: Predicate) -> Predicate:
        if name in target:
            raise ValueError(f"a pruning rule named {name!r} is already registered; pick another name")
        rule = PruningRule(name, statement, predicate, frozenset(levels), enabled)
        target[name] = rule
        return predicate

    return register


# ---- the built-in rules (mirage-notes §4.1-4.4) --------------------------------------------------


@pruning_rule("canonical_order", "ops are added in strictly increasing (operands, op rank) order")
def canonical_order(candidate: Candidate, context: PruningContext) -> bool:
    return candidate.order > candidate.last_order


@pruning_rule("shape", "the op's shape rule accepts the operands (shape, dtype, for-loop flag)")
def shape(candidate: Candidate, context: PruningContext) -> bool:
    return candidate.output_types is not None


@pruning_rule("single_exp", "no input-to-output path goes through more than one exp (LAX)")
def single_exp(candidate: Candidate, context: PruningContext) -> bool:
    return candidate.term is None or candidate.term.exp_depth <= context.max_exps_on_a_path


@pruning_rule("identity_reduction", "no reduction over a dim that already has its result's extent")
def identity_reduction(candidate: Candidate, context: PruningContext) -> bool:
    # sum or max over one element, or a strided sum down to the extent the dim already has: the op
    # returns its operand, so the µGraph without it computes the same and is searched instead
    if candidate.op not in (Op.REDUCTION, Op.REDUCTION_MAX, Op.REDUCTION_TO_DIMX):
        return True
    shape, dim = candidate.input_types[0].shape, candidate.attrs.dim
    if not -len(shape) <= dim < len(shape):
        return True  # the shape rule's to judge
    return shape[dim] != (candidate.reduction_dimx if candidate.op is Op.REDUCTION_TO_DIMX else 1)


def identity_reductions(graph) -> list[str]:
    """Where a µGraph (a ``KernelGraph``) has reductions that ``identity_reduction`` cuts, as
    ``"%k"`` (kernel level) or ``"%k/%b"`` (node b of the block graph of kernel node k)."""
    found = []
    levels = [("", graph)] + [(f"%{k}/", n.attrs) for k, n in enumerate(graph.nodes)
                              if getattr(n.attrs, "level", None) is Level.BLOCK]
    for where, level in levels:
        for i, node in enumerate(level.nodes):
            candidate = Candidate(level.level, node.op, node.attrs, (), level.operand_types(node), None, 0,
                                  reduction_dimx=getattr(level, "reduction_dimx", 64))
            if node.inputs and not identity_reduction(candidate, PruningContext()):
                found.append(f"{where}%{i}")
    return found


@pruning_rule("memory", "the tensors fit in shared memory (block) or device memory (kernel)")
def memory(candidate: Candidate, context: PruningContext) -> bool:
    limit = context.shared_memory_bytes if candidate.level is Level.BLOCK else context.device_memory_bytes
    return candidate.memory_bytes <= limit


@pruning_rule("abstract_expression", "the op's abstract expression is a subexpression of the target's")
def abstract_expression(candidate: Candidate, context: PruningContext) -> bool:
    if context.oracle is None or candidate.term is None:
        return True
    return context.oracle.contains(candidate.term)


#: The rules that ship with the table, in table order (whatever registers rules later comes after).
BUILT_IN_RULES: tuple[str, ...] = tuple(RULES)


# ---- the table -------------------------------------------------------------------------------------


@dataclass
class RuleStats:
    checked: int = 0  # candidates this rule judged
    cut: int = 0  # candidates it rejected
    seconds: float = 0.0


@dataclass
class PruningStats:
    """Per-rule counters of a table (merge the stats of parallel workers with ``+``)."""

    rules: dict[str, RuleStats] = field(default_factory=dict)
    candidates: int = 0
    kept: int = 0

    def __add__(self, other: PruningStats) -> PruningStats:
        merged = PruningStats(candidates=self.candidates + other.candidates, kept=self.kept + other.kept)
        for name in {**self.rules, **other.rules}:
            a, b = self.rules.get(name, RuleStats()), other.rules.get(name, RuleStats())
            merged.rules[name] = RuleStats(a.checked + b.checked, a.cut + b.cut, a.seconds + b.seconds)
        return merged

    @property
    def cut(self) -> dict[str, int]:
        return {name: s.cut for name, s in self.rules.items()}

    def to_dict(self) -> dict:
        return {
            "candidates": self.candidates,
            "kept": self.kept,
            "rules": {n: vars(s).copy() for n, s in self.rules.items()},
        }

    def __str__(self) -> str:
        lines = [f"{self.candidates} candidates, {self.kept} kept"]
        for name, s in self.rules.items():
            lines.append(f"  {name:<24} judged {s.checked:>9}  cut {s.cut:>9}  {s.seconds * 1e3:9.1f} ms")
        return "\n".join(lines)


class PruningTable:
    """The rules in force for one search.  ``check(candidate)`` is the verdict: the name of the rule
    that cuts the candidate, or ``None`` if every enabled rule keeps it."""

    def __init__(
        self,
        context: PruningContext | None = None,
        *,
        disabled: Sequence[str] = (),
        enabled: Sequence[str] = (),
        rules: Mapping[str, PruningRule] | None = None,
    ) -> None:
        self.context = context or PruningContext()
        self.rules: dict[str, PruningRule] = dict(RULES if rules is None else rules)
        unknown = sorted((set(disabled) | set(enabled)) - set(self.rules))
        if unknown:
            raise UnknownRuleError(f"unknown pruning rule(s) {unknown}; known rules: {list(self.rules)}")
        self._enabled = {n for n, r in self.rules.items() if r.enabled_by_default}
        self._enabled = (self._enabled | set(enabled)) - set(disabled)
        self.stats = PruningStats(rules={name: RuleStats() for name in self.rules})
        self._by_level: dict[Level, tuple[PruningRule, ...]] = {}
        self._refresh()

    def _refresh(self) -> None:
        self._by_level = {
            level: tuple(r for n, r in self.rules.items() if n in self._enabled and level in r.levels)
            for level in Level
        }

    def enable(self, name: str, on: bool = True) -> None:
        """Switch one rule on (or off with ``on=False``)."""
        if name not in self.rules:
            raise UnknownRuleError(f"unknown pruning rule {name!r}; known rules: {list(self.rules)}")
        self._enabled = self._enabled | {name} if on else self._enabled - {name}
        self._refresh()

    def disable(self, name: str) -> None:
        self.enable(name, on=False)

    def is_enabled(self, name: str) -> bool:
        return name in self._enabled

    @property
    def enabled(self) -> list[str]:
        return [n for n in self.rules if n in self._enabled]

    def check(self, candidate: Candidate) -> str | None:
        stats = self.stats
        stats.candidates += 1
        context = self.context
        for rule in self._by_level[candidate.level]:
            counters = stats.rules[rule.name]
            start = time.perf_counter()
            keep = judge(rule, candidate, context)
            counters.seconds += time.perf_counter() - start
            counters.checked += 1
            if not keep:
                counters.cut += 1
                return rule.name
        stats.kept += 1
        return None

    def describe(self) -> str:
        """One line per rule: on/off, name, levels and statement."""
        return "\n".join(
            f"[{'on ' if n in self._enabled else 'off'}] {n:<22} "
            f"{'/'.join(sorted(level.value for level in r.levels)):<13} {r.statement}"
            for n, r in self.rules.items()
        )


__all__ = [
    "BOTH_LEVELS",
    "BUILT_IN_RULES",
    "PruningContext",
    "PruningRule",
    "PruningRuleError",
    "PruningStats",
    "PruningTable",
    "RULES",
    "RuleStats",
    "UnknownRuleError",
    "judge",
    "pruning_rule",
]
