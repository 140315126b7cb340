"""Abstract expressions: hash-consing, the abstraction of constants and reductions, printing, parsing."""

from __future__ import annotations

import doctest
import pickle

import pytest

from mirage.errors import MirageError
from mirage.generator import abstract_expr as ae

x, y, z = ae.variable(0), ae.variable(1), ae.variable(2)
c = ae.constant()


def test_building_a_term_twice_returns_the_same_object():
    first = ae.sum_of(64, ae.mul(ae.div(x, ae.rms(64, x)), y))
    second = ae.sum_of(64, ae.mul(ae.div(x, ae.rms(64, x)), y))
    assert first is second
    assert ae.add(x, y) is not ae.add(y, x)  # no rewriting at construction: commutativity is an axiom


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        (ae.add(x, c), x),  # x + c = x
        (ae.add(c, y), y),
        (ae.sub(x, y), ae.add(x, y)),  # the sign is a constant factor
        (ae.mul(x, c), x),  # x * c = x
        (ae.mul(c, x), x),
        (ae.div(x, c), x),  # x / c = x
        (ae.exp(c), c),
        (ae.sqrt(c), c),
        (ae.opaque("silu", c), c),
        (ae.sum_of(1, x), x),  # sum(1, x) = x
        (ae.sum_of(4096, c), c),
        (ae.sum_of(4, ae.sum_of(128, x)), ae.sum_of(512, x)),  # sum(i, sum(j, x)) = sum(i*j, x)
        (ae.rms(64, x), ae.sqrt(ae.sum_of(64, ae.mul(x, x)))),
    ],
)
def test_smart_constructors_apply_the_abstraction(built, expected):
    assert built is expected


def test_a_reciprocal_keeps_its_constant():
    reciprocal = ae.div(c, x)
    assert reciprocal.op is ae.TermOp.DIV and reciprocal.args == (c, x)


@pytest.mark.parametrize(
    ("term", "depth"),
    [
        (x, 0),
        (ae.exp(x), 1),
        (ae.div(ae.exp(x), ae.sum_of(8, ae.exp(x))), 1),
        (ae.exp(ae.sum_of(4, ae.exp(x))), 2),
        (ae.mul(ae.exp(ae.exp(x)), ae.exp(y)), 2),
    ],
)
def test_exp_depth_counts_exps_on_the_deepest_path(term, depth):
    assert term.exp_depth == depth


@pytest.mark.parametrize(
    "text",
    [
        "v0",
        "c",
        "(+ v0 v1)",
        "(/ c (sqrt (sum 4096 (* v0 v0))))",
        "(sum 4096 (* (/ (exp (sum 64 (* v0 v1))) (sum 4096 (exp (sum 64 (* v0 v1))))) v2))",
        "(* (silu (sum 4096 (* v0 v1))) (sum 4096 (* v0 v2)))",
    ],
)
def test_printing_and_parsing_are_inverse(text):
    term = ae.parse(text)
    assert ae.to_sexpr(term) == text
    assert ae.parse(str(term)) is term


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("(+ v0)", "takes 2 arguments"),
        ("(exp v0 v1)", "takes 1 argument"),
        ("(sum x v0)", "reduction size must be an integer"),
        ("(sum 0 v0)", "positive int"),
        ("(+ v0 v1", "missing"),
        ("v0 v1", "trailing"),
        ("w3", "unknown leaf"),
        (")", "unexpected"),
    ],
)
def test_malformed_expressions_raise_a_mirage_error(text, message):
    with pytest.raises(ae.AbstractExpressionError, match=message) as info:
        ae.parse(text)
    assert isinstance(info.value, MirageError)


@pytest.mark.parametrize(
    "build",
    [lambda: ae.variable(-1), lambda: ae.sum_of(0, x), lambda: ae.opaque("sum", x), lambda: ae.opaque("", x)],
)
def test_bad_constructor_arguments_are_rejected(build):
    with pytest.raises(ae.AbstractExpressionError):
        build()


def test_terms_pickle_back_to_the_same_interned_object():
    term = ae.parse("(/ (sum 4096 (* (exp (sum 64 (* v0 v1))) v2)) (sum 4096 (exp (sum 64 (* v0 v1)))))")
    assert pickle.loads(pickle.dumps(term)) is term


def test_subterms_lists_each_node_once_children_first():
    shared = ae.mul(x, y)
    term = ae.add(shared, ae.exp(shared))
    nodes = list(term.subterms())
    assert len(nodes) == len({id(n) for n in nodes}) == 5
    assert nodes[-1] is term
    assert nodes.index(shared) < nodes.index(ae.exp(shared))
    assert term.variables() == {0, 1}


def test_docstring_examples():
    result = doctest.testmod(ae)
    assert result.attempted > 0 and result.failed == 0
