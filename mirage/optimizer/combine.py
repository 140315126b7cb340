"""The stable combine of split-KV partials (the second half of the online-softmax rewrite).

A split-KV attention µGraph (Mirage's FlashDecoding-like GQA, mirage-notes §1.7) has two kernels.
Kernel 1 gives each block b a slice of the keys; after :mod:`mirage.optimizer.softmax` it saves
partials ``P_b = exp(−M_b)·Σ_{r∈b} …`` and the row maxima ``M_b``.  Kernel 2 summed the raw
partials over b with ``sum`` / ``sum_todimx`` accumulators across the last dim, then divided.

The rewritten kernel 2 walks the splits with its for-loop instead (``forloop_range`` = number of
splits, every partial read one split per iteration along its last dim) and combines them the
online way::

    g = running_max(M_b)            w = exp(M_b − g)
    acc = accum_rescale(P_b · w, g)  # acc·exp(g_prev − g) + P_b·w  =  exp(−G)·Σ_b raw partials

so every accumulator holds ``exp(−G)·(original)``, G the row maximum over all splits, and results of
scale degree 0 (the division) are unchanged.  Summing over the last dim in splits is the same sum:
``sum`` adds every element once, ``sum_todimx`` adds elements ``dimx`` apart, and the split width
is a multiple of ``dimx``.
"""

from __future__ import annotations

import dataclasses

from mirage.mugraph.graph import AccumKind, BlockGraph, KernelGraph, Node, Ref
from mirage.mugraph.ops import Op
from mirage.optimizer.errors import OptimizerError
from mirage.optimizer.graphs import BlockRewriter
from mirage.optimizer.scale import Degree, keeps_rows, propagate
from mirage.optimizer.softmax import PartialOutput, rescaled_accumulator

COMBINABLE = frozenset({AccumKind.SUM, AccumKind.MEAN, AccumKind.SUM_TODIMX})


class CombineError(OptimizerError):
    """A kernel that reads split-KV partials does not have the form the stable combine supports."""


def _splits(producer: BlockGraph, output: int) -> int:
    """How many blocks of ``producer`` write side by side along the last dim of ``output``."""
    saver = producer.nodes[producer.output_nodes[output]].attrs
    rank = producer.result_types[output].rank
    axes = [a for a, d in enumerate(saver.output_map) if d == rank - 1 and producer.grid_dim[a] > 1]
    return producer.grid_dim[axes[0]] if axes else 1


def combine_kernel(graph: KernelGraph, index: int, kernel: int, producer: BlockGraph,
                   partials: tuple[PartialOutput, ...]) -> Node:
    """The stable version of graph-defined op ``index``, which reads partials of op ``kernel``.

    ``producer`` is the rewritten block graph of ``kernel`` (it has the maxima outputs).
    """
    node = graph.nodes[index]
    block: BlockGraph = node.attrs
    by_output = {p.output: p for p in partials}
    if block.forloop_range != 1:
        raise CombineError(f"combine %{index} has forloop_range {block.forloop_range}; the rewrite "
                           "needs 1 (it uses the for-loop to walk the splits)")
    iterators = block.input_nodes
    sources = [node.inputs[b] for b in range(len(iterators))]
    for b, src in enumerate(sources):
        if src.node != kernel or src.index not in by_output:
            raise CombineError(f"combine %{index}: input {b} is not a partial result of %{kernel}")
    read = [by_output[s.index] for s in sources]
    if len({(p.site, p.maxima) for p in read}) != 1:
        raise CombineError(f"combine %{index} reads partials with different row maxima")
    maxima = read[0].maxima
    splits = _splits(producer, read[0].output)
    maxima_type = producer.result_types[maxima]
    uses = block.consumers()
    maps = set()
    accumulators: dict[int, int] = {}  # accumulator node -> width of one split
    for i in iterators:
        it = block.nodes[i].attrs
        last = it.source.rank - 1
        maps.add(it.input_map)
        splits_last = any(d == last and block.grid_dim[a] > 1 for a, d in enumerate(it.input_map))
        if it.forloop_dim != -1 or splits_last:
            raise CombineError(f"combine %{index}: input %{i} splits the last dim of a partial")
        if maxima_type.shape[:-1] != it.source.shape[:-1] or maxima_type.shape[-1] != splits:
            raise CombineError(f"combine %{index}: maxima {list(maxima_type.shape)} do not match partial "
                               f"{list(it.source.shape)} with {splits} splits")
        width = it.source.shape[-1] // splits
        for reader in set(uses[Ref(i, 0)]):
            accum = block.nodes[reader]
            if accum.op is not Op.ACCUM or accum.attrs.kind not in COMBINABLE:
                raise CombineError(f"combine %{index}: partial %{i} is read by {accum.op.value} "
                                   "(only sum, mean and sum_todimx accumulators can combine)")
            if accum.attrs.kind is AccumKind.SUM_TODIMX and width % block.reduction_dimx:
                raise CombineError(f"combine %{index}: split width {width} is not a multiple of "
                                   f"reduction_dimx={block.reduction_dimx}")
            accumulators[reader] = width
    if len(maps) != 1:
        raise CombineError(f"combine %{index}: partials are read with different input maps")
    rows = (*block.nodes[iterators[0]].outputs[0].shape[:-1], 1)
    _check_degrees(block, set(accumulators), rows, index)
    (input_map,) = maps
    rw = BlockRewriter(block, forloop_range=splits)
    bindings: list[Ref] = []
    weight: tuple[Ref, Ref] | None = None
    for i, old in enumerate(block.nodes):
        if old.op is Op.INPUT:
            rw.alias(Ref(i, 0), rw.emit_input(old, forloop_dim=old.attrs.source.rank - 1))
            bindings.append(sources[iterators.index(i)])
        elif i in accumulators:
            if weight is None:
                tile_max = rw.emit_iterator(maxima_type, input_map, maxima_type.rank - 1)
                bindings.append(Ref(kernel, maxima))
                g = rw.emit(Op.RUNNING_MAX, (tile_max,))
                weight = (g, rw.emit(Op.EXP, (rw.emit(Op.SUB, (tile_max, g)),)))
            g, w = weight
            term = rw.emit(Op.MUL, (rw.ref(old.inputs[0]), w))
            full = block.type_of(old.inputs[0]).shape[-1]
            rw.alias(Ref(i, 0), rescaled_accumulator(rw, old.attrs.kind, term, g, accumulators[i], full,
                                                     block.reduction_dimx))
        else:
            rw.copy(i)
    if rw.graph.result_types != block.result_types:
        raise CombineError(f"combine %{index}: the rewrite changed the output types")
    return dataclasses.replace(node, inputs=tuple(bindings), attrs=rw.graph)


def _check_degrees(block: BlockGraph, accumulators: set[int], rows: tuple[int, ...], index: int) -> None:
    """Every result of the combine must be free of the common factor exp(G)."""
    degrees: list[Degree] = []
    for i, node in enumerate(block.nodes):
        ins = [degrees[r.node] for r in node.inputs]
        if i in accumulators:
            degree: Degree | None = {0: 1}
        elif node.op is Op.OUTPUT:
            degree = ins[0]
            if degree:
                raise CombineError(f"combine %{index}: output %{i} is not a ratio of combined partials "
                                   "(its value would keep the factor exp(G))")
        else:
            degree = propagate(node, block.operand_types(node), ins)
        if degree is None:
            raise CombineError(f"combine %{index}: %{i} ({node.op.value}) does not commute with the "
                               "per-row factor")
        if degree and node.op is not Op.OUTPUT and not keeps_rows(node.outputs[0], rows):
            raise CombineError(f"combine %{index}: %{i} does not keep the rows of the partials")
        degrees.append(degree)
