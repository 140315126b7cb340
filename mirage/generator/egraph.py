"""A small e-graph (union-find + hash-cons + deferred rebuild), saturated with the axiom table.

This is the default back end of the subexpression check (``egraph_subexpression.py``); the
``egglog`` back end (``egraph_egglog.py``) implements the same interface.  Both read the rules of
``egraph_rules.py`` and stop at explicit limits with a typed :class:`StopReason`.

An e-node is the tuple ``(op, parameter, child_class, ...)``.  Saturation follows egg: each
iteration searches every rule on the current e-graph, then applies all matches, then restores
congruence (``rebuild``).  After saturation the e-graph is only read: :meth:`EGraph.lookup` finds
the e-class of a term bottom-up through the hash-cons, or ``None`` if some node is not represented.

Saturating a LayerNorm's target applies hundreds of thousands of matches.  To do it in about a
second, each rule compiles to Python functions (see :func:`_compile_search`), and each search after
the first is *semi-naive*, as in egglog: it only looks for matches with an e-node new since the
previous search (the others were applied then).  Each iteration still ends with the e-graph of a
full search (up to the numbering of e-classes).

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
import functools
import gc
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mirage.generator.abstract_expr import Term, TermOp
from mirage.generator.egraph_rules import Pattern, PatternNode, PatternVariable, Rewrite, SizeVariable

logger = logging.getLogger(__name__)

ENode = tuple  # (op: TermOp, parameter, *child_class_ids)


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
        parent = self._parent
        for child in node[2:]:
            if parent[child] != child:
                find = self.find
                return (node[0], node[1], *[find(c) for c in node[2:]])
        return node

    def add_node(self, node: ENode) -> int:
        return self._add(self._canonical(node))

    def _add(self, node: ENode) -> int:
        """``add_node`` of a node whose children are canonical."""
        eclass = self._hashcons.get(node)
        if eclass is not None:
            return eclass if self._parent[eclass] == eclass else self.find(eclass)
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
        uses, hashcons, find, canonical_of = self._uses[eclass], self._hashcons, self.find, self._canonical
        self._uses[eclass] = []
        for node, _ in uses:
            hashcons.pop(node, None)
        merged: dict[ENode, int] = {}
        for node, user in uses:
            canonical = canonical_of(node)
            other = merged.get(canonical)
            if other is not None:
                self.union(user, other)
            merged[canonical] = find(user)
        for canonical, user in merged.items():
            hashcons[canonical] = find(user)
        self._uses[find(eclass)].extend(merged.items())

    def _compact(self) -> None:
        """Re-key the hash-cons by canonical e-nodes, dropping stale keys (so it lists each e-node once)."""
        while True:
            fresh: dict[ENode, int] = {}
            canonical_of, find = self._canonical, self.find
            for node, eclass in self._hashcons.items():
                canonical, eclass = canonical_of(node), find(eclass)
                other = fresh.setdefault(canonical, eclass)
                if other != eclass:
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

    def _index(self, previous: dict[ENode, int] | None) -> _Index:
        """Per operator and e-class, its e-nodes with that operator, each with a flag: new since
        ``previous`` (the hash-cons at the last search; ``None``: all are new); and the new ones."""
        self._compact()
        index: _Index = {op: {} for op in TermOp}
        for node, eclass in self._hashcons.items():
            new = previous is None or previous.get(node) != eclass
            nodes = index[node[0]].setdefault(eclass, ([], []))
            nodes[0].append((node, new))
            if new:
                nodes[1].append((node, new))
        return index

    def _fresh(self, index: _Index, height: int) -> list[set[int]]:
        """``fresh[h]``: the e-classes at most ``h - 1`` levels above a new e-node, the only ones
        where a pattern of height ``h`` may match one."""
        fresh = [set(), {c for by_class in index.values() for c, (_, new) in by_class.items() if new}]
        while len(fresh) <= height:
            below = fresh[-1]
            fresh.append(below | {c for n, c in self._hashcons.items() if any(a in below for a in n[2:])})
        return fresh

    def saturate(self, rules: Iterable[Rewrite], limits: SaturationLimits | None = None) -> SaturationReport:
        """Apply ``rules`` until nothing changes or a limit is hit; return a :class:`SaturationReport`."""
        limits = limits or SaturationLimits()
        compiled = [_Rule.compile(name, lhs, rhs) for rule in rules for name, lhs, rhs in rule.directions()]
        height = max((rule.height for rule in compiled), default=1)
        start = time.perf_counter()
        deadline = start + limits.time_s
        banned_until = {rule.name: 0 for rule in compiled}
        applied: set[tuple] = set()
        times_banned = dict.fromkeys(banned_until, 0)
        reason, iteration = StopReason.ITERATION_LIMIT, 0
        # Semi-naive search: a match whose e-nodes were all in the same e-classes at the previous
        # search was found then, and applied (or skipped, as applied before): its key, with the same
        # canonical classes, is in ``applied``.  Not with a match limit, whose bans count old matches.
        previous: dict[ENode, int] | None = None
        # Saturation allocates millions of tuples and no reference cycles: without this pause, the
        # cyclic collector walks the whole heap (torch's, in a search) again and again.
        collecting = gc.isenabled()
        gc.disable()
        try:
            while iteration < limits.iterations:
                iteration += 1
                index = self._index(previous)
                fresh = None if previous is None else self._fresh(index, height)
                if limits.match_limit is None:
                    previous = dict(self._hashcons)
                matches: list[tuple[_Rule, list[tuple[int, tuple]]]] = []
                any_banned = False
                for rule in compiled:
                    name = rule.name
                    if banned_until[name] > iteration:
                        any_banned = True
                        continue
                    threshold = (
                        1 << 62 if limits.match_limit is None else limits.match_limit << times_banned[name]
                    )
                    found = rule.search(index, fresh, [], threshold, deadline)
                    if len(found) > threshold:
                        times_banned[name] += 1
                        banned_until[name] = iteration + (limits.ban_length << times_banned[name])
                        any_banned = True
                        continue
                    matches.append((rule, found))
                changed = self._apply(matches, applied, limits, deadline)
                self.rebuild()
                self._check(limits, deadline)
                if not changed and not any_banned:
                    reason = StopReason.SATURATED
                    break
        except _Budget as budget:
            reason = budget.reason
            self.rebuild()
        finally:
            if collecting:
                gc.enable()
        self._compact()
        report = SaturationReport(
            self.backend, reason, iteration, self.node_count, self.class_count, time.perf_counter() - start
        )
        logger.debug("saturation: %s", report)
        return report

    def _apply(self, matches: list, applied: set, limits: SaturationLimits, deadline: float) -> bool:
        """Union each match's e-class with its instantiated right side; whether anything merged."""
        find, parent, union, add = self.find, self._parent, self.union, self._add
        changed, count = False, 0
        for rule, found in matches:
            key, instantiate, is_class = rule.key, rule.instantiate, rule.is_class
            for eclass, values in found:
                pairs = zip(values, is_class, strict=True)
                values = tuple([find(v) if c and parent[v] != v else v for v, c in pairs])
                # A match applied before, on the same (canonical) classes, adds nothing new.
                before, eclass = len(applied), find(eclass)
                applied.add((key, eclass, values))
                if len(applied) > before:
                    result = instantiate(add, *values)  # canonical, as ``eclass``: adding merges nothing
                    if result != eclass:
                        union(eclass, result)
                        changed = True
                count += 1
                if count % 512 == 1:
                    self._check(limits, deadline)
        return changed

    def _check(self, limits: SaturationLimits, deadline: float) -> None:
        if self.node_count > limits.nodes:
            raise _Budget(StopReason.NODE_LIMIT)
        if time.perf_counter() > deadline:
            raise _Budget(StopReason.TIME_LIMIT)


_Index = dict[TermOp, dict[int, tuple[list[tuple[ENode, bool]], list[tuple[ENode, bool]]]]]
_Slots = dict[PatternVariable | SizeVariable, int]  # a variable's position in the values of a match


@dataclass(frozen=True)
class _Rule:
    """One direction of a rewrite, compiled to Python functions of the values of a match."""

    name: str
    search: Callable[..., list[tuple[int, tuple]]]  # see _compile_search
    instantiate: Callable[..., int]  # see _compile_rhs
    height: int  # of the left side
    key: str  # the name and the variables in slot order: the start of an ``applied`` key
    is_class: tuple[bool, ...]  # per slot: an e-class (canonicalised), or a size

    @staticmethod
    @functools.cache
    def compile(name: str, lhs: Pattern, rhs: Pattern) -> _Rule:
        assert isinstance(lhs, PatternNode), "a rule's left side must be an operator pattern"
        slots: _Slots = {}
        search = _compile_search(name, lhs, slots)  # numbers the slots
        instantiate = _compile_rhs(name, rhs, slots)
        is_class = tuple(isinstance(v, PatternVariable) for v in slots)
        return _Rule(name, search, instantiate, _height(lhs), " ".join([name, *map(str, slots)]), is_class)


def _height(pattern: Pattern) -> int:
    return 0 if isinstance(pattern, PatternVariable) else 1 + max(map(_height, pattern.args), default=0)


def _compile_search(name: str, lhs: PatternNode, slots: _Slots) -> Callable[..., list[tuple[int, tuple]]]:
    """Compile ``lhs`` to ``search(index, fresh, out, threshold, deadline)``: nested loops over the
    index, one per operator pattern in the order of egg's recursive matcher, that append
    ``(e-class, values)`` per match to ``out``, e-class by e-class (stopping past ``threshold``).

    With ``fresh`` (see :meth:`EGraph._fresh`), only matches with a new e-node are wanted: a loop
    runs over the new e-nodes of its e-class alone when nothing in the rest of the pattern may match
    a new one.  Given all e-nodes as new, the loops find every match."""
    env: dict = dict(EMPTY=((), ()), perf_counter=time.perf_counter, _Budget=_Budget, StopReason=StopReason)
    ops: dict[TermOp, str] = {lhs.op: "by_op0"}  # the local name of each operator's part of the index
    body = [
        f"    roots = None if fresh is None else fresh[{_height(lhs)}]",
        "    for root in by_op0:",
        "        if roots is not None and root not in roots: continue  # every match here is old",
    ]

    def bind(variable: PatternVariable | SizeVariable, value: str, indent: str) -> None:
        # A variable bound before must match the same value (nonlinear patterns, like distribute).
        # Slots are numbered in the order the loops bind them.
        if variable in slots:
            body.append(f"{indent}if {value} != v{slots[variable]}: continue")
        else:
            body.append(f"{indent}v{slots.setdefault(variable, len(slots))} = {value}")

    def match(pending: list[tuple[Pattern, str]], flags: list[str], indent: str) -> None:
        """Emit the loops that match each ``(pattern, e-class expression)`` of ``pending``."""
        if not pending:
            values = "".join(f"v{slot}, " for slot in range(len(slots)))
            body.append(f"{indent}if {' or '.join(flags)}: out.append((root, ({values})))")
            return
        (pattern, where), rest = pending[0], pending[1:]
        if isinstance(pattern, PatternVariable):
            bind(pattern, where, indent)
            return match(rest, flags, indent)
        node, flag = f"n{len(flags)}", f"f{len(flags)}"
        conditions = flags + [f"{w} in fresh[{_height(p)}]" for p, w in rest if isinstance(p, PatternNode)]
        which = f"0 if {' or '.join(conditions)} else 1" if conditions else "1"
        which = "0" if _height(pattern) > 1 else which  # the children may match new e-nodes
        by_op = ops.setdefault(pattern.op, f"by_op{len(ops)}")
        body.append(f"{indent}for {node}, {flag} in {by_op}.get({where}, EMPTY)[{which}]:")
        indent += "    "
        if isinstance(pattern.parameter, SizeVariable):
            bind(pattern.parameter, f"{node}[1]", indent)
        else:
            body.append(f"{indent}if {node}[1] != {_constant(env, pattern.parameter)}: continue")
        children = [(arg, f"{node}[{2 + position}]") for position, arg in enumerate(pattern.args)]
        match(children + rest, flags + [flag], indent)

    match([(lhs, "root")], [], " " * 8)
    body += [
        "        if len(out) > threshold: return out",
        "        if perf_counter() > deadline: raise _Budget(StopReason.TIME_LIMIT)",
        "    return out",
    ]
    header = [f"    {local} = index[{_constant(env, op)}]" for op, local in ops.items()]
    return _define(env, name, "search(index, fresh, out, threshold, deadline)", header + body)


def _compile_rhs(name: str, rhs: Pattern, slots: _Slots) -> Callable[..., int]:
    """Compile ``rhs`` to ``instantiate(add, *values)``: add its e-nodes, children first, for the
    canonical values of a match; return its e-class."""
    env: dict = {}
    body: list[str] = []

    def emit(pattern: Pattern) -> str:
        if isinstance(pattern, PatternVariable):
            return f"v{slots[pattern]}"  # KeyError: a variable the left side does not bind
        p = pattern.parameter
        parameter = f"v{slots[p]}" if isinstance(p, SizeVariable) else _constant(env, p)
        children = "".join(f"{emit(arg)}, " for arg in pattern.args)
        body.append(f"    r{len(body)} = add(({_constant(env, pattern.op)}, {parameter}, {children}))")
        return f"r{len(body) - 1}"

    result = emit(rhs)
    signature = f"instantiate(add, {''.join(f'v{slot}, ' for slot in range(len(slots)))})"
    return _define(env, name, signature, [*body, f"    return {result}"])


def _constant(env: dict, value: object) -> str:  # its name in the namespace of generated code
    env[f"k{len(env)}"] = value
    return f"k{len(env) - 1}"


def _define(env: dict, rule: str, signature: str, body: list[str]) -> Callable:
    exec(compile("\n".join([f"def {signature}:", *body]), f"<{rule}>", "exec"), env)
    return env[signature.split("(")[0]]
