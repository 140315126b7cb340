"""Random valid µGraphs (mirage.codegen.random_graphs): valid, deterministic, varied, and lowerable."""

from __future__ import annotations

import collections

import pytest

from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.random_graphs import random_graph, random_graphs
from mirage.mugraph import check
from mirage.mugraph.graph import AccumKind
from mirage.mugraph.ops import Op

COUNT = 100


@pytest.fixture(scope="module")
def cases():
    return random_graphs(COUNT)


def test_every_graph_is_valid(cases):
    for case in cases:
        check(case.graph)
        assert case.graph.name == f"random_{case.seed}"


def test_graphs_are_deterministic_and_distinct(cases):
    assert random_graph(17).graph == cases[17].graph
    hashes = {c.graph.content_hash() for c in cases}
    assert len(hashes) == COUNT


def _features(cases) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    for case in cases:
        seen[f"dtype:{case.graph.input_types[0].dtype.value}"] += 1
        for node in case.graph.nodes:
            if node.op is not Op.CUSTOMIZED:
                seen[f"kernel:{node.op.value}"] += 1
                continue
            block = node.attrs
            seen[f"grid_axes:{sum(g > 1 for g in block.grid_dim)}"] += 1
            seen[f"forloop:{block.forloop_range > 1}"] += 1
            seen[f"threads:{block.block_dim[0]}"] += 1
            seen[f"block:{block.block_dim}"] += 1
            for inner in block.nodes:
                seen[inner.op.value] += 1
                if inner.op is Op.ACCUM:
                    seen[f"accum:{inner.attrs.kind.value}"] += 1
                if inner.op is Op.INPUT:
                    seen[f"fmap:{inner.attrs.forloop_dim >= 0}"] += 1
                    seen[f"rank:{len(inner.outputs[0].shape)}"] += 1
    return seen


def test_graphs_cover_the_ir(cases):
    seen = _features(cases)
    wanted = [
        "matmul",
        "rms_norm",
        "reduction_to_dimx",
        "exp",
        "div",
        "sqrt",
        "silu",
        "gelu",
        "clamp",
        "accum:none",
        "accum:sum",
        "accum:mean",
        "accum:rms",
        "accum:sum_todimx",
        "accum:max",
        "grid_axes:0",
        "grid_axes:1",
        "grid_axes:2",
        "forloop:True",
        "forloop:False",
        "fmap:True",
        "fmap:False",
        "rank:2",
        "rank:3",
        "threads:64",
        "threads:256",
        "dtype:float16",
        "dtype:bfloat16",
        "dtype:float32",
        "kernel:reduction",
        "kernel:mul_scalar",
        "kernel:matmul",
        "kernel:rms_norm",
        "concat_matmul",
        "reduction_max",
        "block:(32, 4, 1)",
    ]
    missing = [w for w in wanted if not seen[w]]
    assert not missing, f"no random graph has {missing}: {sorted(seen.items())}"


def test_every_graph_lowers_to_cuda(cases):
    softmax, two_kernels = 0, 0
    for case in cases:
        program = generate_cuda_program(case.graph, 90)
        # shared memory for every kernel but those run in registers from global memory to global memory
        pairs = zip(program.kernels, program.prepared.kernels, strict=True)
        assert program.kernels and all(k.smem_bytes > 0 or p.row_loop is not None and p.row_loop.direct
                                       for k, p in pairs)
        softmax += program.prepared.softmax.applied
        two_kernels += len(program.kernels) > 1
    # attention µGraphs go through the online-softmax rewrite, split-KV ones through a combine kernel
    assert softmax >= 5 and two_kernels >= 5


def test_accumulator_kinds_are_all_reachable():
    assert {k.value for k in AccumKind} - {"none"} <= {
        key.split(":")[1] for key in _features(random_graphs(COUNT)) if key.startswith("accum:")
    } | {"none"}
