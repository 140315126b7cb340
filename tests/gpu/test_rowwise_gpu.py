"""One-kernel element-wise µGraphs (mirage.generator.rowwise) on a GPU: every candidate of a chain
with row and column broadcasts passes the float check at short, long and single rows; AdamW's step
through ``mi.superoptimize`` runs as one kernel and matches float64."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.generator import rowwise  # noqa: E402
from tests.unit.generator.test_rowwise import adamw_reference, modulated  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape", [(64, 512), (256, 1024), (8, 32000), (1, 4096), (3, 1000)])
def test_every_candidate_passes_the_float_check(shape):
    graphs = rowwise.candidates(modulated(*shape))
    for graph, program in zip(graphs, build_many([generate_cuda_program(g, None) for g in graphs]),
                              strict=True):
        result = check_on_gpu(graph, program.with_poison())
        assert result.passed, (graph.block_graphs()[0].grid_dim, result.as_dict())


def test_adamw_candidates_pass_the_float_check():
    graphs = rowwise.candidates(adamw_reference())
    for graph, program in zip(graphs, build_many([generate_cuda_program(g, None) for g in graphs]),
                              strict=True):
        assert check_on_gpu(graph, program.with_poison()).passed


def test_adamw_runs_as_one_kernel_and_matches_float64():
    from benchmarks.unseen_models import AdamWStep

    torch.manual_seed(0)
    model = AdamWStep().cuda().half()
    inputs = tuple(torch.randn(256, 1024, device="cuda").half() for _ in range(3))
    fast = mi.superoptimize(model, inputs, time_limit_s=2, progress=False, use_cache=False)
    (spec,) = fast.specializations
    assert len(spec.partition.subprograms) == 1, fast.report()
    (choice,) = spec.choices.values()
    assert choice.source in ("row-wise", "search") and choice.build is not None, fast.report()
    want = copy.deepcopy(model).double()(*(x.double() for x in inputs))
    for got, expected in zip(fast(*inputs), want, strict=True):
        assert float((got.double() - expected).abs().max() / expected.abs().max()) < 2e-3
