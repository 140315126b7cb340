"""verify(), the Verifier, float_check(): accepted pairs, rejected pairs, permutations, errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
from verifier_graphs import small_attention, tiled_matmul

import mirage as mi
from mirage.verifier import (
    GraphMismatchError,
    Guarantee,
    NotVerifiableError,
    Verifier,
    float_check,
    verify,
)


def graph(build, shapes=((4, 8), (8, 6)), dtype=mi.float32) -> mi.KernelGraph:
    g = mi.new_kernel_graph()
    inputs = [g.new_input(dims=s, dtype=dtype) for s in shapes]
    outputs = build(g, *inputs)
    for out in outputs if isinstance(outputs, tuple) else (outputs,):
        g.mark_output(out)
    return g.freeze()


def exp_epilogue(g, x, w):
    return g.mul(g.exp(g.matmul(x, w)), g.matmul(x, w))


# (name, reference, candidate): all equivalent
EQUIVALENT = [
    ("y + y = 2·y", graph(lambda g, x, w: g.add(g.matmul(x, w), g.matmul(x, w))),
     graph(lambda g, x, w: g.mul_scalar(g.matmul(x, w), 2.0))),
    ("(x·2) @ w = 2·(x @ w)", graph(lambda g, x, w: g.matmul(g.mul_scalar(x, 2.0), w)),
     graph(lambda g, x, w: g.mul_scalar(g.matmul(x, w), 2.0))),
    ("exp(xw)·xw commuted", graph(exp_epilogue),
     graph(lambda g, x, w: g.mul(g.matmul(x, w), g.exp(g.matmul(x, w))))),
    ("tiled matmul vs matmul", graph(lambda g, x, w: g.matmul(x, w), dtype=mi.float16),
     tiled_matmul(grid=2, iters=4)),
    ("sqrt of a product", graph(lambda g, x, w: g.sqrt(g.mul(g.square(x), g.square(x))), ((3, 4),) * 2),
     graph(lambda g, x, w: g.mul(g.sqrt(g.square(x)), g.sqrt(g.square(x))), ((3, 4),) * 2)),
    ("silu of equal arguments", graph(lambda g, x, w: g.silu(g.add(x, w)), ((3, 4),) * 2),
     graph(lambda g, x, w: g.silu(g.add(w, x)), ((3, 4),) * 2)),
    # scalars are the rationals they stand for: 1/20 · 1/1536 is 1/30720 (a mean of slice means),
    # though no float of the three is that product exactly
    ("a mean in two steps",
     graph(lambda g, x, w: g.mul_scalar(g.add_scalar(x, 0.1), 1 / 30720), ((3, 4),) * 2),
     graph(lambda g, x, w: g.mul_scalar(g.mul_scalar(g.add_scalar(x, 0.1), 1 / 1536), 0.05), ((3, 4),) * 2)),
]

# (name, reference, candidate): none equivalent
DIFFERENT = [
    ("missing factor", graph(lambda g, x, w: g.mul_scalar(g.matmul(x, w), 2.0)),
     graph(lambda g, x, w: g.matmul(x, w))),
    ("scale 1/8 vs 1/9", graph(lambda g, x, w: g.mul_scalar(g.matmul(x, w), 1 / 8)),
     graph(lambda g, x, w: g.mul_scalar(g.matmul(x, w), 1 / 9))),
    ("exp vs sqrt", graph(lambda g, x, w: g.exp(g.matmul(x, w))),
     graph(lambda g, x, w: g.sqrt(g.matmul(x, w)))),
    ("silu vs gelu", graph(lambda g, x, w: g.silu(g.matmul(x, w))),
     graph(lambda g, x, w: g.gelu(g.matmul(x, w)))),
    ("sub operands swapped", graph(lambda g, x, w: g.sub(x, w), ((3, 4),) * 2),
     graph(lambda g, x, w: g.sub(w, x), ((3, 4),) * 2)),
    ("div operands swapped", graph(lambda g, x, w: g.div(x, w), ((3, 4),) * 2),
     graph(lambda g, x, w: g.div(w, x), ((3, 4),) * 2)),
    ("x² vs x", graph(lambda g, x, w: g.square(x), ((3, 4),) * 2), graph(lambda g, x, w: x, ((3, 4),) * 2)),
    ("sqrt(x²) vs x", graph(lambda g, x, w: g.sqrt(g.square(x)), ((3, 4),) * 2),
     graph(lambda g, x, w: g.mul_scalar(x, 1.0), ((3, 4),) * 2)),
    ("exp inside the loop", graph(lambda g, x, w: g.exp(g.matmul(x, w)), dtype=mi.float16),
     tiled_matmul(grid=2, iters=4, epilogue="exp")),
]


@pytest.mark.parametrize("name, reference, candidate", EQUIVALENT, ids=[row[0] for row in EQUIVALENT])
def test_equivalent_pairs_are_accepted_with_a_bound(name, reference, candidate):
    result = verify(reference, candidate, seed=0)
    assert result.equivalent, result.reason
    assert result.guarantee in (Guarantee.THEOREM, Guarantee.UNINTERPRETED)
    assert result.error_bound <= 1e-9
    assert result.tests_run >= 1 and result.output_permutation == (0,)
    assert float_check(reference, candidate, seed=0).equivalent


@pytest.mark.parametrize("name, reference, candidate", DIFFERENT, ids=[row[0] for row in DIFFERENT])
def test_different_pairs_are_rejected(name, reference, candidate):
    result = verify(reference, candidate, seed=1)
    assert not result.equivalent and result.output_permutation is None
    assert result.tests_run == 1  # a wrong candidate fails its first test
    float_result = float_check(reference, candidate, seed=1)
    assert not float_result.equivalent and float_result.max_error > 1.0


def test_exp_graph_gets_the_theorem_bound_with_more_tests():
    reference, candidate = EQUIVALENT[2][1], EQUIVALENT[2][2]
    result = verify(reference, candidate, seed=2)
    assert result.guarantee is Guarantee.THEOREM
    assert 0.01 < result.epsilon_per_test < 0.1  # q^(-1/4) dominates for k = 2
    assert result.tests_run == int(np.ceil(np.log(1e-9) / np.log(result.epsilon_per_test)))
    assert result.error_bound == pytest.approx(result.epsilon_per_test**result.tests_run)


@pytest.mark.parametrize("delta", [1e-3, 1e-9, 1e-15])
def test_tests_grow_with_smaller_delta(delta):
    reference, candidate = EQUIVALENT[2][1], EQUIVALENT[2][2]
    result = verify(reference, candidate, delta=delta, seed=3)
    assert result.error_bound <= delta
    assert result.error_bound > delta * result.epsilon_per_test  # one test fewer would not do


def test_attention_is_accepted_but_only_heuristically():
    result = verify(small_attention(fused=False), small_attention(), seed=4, heuristic_tests=3)
    assert result.equivalent
    assert result.guarantee is Guarantee.HEURISTIC and result.error_bound == 1.0 and result.tests_run == 3


def test_wrong_attention_is_rejected():
    wrong = small_attention(iters=1, kv_splits=4)  # equivalent: another split
    assert verify(small_attention(fused=False), wrong, seed=5).equivalent
    g = mi.new_kernel_graph()
    q, k, v = (g.new_input(dims=t.shape, dtype=t.dtype) for t in small_attention().input_types)
    e = g.exp(g.mul_scalar(g.matmul(q, k), 0.5))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, 1)), v))  # normalizes over the wrong dim
    assert not verify(small_attention(), g.freeze(), seed=5).equivalent


def two_outputs(swapped: bool) -> mi.KernelGraph:
    def build(g, x, w):
        first, second = g.matmul(x, w), g.mul_scalar(g.matmul(x, w), 3.0)
        return (second, first) if swapped else (first, second)

    return graph(build)


def test_outputs_match_under_a_permutation():
    result = verify(two_outputs(False), two_outputs(True), seed=6)
    assert result.equivalent and result.output_permutation == (1, 0)
    assert float_check(two_outputs(False), two_outputs(True)).output_permutation == (1, 0)


def test_different_output_counts_are_not_equivalent():
    one = graph(lambda g, x, w: g.matmul(x, w))
    result = verify(two_outputs(False), one)
    assert not result.equivalent and "output shapes differ" in result.reason


def test_graphs_with_different_inputs_are_refused():
    with pytest.raises(GraphMismatchError, match="different inputs"):
        verify(graph(lambda g, x, w: g.matmul(x, w)), graph(lambda g, x, w: g.matmul(x, w), ((4, 8), (8, 5))))


@pytest.mark.parametrize("build, message", [
    (lambda g, x, w: g.exp(g.exp(g.matmul(x, w))), "2 exps"),
    (lambda g, x, w: g.reduction_max(g.matmul(x, w), 1), "order-based"),
])
def test_graphs_outside_the_field_are_refused(build, message):
    outside = graph(build)
    with pytest.raises(NotVerifiableError, match=message):
        verify(outside, outside)
    assert float_check(outside, outside).equivalent


def test_stable_softmax_equals_lax_softmax_in_floating_point():
    def softmax(stable: bool):
        def build(g, x, w):
            s = g.matmul(x, w)
            if stable:
                s = g.sub(s, g.reduction_max(s, 1))
            e = g.exp(s)
            return g.div(e, g.reduction(e, 1))

        return graph(build)

    assert float_check(softmax(False), softmax(True), seed=7).equivalent


@pytest.mark.parametrize("dtype, scale, equivalent", [
    (mi.float32, 1 + 1e-4, False),
    (mi.float16, 1 + 1e-4, True),
    (mi.float16, 1 + 1e-2, False),
])
def test_float_tolerance_follows_the_output_dtype(dtype, scale, equivalent):
    reference = graph(lambda g, x, w: g.matmul(x, w), dtype=dtype)
    candidate = graph(lambda g, x, w: g.mul_scalar(g.matmul(x, w), scale), dtype=dtype)
    assert float_check(reference, candidate, seed=8).equivalent is equivalent


def test_verifier_reuses_reference_tests_across_candidates():
    reference = graph(exp_epilogue)
    verifier = Verifier(reference, seed=9)
    first = verifier.verify(EQUIVALENT[2][2])
    assert first.equivalent
    assert not verifier.verify(graph(lambda g, x, w: g.exp(g.matmul(x, w)))).equivalent
    again = verifier.verify(reference)
    assert again.equivalent and again.tests_run == first.tests_run


def test_verify_is_reproducible_from_a_seed():
    reference, candidate = EQUIVALENT[2][1], EQUIVALENT[2][2]
    first, second = verify(reference, candidate, seed=10), verify(reference, candidate, seed=10)
    assert (first.tests_run, first.error_bound) == (second.tests_run, second.error_bound)


BENCHMARKS = ["lora_m16", "ntrans_b1", "ntrans_b8"]
if os.environ.get("MIRAGE_FULL_BENCHMARKS"):
    BENCHMARKS = ["gqa_b1", "qknorm_b1", "rmsnorm_b1", "ntrans_b1", "gqa_b8", "qknorm_b8", "rmsnorm_b8",
                  "ntrans_b8", "lora_m16", "gatedmlp_m1", "gatedmlp_m8"]


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_fused_graphs_are_accepted(name):
    from benchmarks.mugraphs import CASES

    case = CASES[name]
    result = verify(case.reference(), case.fused(), seed=11)
    assert result.equivalent
    if case.program in ("gqa", "qknorm"):
        assert result.guarantee is Guarantee.HEURISTIC
    else:
        assert result.error_bound <= 1e-9
