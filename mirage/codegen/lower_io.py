"""Lowering of a kernel's inputs and outputs: the input iterators' and output savers' records
(:class:`~mirage.codegen.lower_context.InputIteratorContext`, ``OutputSaverContext``), with where each
block's tile lies in the device tensor (uneven grids' ``tile_ends``), and the kernel's parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mirage.codegen import column_major
from mirage.codegen import lower_context as ctx
from mirage.codegen.lower_ops import element_type, rank4, rank4_dim, rank4_map, tile_layout
from mirage.optimizer.memory import BufferKind

if TYPE_CHECKING:
    from mirage.codegen.lower import KernelLowering


def iterator(lw: KernelLowering, k: int, i: int) -> ctx.InputIteratorContext:
    """Input iterator node ``i``, the kernel's ``k``-th input: a computed causal mask (nothing copied),
    a row-local loop's direct reads (no shared tile), or a tile copied into shared memory."""
    it = lw.graph.nodes[i].attrs
    dims = rank4(it.source.shape)
    dim_map = rank4_map(it.source.rank, it.input_map, lw.graph.grid_dim)
    forloop_dim = rank4_dim(it.source.rank, it.forloop_dim)
    common = {"name": f"in{i}", "node": i, "parameter": f"input{k}"}
    if lw.softmax is not None and lw.softmax.mask_rows and i == lw.softmax.column:
        tile = lw.generated_tile(i)  # the chain computes the mask from indices: nothing copied
        return ctx.InputIteratorContext(**common, tile=tile, source_dims=dims, input_map=dim_map,
                                        forloop_dim=forloop_dim, stages=1, pipelined=False,
                                        generated=lw.softmax.mask_rows,
                                        tile_ends=_ends(lw, dims, dim_map, tile.layout.dims))
    if lw.row_loop is not None and i in lw.row_loop.plan.direct:
        element = lw.element(i)
        layout = tile_layout(lw.graph.nodes[i].outputs[0].shape, element, 1 << 30, False)  # dense
        return ctx.InputIteratorContext(**common, tile=ctx.Tile(f"t{i}", element, layout, -1),
                                        source_dims=dims, input_map=dim_map, forloop_dim=forloop_dim,
                                        stages=1, pipelined=False, direct=True,
                                        tile_ends=_ends(lw, dims, dim_map, layout.dims))
    buffer = lw.kernel.memory.buffer_of(i)
    pipelined = buffer.kind is BufferKind.INPUT_STAGES
    tile = lw.tile(i)
    grid = lw.graph.grid_dim
    shared_by_blocks = any(grid[a] > 1 and it.input_map[a] == -1 for a in range(3))
    multicast = lw.kernel.multicast.size if i in lw.kernel.multicast.inputs and pipelined else 0
    tma = i in lw.kernel.tma_inputs and pipelined
    stored, view, dims, dim_map, forloop_dim = column_major.iterated(  # (a tile read in place)
        tile.layout, dims, dim_map, forloop_dim)
    return ctx.InputIteratorContext(
        **common,
        tile=ctx.Tile(tile.name, tile.element, stored, buffer.offset),
        view=view,
        source_dims=dims,
        input_map=dim_map,
        forloop_dim=forloop_dim,
        stages=buffer.slots if pipelined else 1,
        pipelined=pipelined,
        staggered=(lw.stagger_shared_loads and shared_by_blocks and tile.layout.rows > 1 and not multicast),
        evict_first=(lw.evict_first_streams and pipelined and not shared_by_blocks and not multicast
                     and not tma),
        multicast=multicast,
        barriers=lw.kernel.memory.barriers_of(i) if multicast or tma else -1,
        tma=tma,
        late=lw.softmax is not None and i in lw.softmax.late,
        tile_ends=_ends(lw, dims, dim_map, stored.dims),
    )


def direct_saver(lw: KernelLowering, i: int) -> ctx.OutputSaverContext:
    """Saver ``i``, for a result written from registers (no shared tile): its tile is the result's
    dense layout, what the writer's linear indices mean."""
    (src,) = lw.graph.nodes[i].inputs
    tile = ctx.Tile(f"t{src.node}", lw.element(src.node), lw.result_layout(src.node), -1)
    return saver(lw, lw.graph.output_nodes.index(i), i, tile)


def saver(lw: KernelLowering, j: int, i: int, tile: ctx.Tile | None = None) -> ctx.OutputSaverContext:
    """Output saver node ``i``, the kernel's ``j``-th output, saving ``tile`` (default: its operand's)."""
    node = lw.graph.nodes[i]
    (src,) = node.inputs
    target = node.outputs[0]
    tile = tile or lw.operand(src)
    output_map = rank4_map(target.rank, node.attrs.output_map, lw.graph.grid_dim)
    return ctx.OutputSaverContext(
        name=f"out{i}",
        node=i,
        parameter=f"output{j}",
        element=element_type(target.dtype, f"output %{i}"),
        tile=tile,
        target_dims=rank4(target.shape),
        output_map=output_map,
        **ctx.saver_layout(lw.output_strides[j] if j < len(lw.output_strides) else None),
        tile_ends=_ends(lw, rank4(target.shape), output_map, tile.layout.dims),
    )


def parameters(lw: KernelLowering) -> tuple[ctx.Parameter, ...]:
    """The kernel's parameters: its outputs, then its inputs."""
    def dtype(i: int, what: str) -> str:
        return element_type(lw.graph.nodes[i].outputs[0].dtype, what)

    outputs = [ctx.Parameter(f"output{j}", dtype(i, "an output"), True)
               for j, i in enumerate(lw.graph.output_nodes)]
    inputs = [ctx.Parameter(f"input{k}", dtype(i, "an input"), False)
              for k, i in enumerate(lw.graph.input_nodes)]
    return tuple(outputs + inputs)


def _ends(lw: KernelLowering, dims, dim_map, tile) -> tuple[str, str, str, str] | None:
    return ctx.tile_ends(lw.graph.spans, dims, dim_map, tile)
