"""The reference guide: which ops recompute a reference tensor, and which proposals it puts first."""

from __future__ import annotations

import doctest

import pytest

from benchmarks.mugraphs import CASES
from mirage.generator import guide as guide_module
from mirage.generator.candidates import order_key
from mirage.generator.guide import ReferenceGuide
from mirage.generator.space import SearchSpace, parse_op


@pytest.fixture(scope="module")
def qknorm():
    return ReferenceGuide.of(CASES["qknorm_b1"].reference())


def test_inputs_and_signatures_follow_the_reference(qknorm):
    assert qknorm.inputs == (0, 1, 2)
    ops = [str(s.choice) for s in qknorm.signatures]
    assert ops[:3] == ["rms_norm(eps=1e-06)", "square", "reduction(dim=1)"]
    assert len(ops) == 13  # every pre-defined op of the reference


@pytest.mark.parametrize(
    "op, operands, expected",
    [
        ("rms_norm=1e-6", (0,), 3),  # rms_norm(Q)
        ("rms_norm=1e-5", (0,), None),  # another epsilon
        ("rms_norm=1e-6", (1,), None),  # on K
        ("square", (1,), 4),
        ("mul_scalar=0.015625", (5,), 6),  # the mean's 1/64, on the sum of squares
        ("mul_scalar=0.125", (5,), None),  # the softmax scale there: not the reference's
        ("add_scalar=1e-6", (6,), 7),
        ("add_scalar=1e-6", (5,), None),  # eps before the 1/64
        ("sqrt", (5,), None),  # sqrt of the sum without mean and eps
        ("sqrt", (7,), 8),
        ("div", (1, 8), 9),
        ("div", (8, 1), None),  # not commutative
        ("square", (None,), None),
    ],
)
def test_value_of_an_op(qknorm, op, operands, expected):
    assert qknorm.value(parse_op(op), operands) == expected


def test_commutative_ops_match_either_operand_order():
    guide = ReferenceGuide.of(CASES["gatedmlp_m1"].reference())
    mul = next(s for s in guide.signatures if s.choice.op.value == "mul")
    assert guide.value(mul.choice, mul.operands) == mul.value
    assert guide.value(mul.choice, tuple(reversed(mul.operands))) == mul.value


def test_first_lists_the_proposals_that_recompute_a_new_value(qknorm):
    space = SearchSpace.named("attention").resolve(CASES["qknorm_b1"].reference())
    rank = {str(c): r for r, c in enumerate(space.block_ops)}
    table = qknorm.for_ops(space.block_ops)

    def proposal(inputs, name):
        return (order_key(True, inputs, rank[name]), rank[name], inputs)

    proposals = sorted(
        [
            proposal((0,), "square"),  # square(Q): not in the reference
            proposal((0,), "rms_norm(eps=1e-06)"),
            proposal((1,), "square"),
            proposal((1,), "rms_norm(eps=1e-06)"),
        ]
    )
    first = table.first((0, 1, 2), proposals, True)
    chosen = sorted((str(space.block_ops[proposals[k][1]]), proposals[k][2], v) for k, v in first.items())
    assert chosen == [("rms_norm(eps=1e-06)", (0,), 3), ("square", (1,), 4)]
    # a value already computed in the state is not recomputed first
    assert set(table.first((0, 1, 2, 3), proposals, True).values()) == {4}
    assert table.first((None, None, None), proposals, True) == {}


def test_docstring_examples():
    result = doctest.testmod(guide_module)
    assert result.attempted > 0 and result.failed == 0
