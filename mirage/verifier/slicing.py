"""One slice of a batched program: a cheap necessary test before a full verification.

Attention's heads, a batch of sequences: many programs compute every index of their leading dim
independently, and a verification at the real shapes pays for all of them. A search verifies many
candidates that pass its pruning and still differ from the reference (a scale applied twice, which
abstract expressions do not see): at (12, 512, 64) × 512 keys, 36 of the 50 candidates that one
search unit checked in 40 s were wrong, and the 50 checks took 18 s of float64 products.

:func:`batch_slice` rewrites a kernel graph to size 1 in its leading dim where that is exact: every
kernel-level tensor has the same leading size ``B``, no op mixes its indices (matrix products batch
over it, reductions and norms run over other dims, element-wise ops need no broadcast along it), and
every graph-defined op gives each block one index (grid x of ``B`` mapped to dim 0 of each input and
output, on no other axis, never iterated). The slice then computes index 0 exactly as the whole graph
does, and every other index by the same function (the same ops and block program on that index's
inputs alone), so two graphs that slice are equivalent exactly when their slices are: the search's
checker verifies a candidate on its slice, at 1/B of the cost. Inputs of leading size 1 (a mask that
all heads share) are read whole by every index: element-wise ops broadcast them, and blocks read them
with no map of that dim; the slice keeps them as they are.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> q = g.new_input(dims=(12, 16, 8), dtype=mi.float16)
>>> k = g.new_input(dims=(12, 8, 32), dtype=mi.float16)
>>> g.mark_output(g.exp(g.matmul(q, k)))
>>> sliced = batch_slice(g.freeze())
>>> [n.outputs[0].shape for n in sliced.nodes]
[(1, 16, 8), (1, 8, 32), (1, 16, 32), (1, 16, 32)]
>>> g = mi.new_kernel_graph()
>>> g.mark_output(g.reduction(g.new_input(dims=(12, 16), dtype=mi.float16), 0))
>>> batch_slice(g.freeze()) is None  # a sum over the leading dim mixes its indices
True
"""

from __future__ import annotations

import dataclasses

from mirage.errors import MirageError
from mirage.mugraph.graph import BlockGraph, InputIterator, KernelGraph, Node, OutputSaver, TensorType
from mirage.mugraph.ops import ELEMENTWISE, REDUCTIONS, Op

MIN_BATCH = 2  # below this a slice saves nothing


class SlicedVerifier:
    """A :class:`~mirage.verifier.Verifier` of ``reference`` that checks each candidate on its slice
    where the reference and the candidate both have an exact one with the same inputs (at 1/B of the
    work: two such graphs are equivalent exactly when their slices are, module docstring), and whole
    otherwise. Keyword arguments go to both verifiers; the whole one is built when first needed."""

    def __init__(self, reference: KernelGraph, **options) -> None:
        from mirage.verifier.verify import Verifier

        self.reference, self._options, self._whole = reference, options, None
        sliced = batch_slice(reference)
        self.sliced = None if sliced is None else Verifier(sliced, **options)

    def verify(self, candidate: KernelGraph):
        from mirage.verifier.verify import Verifier

        result = self.verify_slice(candidate)
        if result is not None:
            return result
        if self._whole is None:
            self._whole = Verifier(self.reference, **self._options)
        return self._whole.verify(candidate)

    def verify_slice(self, candidate: KernelGraph):
        """The verification of the candidate's slice, or None where either graph has no exact one."""
        if self.sliced is None:
            return None
        sliced = _matching_slice(candidate, self.sliced.reference)
        return None if sliced is None else self.sliced.verify(sliced)


def sliced_pair(reference: KernelGraph, candidate: KernelGraph) -> tuple[KernelGraph, KernelGraph] | None:
    """The slices of ``reference`` and ``candidate`` where both have an exact one with the same inputs
    (two such graphs agree exactly when their slices do, module docstring), else None."""
    reference_slice = batch_slice(reference)
    if reference_slice is None:
        return None
    candidate_slice = _matching_slice(candidate, reference_slice)
    return None if candidate_slice is None else (reference_slice, candidate_slice)


def _matching_slice(candidate: KernelGraph, reference_slice: KernelGraph) -> KernelGraph | None:
    sliced = batch_slice(candidate)
    return sliced if sliced is not None and _input_types(sliced) == _input_types(reference_slice) else None


def _input_types(graph: KernelGraph) -> list[TensorType]:
    return [n.outputs[0] for n in graph.nodes if n.op is Op.INPUT]


class _Mixed(Exception):
    """The leading dim is not independent somewhere."""


def batch_slice(graph: KernelGraph) -> KernelGraph | None:
    """``graph`` at index 0 of its leading dim (module docstring), or None where that slice would not
    compute exactly what the whole graph computes there, or the leading dim is smaller than 2."""
    from mirage.mugraph.check import check

    inputs = [n.outputs[0].shape for n in graph.nodes if n.op is Op.INPUT and n.outputs]
    if not inputs or not all(inputs):
        return None
    batch = max(shape[0] for shape in inputs)
    if batch < MIN_BATCH:
        return None
    try:
        nodes = tuple(_slice_node(node, batch) for node in graph.nodes)
        sliced = KernelGraph(nodes, graph.outputs, graph.name)
        check(sliced)  # the rewritten types agree with what the ops compute
    except (_Mixed, MirageError):
        return None
    return sliced


def _one(t: TensorType, batch: int) -> TensorType:
    if not t.shape or t.shape[0] != batch:
        raise _Mixed
    return dataclasses.replace(t, shape=(1, *t.shape[1:]))


def _shared(node: Node) -> bool:
    """An input of leading size 1: every index reads it whole (a mask shared by the heads)."""
    return node.op is Op.INPUT and node.outputs[0].shape[0] == 1


def _slice_node(node: Node, batch: int) -> Node:
    if _shared(node):
        return node
    outputs = tuple(_one(t, batch) for t in node.outputs)
    rank = len(node.outputs[0].shape)
    op, attrs = node.op, node.attrs
    if op is Op.CUSTOMIZED:
        attrs = _slice_block(attrs, batch)
    elif op is Op.MATMUL or op is Op.CONCAT_MATMUL:
        if rank < 3:  # dim 0 would be a row dim, not a batch dim
            raise _Mixed
    elif op in REDUCTIONS:
        if attrs.dim == 0:
            raise _Mixed
    elif op is Op.RMS_NORM:
        if rank < 2:
            raise _Mixed
    elif op is not Op.INPUT and op not in ELEMENTWISE:
        raise _Mixed
    return dataclasses.replace(node, attrs=attrs, outputs=outputs)


def _one_block_an_index(dim_map: tuple[int, int, int], forloop_dim: int) -> bool:
    return dim_map[0] == 0 and 0 not in dim_map[1:] and forloop_dim != 0


def _slice_block(graph: BlockGraph, batch: int) -> BlockGraph:
    if graph.grid_dim[0] != batch or graph.spans[0]:
        raise _Mixed
    nodes = []
    for node in graph.nodes:
        attrs = node.attrs
        if isinstance(attrs, InputIterator) and attrs.source.shape[:1] == (1,):
            if 0 in attrs.input_map or attrs.forloop_dim == 0:  # a shared input, read whole by every block
                raise _Mixed
            nodes.append(node)
        elif isinstance(attrs, InputIterator):
            if not _one_block_an_index(attrs.input_map, attrs.forloop_dim):
                raise _Mixed
            nodes.append(dataclasses.replace(node, attrs=dataclasses.replace(  # one block on x: no map
                attrs, source=_one(attrs.source, batch), input_map=(-1, *attrs.input_map[1:]))))
        elif isinstance(attrs, OutputSaver):
            if not _one_block_an_index(attrs.output_map, attrs.forloop_dim):
                raise _Mixed
            saver = dataclasses.replace(attrs, output_map=(-1, *attrs.output_map[1:]))
            outputs = tuple(_one(t, batch) for t in node.outputs)
            nodes.append(dataclasses.replace(node, attrs=saver, outputs=outputs))
        else:
            if any(t.shape and t.shape[0] != 1 for t in node.outputs):
                raise _Mixed
            nodes.append(node)
    return dataclasses.replace(graph, nodes=tuple(nodes), grid_dim=(1, *graph.grid_dim[1:]))
