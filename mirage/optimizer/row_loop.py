"""Row-local loops: for-loop bodies that every thread can run on its own elements, in registers.

A split-KV combine walks the key splits one per iteration: a running maximum of the splits' maxima
(one value per query row), rescale factors, a row sum and a [rows, 64] output accumulator.  Op by
op that is five shared-memory passes with a barrier between each two, for a few hundred values per
iteration.  But no value of such a body depends on another row, nor (beyond a broadcast of one value
per row) on another column: a thread that owns a chunk of consecutive columns of one row can run
the whole body for its elements, keep the accumulators and running maxima in registers, and leave
the shared tiles to the input iterators.  The loop then has no barrier besides the pipeline's.

:func:`match` accepts a block graph whose loop body has only

* element-wise ops (FUSED thread graphs or single ops) of operands of one of two shapes, the
  *wide* ``[.., R, W]`` and the *narrow* ``[.., R, 1]`` (broadcast along the row), leading dims 1;
* running maxima, and accumulators of kinds none, sum, mean and max whose sums run over a last dim
  of extent 1 (so that they are element-wise), rescaled (``accum_rescale``) or not;
* reductions over a dim of extent 1 (copies);

and whose loop values are read after the loop only through those accumulators and maxima.  The
accumulators' shared tiles are written once after the loop (:class:`RowLoop.states`); every other
loop value lives in registers only (:attr:`RowLoop.register_only`: no buffer in the memory plan).

Direct reads (:attr:`RowLoop.direct`).  An input tile that changes every iteration and that only the
loop body reads need not pass through shared memory at all: each thread reads its own elements of
it from global memory (16-byte vectors where the chunk allows).  When every such input is read
directly, the loop touches no shared memory, so it needs no barrier and no copy pipeline; unrolled,
the loads of all its iterations are in flight at once.  A split-KV combine then costs about one
memory round trip, where the staged loop paid a barrier and a pipeline wait per key split.

Row reductions (``row_reductions``).  A body may also reduce along its rows: a sum or max over the
last dim of a wide value (a narrow result) and rms_norm of a wide value.  Each thread reduces its own
chunk, the row's threads combine by warp shuffles, and where a row spans several warps, through one
float per warp in shared memory (:attr:`RowLoop.scratch_floats`) and one barrier.  Such a body must
have every thread on a row (``rows · row_threads`` = the block's threads), a power-of-two count of
threads per row, and, when its rows span warps, one iteration (a second use of the scratch would need a
second barrier).  With them a one-iteration kernel of element-wise ops and row norms (nGPT's update,
a layer's RMSNorm) runs in registers from its inputs' global memory to its output: every input read
once with 16-byte loads, no tile in shared memory (with the epilogues below).

Epilogues (``row_epilogues``).  Element-wise work after the loop over the states (a split-KV
combine's ``O / l``) runs in registers too (:attr:`RowLoop.post`, all or none), and what the output
savers read, states or post nodes, goes from registers to the device output
(:attr:`RowLoop.outputs`).  States that nothing else reads after the loop then get no shared tile
(:attr:`RowLoop.untiled`), and the write-back, its barrier and the savers' pass go.

Columns (``column_loops``).  A body whose tiles are ``[R, W]`` and ``[1, W]`` and whose reductions run
over dim -2 (a norm of every column, such as QKNorm's keys stored transposed) is the same loop on the
transposed tiles (:attr:`RowLoop.transposed`): the loop's rows are the tile's W columns, its width the R
tile rows, and each thread owns one column whole (``chunk = R``, one thread a row of the loop), so its
reductions need no other thread.  A warp's 32 threads hold 32 consecutive columns: each direct read
and each store of element ``e`` covers 32 neighbouring elements of one tile row.

Ragged rows (``ragged_rows``).  A width that no chunk of 1 to 64 columns divides (a slice of 1,733
columns: GPT-2's 50,257 split 29 ways), or whose chunks leave threads of a reducing block without a
row (2,000 columns: 125 chunks of 16 in a block of 128), gets the chunk that covers it with the
threads a row has, the row padded to ``row_threads · chunk`` columns (:attr:`RowLoop.padded`, by an
eighth of the row at most).  The padding's columns read nothing (a 0 in their registers), take no
part in a row reduction, and are neither stored nor written back; what element-wise ops make of
them stays in their registers.  Where whole chunks lie past the width (2,000 = 125 · 16), a
thread's chunk is read and stored whole, in 16-byte vectors where they align (:attr:`RowLoop.mask`);
where whole 16-byte groups do, group by group; where a group straddles it, element by element.
Ragged rows do not interleave.

Short rows (``short_rows``).  A body may also hold values of a second, short width ``S`` (at most
:data:`SHORT_CHUNK` columns a lane): a split reduction's partials, ``[R, S]`` a row, that the second
kernel of a split log_softmax or norm reduces to the row's logsumexp or statistics before it writes
its slice of the wide row.  The first ``min(row_threads, 32)`` lanes of a row
(:attr:`RowLoop.short_lanes`, all in one warp) each hold ``short_chunk`` consecutive columns of a
short value, the columns past ``S`` masked as a ragged row's, and reduce it by warp shuffles: no
barrier, and every thread of the row (each warp of a row does the same) gets the result.  The rows
fill the block then, as for row reductions.  A short value may be read, mapped and reduced to a
narrow one, but not mixed with wide values, kept across iterations or written out
(:attr:`RowLoop.short`, ``short_reductions``).

Interleaving (``row_interleave``).  A thread that holds more than 8 columns holds them in groups of 8
(:attr:`RowLoop.group`), group ``j`` at column ``(j · row_threads + lane) · 8``: each of a warp's
16-byte accesses then covers 512 contiguous bytes, where consecutive chunks of 16 or more columns a
thread would leave gaps between its lanes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from mirage.mugraph.graph import AccumKind, BlockGraph, Ref
from mirage.mugraph.ops import ELEMENTWISE, Op
from mirage.optimizer.graphs import NoMatch, require
from mirage.optimizer.schedule import Action, Phase, Schedule, Step

log = logging.getLogger(__name__)

ELEMENTWISE_KINDS = frozenset({AccumKind.NONE, AccumKind.SUM, AccumKind.MEAN, AccumKind.MAX})
VECTOR = 8  # columns of one 16-byte access of 16-bit elements: a thread's group when it holds more
COLUMN_ELEMENTS = 64  # the most tile rows a thread of a transposed loop holds (registers per wide value)


@dataclass(frozen=True)
class RowLoop:
    """The loop body of a block graph as per-thread code (see the module docstring)."""

    rows: int  # R
    width: int  # W
    chunk: int  # columns of a wide value per thread
    nodes: tuple[int, ...]  # loop nodes in execution order
    states: tuple[int, ...]  # accumulators and running maxima (registers across iterations)
    direct: tuple[int, ...] = ()  # per-iteration inputs read from global memory by each thread
    reductions: tuple[int, ...] = ()  # nodes reducing along a wide row (sum, max, rms_norm)
    outputs: tuple[tuple[int, int], ...] = ()  # (state or post node, saver): from registers to the output
    threads: int = 0  # of the block
    post: tuple[int, ...] = ()  # element-wise nodes after the loop, computed from the states in registers
    untiled: tuple[int, ...] = ()  # states that need no shared tile (read only by post nodes and savers)
    vector: int = 0  # a thread's columns come in groups of this many, interleaved across the row's
    # threads (0: one group, the chunk's consecutive columns)
    transposed: bool = False  # the loop's rows are the tiles' columns (see the module docstring)
    padded: int = 0  # a ragged row's columns with its padding (row_threads · chunk); 0: not ragged
    short: int = 0  # S of the short values (see the module docstring); 0: none
    short_reductions: tuple[int, ...] = ()  # nodes reducing a short value (by a warp's shuffles)

    @property
    def short_lanes(self) -> int:
        """Lanes of a row that hold a short value (the row's threads, at most a warp)."""
        return min(self.row_threads, 32)

    @property
    def short_chunk(self) -> int:
        """Columns of a short value a lane holds."""
        return -(-self.short // self.short_lanes) if self.short else 0

    @property
    def ragged(self) -> bool:
        return self.padded > self.width

    @property
    def mask(self) -> str:
        """How a ragged row's padding is masked: ``chunk`` where whole chunks lie past the width (a
        thread's chunk read and stored whole, 16-byte vectors allowed), ``vector`` where whole groups
        of :data:`VECTOR` columns do, ``element`` where a group straddles it; "" for a row with no
        padding."""
        return _mask(self.width, self.chunk) if self.ragged else ""

    @property
    def register_only(self) -> frozenset[int]:
        """Nodes with no shared-memory buffer: loop values in registers, the direct inputs, the
        post-loop nodes and the states that only they and output savers read."""
        return ((frozenset(self.nodes) - frozenset(self.states)) | frozenset(self.direct)
                | frozenset(self.untiled) | frozenset(self.post))

    @property
    def scratch_floats(self) -> int:
        """Shared floats the cross-warp combines use: one per warp and row reduction, when rows span
        warps (each reduction its own, so that one barrier each suffices)."""
        if self.row_threads <= 32:
            return 0
        return len(self.reductions) * self.threads // 32

    @property
    def row_threads(self) -> int:
        """Threads per row."""
        return (self.padded or self.width) // self.chunk

    @property
    def group(self) -> int:
        """Consecutive columns a thread holds: a chunk is ``chunk / group`` groups, group ``j`` of the
        thread of lane ``l`` (its index in the row) at column ``(j · row_threads + l) · group``."""
        return self.vector or self.chunk




def _rows_and_width(shape: tuple[int, ...], transposed: bool = False) -> tuple[int, int]:
    """(rows, width) of a tile in the loop's view: the tile's own, or its columns as the rows."""
    require(len(shape) >= 2 and math.prod(shape[:-2]) == 1,
             f"shape {list(shape)} is not one [rows, cols] tile")
    return (shape[-1], shape[-2]) if transposed else (shape[-2], shape[-1])


CHUNKS = (1, 2, 4, 8, 16, 32, 64)
MAX_PADDING = 8  # a ragged row's padding is at most an eighth of its width
SHORT_CHUNK = 8  # the most columns of a short value a lane holds (256 over a warp)


def _chunk(rows: int, width: int, threads: int) -> int | None:
    """Columns per thread: the fewest that let every (row, chunk) have a thread of its own."""
    for chunk in CHUNKS:
        if width % chunk == 0 and rows * (width // chunk) <= threads:
            return chunk
    return None


def _fills(rows: int, row_threads: int, threads: int) -> bool:
    """Whether rows of ``row_threads`` threads (a power of two) fill a block (what reductions need)."""
    return rows * row_threads == threads and row_threads & (row_threads - 1) == 0


def _mask(width: int, chunk: int) -> str:
    if width % chunk == 0:
        return "chunk"
    return "vector" if width % VECTOR == 0 and chunk % VECTOR == 0 else "element"


def _ragged(rows: int, width: int, threads: int, fill: bool) -> tuple[int, int] | None:
    """(chunk, padded width) of a ragged row: with ``fill`` (rows that reduce), the block's threads
    split evenly among the rows (a power of two a row) and the fewest columns a thread that cover
    the row; else the fewest columns a thread of :data:`CHUNKS` that leave a thread to every chunk.
    None where the padding would be more than a :data:`MAX_PADDING`-th of the row (2 rows of 64 in a
    block of 256 would leave half its threads idle at every shuffle).  A width of whole 16-byte
    vectors that no chunk divides takes a chunk of whole vectors, read and stored so: Llama 3's
    slices of 16,032 columns at 63 a thread, element by element, ran 3× slower than op by op, whose
    copies are 16-byte vectors.  Element masks are left to widths that no vector divides, which op
    by op reads element by element too."""
    found = None
    if fill:
        lanes = threads // rows
        chunk = -(-width // lanes)
        if width % chunk and width % VECTOR == 0:  # no whole chunks: whole vectors
            chunk = -(-chunk // VECTOR) * VECTOR
        if _fills(rows, lanes, threads) and chunk <= CHUNKS[-1]:
            found = chunk, lanes
    else:
        found = next(((c, -(-width // c)) for c in CHUNKS if rows * -(-width // c) <= threads), None)
    if found is None or (found[0] * found[1] - width) * MAX_PADDING > width:
        return None
    return found[0], found[0] * found[1]


def _direct_inputs(graph: BlockGraph, members: set[int]) -> tuple[int, ...]:
    """The inputs that change every iteration (every input of a one-iteration loop), if the loop
    body is their only reader (all or none: one staged input would bring back the pipeline and its
    barriers)."""
    uses = graph.consumers()
    varying = tuple(i for i in graph.input_nodes
                    if graph.forloop_range == 1 or graph.nodes[i].attrs.forloop_dim >= 0)
    if all(reader in members for i in varying for reader in uses.get(Ref(i, 0), [])):
        return varying
    return ()


def _row_reduction(graph: BlockGraph, i: int, width: int, transposed: bool = False) -> bool:
    """Whether node ``i`` reduces along a wide row of the loop's view (else it is a copy, or not
    row-local): the tile's last dim, or with ``transposed`` its dim -2."""
    node = graph.nodes[i]
    source = graph.type_of(node.inputs[0]).shape
    if node.op is Op.RMS_NORM:
        require(not transposed or source[-1] == 1, f"%{i}: rms_norm along the rows of a column loop")
        return width > 1 and source[-1] == width
    along = len(source) - (2 if transposed else 1)
    require(source[node.attrs.dim] == 1 or node.attrs.dim == along,
            f"%{i} reduces a dim other than the row's")
    return source[node.attrs.dim] > 1


def _post(graph: BlockGraph, schedule: Schedule, states: list[int], rows: int, width: int,
          transposed: bool = False) -> tuple[int, ...]:
    """The post-loop nodes, if every one is element-wise over the states and earlier ones (rows ×
    (1 or W)) and read only by later ones and output savers: computed in registers after the loop."""
    post = [item.node for item in schedule.items
            if isinstance(item, Step) and item.phase is Phase.POST_LOOP and item.action is not Action.STORE]
    uses = graph.consumers()
    savers = set(graph.output_nodes)
    known = set(states)
    for i in post:
        node = graph.nodes[i]
        require(node.op is Op.FUSED or node.op in ELEMENTWISE, f"%{i} ({node.op.value}) after the loop")
        require(all(r.node in known and r.index == 0 for r in node.inputs),
                f"%{i} reads more than the states")
        shape = _rows_and_width(graph.type_of(Ref(i)).shape, transposed)
        require(shape[0] == rows and shape[1] in (1, width), f"%{i} is not rows × (1 or W)")
        require(set(uses.get(Ref(i, 0), [])) <= set(post) | savers, f"%{i} is read by more than the savers")
        known.add(i)
    return tuple(post)


def _epilogue(graph: BlockGraph, schedule: Schedule, members: set[int], states: list[int], rows: int,
              width: int, transposed: bool = False
              ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...]]:
    """(post nodes, untiled states, outputs): what runs after the loop in registers, the states no
    one reads from a tile then, and the savers written from registers."""
    try:
        post = _post(graph, schedule, states, rows, width, transposed)
    except NoMatch as reason:
        log.debug("after the loop op by op: %s", reason)
        post = ()
    uses = graph.consumers()
    savers = set(graph.output_nodes)
    untiled = tuple(i for i in states if set(uses.get(Ref(i, 0), [])) - members <= set(post) | savers)
    outputs = tuple((graph.nodes[i].inputs[0].node, i) for i in graph.output_nodes
                    if graph.nodes[i].inputs[0].node in set(untiled) | set(post))
    return post, untiled, outputs


def _loop_nodes(schedule: Schedule) -> list[int]:
    loop = [item.node for item in schedule.items
            if isinstance(item, Step) and item.phase is Phase.LOOP and item.epilogue_of is None
            and item.action in (Action.COMPUTE, Action.ACCUMULATE)]
    loop += [item.node for item in schedule.items
             if isinstance(item, Step) and item.phase is Phase.LOOP and item.epilogue_of is not None]
    return sorted(set(loop))  # node order is a topological order


def _states_and_reductions(graph: BlockGraph, order: list[int], width: int, reductions: bool,
                           transposed: bool, short: int = 0) -> tuple[list[int], list[int], list[int]]:
    """The loop's states (accumulators, running maxima), its reductions along a wide row and those
    of short values."""
    members = set(order)
    along = -2 if transposed else -1  # the tile dim of the loop's rows
    states, reducing, short_reducing = [], [], []
    for i in order:
        node = graph.nodes[i]
        op = node.op
        if op is Op.FUSED or op in ELEMENTWISE:
            continue
        if op is Op.RUNNING_MAX:
            require(graph.type_of(node.inputs[0]).shape[along] == 1, "a running max of a wide value")
            states.append(i)
        elif op in (Op.ACCUM, Op.ACCUM_RESCALE):
            kind = node.attrs.kind
            source = graph.type_of(node.inputs[0])
            elementwise = kind in ELEMENTWISE_KINDS and (
                kind in (AccumKind.NONE, AccumKind.MAX) or source.shape[along] == 1
            )
            require(elementwise, f"%{i}: a {kind.value} accumulator that is not element-wise")
            require(not short or graph.type_of(Ref(i)).shape[-1] != short, f"%{i}: a short state")
            if op is Op.ACCUM_RESCALE:
                require(node.inputs[1].node in members, f"%{i} rescales by a maximum outside the loop")
            states.append(i)
        elif op in (Op.REDUCTION, Op.REDUCTION_MAX, Op.RMS_NORM):
            require(reductions or op is not Op.RMS_NORM, f"%{i}: rms_norm in the loop body")
            source = graph.type_of(node.inputs[0]).shape
            if short and source[-1] == short:
                require(op is not Op.RMS_NORM and node.attrs.dim == len(source) - 1,
                        f"%{i}: a short value's rms_norm, or a reduction across its rows")
                short_reducing.append(i)
            elif _row_reduction(graph, i, width, transposed):
                require(reductions, f"%{i} reduces along the row")
                reducing.append(i)
        else:
            raise NoMatch(f"%{i}: {op.value} in the loop body")
    return states, reducing, short_reducing


def _match(graph: BlockGraph, schedule: Schedule, direct_loads: bool, reductions: bool,
           epilogues: bool, interleave: bool, transposed: bool = False, ragged: bool = True,
           short_rows: bool = True) -> RowLoop:
    require(graph.forloop_range > 1 or reductions, "a one-iteration loop")
    order = _loop_nodes(schedule)
    require(bool(order), "an empty loop body")
    members = set(order)
    shapes = {graph.type_of(Ref(i)).shape for i in order}
    shapes |= {graph.type_of(r).shape for i in order for r in graph.nodes[i].inputs}
    dims = {_rows_and_width(s, transposed) for s in shapes}
    rows = {r for r, _ in dims}
    widths = {w for _, w in dims} - {1}
    short = min(widths) if len(widths) == 2 and short_rows and reductions and not transposed else 0
    require(len(rows) == 1 and len(widths - {short}) <= 1,
            f"tiles of shapes {sorted(dims)}: not rows × (1 or W)")
    (r,) = rows
    width = max(widths) if widths else 1
    states, reducing, short_reducing = _states_and_reductions(graph, order, width, reductions, transposed,
                                                              short)
    uses = graph.consumers()
    for i in order:
        if i in states:
            continue
        readers = set(uses.get(Ref(i, 0), []))
        require(readers <= members, f"%{i} is read after the loop")
    threads = math.prod(graph.block_dim)
    if transposed:  # a whole column a thread: no thread shares a reduction
        require(bool(reducing), "no reduction over the columns")
        require(width <= COLUMN_ELEMENTS, f"columns of {width} elements: more than a thread holds")
        require(r <= threads, f"{r} columns need more threads than the block has")
        require(2 * r >= threads, f"{r} columns leave more than half of {threads} threads idle")
        chunk = width
    padded = 0
    if not transposed:
        fill = bool(reducing) or bool(short)  # shuffles need every thread of a row
        chunk = _chunk(r, width, threads)
        unfilled = chunk is not None and fill and not _fills(r, width // chunk, threads)
        if (chunk is None or unfilled) and ragged:
            chunk, padded = _ragged(r, width, threads, fill) or (chunk, 0)
        require(chunk is not None, f"{r} rows × {width} columns need more threads than the block has")
    row_threads = (padded or width) // chunk
    if short:
        require(_fills(r, row_threads, threads), f"{r} rows of {row_threads} threads hold short values")
        require(-(-short // min(row_threads, 32)) <= SHORT_CHUNK, f"short values of {short} columns")
    if reducing and not transposed:
        require(_fills(r, row_threads, threads),
                f"{r} rows of {row_threads} threads in a block of {threads}: rows must fill it")
        require(row_threads <= 32 or graph.forloop_range == 1, "rows spanning warps in a loop")
    direct = _direct_inputs(graph, members) if direct_loads else ()
    post, untiled, outputs = ((), (), ())
    if epilogues:
        post, untiled, outputs = _epilogue(graph, schedule, members, states, r, width, transposed)
    vector = VECTOR if interleave and chunk > VECTOR and not transposed and not padded else 0
    return RowLoop(r, width, chunk, tuple(order), tuple(states), direct, tuple(reducing), outputs, threads,
                   post, untiled, vector, transposed, padded, short, tuple(short_reducing))


def match(graph: BlockGraph, schedule: Schedule, direct_loads: bool = True,
          reductions: bool = True, epilogues: bool = True, interleave: bool = True,
          columns: bool = True, ragged: bool = True, short_rows: bool = True) -> RowLoop | None:
    """The row-local loop of ``graph`` (see the module docstring), or None.  ``direct_loads``: read
    the per-iteration inputs that only the body uses straight from global memory; ``reductions``:
    bodies may reduce along their rows, and one-iteration loops qualify; ``epilogues``: element-wise
    work after the loop runs in registers too, and results go from registers to the outputs;
    ``interleave``: a thread's columns in groups of :data:`VECTOR`, interleaved across the row;
    ``columns``: a body that reduces over its tiles' columns (dim -2) is the loop of the transposed
    tiles, a column a thread (with ``reductions``); ``ragged``: a width that no chunk divides is
    padded; ``short_rows``: values of a second, short width are spread over a warp's lanes (see the
    module docstring)."""
    try:
        return _match(graph, schedule, direct_loads, reductions, epilogues, interleave, ragged=ragged,
                      short_rows=short_rows)
    except NoMatch as reason:
        if columns and reductions:
            try:
                return _match(graph, schedule, direct_loads, reductions, epilogues, interleave,
                              transposed=True)
            except NoMatch as column_reason:
                log.debug("no column loop either: %s", column_reason)
        log.debug("loop body lowered op by op: %s", reason)
        return None
