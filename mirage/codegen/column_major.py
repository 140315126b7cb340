"""Inputs read in place where they arrive transposed.

A kernel input whose :class:`~mirage.mugraph.graph.KernelInput` says ``layout="col"`` is expected
column-major in its last two dims: a transposed view of a row-major tensor, as ``nn.Linear`` reads
``weight.T``.  A kernel copies such a tile row by row as it lies in memory (16-byte ``cp.async``, the
stored rows being the tile's columns) into a ``dev::Transposed`` shared tile, which a tensor-core
matmul reads as its B operand with ``ldmatrix`` without ``.trans``.  No row-major copy of the tensor
is made, neither before each call nor kept beside a parameter.

Only tiles that every reader can take so are read in place: a tile of 16-bit elements whose only
readers are matmuls taking it as B (``matmul``'s second operand, ``concat_matmul``'s third and
fourth), copied by the input iterators without a row-local loop or a multicast copy, with K (the
tile's second-to-last dim) whole 16-byte rows.  In an online-softmax chain, that is its K (Kᵀ of
``q @ k.transpose(-2, -1)``, which the chain then reads as keys lie in a row-major ``k``) without key
norms: the warp form reads it with ``ldmatrix``, the warpgroup form as wgmma's K-major B operand
(the form Q's tile has: D whole 64-element swizzle rows), copied by threads or, the stored tile being
a row-major box of the underlying tensor, by TMA (at most 256 keys a tile).
Where one reader of a kernel input cannot, the program reads that input row-major
(:attr:`Program.transposed_inputs` leaves it out), and a transposed argument is copied as before.

Views that are not dense are read in place through their strides: an input declared with
``KernelInput.strides`` (a head split ``x.view(s, h, d).transpose(0, 1)``, strides ``(d, h·d, 1)``, or
its keys transposed, ``(d, 1, h·d)`` with ``layout="col"``) gets input iterators that address it
through those strides (:func:`with_strides`), since every iterator addresses its tensor through a
``dev::Strides``; :attr:`CudaProgram.input_strides` lists them, and a call passing other strides is
copied into the declared ones (:func:`in_layout`).

>>> import mirage as mi
>>> from mirage.codegen import generate_cuda_program
>>> g = mi.new_kernel_graph("linear")
>>> X = g.new_input(dims=(8, 512), dtype=mi.float16)
>>> W = g.new_input(dims=(512, 1024), dtype=mi.float16, strides=(1, 512))  # weight.T of [1024, 512]
>>> tb = mi.new_threadblock_graph(grid_dim=(16, 1, 1), block_dim=(128, 1, 1), forloop_range=8)
>>> x = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
>>> w = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
>>> tb.new_output(tb.forloop_accum(tb.matmul(x, w)), output_map=(1, -1, -1))
>>> (Y,) = g.customized([X, W], tb)
>>> g.mark_output(Y)
>>> program = generate_cuda_program(g, target_cc=90)
>>> program.transposed_inputs
(1,)
>>> "mirage::dev::Transposed<" in program.code
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from mirage.mugraph.graph import DType, KernelGraph, KernelInput, Ref, rank4_split, same_strides
from mirage.mugraph.ops import Op
from mirage.optimizer.tma import MAX_BOX

# where a block op takes its B operands
B_OPERANDS = {Op.MATMUL: frozenset({1}), Op.CONCAT_MATMUL: frozenset({2, 3})}
SIXTEEN_BIT = frozenset({DType.FLOAT16, DType.BFLOAT16})


def readable_in_place(kernel, i: int) -> bool:
    """Whether block input ``i`` of prepared ``kernel`` can be copied into a ``dev::Transposed`` tile
    (see the module docstring)."""
    graph = kernel.block_graph
    node = graph.nodes[i]
    shape = node.outputs[0].shape
    chain = kernel.softmax_chain
    if chain is not None and (chain.key_norm is not None or graph.nodes[chain.qk].inputs[1] != Ref(i, 0)):
        return False  # in an online-softmax chain, only K (its Q·K's B), without key norms
    if chain is not None and chain.warpgroup and (shape[-2] % 64 or (i in kernel.tma_inputs
                                                                     and shape[-1] > MAX_BOX)):
        return False  # the warpgroup form's K-major B: stored rows of whole 64-element swizzle rows
    if kernel.row_loop is not None or i in kernel.multicast.inputs:
        return False
    if node.outputs[0].dtype not in SIXTEEN_BIT or len(shape) < 2 or shape[-2] % 8:
        return False
    readers = [(n, p) for n in graph.nodes for p, ref in enumerate(n.inputs) if ref == Ref(i, 0)]
    return bool(readers) and all(p in B_OPERANDS.get(n.op, ()) for n, p in readers)


def transposed_reads(prepared) -> tuple[tuple[int, ...], dict[int, frozenset[int]]]:
    """The kernel inputs of ``prepared`` (positions among the graph's inputs) that the program reads
    in place, and per graph-defined op the block input nodes that read them."""
    graph: KernelGraph = prepared.graph
    wanted = {n: p for p, n in enumerate(graph.input_nodes)
              if isinstance(graph.nodes[n].attrs, KernelInput) and graph.nodes[n].attrs.layout == "col"}
    readers: dict[int, list[tuple[int, int]]] = {n: [] for n in wanted}
    legal: dict[int, bool] = dict.fromkeys(wanted, True)
    for kernel in prepared.kernels:
        for position, ref in enumerate(graph.nodes[kernel.node].inputs):
            if ref.node in wanted:
                i = kernel.block_graph.input_nodes[position]
                readers[ref.node].append((kernel.node, i))
                legal[ref.node] = legal[ref.node] and readable_in_place(kernel, i)
    chosen = [n for n in wanted if legal[n] and readers[n]]
    per_kernel: dict[int, set[int]] = {}
    for n in chosen:
        for kernel_node, i in readers[n]:
            per_kernel.setdefault(kernel_node, set()).add(i)
    return (tuple(sorted(wanted[n] for n in chosen)),
            {k: frozenset(v) for k, v in per_kernel.items()})


def strided_reads(graph: KernelGraph, transposed_inputs: Iterable[int],
                  split_inputs: Iterable[int] = ()) -> dict[int, tuple[int, ...]]:
    """The inputs of ``graph`` (positions among its inputs) that the program reads in place through
    the strides they are declared with (``KernelInput.strides``: a view such as a head split), and
    those strides: every input iterator addresses its tensor through strides, so each such input
    whose layout the program keeps (a "col" one only where it is read transposed, one with split dims
    only where ``split_inputs`` has it: :func:`split_reads`) is read so."""
    transposed, split = set(transposed_inputs), set(split_inputs)
    out = {}
    for p, n in enumerate(graph.input_nodes):
        attrs = graph.nodes[n].attrs
        if (isinstance(attrs, KernelInput) and attrs.strides and (attrs.layout != "col" or p in transposed)
                and (not attrs.split_strides or p in split)):
            out[p] = attrs.strides
    return out


def split_reads(graph: KernelGraph, contexts: dict,
                kernel_inputs: dict[int, Sequence[int]]) -> tuple[int, ...]:
    """The inputs with split dims (``KernelInput.split_strides``; positions among the graph's inputs) that
    every reader takes in place: graph-defined ops only, whose iterators copy by threads (no tensor
    map), never step a split dim in their for-loop and fill tiles whose extent along it divides its
    inner extent (a tile never straddles the split: ``dev::Strides``), or along a split last dim is a
    multiple of it (``dev::InputIterator::column_offset``). ``contexts``: each kernel's
    lowered context by node; ``kernel_inputs``: each kernel parameter's input position by node."""
    split = {p: graph.nodes[n].attrs.splits() for p, n in enumerate(graph.input_nodes)
             if isinstance(graph.nodes[n].attrs, KernelInput) and graph.nodes[n].attrs.split_strides}
    if not split:
        return ()
    legal = dict.fromkeys(split, True)
    positions = {n: p for p, n in enumerate(graph.input_nodes)}
    for node in graph.nodes:  # an op run through torch would take the view for the graph's shape
        if node.op is not Op.CUSTOMIZED:
            for ref in node.inputs:
                if positions.get(ref.node) in legal:
                    legal[positions[ref.node]] = False
    for k, context in contexts.items():
        for it in context.iterators:
            p = kernel_inputs[k][int(it.parameter.removeprefix("input"))]
            if p not in split or it.generated:
                continue
            rank = len(graph.type_of(Ref(graph.input_nodes[p], 0)).shape)
            for d, (inner, _) in split[p].items():
                d4 = d + 4 - rank
                extent = it.tile.layout.dims[d4]
                # the last dim (a broadcast inner part) also splits within a tile that starts its spans
                # (dev::InputIterator::column_offset); never a tile read transposed
                fits = inner % extent == 0 or (d4 == 3 and extent % inner == 0 and it.view is None)
                fits = fits and not (d4 == 3 and it.multicast > 1)  # dev::InputIterator's BroadcastRows only
                legal[p] = legal[p] and not it.tma and it.forloop_dim != d4 and fits
    return tuple(sorted(p for p in split if legal[p]))


def with_strides(context, kernel_inputs: Sequence[int], strides: dict[int, tuple[int, ...]],
                 splits: dict[int, dict[int, tuple[int, int]]] | None = None):
    """Kernel ``context`` with its iterators over the strided inputs (positions among the graph's
    inputs, ``kernel_inputs`` giving each kernel parameter's) addressing them through their strides,
    rank-4 and, for a tile read transposed, as stored (the last two swapped, as :func:`iterated` swaps
    the dims); ``splits``: the split dims of those that have them (``KernelInput.splits``)."""
    if not strides:
        return context
    iterators = []
    for it in context.iterators:
        position = kernel_inputs[int(it.parameter.removeprefix("input"))]
        given = strides.get(position)
        if given is not None and not it.generated:
            padded = (given[0] * it.source_dims[4 - len(given)],) * (4 - len(given)) + tuple(given)
            if it.view is not None:
                padded = (*padded[:2], padded[3], padded[2])
            split = (splits or {}).get(position)  # never a transposed tile's stored dims: no swap
            it = dataclasses.replace(it, source_strides=padded,
                                     source_split=rank4_split(split, len(given)) if split else None)
        iterators.append(it)
    return dataclasses.replace(context, iterators=tuple(iterators))


def in_layout(tensor, transposed: bool, strides: Sequence[int] | None = None,
              view: tuple[tuple[int, ...], tuple[int, ...]] | None = None):
    """``tensor`` as a kernel reads it: row-major, or column-major in its last two dims where the
    program reads it in place so (``CudaProgram.transposed_inputs``), or with the ``strides`` the
    program reads it through (``CudaProgram.input_strides``), or as the view of split dims ``view``
    (its shape and strides: ``CudaProgram.input_views``), which it may arrive as or in the graph's
    shape; a copy only where it is not."""
    if view is not None:
        if tuple(tensor.shape) != view[0]:
            tensor = tensor.reshape(view[0])
        return tensor if same_strides(view[0], tensor.stride(), view[1]) else torch_strided(tensor, view[1])
    if strides is not None:
        if same_strides(tensor.shape, tensor.stride(), strides):
            return tensor
        return torch_strided(tensor, strides)
    if not transposed:
        return tensor.contiguous()
    return tensor if tensor.mT.is_contiguous() else tensor.mT.contiguous().mT


def torch_strided(tensor, strides: Sequence[int]):
    """A copy of ``tensor`` laid out with element ``strides``.  A dim of stride 0 (a broadcast) must be
    one in ``tensor`` too (else its values may differ along it: :class:`LaunchError`); its first slice
    is copied and expanded."""
    import torch

    shape = tuple(tensor.shape)
    broadcast = [d for d, (s, n) in enumerate(zip(strides, shape, strict=True)) if s == 0 and n > 1]
    if any(tensor.stride(d) != 0 for d in broadcast):
        from mirage.codegen.runtime import LaunchError

        raise LaunchError(f"an input of shape {list(shape)} is read as a broadcast along dims {broadcast} "
                          f"(strides {tuple(strides)}) but arrives with strides {tuple(tensor.stride())}: "
                          "pass a tensor expanded along those dims (tensor.expand), or build the graph "
                          "without the broadcast strides")
    compact = tuple(1 if d in broadcast else n for d, n in enumerate(shape))
    first = tensor[tuple(slice(0, 1) if d in broadcast else slice(None) for d in range(len(shape)))]
    out = torch.empty_strided(compact, tuple(s or 1 for s in strides), dtype=tensor.dtype,
                              device=tensor.device)
    return out.copy_(first).expand(shape)


def iterated(layout, source_dims: tuple[int, ...], input_map: tuple[int, ...], forloop_dim: int):
    """What an input iterator copies: (the layout it fills, the layout the steps read where that
    differs, else None, the source's rank-4 dims, grid map, loop dim).  A tile read in place is
    copied as it lies in memory: the transposed problem in row-major terms, its stored layout, with the
    last two dims swapped in the source's dims, the grid map and the loop dim."""
    if not layout.transposed:
        return layout, None, source_dims, input_map, forloop_dim
    swap = {2: 3, 3: 2}
    return (layout.stored, layout, (*source_dims[:2], source_dims[3], source_dims[2]),
            tuple(swap.get(d, d) for d in input_map), swap.get(forloop_dim, forloop_dim))


def with_transposed_inputs(graph: KernelGraph, positions: Iterable[int]) -> KernelGraph:
    """``graph`` with its inputs at ``positions`` (among its inputs) declared column-major
    (``layout="col"``): what a caller passing ``weight.T`` there promises.  The function computed is
    the same; calls may still pass any layout."""
    positions = set(positions)
    inputs = graph.input_nodes
    if not positions <= set(range(len(inputs))) or any(len(graph.nodes[inputs[p]].outputs[0].shape) < 2
                                                          for p in positions):
        raise ValueError(f"positions {sorted(positions)} are not inputs of 2 or more dims of a graph with "
                         f"{len(inputs)} input(s)")
    nodes = list(graph.nodes)
    for p in positions:
        node = nodes[inputs[p]]
        nodes[inputs[p]] = dataclasses.replace(node, attrs=dataclasses.replace(node.attrs, layout="col"))
    return dataclasses.replace(graph, nodes=tuple(nodes))
