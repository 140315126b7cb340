"""Multicast inputs on a GPU (mirage.optimizer.multicast): a tile that every block loads alike, read
once per cluster of blocks and multicast into each block's shared memory.

GEMVs multicast X along grid x; attention kernels K and V along the query splits (grid z). Each
program is built with and without multicast; the multicast build must pass the float check
against the float64 reference and equal the plain build bit for bit (only where the tile comes from
changes), over several launches, since the slots' barriers carry their phases from iteration to
iteration. A misaligned X takes the element-copy path of the same protocol.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from gpu_helpers import (  # noqa: E402
    GEMV_PROGRAMS,
    assert_checked_and_matching,
    assert_equal_bits,
    assert_matching_on_misaligned,
)

from benchmarks.mugraphs import mlp  # noqa: E402
from benchmarks.variants import family  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu

GRAPHS = {
    **GEMV_PROGRAMS,
    "rmsnorm_b1_512": lambda: mlp.rmsnorm_fused(1, grid=128, iters=16, threads=512),
    "gatedmlp_m8": lambda: mlp.gatedmlp_fused(8, grid=128, iters=16, threads=256),
    # K and V along the query splits (clusters of two along grid z)
    "gqa_b8": lambda: _member("gqa_b8", "kv_splits=8,q_splits=2,iters=8,threads=128,", "combine_rows=8"),
    "qknorm_b1_key_scales": lambda: _member("qknorm_b1", "key_scales=True", "q_splits=4"),
}


def _member(case: str, *parts: str):
    return next(g for row, g in family(case) if all(p in row.label for p in parts))


def _builds(graph, stages: int):
    options = dataclasses.replace(OptimizerOptions(), stages=stages, multicast_axes=(0, 1, 2))
    multicast = generate_cuda_program(graph, None, options=dataclasses.replace(options, multicast_cluster=2))
    assert any(k.cluster_size == 2 for k in multicast.kernels)
    return build_many([multicast, generate_cuda_program(graph, None, options=options)])


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("stages", [2, 3])
def test_multicast_build_matches_the_plain_build(name, stages):
    graph = GRAPHS[name]()
    ours, theirs = _builds(graph, stages)
    assert_checked_and_matching(graph, ours, theirs, 5, assert_equal_bits)


def test_misaligned_tile_is_copied_element_by_element():
    """X starting 2 bytes past a 16-byte boundary: no bulk copies, the same results."""
    graph = GRAPHS["rmsnorm_b8"]()
    ours, theirs = _builds(graph, 2)
    assert_matching_on_misaligned(graph, ours, theirs, 0, 6, assert_equal_bits)
