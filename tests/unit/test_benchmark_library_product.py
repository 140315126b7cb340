"""RMSNorm's member whose product is the kernel graph's pre-defined matmul
(``mlp.rmsnorm_two_kernels(library_product=True)``): one generated kernel (the normalization), then the
matmul as a kernel-level op that the runtime runs through torch (the vendor library)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.mugraphs import CASES
from benchmarks.variants import family
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.interpret import interpret
from mirage.mugraph.ops import Op


def _member(case: str):
    (member,) = [(v, g) for v, g in family(case) if "library_product=True" in v.label]
    return member


@pytest.mark.parametrize("case, rows", [("rmsnorm_b1", 2), ("rmsnorm_b8", 16)])
def test_the_member_is_one_generated_kernel_and_a_predefined_matmul(case, rows):
    _, graph = _member(case)
    program = generate_cuda_program(graph, 90)
    assert [k.grid for k in program.kernels] == [(rows, 1, 1)]  # one block a row: the normalization
    assert [n.op for n in graph.nodes if n.op is Op.MATMUL] == [Op.MATMUL]  # the product: kernel level
    reference = CASES[case].reference()
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(t.shape).astype(np.float16) for t in reference.input_types]
    expected = np.asarray(interpret(reference, inputs, dtype=np.float64)[0])
    got = np.asarray(interpret(graph, inputs, dtype=np.float64)[0])
    assert np.abs(got - expected).max() <= 1e-12 * np.abs(expected).max()
