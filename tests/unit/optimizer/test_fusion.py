"""Thread-graph fusion: same function, valid graphs, the grouping rule."""

from __future__ import annotations

import pytest
from optimizer_graphs import assert_same_function, attention_one_kernel, elementwise_tree, matmul_chain

import mirage as mi
from benchmarks.mugraphs import CASES
from mirage.mugraph.ops import ELEMENTWISE, Op
from mirage.mugraph.text import to_text
from mirage.optimizer.fusion import element_groups, fuse_block, fuse_thread_graphs
from mirage.optimizer.softmax import online_softmax

# every benchmark program once (other sizes differ only in shapes; test_pipeline runs them all)
BENCHMARKS = [n for n in CASES if not n.endswith(("_b8", "_m8"))]
SMALL = {"tree": elementwise_tree, "gemm": matmul_chain, "attention": attention_one_kernel}


def _fused_nodes(graph):
    return [n for b in graph.block_graphs() for n in b.nodes if n.op is Op.FUSED]


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_graphs_keep_their_function(name):
    graph = CASES[name].fused()
    fused, result = fuse_thread_graphs(graph)
    mi.check(fused)
    assert_same_function(graph, fused, rtol=1e-12)
    assert result.groups + result.wrapped_single == len(_fused_nodes(fused))


@pytest.mark.parametrize("name", ["gqa_b1", "qknorm_b1"])
def test_stable_attention_graphs_fuse_too(name):
    stable, _ = online_softmax(CASES[name].fused())
    fused, result = fuse_thread_graphs(stable)
    mi.check(fused)
    assert result.groups >= 1
    assert_same_function(stable, fused, rtol=1e-12)


@pytest.mark.parametrize("build", SMALL.values(), ids=SMALL.keys())
def test_fused_nodes_are_well_formed(build):
    fused, _ = fuse_thread_graphs(build())
    for block in fused.block_graphs():
        for node in block.nodes:
            assert node.op is Op.FUSED or node.op not in ELEMENTWISE  # nothing element-wise left outside
            if node.op is not Op.FUSED:
                continue
            thread = node.attrs
            mi.check(thread)
            assert thread.type_of(thread.outputs[0]) == node.outputs[0]
            inputs = [n for n in thread.nodes if n.op is Op.INPUT]
            assert [n.attrs.index for n in inputs] == list(range(len(node.inputs)))
            for n in inputs:
                assert n.outputs[0] == block.type_of(node.inputs[n.attrs.index])


def test_groups_follow_the_single_reader_rule():
    block = elementwise_tree().block_graphs()[0]
    ops = [n.op.value for n in block.nodes]
    groups = [[ops[i] for i in g] for g in element_groups(block)]
    # mul_scalar → exp is read three times, so it ends a group; the tree below joins sqrt(square(·))
    # and mul(y, s) through add and sub (binary ops), with sigmoid(shared) as the sub's other side
    assert ["mul_scalar", "exp"] in groups
    assert ["square", "sqrt", "mul", "add", "sigmoid", "sub"] in groups
    assert ["clamp", "div"] in groups
    fused, result = fuse_block(block)
    assert result.groups == 3 and result.fused_ops == 10 and result.wrapped_single == 0
    tree = next(n for n in fused.nodes if n.op is Op.FUSED and len(n.attrs.nodes) > 6)
    # operands in order of first use, each once: exp(·) (read by square and sigmoid), y, s
    assert [fused.nodes[r.node].op for r in tree.inputs] == [Op.FUSED, Op.INPUT, Op.INPUT]
    assert len([n for n in tree.attrs.nodes if n.op is not Op.INPUT]) == 6


def test_shared_intermediates_stay_in_shared_memory():
    fused, result = fuse_thread_graphs(elementwise_tree())
    (block,) = fused.block_graphs()
    shared = [n for n in block.nodes if n.op is Op.FUSED and n.attrs.nodes[-1].op is Op.EXP]
    assert len(shared) == 1
    readers = [n for n in block.nodes if any(block.nodes[r.node] is shared[0] for r in n.inputs)]
    assert len(readers) == 2  # the tree (square and sigmoid joined it) and the sum accumulator
    # removed intermediates: square, sqrt, mul, add, sigmoid (tree), mul_scalar (chain), clamp
    assert result.smem_tensors_removed == 7
    assert result.smem_bytes_saved == 7 * 8 * 16 * 4


def test_wrap_single_can_be_switched_off():
    graph = matmul_chain()
    wrapped, a = fuse_thread_graphs(graph)
    plain, b = fuse_thread_graphs(graph, wrap_single=False)
    assert a.wrapped_single == 2 and b.wrapped_single == 0
    assert {Op.MUL_SCALAR, Op.SILU} <= {n.op for n in plain.block_graphs()[0].nodes}
    assert_same_function(graph, plain)
    assert_same_function(graph, wrapped)


def test_fusion_is_idempotent_and_round_trips_through_text():
    fused, _ = fuse_thread_graphs(elementwise_tree())
    again, result = fuse_thread_graphs(fused)
    assert again == fused and result.groups == 0
    assert mi.parse(to_text(fused)) == fused

