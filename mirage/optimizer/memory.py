"""Shared-memory planning from tensor lifetimes (mirage-notes §5.3).

Time is the sequence of schedule levels (the steps between two barriers): pre-loop levels, then the
loop's levels, then the post-loop levels.  A buffer lives from the level that writes it to the last
level that reads it; state carried across iterations lives through the whole loop:

* ``TILE``: the result of an op or of a non-pipelined input iterator, in the tensor's dtype;
* ``INPUT_STAGES``: a pipelined input (a for-loop dim and ``forloop_range > 1``): ``stages`` copies of
  its tile, so the copies for the next iterations land while this one computes (2 = double, 3 =
  triple buffering); alive through the loop;
* ``ACCUMULATOR``: an accumulator's state, in ``accumulator_dtype`` (fp32), alive through the loop
  and up to its last reader (two slots for a ``max`` accumulator: its value and the previous one);
  a register-resident accumulator only gets a buffer for its write-back, alive after the loop;
* ``RUNNING_MAX``: two slots (the maximum of this iteration and of the previous one, which rescaling
  accumulators read), alive through the loop.

Loop state is cleared, and pipelined inputs are first fetched (the prologue), in the last pre-loop
level (the first loop level when there is no pre-loop phase), so their lifetimes start there; with
``early_prologue`` the pipelined inputs are fetched at the first pre-loop level instead, so that
their copies fly while the pre-loop steps wait for their own operands and compute.

Results consumed in registers (epilogue producers) get no buffer.  Sizes include layout padding and
are rounded up to 128 bytes; an input tile that may be read in place transposed (``transposed``: its
kernel input is declared column-major, codegen.column_major) is sized to hold its transpose too, the
stored rows padded by one 16-byte vector against ldmatrix's bank conflicts.  The Q, K and V tiles
of a warpgroup softmax chain (``swizzled``) are stored unpadded in the 128-byte swizzled form that
sm_90's warpgroup MMA reads, and start on a 1024-byte boundary (the swizzle pattern repeats every 8
rows of 128 bytes).  Three online fits — first-fit,
best-fit and worst-fit — each over two orders (by start time, by size) place the buffers; the plan
with the lowest peak wins.  A plan over the target's shared memory raises
:class:`~mirage.errors.SharedMemoryError`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from mirage.errors import SharedMemoryError
from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import AccumKind, BlockGraph, Ref
from mirage.mugraph.ops import Op
from mirage.mugraph.target import DEFAULT_TARGET, Target
from mirage.optimizer.layout import TensorLayout
from mirage.optimizer.registers import RegisterPlan
from mirage.optimizer.schedule import Action, Barrier, Phase, Schedule

ALIGNMENT = 128
SWIZZLE_ALIGNMENT = 1024  # a 128-byte swizzled tile (dev::Swizzled128Layout) starts on this boundary
SLOT_BARRIER_BYTES = 16  # a multicast slot's `full` and `empty` barriers (optimizer.multicast)


class BufferKind(enum.Enum):
    TILE = "tile"
    INPUT_STAGES = "input_stages"
    ACCUMULATOR = "accumulator"
    RUNNING_MAX = "running_max"


@dataclass(frozen=True)
class Buffer:
    node: int  # the block-graph node whose result (or state) it holds
    kind: BufferKind
    slots: int  # stages of a pipelined input, 2 for a running max, else 1
    slot_bytes: int  # bytes of one slot (a multiple of ALIGNMENT); slot k starts at offset + k·slot_bytes
    start: int  # first level alive (inclusive)
    end: int  # last level alive (inclusive)
    offset: int = -1  # byte offset in the block's shared memory (set by the plan)
    align: int = ALIGNMENT  # the offset's alignment (SWIZZLE_ALIGNMENT for a swizzled tile)

    @property
    def size(self) -> int:
        return self.slots * self.slot_bytes

    def overlaps_in_time(self, other: Buffer) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class MemoryPlan:
    buffers: tuple[Buffer, ...]
    total: int  # peak bytes: what the kernel requests as dynamic shared memory
    strategy: str  # the fit and order that won, e.g. "best_fit/by_start"
    candidates: tuple[tuple[str, int], ...]  # peak of every fit tried
    levels: int  # length of the timeline
    barriers: tuple[tuple[int, int], ...] = ()  # (multicast or tma input, offset of its slots' barriers)
    early_prologue: bool = False  # the pipeline prologue runs at the first pre-loop level (lifetimes)

    def buffer_of(self, node: int, kind: BufferKind | None = None) -> Buffer:
        for b in self.buffers:
            if b.node == node and (kind is None or b.kind is kind):
                return b
        raise KeyError(f"node %{node} has no shared-memory buffer")

    def barriers_of(self, node: int) -> int:
        """Where the slot barriers of multicast or tma input ``node`` start (after the buffers)."""
        return dict(self.barriers)[node]

    def live_bytes(self) -> int:
        """The most bytes alive at one level: a lower bound on any plan's peak."""
        return max((sum(b.size for b in self.buffers if b.start <= t <= b.end) for t in range(self.levels)),
                   default=0)


def _align(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


def timeline(schedule: Schedule) -> tuple[dict[int, int], dict[int, int], dict[Phase, tuple[int, int]]]:
    """Levels of every node's step and of every finalize step, and each phase's first and last level."""
    main: dict[int, int] = {}
    finalize: dict[int, int] = {}
    spans: dict[Phase, tuple[int, int]] = {}
    level = 0
    for item in schedule.items:
        if isinstance(item, Barrier):
            level += 1
            continue
        (finalize if item.action is Action.FINALIZE else main)[item.node] = level
        spans[item.phase] = (spans.get(item.phase, (level, level))[0], level)
    return main, finalize, spans


def lifetimes(graph: BlockGraph, schedule: Schedule, registers: RegisterPlan,
              layouts: dict[int, TensorLayout] | None = None, stages: int = 2,
              accumulator_dtype: DType = DType.FLOAT32,
              in_registers_only: frozenset[int] = frozenset(),
              read_at: dict[int, int] | None = None,
              multicast: frozenset[int] = frozenset(),
              swizzled: frozenset[int] = frozenset(),
              late: frozenset[int] = frozenset(),
              early_prologue: bool = False,
              transposed: frozenset[int] = frozenset()) -> tuple[list[Buffer], int]:
    """The buffers of ``graph`` with their lifetimes (unplaced), and the timeline length.
    ``in_registers_only``: nodes computed in registers by a chain step (no buffer); ``read_at``:
    nodes that read their operands at another node's step (a chain step runs at its anchor) and
    not at their own, which would end the operands' lifetimes too early; ``multicast``: pipelined
    inputs that keep one slot more than ``stages`` (optimizer.multicast); ``swizzled``: tiles stored
    unpadded and 1024-byte aligned (a warpgroup chain's Q, K and V); ``late``: pipelined inputs read
    one iteration late, which keep one slot more too (a warpgroup chain's V); ``early_prologue``:
    pipelined inputs are first fetched at the first pre-loop level."""
    main, finalize, spans = timeline(schedule)
    reads = {c: max(level, main[read_at[c]]) if c in (read_at or {}) else level for c, level in main.items()}
    loop = spans.get(Phase.LOOP)
    # loop state is cleared, and pipelined inputs are first fetched, in the last pre-loop level
    prologue = spans[Phase.PRE_LOOP][1] if Phase.PRE_LOOP in spans else (loop[0] if loop else 0)
    fetched = spans[Phase.PRE_LOOP][0] if early_prologue and Phase.PRE_LOOP in spans else prologue
    uses = graph.consumers()
    in_registers = set(registers.accumulators)
    buffers: list[Buffer] = []
    for i, node in enumerate(graph.nodes):
        if node.op is Op.OUTPUT or i in registers.register_only or i in in_registers_only:
            continue
        t = node.outputs[0]
        elements = layouts[i].physical_elements if layouts and i in layouts and i not in swizzled else t.numel
        if i in transposed and i not in swizzled and t.rank >= 2:
            elements = max(elements, transposed_padded_elements(t.shape, t.dtype.itemsize))
        align = SWIZZLE_ALIGNMENT if i in swizzled else ALIGNMENT
        start = main[i]
        end = max([start, *(reads[c] for c in uses[Ref(i, 0)])])
        kind, slots, itemsize = BufferKind.TILE, 1, t.dtype.itemsize
        if node.op is Op.INPUT and node.attrs.forloop_dim >= 0 and graph.forloop_range > 1 and loop:
            kind, slots = BufferKind.INPUT_STAGES, max(stages, 1) + (i in multicast or i in late)
            start, end = fetched, max(end, loop[1])
        elif node.op in (Op.ACCUM, Op.ACCUM_RESCALE) and loop:
            kind, itemsize = BufferKind.ACCUMULATOR, accumulator_dtype.itemsize
            slots = 2 if node.attrs.kind is AccumKind.MAX else 1  # a max keeps its previous value too
            start = finalize[i] if i in in_registers else prologue
            end = max(end, start if i in in_registers else loop[1])
        elif node.op is Op.RUNNING_MAX and loop:
            kind, slots, itemsize = BufferKind.RUNNING_MAX, 2, accumulator_dtype.itemsize
            start, end = prologue, max(end, loop[1])
        elif loop and start < loop[0] <= end:
            end = max(end, loop[1])  # a pre-loop tile read in the loop is read every iteration
        buffers.append(Buffer(i, kind, slots, _align(elements * itemsize, align), start, end, align=align))
    return buffers, max([*main.values(), *finalize.values()], default=0) + 1


def transposed_padded_elements(shape: tuple[int, ...], itemsize: int) -> int:
    """Elements of a tile of ``shape`` stored transposed (its last two dims swapped), each stored row
    rounded up to 16 bytes and padded by one 16-byte vector."""
    align = 16 // itemsize
    rows = shape[-1]
    for d in shape[:-2]:
        rows *= d
    return rows * (-(-shape[-2] // align) * align + align)


Fit = Callable[[list[tuple[int, int]], int], int]


def _gaps(placed: list[Buffer], buffer: Buffer) -> list[tuple[int, int]]:
    """Free (offset, size) gaps below the top among buffers alive with ``buffer``, each starting on
    ``buffer``'s alignment; last gap unbounded."""
    busy = sorted((b.offset, b.offset + b.size) for b in placed if b.overlaps_in_time(buffer))
    gaps, cursor = [], 0
    for lo, hi in busy:
        start = _align(cursor, buffer.align)
        if lo > start:
            gaps.append((start, lo - start))
        cursor = max(cursor, hi)
    gaps.append((_align(cursor, buffer.align), -1))  # -1: unbounded
    return gaps


def first_fit(gaps: list[tuple[int, int]], size: int) -> int:
    return next(o for o, s in gaps if s < 0 or s >= size)


def best_fit(gaps: list[tuple[int, int]], size: int) -> int:
    fitting = [(s, o) for o, s in gaps if s >= size]
    return min(fitting)[1] if fitting else gaps[-1][0]


def worst_fit(gaps: list[tuple[int, int]], size: int) -> int:
    fitting = [(s, o) for o, s in gaps if s >= size]
    return max(fitting, key=lambda g: (g[0], -g[1]))[1] if fitting else gaps[-1][0]


FITS: dict[str, Fit] = {"first_fit": first_fit, "best_fit": best_fit, "worst_fit": worst_fit}
ORDERS: dict[str, Callable[[Buffer], tuple]] = {
    "by_start": lambda b: (b.start, -b.size, b.node),
    "by_size": lambda b: (-b.size, b.start, b.node),
}


def place(buffers: Sequence[Buffer], fit: Fit, order: Callable[[Buffer], tuple]) -> list[Buffer]:
    placed: list[Buffer] = []
    for b in sorted(buffers, key=order):
        placed.append(replace(b, offset=fit(_gaps(placed, b), b.size)))
    return placed


def pipeline_depth(graph: BlockGraph, layouts: dict[int, TensorLayout] | None, stages: int,
                   small_bytes: int, deepest: int) -> int:
    """Pipeline stages for ``graph``'s pipelined inputs: ``stages``, or more, up to ``deepest`` and
    never past the for-loop range, when one iteration's tiles total at most ``small_bytes`` — a
    loop over small tiles (a split-KV combine reads a few KB per split) waits on memory latency
    every iteration unless the copies of many iterations are in flight at once."""
    pipelined = [
        i for i, node in enumerate(graph.nodes)
        if node.op is Op.INPUT and node.attrs.forloop_dim >= 0 and graph.forloop_range > 1
    ]
    if not pipelined or stages <= 1:
        return stages  # no pipeline asked for
    per_iteration = 0
    for i in pipelined:
        t = graph.nodes[i].outputs[0]
        elements = layouts[i].physical_elements if layouts and i in layouts else t.numel
        per_iteration += elements * t.dtype.itemsize
    if per_iteration > small_bytes:
        return stages
    return max(stages, min(deepest, graph.forloop_range))


def plan_memory(graph: BlockGraph, schedule: Schedule, registers: RegisterPlan,
                layouts: dict[int, TensorLayout] | None = None, target: Target = DEFAULT_TARGET,
                stages: int = 2, accumulator_dtype: DType = DType.FLOAT32,
                in_registers_only: frozenset[int] = frozenset(),
                read_at: dict[int, int] | None = None,
                multicast: frozenset[int] = frozenset(),
                swizzled: frozenset[int] = frozenset(),
                late: frozenset[int] = frozenset(),
                tma: frozenset[int] = frozenset(), early_prologue: bool = False,
                transposed: frozenset[int] = frozenset()) -> MemoryPlan:
    """Place every buffer of ``graph`` in shared memory (see the module docstring); ``multicast``
    and ``tma`` inputs' slot barriers follow the placed buffers.  ``early_prologue`` (no multicast
    inputs, whose copies meet their cluster in the prologue): see :func:`lifetimes`."""
    early_prologue = early_prologue and not multicast
    buffers, levels = lifetimes(graph, schedule, registers, layouts, stages, accumulator_dtype,
                                in_registers_only, read_at, multicast, swizzled, late, early_prologue,
                                transposed)
    best: tuple[int, str, list[Buffer]] | None = None
    candidates = []
    for fit_name, fit in FITS.items():
        for order_name, order in ORDERS.items():
            placed = place(buffers, fit, order)
            peak = max((b.offset + b.size for b in placed), default=0)
            name = f"{fit_name}/{order_name}"
            candidates.append((name, peak))
            if best is None or peak < best[0]:
                best = (peak, name, placed)
    assert best is not None
    peak, name, placed = best
    barriers = []
    if multicast or tma:  # each such input's slot barriers, one after another after the buffers
        peak = _align(peak)
        for b in sorted(placed, key=lambda b: b.node):
            if b.node in multicast | tma and b.kind is BufferKind.INPUT_STAGES:
                barriers.append((b.node, peak))
                peak += SLOT_BARRIER_BYTES * b.slots
    if peak > target.smem_per_block:
        raise SharedMemoryError(f"the block graph needs {peak} bytes of shared memory ({name}, {stages} "
                                f"input stages), more than the {target.smem_per_block} of {target.name}; "
                                "use fewer pipeline stages, a larger grid or forloop_range so tiles "
                                "get smaller")
    placed.sort(key=lambda b: b.node)
    return MemoryPlan(tuple(placed), peak, name, tuple(candidates), levels, tuple(barriers), early_prologue)
