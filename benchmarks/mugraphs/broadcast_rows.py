"""A gain of one value a channel read as rows of (channels of a group · positions), as a group norm's
frame holds it: through a last dim split over a broadcast (``KernelInput.split_last``), no copy."""

from __future__ import annotations

import mirage as mi


def gain_strides(batch: int, groups: int, per_group: int, positions: int) -> tuple:
    """A gain of one value a channel, as rows (batch · groups) of (channels of a group · positions)."""
    return (((batch, 0), (groups, per_group)), ((per_group, 1), (positions, 0)))


def scaled_rows(blocks: int, per_group: int = 8, positions: int = 256, threads: int = 128) -> mi.KernelGraph:
    """``silu(x · w)`` over 16 rows (2 images · 8 groups) of ``per_group · positions`` columns, ``w`` one
    value a channel read through :func:`gain_strides`; ``blocks`` blocks a row."""
    g = mi.new_kernel_graph()
    cols = per_group * positions
    x = g.new_input(dims=(16, cols), name="x")
    w = g.new_input(dims=(16, cols), strides=gain_strides(2, 8, per_group, positions), name="w")
    axis = 1 if blocks > 1 else -1
    tb = mi.new_threadblock_graph(grid_dim=(16, blocks, 1), block_dim=(threads, 1, 1), forloop_range=1)
    bx = tb.new_input(x, input_map=(0, axis, -1), forloop_dim=-1)
    bw = tb.new_input(w, input_map=(0, axis, -1), forloop_dim=-1)
    tb.new_output(tb.forloop_accum(tb.silu(tb.mul(bx, bw))), output_map=(0, axis, -1))
    (y,) = g.customized([x, w], tb)
    g.mark_output(y)
    return g.freeze()
