"""Weight strips copied with the L2 evict-first policy (``OptimizerOptions.evict_first_streams``) on a
GPU: only the cache policy of the copies changes, so each build must pass the float check against the
float64 reference and equal the build without the policy bit for bit, over several launches."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from gpu_helpers import GEMV_PROGRAMS, assert_checked_and_matching, assert_equal_bits  # noqa: E402

from benchmarks.mugraphs import mlp  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu

GRAPHS = {
    **GEMV_PROGRAMS,
    "rmsnorm_two_kernels_b1": lambda: mlp.rmsnorm_two_kernels(1, grid=128, iters=8, threads=256),
    "gatedmlp_m1": lambda: mlp.gatedmlp_fused(1, grid=128, iters=16, threads=128),
}


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("multicast", [0, 2])
def test_evict_first_build_matches_the_plain_build(name, stages, multicast):
    graph = GRAPHS[name]()
    options = dataclasses.replace(OptimizerOptions(), stages=stages, multicast_cluster=multicast)
    hinted = generate_cuda_program(graph, None, options=options)
    assert "false, false, true>" in hinted.code
    plain = generate_cuda_program(graph, None,
                                  options=dataclasses.replace(options, evict_first_streams=False))
    ours, theirs = build_many([hinted, plain])
    assert_checked_and_matching(graph, ours, theirs, 4, assert_equal_bits)
