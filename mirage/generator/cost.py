"""A simple cost model that ranks verified µGraphs until they can be timed on a GPU, and the
structure signature used to compare a found µGraph with a hand-built one.

The estimate is a roofline per kernel: a launch overhead plus the larger of the time to move the
kernel's device-memory traffic and the time of its floating-point work.  A graph-defined kernel
reads each block's input tiles at every for-loop iteration and writes its outputs once; a
pre-defined kernel reads its inputs and writes its output.

>>> from benchmarks.mugraphs import CASES
>>> case = CASES["rmsnorm_b1"]
>>> estimated_time_us(case.fused()) < estimated_time_us(case.reference())
True
>>> structure(case.fused())
(('customized',), (('accum:none', 'accum:rms', 'div', 'matmul', 'mul'),))
"""

from __future__ import annotations

from dataclasses import dataclass

from mirage.mugraph.graph import Accum, BlockGraph, KernelGraph, Node
from mirage.mugraph.ops import REGISTRY, Op


@dataclass(frozen=True)
class CostModel:
    launch_us: float = 3.0
    bandwidth_bytes_per_us: float = 3.35e6  # H100 SXM HBM3, 3.35 TB/s
    flops_per_us: float = 4.0e8  # dense fp16 tensor-core peak, ~400 TFLOP/s achievable


DEFAULT_COST_MODEL = CostModel()


def _block_traffic(node: Node, block: BlockGraph) -> tuple[float, float]:
    bytes_moved = 0.0
    flops = 0.0
    blocks = block.num_blocks
    for inner in block.nodes:
        if inner.op is Op.INPUT:
            bytes_moved += inner.outputs[0].nbytes * blocks * block.forloop_range
        elif inner.op is Op.OUTPUT:
            bytes_moved += inner.outputs[0].nbytes
        else:
            repeat = 1 if inner.outputs[0].after_accum and inner.op is not Op.ACCUM else block.forloop_range
            flops += _node_flops(inner, block) * blocks * repeat
    return bytes_moved, flops


def _node_flops(node: Node, graph) -> float:
    row = REGISTRY[node.op]
    out = node.outputs[0]
    if node.op is Op.MATMUL:
        return 2.0 * out.numel * graph.type_of(node.inputs[0]).shape[-1]
    if node.op is Op.ACCUM:
        return float(graph.type_of(node.inputs[0]).numel)
    return row.flops * out.numel


def estimated_time_us(graph: KernelGraph, model: CostModel = DEFAULT_COST_MODEL) -> float:
    total = 0.0
    for node in graph.nodes:
        if node.op is Op.INPUT:
            continue
        if isinstance(node.attrs, BlockGraph):
            bytes_moved, flops = _block_traffic(node, node.attrs)
        else:
            bytes_moved = sum(graph.type_of(r).nbytes for r in node.inputs) + sum(
                t.nbytes for t in node.outputs
            )
            flops = _node_flops(node, graph)
        total += model.launch_us + max(bytes_moved / model.bandwidth_bytes_per_us, flops / model.flops_per_us)
    return total


def _op_name(node: Node) -> str:
    if isinstance(node.attrs, Accum):
        return f"accum:{node.attrs.kind.value}"
    return node.op.value


def structure(graph: KernelGraph) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(kernel ops in order, the sorted block ops of each graph-defined kernel); scalar ops ignored."""
    ignored = {Op.INPUT, Op.OUTPUT, Op.MUL_SCALAR, Op.ADD_SCALAR}
    kernel = tuple(_op_name(n) for n in graph.nodes if n.op not in ignored)
    blocks = tuple(
        tuple(sorted(_op_name(n) for n in b.nodes if n.op not in ignored)) for b in graph.block_graphs()
    )
    return kernel, blocks


def is_fused(graph: KernelGraph, kernels: int = 1) -> bool:
    """Whether every kernel of ``graph`` is graph-defined and there are at most ``kernels`` of them."""
    ops = [n.op for n in graph.nodes if n.op is not Op.INPUT]
    return bool(ops) and all(op is Op.CUSTOMIZED for op in ops) and len(ops) <= kernels
