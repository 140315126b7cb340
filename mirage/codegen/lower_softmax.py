"""Lowering of the register-resident online-softmax chain (optimizer.softmax_chain, gen/softmax.cuh):
its type, the link that maps per-key values to factors, its merge scratch and its write-back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mirage.codegen import lower_context as ctx
from mirage.codegen import lower_io as io
from mirage.codegen.lower_functions import thread_function
from mirage.codegen.lower_ops import LoweringError
from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import Node, Ref, Scalar, TensorType, ThreadGraph, ThreadInput
from mirage.mugraph.ops import Op

FLOAT32 = TensorType((1,), DType.FLOAT32)

if TYPE_CHECKING:
    from mirage.codegen.lower import KernelLowering


def chain_type(lw: KernelLowering) -> ctx.OnlineSoftmaxType:
    chain = lw.softmax
    assert chain is not None
    q, k = (lw.operand(r) for r in lw.graph.nodes[chain.qk].inputs)
    v = lw.operand(lw.graph.nodes[chain.pv].inputs[1])
    name = f"softmax{chain.qk}"
    forms = {"defer_values": chain.defer_values, "q_fragments": chain.q_fragments, "pingpong": chain.pingpong}
    if chain.key_norm is not None:  # per-key factors from the chain's own K fragments
        assert chain.score is not None and chain.column is not None
        node = lw.graph.nodes[chain.column]
        g = lw.function(chain.column) if node.op is Op.FUSED else "mirage::dev::Identity"
        factor = f"mirage::gen::ColumnFactor<{lw.function(chain.score)}, {chain.qk_argument}>"
        # the warpgroup form trades the factors through the scratch (after the plan, as the merge's)
        scratch = scratch_offset(lw) if chain.warpgroup else None
        return ctx.OnlineSoftmaxType(name, q.element, q, k, v, "mirage::gen::ColumnScore",
                                     key_norms=f"mirage::gen::Compose<{g}, {factor}>",
                                     key_scratch=scratch, **forms)
    if chain.mask_scale is not None:  # c · S + M: the chain of c · S, M / c added to each product
        assert chain.column is not None
        causal = chain.mask_rows > 0  # M computed from indices, not read
        tile = lw.generated_tile(chain.column) if causal else lw.tile(chain.column)
        return ctx.OnlineSoftmaxType(name, q.element, q, k, v, mask_score(lw), tile, mask=True, causal=causal,
                                     **forms)
    if chain.column is not None:  # the products times per-key factors (the column's step stores them)
        loaded = chain.column_loaded  # an input tile: f(1, c) taken on read
        factor = column_factor(lw).function if loaded else None
        return ctx.OnlineSoftmaxType(name, q.element, q, k, v, "mirage::gen::ColumnScore",
                                     lw.tile(chain.column), column_factor=factor, **forms)
    score = lw.function(chain.score) if chain.score is not None else "mirage::dev::Identity"
    return ctx.OnlineSoftmaxType(name, q.element, q, k, v, score, **forms)


def mask_score(lw: KernelLowering) -> str:
    """The functor x · c of a masked chain's score c · S + M (its linear part: the chain scales, and
    folds the scale into its exponentials, as for an unmasked score)."""
    chain = lw.softmax
    assert chain is not None and chain.score is not None and chain.mask_scale is not None
    key = -1 - chain.score  # beside the node functors, apart from them
    if key not in lw.functions:
        scalar = Node(Op.MUL_SCALAR, (Ref(0),), Scalar(chain.mask_scale), (FLOAT32,))
        graph = ThreadGraph((Node(Op.INPUT, (), ThreadInput(0), (FLOAT32,)), scalar), (Ref(1),))
        lw.functions[key] = thread_function(f"{lw.name}_f{chain.score}_linear", graph)
    return lw.functions[key].name


def column_factor(lw: KernelLowering) -> ctx.Link:
    """The link that turns the chain's per-key values c into the factors f(1, c) before their step
    stores them (gen/softmax_columns.cuh's ColumnFactor)."""
    chain = lw.softmax
    assert chain is not None and chain.column is not None and chain.score is not None
    function = f"mirage::gen::ColumnFactor<{lw.function(chain.score)}, {chain.qk_argument}>"
    return ctx.Link(chain.score, function, (None,))


def place(lw: KernelLowering, smem_limit: int | None) -> None:
    """The chain's scratch (the key groups' merge, or the warpgroup form's key factors) goes after the
    plan (and the reduction scratch)."""
    chain = lw.softmax
    assert chain is not None
    lw.softmax_scratch = chain.scratch_bytes
    end = scratch_offset(lw) + lw.softmax_scratch
    if smem_limit is not None and end > smem_limit:
        raise LoweringError(
            f"{lw.name}: the online-softmax chain's scratch ends at {end} bytes of shared "
            f"memory, past the target's {smem_limit}; use fewer threads per query tile or prepare "
            "with OptimizerOptions(register_softmax=False)"
        )
    lw.in_registers -= {chain.out}


def write_back(lw: KernelLowering) -> ctx.OnlineSoftmaxWriteBack:
    """After the loop: the chain's results into their tiles, or, those that only an output saver
    reads (``softmax_output_stores``), straight into the output (``gen::GlobalSink``): no shared
    round trip, no saver pass and no barrier before it."""
    chain = lw.softmax
    assert chain is not None
    nodes = (chain.maximum, chain.running, chain.sum, chain.out)
    tiles = tuple(None if i is None else lw.tile(i) for i in nodes)
    savers = tuple(None if i is None or i == chain.running else _saved_only(lw, i) for i in nodes)
    lw.stored_directly |= {i for i, saver in zip(nodes, savers, strict=True) if saver is not None}
    return ctx.OnlineSoftmaxWriteBack(chain_type(lw), scratch_offset(lw), tiles, savers)


def _saved_only(lw: KernelLowering, i: int) -> ctx.OutputSaverContext | None:
    """The saver of chain result ``i`` when it is the result's only reader, else None."""
    if not lw.softmax_output_stores:
        return None
    readers = lw.graph.consumers().get(Ref(i, 0), [])
    outputs = list(lw.graph.output_nodes)
    if len(readers) != 1 or readers[0] not in outputs:
        return None
    return io.direct_saver(lw, readers[0])


def scratch_offset(lw: KernelLowering) -> int:
    """After the plan and the reduction scratch (whose size is known up front)."""
    base = -(-lw.kernel.smem_bytes // 16) * 16
    return base + -(-4 * max(lw.threads // 32, 1) // 16) * 16


def causal_bound(lw: KernelLowering, loop: list[ctx.Step]) -> str:
    """The computed causal mask's iterator where it may bound the loop: its tile moves along the keys
    with the loop, the loop runs the chain's step alone (a step whose keys are all hidden changes
    nothing), and no input is multicast (the blocks of a cluster would stop at different steps)."""
    masks = [it for it in lw.iterators if it.generated and it.forloop_dim == 3]
    if (len(masks) != 1 or any(it.multicast for it in lw.iterators) or lw.barrier_free_loop
            or not all(isinstance(s, ctx.OnlineSoftmaxStep | ctx.BarrierStep) for s in loop)):
        return ""
    return masks[0].name


def heavy_first_axis(lw: KernelLowering, bound: str) -> int:
    """The grid axis along the rows of the bounding causal mask ``bound`` (its rank-4 dim 2), where
    the grid splits it; -1 for none, or with heavy-first launches off (``heavy_first``)."""
    if not bound or not lw.heavy_first:
        return -1
    (mask,) = [it for it in lw.iterators if it.name == bound]
    axes = [a for a in range(3) if mask.input_map[a] == 2 and lw.graph.grid_dim[a] > 1]
    return axes[0] if len(axes) == 1 else -1
