"""Where the lowering keeps a kernel's work out of shared memory, beside what the optimizer decided:
matmul operands ``X · g`` scaled in the tensor-core fragments (never stored), mean and rms
accumulators summed in registers, and results written by their chain straight to the device
output.  Each function reads a :class:`~mirage.codegen.lower.KernelLowering` and returns the nodes
it applies to; the lowering renders them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mirage.codegen import lower_context as ctx
from mirage.codegen.lower_ops import LoweringError
from mirage.mugraph.graph import AccumKind, BlockGraph, Ref
from mirage.mugraph.ops import Op
from mirage.mugraph.tensor_cores import MAX_SIMT_ROUNDS, exact_shape, takes_tensor_cores
from mirage.optimizer.schedule import Action, Phase, Step

if TYPE_CHECKING:
    from mirage.codegen.lower import KernelLowering


def scaled_operands(lowering: KernelLowering) -> dict[int, tuple[int, Ref, Ref]]:
    """Matmuls whose A operand is ``X · g`` (one element-wise product of a tile X and a row
    vector g broadcast over X's rows) read by nothing else: the tensor-core product scales its
    A fragments by g (exact: the same fp16 / bf16 rounding of each product), and X · g is
    never stored. 16-bit operands of one type only (the tensor-core path)."""
    uses = lowering.graph.consumers()
    outputs = {r for i in lowering.graph.output_nodes for r in lowering.graph.nodes[i].inputs}
    out = {}
    for i, node in enumerate(lowering.graph.nodes):
        if node.op is not Op.MATMUL:
            continue
        chain = lowering.chain_nodes(i)  # only a plain register accumulation (accumulate_scaled)
        last = lowering.graph.nodes[chain[-1]]
        if len(chain) != 2 or chain[-1] not in lowering.in_registers or last.op is not Op.ACCUM or (
            last.attrs.kind not in (AccumKind.NONE, AccumKind.SUM)
        ):
            continue
        a_ref, b_ref = node.inputs
        factors = product_factors(lowering.graph, a_ref.node)
        if factors is None or uses.get(a_ref, []) != [i] or a_ref in outputs:
            continue
        types = [lowering.graph.type_of(r) for r in (*factors, b_ref)]
        if len({t.dtype for t in types}) != 1 or types[0].dtype.itemsize != 2:
            continue
        shape = lowering.graph.type_of(a_ref).shape
        for full, vector in (factors, factors[::-1]):
            f, v = lowering.graph.type_of(full).shape, lowering.graph.type_of(vector).shape
            if f == shape and len(v) == len(f) and v[-1] == f[-1] and all(d == 1 for d in v[:-1]):
                if tensor_core_operands(lowering, full, b_ref, exact=True):
                    out[i] = (a_ref.node, full, vector)
                break
    return out


def tensor_core_refusal(lowering: KernelLowering, a: Ref, b: Ref, exact: bool = False) -> str | None:
    """Why ``A · B`` of these shared tiles does not run on tensor cores, each batch slice
    (``TensorCoreMatmul::kSupported``), or None where it does: one element type; for 16-bit types rows
    of whole 16-byte vectors (ldmatrix), for fp32 (TF32) a B not read transposed; whole warps; and a
    shape the atoms take (``tensor_cores.takes_tensor_cores``). With ``exact`` (A's columns scaled in
    its fragments): 16-bit, one batch, no padding."""
    ta, tb = lowering.operand(a), lowering.operand(b)
    la, lb = ta.layout, tb.layout
    m, k, n = la.dims[2], la.dims[3], lb.dims[3]
    if lowering.threads % 32:
        return f"blocks of {lowering.threads} threads (not whole warps)"
    if not takes_tensor_cores(m, k, n, lowering.threads):
        return f"a [{m}, {k}] · [{k}, {n}] product small enough for the CUDA cores"
    if ta.element != tb.element:
        return f"operands of two element types ({ta.element} and {tb.element})"
    if ta.element == "float":
        if exact:
            return "an fp32 A (its columns are scaled in 16-bit fragments only)"
        return "an fp32 B read transposed (TF32 fragments do not come by ldmatrix)" if lb.transposed else None
    if (2 * la.pitch) % 16 or (2 * lb.pitch) % 16:
        return f"16-bit rows of {la.pitch} and {lb.pitch} elements, not whole 16-byte vectors"
    if exact and not (exact_shape(k, n) and la.dims[0] * la.dims[1] == 1 and lb.dims[0] * lb.dims[1] == 1):
        return "a padded or batched product (A's columns are scaled in whole atoms of one batch only)"
    return None


def tensor_core_operands(lowering: KernelLowering, a: Ref, b: Ref, exact: bool = False) -> bool:
    """Whether ``A · B`` of these shared tiles runs on tensor cores (:func:`tensor_core_refusal`)."""
    return tensor_core_refusal(lowering, a, b, exact) is None


def check_simt_size(lowering: KernelLowering, i: int, refs) -> None:
    """LoweringError where matmul ``i`` (operands ``refs``) would run on the CUDA cores with more than
    :data:`MAX_SIMT_ROUNDS` outputs a thread."""
    if len(refs) != 2:
        return
    reason = tensor_core_refusal(lowering, refs[0], refs[1])
    shape = lowering.graph.nodes[i].outputs[0].shape
    rounds = math.ceil(shape[-2] * shape[-1] / lowering.threads)  # a batch slice at a time
    if reason is not None and rounds > MAX_SIMT_ROUNDS:
        raise LoweringError(
            f"matmul %{i} of {lowering.name} ({list(shape)} outputs) runs on the CUDA cores, {rounds} "
            f"outputs a thread (at most {MAX_SIMT_ROUNDS}), since tensor cores cannot take {reason}; "
            "use tiles that they take, or more blocks")


def row_sums(lowering: KernelLowering) -> dict[int, ctx.RowSums]:
    """Mean and rms accumulators of a tile kept in registers across the loop (``gen::RowSums``):
    those whose per-iteration input is a shared tile (no epilogue chain into them), in kernels
    without a register step of their own (softmax chain, row-local loop)."""
    if lowering.softmax is not None or lowering.row_loop is not None or lowering.graph.forloop_range == 1:
        return {}
    out = {}
    for i, node in enumerate(lowering.graph.nodes):
        if (
            node.op is Op.ACCUM
            and node.attrs.kind in (AccumKind.MEAN, AccumKind.RMS)
            and i not in lowering.in_registers
            and lowering.chain_root(i) == i
        ):
            rms = node.attrs.kind is AccumKind.RMS
            prologue = "mirage::dev::Square" if rms else "mirage::dev::Identity"
            out[i] = ctx.RowSums(f"row_sums{i}", i, lowering.operand(node.inputs[0]), prologue)
    return out


def direct_outputs(lowering: KernelLowering) -> dict[int, tuple[int, int]]:
    """Results that a chain stores once (after the for-loop, or in a one-iteration loop) and only
    an output saver reads: the chain's sink writes them into the device output
    (``gen::GlobalSink``), so neither their shared tile's stores and reads nor the saver's pass
    and the barrier before it remain."""
    steps = [item for item in lowering.kernel.schedule.items if isinstance(item, Step)]
    once = {item.node for item in steps if lowering.graph.forloop_range == 1 or item.phase is Phase.POST_LOOP}
    uses = lowering.graph.consumers()
    finalized = {item.node for item in steps if item.action is Action.FINALIZE}
    elsewhere = (lowering.in_registers | lowering.in_registers_loop() | set(lowering.row_sums)
                 | lowering.folded | finalized)
    out = {}
    for j, i in enumerate(lowering.graph.output_nodes):
        (src,) = lowering.graph.nodes[i].inputs
        node = lowering.graph.nodes[src.node]
        if (src.index == 0 and uses[src] == [i] and src.node in once and src.node not in elsewhere
                and node.op not in (Op.INPUT, Op.RUNNING_MAX)):
            out[src.node] = (j, i)
    return out


def product_factors(graph: BlockGraph, i: int) -> tuple[Ref, Ref] | None:
    """The two operands of node ``i`` when it is a single element-wise product (MUL, or a thread
    graph of one MUL of its two inputs), else None."""
    node = graph.nodes[i]
    if node.op is Op.MUL:
        return node.inputs[0], node.inputs[1]
    if node.op is not Op.FUSED or len(node.inputs) != 2:
        return None
    inner = node.attrs.nodes
    ops = [n for n in inner if n.op is not Op.INPUT]
    if len(ops) != 1 or ops[0].op is not Op.MUL or len(node.attrs.outputs) != 1:
        return None
    sources = {k: node.inputs[n.attrs.index] for k, n in enumerate(inner) if n.op is Op.INPUT}
    a, b = ops[0].inputs
    if a.node not in sources or b.node not in sources or a.node == b.node:
        return None
    return sources[a.node], sources[b.node]
