"""Cluster folds (mirage.optimizer.cluster_fold): which graph-defined ops fold into the kernel before
them, with which clusters, and what the lowering makes of them (GPU runs:
tests/gpu/test_cluster_fold_gpu.py)."""

from __future__ import annotations

import dataclasses

import pytest

import mirage as mi
from benchmarks.variants import attention_fused
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions
from mirage.optimizer.cluster_fold import dependencies, find_folds, fold
from mirage.optimizer.pipeline import prepare
from tests.unit.optimizer.optimizer_graphs import matmul_then_silu, split_k_gemm

H100 = TARGETS["H100"]
FOLD = OptimizerOptions(cluster_folds=True)


def _attention(**kw):
    args = dict(row_sums=True, combine_rows=4, combine_threads=128, kv_splits=8, q_splits=4, iters=4,
                threads=128)
    args.update(kw)
    return attention_fused(1, False, **args)


def _customized(graph):
    return [i for i, n in enumerate(graph.nodes) if n.op.name == "CUSTOMIZED"]


def test_each_combine_block_reads_one_cluster_of_key_splits():
    prepared = prepare(_attention(), H100, FOLD)
    (f,) = prepared.folds
    producer, consumer = _customized(prepared.graph)
    assert (f.producer, f.consumer, f.cluster) == (producer, consumer, (1, 8, 1))
    grid = prepared.graph.nodes[producer].attrs.grid_dim  # (heads 2, key splits 8, query splits 4)
    deps = dependencies(prepared.graph, producer, consumer)
    for block, needed in deps.items():  # combine block (head, 4 rows): the 8 key splits of its 64 rows
        head, rows = block[0], block[1]
        assert needed == {(head, kv, rows * 4 // 64) for kv in range(8)}
    # every combine block runs exactly once, in the cluster that wrote its partials
    flat = [b for blocks in f.blocks for b in blocks]
    assert sorted(flat) == list(range(len(deps)))
    assert len(f.blocks) == grid[0] * grid[2] and f.rounds == 2 and f.cluster_size == 8
    assert all(len(row) == 2 * 8 for row in f.table())


def test_a_cluster_spans_two_grid_axes_where_the_combine_does():
    """128 combine rows span two query splits of 64: each combine block reads a (1, 8, 2) box."""
    prepared = prepare(_attention(combine_rows=128), H100, FOLD)
    (f,) = prepared.folds
    assert f.cluster == (1, 8, 2) and f.blocks == ((0,), (1,), (2,), (3,))


def test_split_k_gemm_folds_its_sum():
    graph = split_k_gemm()
    (f,) = find_folds(graph)
    assert f.cluster == (1, 8, 1) and f.rounds == 1
    assert [len(b) for b in f.blocks] == [1] * 8  # one sum block per column tile


def test_a_consumer_reading_one_block_folds_with_a_block_barrier():
    """Each silu block reads the tile of one product block: clusters of one block, no cluster launch,
    a block barrier between the two bodies."""
    graph = matmul_then_silu()
    (f,) = find_folds(graph)
    assert f.cluster == (1, 1, 1) and f.blocks == tuple((b,) for b in range(8))
    program = generate_cuda_program(graph, 90, options=FOLD)
    (launch,) = program.kernels
    assert launch.cluster_size == 1 and "__cluster_dims__" not in program.code
    body = program.code.split('extern "C" __global__')[1]
    assert "cluster_sync" not in body
    order = [body.index(s) for s in ("_producer(blockIdx", "__syncthreads();", "_consumer(make_uint3")]
    assert order == sorted(order)


@pytest.mark.parametrize("kwargs, reason", [
    ({"combine_threads": 256}, "block sizes differ"),
    ({"kv_splits": 32, "iters": 1}, "clusters of 32 blocks"),
    ({"combine_rows": 2}, "each block would run 4 consumer blocks"),
])
def test_folds_that_do_not_apply_say_why(kwargs, reason):
    prepared = prepare(_attention(**kwargs), H100, OptimizerOptions())
    producer, consumer = _customized(prepared.graph)
    result = fold(prepared.graph, producer, consumer)
    assert isinstance(result, str) and reason in result, result


def test_a_consumer_that_multiplies_matrices_is_not_folded():
    prepared = prepare(attention_fused(1, True, row_sums=True, normalize_k=True, norm_blocks=64, kv_splits=8,
                                       q_splits=4, iters=4, threads=128, combine_rows=8, combine_threads=128),
                       H100, FOLD)
    norm, attention, combine = _customized(prepared.graph)
    assert "multiplies matrices" in fold(prepared.graph, norm, attention)
    assert [(f.producer, f.consumer) for f in prepared.folds] == [(attention, combine)]


def test_folds_are_off_by_default_and_for_older_gpus():
    graph = _attention()
    assert prepare(graph, H100, OptimizerOptions()).folds == ()
    assert prepare(graph, TARGETS["A100"], FOLD).folds == ()


def test_lowering_one_kernel_with_both_bodies():
    program = generate_cuda_program(_attention(), 90, options=FOLD)
    (launch,) = program.kernels
    producer, consumer = launch.nodes
    graph = program.graph
    assert launch.cluster == (1, 8, 1) and launch.grid == graph.nodes[producer].attrs.grid_dim
    # every tensor once: the partials are outputs (written, then read), the kernel's inputs after them
    assert launch.outputs[:3] == tuple(mi.mugraph.graph.Ref(producer, j) for j in range(3))
    assert launch.outputs[3:] == (mi.mugraph.graph.Ref(consumer, 0),)
    assert len(set(launch.arguments)) == len(launch.arguments) == 7
    code = program.code
    assert code.count('extern "C" __global__') == 1 and "__cluster_dims__(1, 8, 1)" in code
    steps = ("_producer(blockIdx", "mirage::dev::cluster_sync();", "_consumer(make_uint3")
    order = [code.index(s) for s in steps]
    assert order == sorted(order)
    signature = code.split("_consumer(const uint3 blockIdx,")[1].split(") {")[0]
    assert "__restrict__" in signature  # the output
    assert signature.count("const __half* input") == 3 and "const __half* __restrict__ input" not in signature
    assert program.kernel(consumer) is launch and program.kernel(producer) is launch


def test_a_launch_description_round_trips():
    program = generate_cuda_program(_attention(), 90, options=FOLD)
    (launch,) = program.kernels
    assert type(launch).from_dict(launch.to_dict()) == launch
    plain = dataclasses.replace(launch, consumer=-1, cluster=(1, 1, 1))
    assert type(launch).from_dict(plain.to_dict()) == plain


COUNTER = OptimizerOptions(counter_folds=True)


def test_counter_folds_take_groups_larger_than_a_cluster():
    """32 key splits make groups of 32 blocks: too many for a cluster, not for a counter."""
    graph = _attention(kv_splits=32, iters=1, q_splits=2)  # grid (2, 32, 2): 128 blocks
    assert prepare(graph, H100, FOLD).folds == ()
    (f,) = prepare(graph, H100, COUNTER).folds
    assert f.counter and f.cluster == (1, 32, 1) and f.cluster_size == 32
    assert prepare(graph, TARGETS["A100"], COUNTER).folds == ()  # 128 blocks, 108 SMs
    small = _attention(kv_splits=16, q_splits=2, iters=2, combine_rows=8)
    (f,) = prepare(small, TARGETS["A100"], COUNTER).folds
    assert f.counter and f.cluster == (1, 16, 1)  # 64 blocks: no sm_90 feature needed


def test_counter_folds_need_a_grid_of_one_wave():
    graph = attention_fused(8, False, row_sums=True, combine_rows=8, combine_threads=128, kv_splits=8,
                            q_splits=4, iters=4, threads=128)  # grid (16, 8, 4): 512 blocks
    prepared = prepare(graph, H100, OptimizerOptions())
    producer, consumer = _customized(prepared.graph)
    result = fold(prepared.graph, producer, consumer, sm_count=H100.sm_count)
    assert isinstance(result, str) and "more than the 132 SMs" in result, result


def test_counter_fold_lowering_meets_at_a_counter_not_a_cluster():
    program = generate_cuda_program(_attention(), 90, options=COUNTER)
    (launch,) = program.kernels
    assert launch.counter and launch.cluster == (1, 1, 1) and launch.cluster_size == 1
    code = program.code
    assert "__cluster_dims__" not in code and "cluster_sync" not in code.split('extern "C" __global__')[1]
    clusters = 2 * 4  # heads × query splits: one counter each
    assert f"__device__ unsigned long long gqa_k3_k4_arrivals[{clusters}];" in code
    steps = ("_producer(blockIdx", "mirage::dev::group_sync(gqa_k3_k4_arrivals + cluster, 8);",
             "_consumer(make_uint3")
    order = [code.index(s) for s in steps]
    assert order == sorted(order)
    assert type(launch).from_dict(launch.to_dict()) == launch


def test_counter_groups_of_one_block_need_no_counter():
    program = generate_cuda_program(matmul_then_silu(), 90, options=COUNTER)
    assert program.kernels[0].counter and "group_sync" not in program.code and "_arrivals" not in program.code
