"""Thread functions: a fused thread graph (or one element-wise op that fusion left alone) as a
device functor of straight-line fp32 statements (``templates/kernel.j2`` renders it)."""

from __future__ import annotations

from mirage.codegen import lower_context as ctx
from mirage.codegen.lower_ops import functor
from mirage.mugraph.graph import BlockGraph, Node, Ref, ThreadGraph, ThreadInput
from mirage.mugraph.ops import Op

DIV_SQRT = "mirage::dev::DivSqrt"  # a / sqrt(b), as rms_norm_apply computes it


def single_op_graph(node: Node, graph: BlockGraph) -> ThreadGraph:
    """A one-op thread graph for an element-wise block op that fusion left alone."""
    inputs = tuple(Node(Op.INPUT, (), ThreadInput(k), (graph.type_of(r),)) for k, r in enumerate(node.inputs))
    op = Node(node.op, tuple(Ref(k) for k in range(len(inputs))), node.attrs, node.outputs)
    return ThreadGraph(inputs + (op,), (Ref(len(inputs)),))


def thread_function(name: str, graph: ThreadGraph, fuse_div_sqrt: bool = True) -> ctx.ThreadFunction:
    """A fused thread graph as straight-line statements over fp32 values (``fuse_div_sqrt``: each
    ``a / sqrt(b)`` as one ``DivSqrt``)."""
    value: dict[int, str] = {}
    statements = []
    arity = 0
    for i, node in enumerate(graph.nodes):
        if node.op is Op.INPUT:
            value[i] = f"x{node.attrs.index}"
            arity = max(arity, node.attrs.index + 1)
            continue
        row = functor(node.op)
        value[i] = f"v{i}"
        device_functor, arguments = row.name, tuple(value[r.node] for r in node.inputs)
        if fuse_div_sqrt and node.op is Op.DIV and graph.nodes[node.inputs[1].node].op is Op.SQRT:
            # a / sqrt(b) as a · rsqrt(b): one SFU op for IEEE sqrt's and division's sequences, each
            # with a slow-path branch (the sqrt's statement stays for other readers; else it is dead)
            root = graph.nodes[node.inputs[1].node].inputs[0]
            device_functor, arguments = DIV_SQRT, (arguments[0], value[root.node])
        statements.append(ctx.ThreadStatement(value[i], device_functor, row.constants(node.attrs), arguments))
    (out,) = graph.outputs
    return ctx.ThreadFunction(name, arity, tuple(statements), value[out.node], _linear_scale(graph))


def _linear_scale(graph: ThreadGraph) -> float | None:
    """c when ``graph`` computes x0 · c with c > 0 (each op a scalar product of the one before)."""
    scale = 1.0
    previous = None
    for i, node in enumerate(graph.nodes):
        if node.op is Op.INPUT:
            if previous is not None or node.attrs.index != 0:
                return None
        elif node.op is Op.MUL_SCALAR and node.inputs[0].node == previous:
            scale *= node.attrs.value
        else:
            return None
        previous = i
    (out,) = graph.outputs
    return scale if out.node == previous and scale > 0 else None
