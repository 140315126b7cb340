"""Which inputs are multicast to clusters of blocks (mirage.optimizer.multicast), and what that
costs in shared memory: a slot more than the pipeline's stages, and two barriers per slot."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.mugraphs import mlp
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions, prepare
from mirage.optimizer.memory import BufferKind
from mirage.optimizer.multicast import multicast_inputs

H100 = TARGETS["H100"]


def _block(graph):
    (block,) = graph.block_graphs()
    return block


def _inputs(block) -> dict[str, int]:
    """rmsnorm's inputs (X, G, W, in the kernel's argument order) → their block input nodes."""
    return dict(zip("XGW", block.input_nodes, strict=True))


def test_only_the_tile_every_block_loads_alike_with_a_row_per_block():
    block = _block(mlp.rmsnorm_fused(8, grid=128, iters=16, threads=256))
    names = _inputs(block)
    # X (16 rows, unmapped on grid x) yes; G (one row) no; W (split along grid x) no
    chosen = multicast_inputs(block, H100, 2)
    assert chosen.inputs == {names["X"]} and chosen.axis == 0 and chosen.shape == (2, 1, 1)
    assert multicast_inputs(block, H100, 16).inputs == {names["X"]}
    assert not multicast_inputs(_block(mlp.rmsnorm_fused(1, grid=128, iters=16, threads=256)), H100, 4)


def test_attention_keys_and_values_go_to_the_query_splits_when_z_is_allowed():
    """GQA's kernel 1 (grid: heads, key splits, query splits): K and V are the same for every query
    split, Q differs and is not pipelined; the combine kernel has no for-loop. By default only grid x
    may hold a cluster (along z it measured slower), so none."""
    from benchmarks.variants import family

    _, graph = next((r, g) for r, g in family("gqa_b8") if "q_splits=2" in r.label)
    attention, combine = graph.block_graphs()
    assert not multicast_inputs(attention, H100, 2)
    chosen = multicast_inputs(attention, H100, 2, axes=(0, 1, 2))
    q, k, v = attention.input_nodes
    assert chosen.inputs == {k, v} and chosen.axis == 2 and chosen.shape == (1, 1, 2)
    assert not multicast_inputs(combine, H100, 2, axes=(0, 1, 2))


@pytest.mark.parametrize("why, kwargs", [
    ("off", {"cluster": 0}),
    ("one block is no cluster", {"cluster": 1}),
    ("no clusters before sm_90", {"target": TARGETS["A100"]}),
    ("the loop has no end-of-iteration barrier", {"one_barrier_loops": True}),
    ("a fold claims the clusters", {"folds": True}),
    ("no grid axis a multiple of the cluster", {"cluster": 3}),
])
def test_no_multicast(why, kwargs):
    block = _block(mlp.rmsnorm_fused(8, grid=128, iters=16, threads=256))
    arguments = {"target": H100, "cluster": 2} | kwargs
    assert not multicast_inputs(block, arguments.pop("target"), arguments.pop("cluster"), **arguments), why


def test_no_multicast_without_a_for_loop():
    block = _block(mlp.lora_fused(16, grid=64))  # K in one step
    assert block.forloop_range == 1
    assert not multicast_inputs(block, H100, 2)


def test_the_ring_has_a_slot_more_and_its_barriers_follow_the_buffers():
    graph = mlp.rmsnorm_fused(8, grid=128, iters=16, threads=256)
    plain = prepare(graph, H100, dataclasses.replace(OptimizerOptions(), stages=3))
    (kernel,) = prepare(graph, H100, OptimizerOptions(stages=3, multicast_cluster=2)).kernels
    (before,) = plain.kernels
    x = _inputs(kernel.block_graph)["X"]
    assert kernel.multicast.inputs == {x} and kernel.multicast.size == 2 and not before.multicast
    assert kernel.memory.buffer_of(x, BufferKind.INPUT_STAGES).slots == 4
    assert before.memory.buffer_of(x, BufferKind.INPUT_STAGES).slots == 3
    end = max(b.offset + b.size for b in kernel.memory.buffers)
    barriers = kernel.memory.barriers_of(x)
    assert barriers >= end and barriers % 8 == 0
    assert kernel.memory.total == barriers + 16 * 4
    assert before.memory.barriers == ()


def test_a_cluster_larger_than_the_hardware_allows_is_a_clear_error():
    block = _block(mlp.rmsnorm_fused(8, grid=128, iters=16, threads=256))
    with pytest.raises(ValueError, match="at most 16 blocks"):
        multicast_inputs(block, H100, 32)
