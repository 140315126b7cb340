"""A small e-graph (union-find + hash-cons + deferred rebuild), saturated with the axiom table.

This is the default back end of the subexpression check (``egraph_subexpression.py``); the
``egglog`` back end (``egraph_egglog.py``) implements the same interface.  Both read the rules of
``egraph_rules.py`` and stop at explicit limits with a typed :class:`StopReason`.

An e-node is the tuple ``(op, parameter, child_class, ...)``.  Saturation follows egg: each
iteration searches every rule on the current e-graph, then applies all matches, then restores
congruence (``rebuild``).  After saturation the e-graph is only read: :meth:`EGraph.lookup` finds
the e-class of a term bottom-up through the hash-cons, or ``None`` if some node is not represented.

>>> from mirage.generator import abstract_expr as ae
>>> from mirage.generator.egraph_rules import AXIOMS
>>> x, y = ae.variable(0), ae.variable(1)
>>> graph = EGraph()
>>> root = graph.add_term(ae.mul(ae.add(x, y), x))
>>> graph.saturate(AXIOMS, SaturationLimits(iterations=10)).stop_reason.name
'SATURATED'
>>> graph.lookup(ae.add(ae.mul(x, x), ae.mul(y, x))) == graph.find(root)
True
>>> graph.lookup(ae.exp(x)) is None
True
"""

from __future__ import annotations

import enum
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mirage.generator.abstract_expr import Term, TermOp
from mirage.generator.egraph_rules import Pattern, PatternVariable, Rewrite, SizeVariable

logger = logging.getLogger(__name__)

ENode = tuple  # (op: TermOp, parameter, *child_class_ids)
Substitution = dict


class StopReason(enum.Enum):
    """Why saturation stopped."""

    SATURATED = "saturated"  # no rule adds anything: every rewrite of the target is represented
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    TIME_LIMIT = "time limit"


@dataclass(frozen=True)
class SaturationLimits:
    """Budgets of one saturation (Mirage's egg runner used 100 000 iterations and nodes, 10 s)."""

    iterations: int = 100
    nodes: int = 100_000
    time_s: float = 10.0
    #: egg's backoff scheduler (Python back end only): a rule that finds more matches than this in
    #: one iteration is skipped for a few iterations (the threshold and the pause double at every
    #: ban).  None, the default, applies every match, as egglog does, so both back ends build the
    #: same e-graph iteration by iteration.
    match_limit: int | None = None
    ban_length: int = 2


@dataclass(frozen=True)
class SaturationReport:
    """What a saturation did: why it stopped, how far it got and how long it took."""

    backend: str
    stop_reason: StopReason
    iterations: int
    nodes: int
    classes: int | None  # None where the back end does not count them
    seconds: float

    def __str__(self) -> str:
        return (
            f"{self.backend}: {self.stop_reason.value} after {self.iterations} iterations, "
            f"{self.nodes} e-nodes"
            + ("" if self.classes is None else f" in {self.classes} e-classes")
            + f", {self.seconds * 1e3:.1f} ms"
        )


class _Budget(Exception):
    def __init__(self, reason: StopReason) -> None:
        self.reason = reason


class EGraph:
    """An e-graph over abstract-expression e-nodes."""

    backend = "python"

    def __init__(self) -> None:
        self._parent: list[int] = []
        self._hashcons: dict[ENode, int] = {}
        self._uses: list[list[tuple[ENode, int]]] = []
        self._pending: list[int] = []

    # -- union-find and hash-cons -----------------------------------------------------------------

    def find(self, eclass: int) -> int:
        parent = self._parent
        root = eclass
        while parent[root] != root:
            root = parent[root]
        while parent[eclass] != root:
            parent[eclass], eclass = root, parent[eclass]
        return root

    def _canonical(self, node: ENode) -> ENode:
        if len(node) == 2:
            return node
        find = self.find
        return (node[0], node[1], *(find(c) for c in node[2:]))

    def add_node(self, node: ENode) -> int:
        node = self._canonical(node)
        eclass = self._hashcons.get(node)
        if eclass is not None:
            return self.find(eclass)
        eclass = len(self._parent)
        self._parent.append(eclass)
        self._uses.append([])
        self._hashcons[node] = eclass
        for child in node[2:]:
            self._uses[child].append((node, eclass))
        return eclass

    def add_term(self, term: Term) -> int:
        """Add every node of ``term``; return the e-class of its root."""
        classes: dict[Term, int] = {}
        for node in term.subterms():
            classes[node] = self.add_node((node.op, node.parameter, *(classes[a] for a in node.args)))
        return classes[term]

    def union(self, a: int, b: int) -> bool:
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        if len(self._uses[a]) < len(self._uses[b]):
            a, b = b, a
        self._parent[b] = a
        self._uses[a].extend(self._uses[b])
        self._uses[b] = []
        self._pending.append(a)
        return True

    def rebuild(self) -> None:
        """Restore the congruence invariant after unions (egg's deferred rebuild)."""
        while self._pending:
            todo = {self.find(c) for c in self._pending}
            self._pending = []
            for eclass in todo:
                self._repair(eclass)

    def _repair(self, eclass: int) -> None:
        uses = self._uses[eclass]
        self._uses[eclass] = []
        for node, _ in uses:
            self._hashcons.pop(node, None)
        merged: dict[ENode, int] = {}
        for node, user in uses:
            canonical = self._canonical(node)
            other = merged.get(canonical)
            if other is not None:
                self.union(user, other)
            merged[canonical] = self.find(user)
        for canonical, user in merged.items():
            self._hashcons[canonical] = self.find(user)
        self._uses[self.find(eclass)].extend(merged.items())

    def _compact(self) -> None:
        """Re-key the hash-cons by canonical e-nodes, dropping stale keys (so it lists each e-node once)."""
        while True:
            fresh: dict[ENode, int] = {}
            for node, eclass in self._hashcons.items():
                canonical, eclass = self._canonical(node), self.find(eclass)
                other = fresh.get(canonical)
                if other is not None and other != eclass:
                    self.union(other, eclass)
                fresh[canonical] = eclass
            self._hashcons = fresh
            if not self._pending:
                return
            self.rebuild()

    @property
    def node_count(self) -> int:
        return len(self._hashcons)

    @property
    def class_count(self) -> int:
        return sum(1 for c, p in enumerate(self._parent) if c == p)

    # -- queries ----------------------------------------------------------------------------------

    def lookup_node(self, node: ENode) -> int | None:
        eclass = self._hashcons.get(self._canonical(node))
        return None if eclass is None else self.find(eclass)

    def lookup(self, term: Term, memo: dict[Term, int | None] | None = None) -> int | None:
        """The e-class representing ``term``, or ``None`` if one of its nodes is not represented."""
        memo = {} if memo is None else memo
        found = memo.get(term, -1)
        if found != -1:
            return found
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

    # -- e-matching and saturation ----------------------------------------------------------------

    def _index(self) -> dict[TermOp, dict[int, list[ENode]]]:
        """For each operator, the e-nodes of each e-class with that operator."""
        self._compact()
        index: dict[TermOp, dict[int, list[ENode]]] = defaultdict(lambda: defaultdict(list))
        for node, eclass in self._hashcons.items():
            index[node[0]][eclass].append(node)
        return index

    def _match(self, index, pattern: Pattern, eclass: int, subst: Substitution) -> Iterator[Substitution]:
        if isinstance(pattern, PatternVariable):
            bound = subst.get(pattern)
            if bound is None:
                yield {**subst, pattern: eclass}
            elif bound == eclass:
                yield subst
            return
        for node in index.get(pattern.op, {}).get(eclass, ()):
            current = subst
            parameter = pattern.parameter
            if isinstance(parameter, SizeVariable):
                bound = current.get(parameter)
                if bound is None:
                    current = {**current, parameter: node[1]}
                elif bound != node[1]:
                    continue
            elif parameter != node[1]:
                continue
            yield from self._match_args(index, pattern.args, node, 0, current)

    def _match_args(self, index, args, node: ENode, position: int, subst: Substitution):
        if position == len(args):
            yield subst
            return
        for extended in self._match(index, args[position], node[2 + position], subst):
            yield from self._match_args(index, args, node, position + 1, extended)

    def _canonical_substitution(self, subst: Substitution) -> Iterator[tuple]:
        for variable, value in subst.items():
            yield (variable, value if isinstance(variable, SizeVariable) else self.find(value))

    def _instantiate(self, pattern: Pattern, subst: Substitution) -> int:
        if isinstance(pattern, PatternVariable):
            return subst[pattern]
        parameter = pattern.parameter
        if isinstance(parameter, SizeVariable):
            parameter = subst[parameter]
        children = [self._instantiate(arg, subst) for arg in pattern.args]
        return self.add_node((pattern.op, parameter, *children))

    def saturate(self, rules: Iterable[Rewrite], limits: SaturationLimits | None = None) -> SaturationReport:
        """Apply ``rules`` until nothing changes or a limit is hit; return a :class:`SaturationReport`."""
        limits = limits or SaturationLimits()
        directions = [d for rule in rules for d in rule.directions()]
        start = time.perf_counter()
        deadline = start + limits.time_s
        banned_until = {name: 0 for name, _, _ in directions}
        applied: set[tuple] = set()
        times_banned = dict.fromkeys(banned_until, 0)
        reason, iteration = StopReason.ITERATION_LIMIT, 0
        try:
            while iteration < limits.iterations:
                iteration += 1
                index = self._index()
                matches: list[tuple[str, Pattern, int, Substitution]] = []
                any_banned = False
                for name, lhs, rhs in directions:
                    if banned_until[name] > iteration:
                        any_banned = True
                        continue
                    threshold = (
                        1 << 62 if limits.match_limit is None else limits.match_limit << times_banned[name]
                    )
                    found = self._search(index, lhs, threshold, deadline)
                    if len(found) > threshold:
                        times_banned[name] += 1
                        banned_until[name] = iteration + (limits.ban_length << times_banned[name])
                        any_banned = True
                        continue
                    matches.extend((name, rhs, eclass, subst) for eclass, subst in found)
                changed = False
                for count, (name, rhs, eclass, subst) in enumerate(matches):
                    # A match applied before, on the same (canonical) classes, adds nothing new.
                    key = (name, self.find(eclass), *self._canonical_substitution(subst))
                    if key in applied:
                        continue
                    applied.add(key)
                    changed |= self.union(eclass, self._instantiate(rhs, subst))
                    if count % 512 == 0:
                        self._check(limits, deadline)
                self.rebuild()
                self._check(limits, deadline)
                if not changed and not any_banned:
                    reason = StopReason.SATURATED
                    break
        except _Budget as budget:
            reason = budget.reason
            self.rebuild()
        self._compact()
        report = SaturationReport(
            self.backend, reason, iteration, self.node_count, self.class_count, time.perf_counter() - start
        )
        logger.debug("saturation: %s", report)
        return report

    def _search(self, index, lhs: Pattern, threshold: int, deadline: float) -> list[tuple[int, Substitution]]:
        found: list[tuple[int, Substitution]] = []
        assert not isinstance(lhs, PatternVariable), "a rule's left side must be an operator pattern"
        for eclass in list(index.get(lhs.op, {})):
            for subst in self._match(index, lhs, eclass, {}):
                found.append((eclass, subst))
                if len(found) > threshold:
                    return found
            if time.perf_counter() > deadline:
                raise _Budget(StopReason.TIME_LIMIT)
        return found

    def _check(self, limits: SaturationLimits, deadline: float) -> None:
        if self.node_count > limits.nodes:
            raise _Budget(StopReason.NODE_LIMIT)
        if time.perf_counter() > deadline:
            raise _Budget(StopReason.TIME_LIMIT)
