"""A tiny constraint language for the layout model, with a z3 back end and a brute-force evaluator.

The layout model is data: a list of :class:`Rule` rows, each a named hard constraint or a named cost
paid when its condition holds.  Conditions are built from typed constructors (:class:`Is`,
:class:`Same`, :class:`Flag`, :class:`Not`, :class:`All`, :class:`Any_`, :class:`Implies`) over
categorical variables (an int in a finite domain) and boolean flags.  :func:`solve` minimises the
total cost exactly with z3's ``Optimize``; :func:`evaluate` computes the cost of one assignment, so
tests can check the optimum against brute force on small models.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mirage.optimizer.errors import LayoutError


@dataclass(frozen=True)
class Choice:
    """A categorical variable: one value of ``domain``."""

    name: str
    domain: tuple[int, ...]


@dataclass(frozen=True)
class Is:
    var: Choice
    value: int


@dataclass(frozen=True)
class Same:
    a: Choice
    b: Choice


@dataclass(frozen=True)
class Flag:
    name: str


@dataclass(frozen=True)
class Not:
    term: Condition


@dataclass(frozen=True)
class All:
    terms: tuple[Condition, ...]


@dataclass(frozen=True)
class Any_:
    terms: tuple[Condition, ...]


@dataclass(frozen=True)
class Implies:
    premise: Condition
    conclusion: Condition


Condition = Is | Same | Flag | Not | All | Any_ | Implies


@dataclass(frozen=True)
class Rule:
    """A named row of the model: a hard constraint (``cost is None``) or a cost paid when ``when``."""

    name: str  # the rule (a cost name of LayoutCosts, or a constraint name)
    subject: str  # what it is about, for reports ("kernel %3, %5 matmul operand 0")
    when: Condition
    cost: int | None = None


Assignment = dict[str, int | bool]


def holds(c: Condition, values: Assignment) -> bool:
    match c:
        case Is(var, value):
            return values[var.name] == value
        case Same(a, b):
            return values[a.name] == values[b.name]
        case Flag(name):
            return bool(values[name])
        case Not(term):
            return not holds(term, values)
        case All(terms):
            return all(holds(t, values) for t in terms)
        case Any_(terms):
            return any(holds(t, values) for t in terms)
        case Implies(premise, conclusion):
            return not holds(premise, values) or holds(conclusion, values)
    raise TypeError(f"not a condition: {c!r}")


def variables(rules: Sequence[Rule]) -> tuple[list[Choice], list[str]]:
    """The choices and flags that ``rules`` mention, in first-mention order."""
    choices: dict[str, Choice] = {}
    flags: dict[str, None] = {}

    def walk(c: Condition) -> None:
        match c:
            case Is(var, _):
                choices.setdefault(var.name, var)
            case Same(a, b):
                choices.setdefault(a.name, a)
                choices.setdefault(b.name, b)
            case Flag(name):
                flags.setdefault(name)
            case Not(term):
                walk(term)
            case All(terms) | Any_(terms):
                for t in terms:
                    walk(t)
            case Implies(premise, conclusion):
                walk(premise)
                walk(conclusion)

    for rule in rules:
        walk(rule.when)
    return list(choices.values()), list(flags)


def evaluate(rules: Sequence[Rule], values: Assignment) -> int | None:
    """Total cost of ``values``, or None when a hard constraint fails."""
    total = 0
    for rule in rules:
        ok = holds(rule.when, values)
        if rule.cost is None and not ok:
            return None
        if rule.cost is not None and ok:
            total += rule.cost
    return total


def assignments(rules: Sequence[Rule]) -> Iterator[Assignment]:
    """Every assignment of the model's variables (for brute force on small models)."""
    choices, flags = variables(rules)
    domains = [c.domain for c in choices] + [(False, True)] * len(flags)
    names = [c.name for c in choices] + flags
    for combo in itertools.product(*domains):
        yield dict(zip(names, combo, strict=True))


def solve(rules: Sequence[Rule], timeout_ms: int = 20_000) -> tuple[Assignment, int]:
    """The assignment of least total cost, and that cost (z3 ``Optimize``, exact)."""
    import z3

    choices, flags = variables(rules)
    ints = {c.name: z3.Int(c.name) for c in choices}
    bools = {f: z3.Bool(f) for f in flags}

    def expr(c: Condition):
        match c:
            case Is(var, value):
                return ints[var.name] == value
            case Same(a, b):
                return ints[a.name] == ints[b.name]
            case Flag(name):
                return bools[name]
            case Not(term):
                return z3.Not(expr(term))
            case All(terms):
                return z3.And(*[expr(t) for t in terms]) if terms else z3.BoolVal(True)
            case Any_(terms):
                return z3.Or(*[expr(t) for t in terms]) if terms else z3.BoolVal(False)
            case Implies(premise, conclusion):
                return z3.Implies(expr(premise), expr(conclusion))
        raise TypeError(f"not a condition: {c!r}")

    opt = z3.Optimize()
    opt.set("timeout", timeout_ms)
    for c in choices:
        opt.add(z3.Or(*[ints[c.name] == v for v in c.domain]))
    costs = []
    for rule in rules:
        if rule.cost is None:
            opt.add(expr(rule.when))
        elif rule.cost:
            costs.append(z3.If(expr(rule.when), rule.cost, 0))
    objective = z3.Sum(costs) if costs else z3.IntVal(0)
    opt.minimize(objective)
    status = opt.check()
    if status == z3.unsat:
        names = sorted({r.name for r in rules if r.cost is None})
        raise LayoutError(f"the layout constraints contradict each other (rules: {', '.join(names)}); "
                          "this is a bug in the layout model or an op it does not know")
    if status != z3.sat:
        raise LayoutError(f"z3 gave up on the layout model ({opt.reason_unknown()}); raise timeout_ms")
    model = opt.model()
    values: Assignment = {}
    for c in choices:
        values[c.name] = model.eval(ints[c.name], model_completion=True).as_long()
    for f in flags:
        values[f] = z3.is_true(model.eval(bools[f], model_completion=True))
    cost = evaluate(rules, values)
    assert cost is not None, "z3 returned an assignment that breaks a hard constraint"
    return values, cost
