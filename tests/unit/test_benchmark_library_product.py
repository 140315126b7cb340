"""RMSNorm's member whose product is the kernel graph's pre-defined matmul
(``mlp.rmsnorm_two_kernels(library_product=True)``): one generated kernel (the normalization), then the
matmul as a kernel-level op that the runtime runs through torch (the vendor library)."""

from __future__ import annotations

import pytest

from benchmarks.variants import family, interpreted_error
from mirage.codegen.lower_program import generate_cuda_program
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
    assert interpreted_error(case, graph) <= 1e-12
