"""The K-split weight streaming of the rmsnorm family (``mlp.streamed_matmul(k_splits=2)``): partial
products stacked along the rows, summed by a second kernel, or by the first where a cluster fold
takes the sum in."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.variants import family, interpreted_error
from mirage.codegen.lower_program import generate_cuda_program
from mirage.optimizer import OptimizerOptions


def _split_members(case: str):
    return [(v, g) for v, g in family(case, wide=True) if "k_splits=2" in v.label]


@pytest.mark.parametrize("case", ["rmsnorm_b1", "rmsnorm_b8"])
def test_split_members_compute_the_reference(case):
    members = _split_members(case)
    assert len(members) == 4
    for variant, graph in members:
        assert [b.grid_dim for b in graph.block_graphs()][1:] == [(128, 2, 1), (128, 1, 1)], variant.label
        assert interpreted_error(case, graph, seed=3) <= 1e-12, variant.label


def test_a_cluster_fold_takes_the_sum_into_the_product_kernel():
    variant, graph = _split_members("rmsnorm_b8")[-1]
    options = [dataclasses.replace(OptimizerOptions(), stages=2, cluster_folds=f) for f in (False, True)]
    kernels = [len(generate_cuda_program(graph, None, options=o).kernels) for o in options]
    assert kernels == [3, 2], variant.label
