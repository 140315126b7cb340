"""RMSNorm's member whose product is the kernel graph's pre-defined matmul
(``mlp.rmsnorm_two_kernels(library_product=True)``): one generated kernel (the normalization), then the
matmul as a kernel-level op that the runtime runs through torch (the vendor library); and GatedMLP's
exploration members of the same kind (``mlp.gatedmlp_library``)."""

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


@pytest.mark.parametrize("case", ["gatedmlp_m1", "gatedmlp_m8"])
def test_gatedmlp_library_members_are_two_predefined_matmuls_and_the_gate(case):
    members = [(v, g) for v, g in family(case, wide=True) if "library_product=True" in v.label]
    assert len(members) == 6  # 8, 16 or 32 blocks of 128 or 256 threads
    assert not any("library_product" in v.label for v, _ in family(case))  # measured slower: not tuned
    _, graph = members[2]
    program = generate_cuda_program(graph, 90)
    assert [k.grid for k in program.kernels] == [(16, 1, 1)]  # the gate, a strip of 256 columns a block
    assert [n.op for n in graph.nodes if n.op is Op.MATMUL] == [Op.MATMUL, Op.MATMUL]
    assert interpreted_error(case, graph) <= 1e-9
