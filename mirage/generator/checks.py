"""How the search applies the pruning rule table (``mirage.generator.pruning``) at speed.

The table (:class:`~mirage.generator.pruning.PruningTable`) judges one
:class:`~mirage.generator.pruning.Candidate` at a time.  The search proposes millions of
candidates, so it applies the built-in rules where they are cheapest and gives the same verdicts:

* ``canonical_order`` is enforced by the enumeration itself (only ordered operand tuples are
  listed, by bisection); the count of tuples skipped is reported under the rule's name;
* ``shape``, ``single_exp``, ``identity_reduction`` and ``abstract_expression`` depend only on the
  op, its operand types and its term, so their verdict is memoized per op (``evaluate.py``);
* ``memory`` is a comparison of the state's memory with the budget;
* every other enabled rule of the table (rules users register with ``pruning_rule``) runs on a
  full :class:`Candidate` for each proposal, with ``prefix=None`` (the search does not build the
  prefix graph of a proposal).

The search adds its own checks, counted and switchable by name like the rules (:data:`SEARCH_CHECKS`).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from mirage.generator import pruning
from mirage.generator.abstract_expr import Term
from mirage.generator.pruning import RULES, Candidate, PruningContext, PruningTable, UnknownRuleError
from mirage.generator.pruning.rules import BUILT_IN_RULES, judge
from mirage.generator.space import SearchSpace, SearchSpaceError
from mirage.mugraph.graph import Level

#: Rules whose verdict depends only on the op, its operand types and its term (memoized per op).
MEMOIZED = ("shape", "single_exp", "identity_reduction", "abstract_expression")
#: Rules the search applies itself, in the table's terms.
STRUCTURAL = ("canonical_order", "memory")

#: The search's own checks (not in the pruning table), each counted under its name.
SEARCH_CHECKS = {
    "block_matmul_batch": "block-level matmuls need leading dims of 1 (as Mirage's)",
    "block_lookahead": "the block graph can still be closed within the block-op budget",
    "kernel_lookahead": "the kernel graph can still end with as many sinks as the reference has outputs",
    "input_maps": "every input iterator fits its tensor (tile divisibility)",
    "output_maps": "every output saver fits the grid",
    "scalar_chain": "a mul_scalar (add_scalar) does not take the result of another, through accumulators "
    "and savers, unless the reference applies two on one path (mirage.generator.scalars)",
    "commutative_operands": "with the complete canonical order, add and mul take their operands in "
    "increasing index order (the swapped op is the same op)",
    "output_expression": "a complete candidate is verified only if each of its output terms is in the "
    "e-class of a target (a heuristic filter in front of the verifier)",
}
_ALWAYS_ON = ("shape", "input_maps", "output_maps")


class SearchRules:
    """The rules in force for one search, split by how the search applies them."""

    def __init__(self, table: PruningTable, disabled_checks: Sequence[str] = ()) -> None:
        self.table = table
        self.context: PruningContext = table.context
        self.disabled_checks = frozenset(disabled_checks)
        enabled = set(table.enabled)
        self.memoized = tuple(table.rules[n] for n in MEMOIZED if n in enabled and n != "shape")
        self.extra = tuple(
            r for n, r in table.rules.items() if n in enabled and n not in MEMOIZED and n not in STRUCTURAL
        )
        # a rule judges the candidates of the levels it names only
        self.extra_at = {level: tuple(r for r in self.extra if level in r.levels) for level in Level}
        self.missing: tuple[str, ...] = ()  # rules a worker process could not register (__setstate__)
        self._roots: list | None = None  # e-classes of the targets (per process)

    def enabled(self, name: str) -> bool:
        if name in SEARCH_CHECKS:
            return name not in self.disabled_checks
        return self.table.is_enabled(name)

    def op_verdict(self, candidate: Candidate) -> str | None:
        """The memoizable rules: the name of the first that cuts ``candidate``, or ``None``."""
        for rule in self.memoized:
            if not judge(rule, candidate, self.context):
                return rule.name
        return None

    def extra_verdict(self, candidate: Candidate) -> str | None:
        for rule in self.extra_at[candidate.level]:
            if not judge(rule, candidate, self.context):
                return rule.name
        return None

    def require_registered(self) -> None:
        """Raise where this process (a worker) lacks some of the rules in force: never search with
        fewer rules than asked, or the results would depend on the workers."""
        if self.missing:
            raise SearchSpaceError(
                f"pruning rule(s) {list(self.missing)} are not registered in the search's worker processes: "
                "define rules at the top level of an importable module (not under "
                "`if __name__ == \"__main__\":`), or search with workers=1")

    @property
    def oracle_report(self) -> str:
        oracle = self.context.oracle
        return "abstract-expression pruning off" if oracle is None else getattr(oracle, "report", "")

    def outputs_match_target(self, terms: Sequence[Term]) -> bool:
        """Whether each term is in the e-class of some target (``True`` when that cannot be told)."""
        oracle = self.context.oracle
        if oracle is None or not self.enabled("output_expression") or not hasattr(oracle, "pairs"):
            return True
        if self._roots is None:
            graph = oracle.egraph  # type: ignore[attr-defined]
            self._roots = [graph.find(graph.lookup(t)) for t in oracle.targets]  # type: ignore[attr-defined]
        return all(any((root, 1) in oracle.pairs(term) for root in self._roots) for term in terms)

    def __getstate__(self) -> dict[str, Any]:
        # rules pickle by name: the table is rebuilt from the registry in the receiving process, which
        # imports the modules of the rules it lacks (a rule module imported after start-up)
        disabled = [name for name in self.table.rules if not self.table.is_enabled(name)]
        modules = {name: rule.predicate.__module__ for name, rule in self.table.rules.items()
                   if self.table.is_enabled(name)}
        return {"context": self.context, "disabled": disabled, "disabled_checks": self.disabled_checks,
                "modules": modules}

    def __setstate__(self, state: dict[str, Any]) -> None:
        modules = state.get("modules", {})
        for name, module in modules.items():
            if name not in RULES and module not in ("__main__", "__mp_main__"):
                importlib.import_module(module)
        # a rule the worker lacks is reported when the worker is asked to search (require_registered),
        # not raised here: an error while a worker process unpickles its start-up arguments can leave
        # it hanging, and the search with it
        missing = tuple(sorted(set(modules) - set(RULES)))
        disabled = [name for name in state["disabled"] if name in RULES]
        enabled = [name for name in modules if name in RULES]
        self.__init__(  # type: ignore[misc]
            PruningTable(state["context"], disabled=disabled, enabled=enabled), state["disabled_checks"]
        )
        self.missing = missing


def registered_rules(disabled: Sequence[str] = ()) -> list[str]:
    """The rules in force beyond the built-in ones (``name=module.function``), for the keys of the
    result cache and of checkpoints: a rule registered (or switched off) since a search was cached
    changes what the search finds and counts, so it is a different search."""
    disabled = set(disabled)
    return sorted(
        f"{name}={getattr(rule.predicate, '__module__', '?')}.{getattr(rule.predicate, '__qualname__', '?')}"
        for name, rule in RULES.items()
        if rule.enabled_by_default and name not in disabled and name not in BUILT_IN_RULES
    )


def make_rules(
    targets: Sequence[Term],
    space: SearchSpace,
    disabled: Sequence[str] = (),
    oracle_config: pruning.SubexpressionConfig | None = None,
) -> SearchRules:
    """The table of ``mirage.generator.pruning`` with ``disabled`` rules off, plus the search's checks."""
    disabled = tuple(disabled)
    forced = sorted(set(disabled) & set(_ALWAYS_ON))
    if forced:
        raise SearchSpaceError(f"{forced} cannot be switched off: they keep the µGraphs valid")
    checks = [n for n in disabled if n in SEARCH_CHECKS]
    rules = [n for n in disabled if n not in SEARCH_CHECKS]
    oracle = None
    if "abstract_expression" not in rules:
        oracle = pruning.subexpression_oracle(tuple(targets), oracle_config)
    context = PruningContext(
        oracle=oracle,
        shared_memory_bytes=space.shared_memory_bytes,
        device_memory_bytes=space.device_memory_bytes,
    )
    try:
        table = PruningTable(context, disabled=rules)
    except UnknownRuleError as error:
        raise SearchSpaceError(f"{error.args[0]}; the search's own checks: {sorted(SEARCH_CHECKS)}") from None
    return SearchRules(table, checks)
