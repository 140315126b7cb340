"""The kernel program: typed records that the templates render into CUDA.

The lowering (:mod:`mirage.codegen.lower`) turns each graph-defined op of a prepared program into a
:class:`KernelContext`; ``templates/kernel.j2`` renders it by instantiating the device library
(``mirage/*.cuh``) and its generated-kernel helpers (``mirage/gen/kernel.cuh``).  Nothing here holds
C++ text assembled in Python: records carry names, numbers and device-library identifiers, and the
templates put them together.

Every block op is lowered as a :class:`ChainStep`: a *producer* computes the op and hands each
element of its result to the *links* (fused thread graphs applied as its epilogue, in registers),
and the last value goes to a *sink* (a store into the result's shared tile, or an accumulator
update).  A matmul whose accumulator lives in registers across the for-loop is a
:class:`RegisterChainStep`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

NEGATIVE_INFINITY = "mirage::gen::negative_infinity()"  # the initial value of maxima
RUNNING_MAX_START = "mirage::gen::running_max_floor()"  # where running maxima start (ops.RUNNING_MAX_FLOOR)


def initial_value(is_max: bool) -> str:
    """The C++ value an accumulator starts from: −inf for a maximum, else 0."""
    return NEGATIVE_INFINITY if is_max else "0.0f"


@dataclass(frozen=True)
class TileLayout:
    """``mirage::dev::Layout<dims..., pitch>``: four logical dims (leading 1s pad lower ranks);
    ``swizzled``: ``mirage::dev::Swizzled128Layout<dims...>`` instead (a warpgroup chain's K and V,
    unpadded; ``pitch`` is then the 64 elements of a swizzle row)."""

    dims: tuple[int, int, int, int]
    pitch: int
    swizzled: bool = False
    # ``mirage::dev::Transposed<stored>``: ``dims`` are the tile's, kept as the layout of the
    # transposed dims that ``pitch`` and ``swizzled`` describe (an input read in place: column_major)
    transposed: bool = False

    @property
    def stored(self) -> TileLayout:
        """How a transposed tile lies in memory (itself for the others)."""
        if not self.transposed:
            return self
        d = self.dims
        return TileLayout((d[0], d[1], d[3], d[2]), self.pitch, self.swizzled)

    @property
    def rows(self) -> int:
        return self.dims[0] * self.dims[1] * self.dims[2]

    @property
    def size(self) -> int:
        return self.rows * self.dims[3]

    @property
    def storage(self) -> int:
        if self.transposed:
            return self.stored.storage
        if self.swizzled:
            return -(-self.size // 512) * 512  # whole 1024-byte spans (Swizzled128Layout::storage)
        return self.rows * self.pitch


@dataclass(frozen=True)
class Tile:
    """A shared-memory tile: a C++ variable ``name`` of type ``SharedTile<element, layout>``."""

    name: str
    element: str  # C++ element type: __half, __nv_bfloat16, float
    layout: TileLayout
    offset: int  # byte offset in dynamic shared memory (-1: a pipelined stage, bound per iteration)


@dataclass(frozen=True)
class InputIteratorContext:
    """An input iterator: the device tensor ``parameter``, tiled as mirage-notes §1.3 says."""

    name: str  # C++ variable of the dev::InputIterator
    node: int
    parameter: str  # kernel parameter holding the device tensor
    tile: Tile  # the tile it fills (offset: the first stage)
    source_dims: tuple[int, int, int, int]  # device tensor shape, rank-4
    input_map: tuple[int, int, int]  # rank-4 dims per grid axis, -1 where replicated or grid 1
    forloop_dim: int  # rank-4 dim, or -1
    stages: int  # 1 unless pipelined
    pipelined: bool  # loaded stage by stage across the for-loop (cp.async pipeline)
    direct: bool = False  # no shared tile: a row-local loop reads its elements from global memory
    view: TileLayout | None = None  # how the steps read that tile, where not as filled (a Transposed tile)
    # rank-4 element strides of a view read in place (column_major.with_strides); None: dense row-major
    source_strides: tuple[int, int, int, int] | None = None
    # its split dims (KernelInput.split_strides), rank-4: (outer strides, inner extents), 0 where unsplit
    source_split: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    staggered: bool = False  # blocks that load the same tile start at different rows (a rotation)
    evict_first: bool = False  # no other block reads its tiles: the copies mark their lines first to leave L2
    multicast: int = 0  # > 1: read once per cluster of this many blocks (dev::MulticastIterator)
    barriers: int = -1  # the multicast or tma slots' barriers: offset in shared memory
    tma: bool = False  # copied by the TMA unit through a tensor map (dev::TensorMapIterator)
    late: bool = False  # read one iteration late (a deferred P·V's V): its stage is handed back a step later
    # > 0: never read; its values are the causal pattern of this period, computed where they are used
    # (gen/softmax_columns.cuh's CausalMasks)
    generated: int = 0
    # rank-4, where an uneven grid axis splits a dim: the element index its last tile starts at (C++
    # text, dev::TileEnds; "mirage::dev::kEven" elsewhere); None on even grids
    tile_ends: tuple[str, str, str, str] | None = None

    @property
    def broadcast_rows(self) -> bool:
        """Whether its source's last dim is split over a broadcast (``KernelInput.split_last``:
        ``dev::InputIterator``'s ``BroadcastRows``)."""
        return self.source_split is not None and self.source_split[1][3] != 0


@dataclass(frozen=True)
class OutputSaverContext:
    name: str
    node: int
    parameter: str
    element: str  # element type of the device tensor
    tile: Tile  # the tile it saves
    target_dims: tuple[int, int, int, int]  # device tensor shape, rank-4
    output_map: tuple[int, int, int]  # rank-4 dims per grid axis, -1 where grid 1
    # rank-4 element strides of a program output declared laid out otherwise (KernelGraph.output_strides);
    # None: row-major
    target_strides: tuple[int, int, int, int] | None = None
    # its split dims, rank-4: (outer strides, inner sizes), 0 where unsplit (dev::Strides)
    target_split: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    tile_ends: tuple[str, str, str, str] | None = None  # as InputIteratorContext's


def tile_ends(spans: tuple[int, int, int], dims: tuple[int, ...], dim_map: tuple[int, int, int],
              tile: tuple[int, ...]) -> tuple[str, str, str, str] | None:
    """``dev::TileEnds`` of a tensor (rank-4 ``dims``, grid map ``dim_map``, rank-4 ``tile``) in a block
    graph of these ``spans``: where the last tile of each uneven axis's dim starts; None if none."""
    ends = ["mirage::dev::kEven"] * 4
    for axis, d in enumerate(dim_map):
        if d >= 0 and spans[axis]:
            ends[d] = str(dims[d] - tile[d])
    return None if all(e == "mirage::dev::kEven" for e in ends) else (ends[0], ends[1], ends[2], ends[3])


def saver_layout(declared: tuple[int, ...] | None) -> dict:
    """An output saver's ``target_strides`` and ``target_split`` from a declared layout (rank-4 strides,
    then rank-4 outer strides and inner sizes where it has split dims: lower_program._output_strides)."""
    if not declared:
        return {}
    split = (declared[4:8], declared[8:12]) if len(declared) > 4 else None
    return {"target_strides": declared[:4], "target_split": split}


@dataclass(frozen=True)
class ThreadStatement:
    """``const float result = functor{constants...}(arguments...);``"""

    result: str
    functor: str  # qualified device functor, e.g. mirage::dev::Exp
    constants: tuple[float, ...]
    arguments: tuple[str, ...]


@dataclass(frozen=True)
class ThreadFunction:
    """A fused thread graph as a device functor ``name{}(x0, x1, ...)``."""

    name: str
    arity: int
    statements: tuple[ThreadStatement, ...]
    result: str
    # c when the function is x0 · c with c > 0 (a chain of scalar products): the online-softmax
    # chain then takes row maxima of the raw scores and folds c into its exponent's FFMA
    linear_scale: float | None = None


@dataclass(frozen=True)
class MatmulType:
    """``using name = mirage::gen::BlockMatmul<threads, Product<...>...>`` (one product per pair)."""

    name: str
    products: tuple[tuple[Tile, Tile], ...]


# ---- producers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapProducer:
    """emit(i, function(operands[i]...)) over ``layout`` (a fused thread graph, or a plain copy)."""

    kind: ClassVar[str] = "map"
    function: str  # a ThreadFunction name, or a device functor (mirage::dev::Identity)
    layout: TileLayout
    operands: tuple[Tile, ...]


@dataclass(frozen=True)
class MatmulProducer:
    kind: ClassVar[str] = "matmul"
    matmul: MatmulType
    operands: tuple[Tile, ...]  # a_0, b_0, a_1, b_1, ...
    scale: Tile | None = None  # a row vector scaling the columns of A (lower_registers.scaled_operands)


class Reducer(enum.Enum):
    SUM = "mirage::dev::SumReduce"
    MAX = "mirage::dev::MaxReduce"


@dataclass(frozen=True)
class ReduceProducer:
    kind: ClassVar[str] = "reduce"
    reducer: Reducer
    dim: int  # rank-4
    prologue: str  # device functor applied to each input element (Identity, Square)
    operand: Tile
    scratch: int | None = None  # byte offset of the block-wide reduction scratch (None: a warp per output)


@dataclass(frozen=True)
class ReduceToDimxProducer:
    kind: ClassVar[str] = "reduce_to_dimx"
    dim: int  # rank-4
    dimx: int
    operand: Tile


@dataclass(frozen=True)
class RmsNormProducer:
    kind: ClassVar[str] = "rms_norm"
    eps: float
    operand: Tile
    scratch: int | None = None  # as ReduceProducer.scratch


Producer = MapProducer | MatmulProducer | ReduceProducer | ReduceToDimxProducer | RmsNormProducer


@dataclass(frozen=True)
class Link:
    """value = function(arguments...), an argument None standing for the value in registers."""

    node: int
    function: str
    arguments: tuple[Tile | None, ...]


class SinkKind(enum.Enum):
    STORE = "store_into"  # tile[i] = value
    ADD = "add_into"  # acc[i] += value
    MAX = "max_into"  # acc[i] = max(acc[i], value)
    RUNNING_MAX = "running_max_into"  # previous[i] = current[i]; current[i] = max(current[i], value)
    RESCALE = "rescale_into"  # acc[i] = acc[i] · exp(m_previous − m_current) + value
    GLOBAL = "store_global"  # the device output (a one-iteration kernel's result read by its saver only)


@dataclass(frozen=True)
class Sink:
    node: int
    kind: SinkKind
    tiles: tuple[
        Tile, ...
    ]  # target; for RUNNING_MAX (current, previous); for RESCALE (acc, current, previous)
    saver: OutputSaverContext | None = None  # GLOBAL: the output saver it replaces


@dataclass(frozen=True)
class RegisterAccumulator:
    """A matmul accumulator in registers: ``typename matmul::Registers name``."""

    name: str
    node: int
    matmul: MatmulType
    initial: str  # "0.0f" or "mirage::gen::negative_infinity()"


# ---- steps ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainStep:
    kind: ClassVar[str] = "chain"
    node: int  # the producer's node
    producer: Producer
    links: tuple[Link, ...]
    sink: Sink
    index_layout: TileLayout  # the producer's result layout (links broadcast operands against it)


@dataclass(frozen=True)
class RegisterChainStep:
    """registers = combine(registers (rescaled), links(Σ A·B)); ``direct`` when there are no links."""

    kind: ClassVar[str] = "register_chain"
    node: int
    accumulator: RegisterAccumulator
    producer: MatmulProducer
    links: tuple[Link, ...]
    combine: str  # mirage::dev::Add or mirage::dev::Maximum
    rescale: tuple[Tile, Tile] | None  # (current, previous) maxima for an online-softmax rescale
    index_layout: TileLayout


@dataclass(frozen=True)
class OnlineSoftmaxType:
    """``using name = mirage::gen::OnlineSoftmax<threads, element, Q, K, V, score>`` and its state
    ``typename name::State name_state`` (gen/softmax.cuh)."""

    name: str
    element: str
    q: Tile
    k: Tile
    v: Tile
    score: str  # functor applied to Q·K (a ThreadFunction name, or mirage::dev::Identity)
    columns: Tile | None = None  # per-key factors of the products (gen/softmax.cuh's Columns)
    column_factor: str | None = None  # ...or per-key values, each read as this functor of it (FactorTile)
    key_norms: str | None = None  # ...or their functor of each key's sum of squares (KeyNorms)
    mask: bool = False  # ``columns`` is an additive mask of the scores' shape (MaskTile)
    causal: bool = False  # ...computed from indices (CausalMask): ``columns`` names no shared tile
    key_scratch: int | None = None  # the warpgroup form's key norms: byte offset of their scratch
    defer_values: bool = False  # the warpgroup form's P·V issued with the next Q·K (DeferValues)
    q_fragments: bool = False  # the warpgroup form's Q·K reads Q's fragments from registers (QFragments)
    pingpong: int = 0  # the warpgroup form's two warpgroups take turns issuing products (PingPong)

    @property
    def state(self) -> str:
        return f"{self.name}_state"

    @property
    def flags(self) -> str:
        """The template's trailing arguments (DeferValues, QFragments, PingPong) up to the last set one."""
        flags = [self.defer_values, self.q_fragments, self.pingpong]
        while flags and not flags[-1]:
            flags.pop()
        return "".join(f", {f}" if type(f) is int else ", true" if f else ", false" for f in flags)


@dataclass(frozen=True)
class OnlineSoftmaxStep:
    """One iteration of a register-resident online-softmax chain (lower_softmax)."""

    kind: ClassVar[str] = "online_softmax"
    node: int  # the chain's first matmul
    chain: OnlineSoftmaxType


@dataclass(frozen=True)
class OnlineSoftmaxWriteBack:
    """After the loop: the chain's maximum, running max, sum and output into their shared tiles."""

    kind: ClassVar[str] = "online_softmax_write_back"
    chain: OnlineSoftmaxType
    scratch: int  # byte offset of the key-group merge scratch (unused with one group)
    tiles: tuple[Tile | None, Tile | None, Tile | None, Tile | None]  # maximum, running, sum, out
    # per tile, the output saver that takes the result straight from the chain instead (or None)
    savers: tuple[OutputSaverContext | None, ...] = (None, None, None, None)


# ---- row-local loop bodies (mirage.codegen.lower_rowloop) ---------------------------------------------


@dataclass(frozen=True)
class Value:
    """A value of a row-local loop body in a thread's registers (lower_rowloop): the thread's chunk of
    a wide row (``float name[kRowChunk]``), its lane's chunk of a short value (``float
    name[kShortChunk]``, RowLoop.short) or one narrow value a row (``float name``)."""

    name: str
    wide: bool
    short: bool = False

    @property
    def extent(self) -> str:
        """The C++ extent of the value's array ("" for a narrow value)."""
        return "kRowChunk" if self.wide else "kShortChunk" if self.short else ""


@dataclass(frozen=True)
class Statement:
    """One statement of the loop body (``kind`` picks the template's spelling):

    * ``load``: ``result = tile[row, col + e]`` (or ``tile[row, 0]`` when narrow, broadcast)
    * ``read``: the same elements of this iteration's tile of input ``iterator``, from global memory
    * ``map``: ``result = function(arguments...)`` element by element
    * ``copy``: ``result = arguments[0]``
    * ``running_max``: ``previous = state; state = max(state, arguments[0])``
    * ``accumulate``: ``state = state · factor + arguments[0]`` (``combine`` add) or
      ``max(state, arguments[0])``; ``factor = exp(previous − current)`` of ``rescale``, else 1
    * ``reduce``: the narrow ``result`` = the sum (``combine`` add) or max of the wide ``arguments[0]``
      over the row: each thread its chunk, then ``dev::row_combine`` over the row's ``lanes`` threads
      (through the shared floats at ``scratch``, a C++ pointer expression, where rows span warps)
    * ``rms``: ``result = arguments[0] / sqrt(Σ arguments[0]² / count + eps)``, the sum of squares
      combined over the row's threads as for ``reduce``

    In a ragged loop (``mask``, RowLoop.mask) a ``load`` or ``read`` gives 0 past the row's width
    (``kRowWidth``), by whole chunks (``chunk``), whole groups of 8 (``vector``) or element by element
    (``element``), and a ``reduce`` or ``rms`` leaves those columns out; a short value's (``short``)
    past ``kShort``.
    """

    kind: str
    result: Value
    arguments: tuple[Value, ...] = ()
    function: str = ""
    tile: Tile | None = None
    iterator: str = ""
    combine: str = "add"
    rescale: tuple[str, str] | None = None  # (current, previous) names of a running max
    lanes: int = 1  # reduce, rms: threads of a row (1: the thread's own chunk is the row)
    scratch: str = "nullptr"  # reduce, rms: the cross-warp combine's shared floats
    count: int = 1  # rms: elements of a row
    eps: float = 0.0  # rms
    column: str = "row_loop_col + e"  # load: the column of element e (RowLoop.group)
    mask: str = ""  # load, read, reduce, rms: columns past the row's width masked (RowLoop.mask)
    groups: int = 1  # read: a thread's groups of consecutive columns, ``stride`` columns apart
    stride: int = 0
    transposed: bool = False  # load, read: the loop's row is the tile's column (RowLoop.transposed)


@dataclass(frozen=True)
class State:
    """A register accumulator or running max: declared before the loop, written back after it."""

    value: Value
    initial: str
    tile: Tile | None  # None: written straight to an output (RowLoopWriteBack.outputs)
    previous: str | None = None  # running maxima keep their value before this iteration


@dataclass(frozen=True)
class RowLoopSetup:
    """Before the loop: the thread's row and columns, and its states."""

    kind: ClassVar[str] = "row_loop_setup"
    rows: int
    row_threads: int
    chunk: int
    group: int  # consecutive columns (RowLoop.group); groups row_threads · group columns apart
    states: tuple[State, ...]
    threads: int  # of the block (all active when rows · row_threads equals it)
    transposed: bool = False  # the loop's rows are the tiles' columns (RowLoop.transposed)
    width: int = 0  # a ragged row's columns (RowLoop.padded): kRowWidth, the thread's chunk masked past it
    short: int = 0  # S of the short values (RowLoop.short): kShort
    short_lanes: int = 0  # lanes of a row holding a short value: kShortLanes
    short_chunk: int = 0  # columns of it a lane holds: kShortChunk


@dataclass(frozen=True)
class RowLoopStep:
    kind: ClassVar[str] = "row_loop"
    nodes: tuple[int, ...]
    statements: tuple[Statement, ...]


@dataclass(frozen=True)
class DirectLoop:
    """A row-local loop whose per-iteration inputs are read from global memory (no barrier).

    Rendered as batches of ``batch`` iterations: first every read of the batch (all loads in flight
    at once), then the batch's statements, where each ``read`` names its batch slot.  The loop is
    compiled twice, with vector loads when every iterator of ``vector_checks`` is aligned for them
    and without."""

    batch: int
    reads: tuple[Statement, ...]
    vector_checks: tuple[str, ...]  # iterators read as wide values
    step: RowLoopStep


@dataclass(frozen=True)
class RowLoopWriteBack:
    """After the loop: the element-wise ``statements`` of the post-loop nodes (in registers), the
    states that keep a tile into it, and the savers' values from registers into the outputs."""

    kind: ClassVar[str] = "row_loop_write_back"
    states: tuple[State, ...]
    outputs: tuple[tuple[Value, OutputSaverContext], ...] = ()
    statements: tuple[Statement, ...] = ()
    column: str = "row_loop_col + e"  # the column of element e
    groups: int = 1  # a thread's groups of consecutive columns, ``stride`` columns apart
    stride: int = 0
    transposed: bool = False  # the loop's rows are the tiles' columns (RowLoop.transposed)
    mask: str = ""  # columns past the row's width (kRowWidth) neither stored nor written back (RowLoop.mask)


@dataclass(frozen=True)
class LoadStep:
    """Issue the cp.async copies of a non-pipelined input iterator."""

    kind: ClassVar[str] = "load"
    iterator: InputIteratorContext


@dataclass(frozen=True)
class FillStep:
    """Clear loop state before the loop (accumulators, running maxima)."""

    kind: ClassVar[str] = "fill"
    tile: Tile
    value: str


@dataclass(frozen=True)
class RowSums:
    """A for-loop accumulator of sums over the last dim kept in registers (``gen::RowSums``): each
    thread adds its slice of every iteration's tile; the row's lanes combine after the loop."""

    name: str  # C++ variable
    node: int  # the accumulator
    operand: Tile  # the tile summed each iteration
    prologue: str  # device functor applied to each element (Identity, Square)


class FinalizeKind(enum.Enum):
    WRITE_BACK = "write_back"  # register accumulator → its shared tile
    MEAN = "mean"
    RMS = "rms"


@dataclass(frozen=True)
class FinalizeStep:
    kind: ClassVar[str] = "finalize"
    node: int
    finalize: FinalizeKind
    tile: Tile
    count: int = 1  # elements summed per result (mean, rms)
    eps: float = 0.0
    accumulator: RegisterAccumulator | None = None
    row_sums: RowSums | None = None  # mean / rms: the sums are in these registers, not in the tile


@dataclass(frozen=True)
class StoreStep:
    kind: ClassVar[str] = "store"
    saver: OutputSaverContext


@dataclass(frozen=True)
class BarrierStep:
    kind: ClassVar[str] = "barrier"
    reason: str
    wait_copies: bool  # non-pipelined copies were issued since the last barrier: wait for them first
    groups_in_flight: int = 0  # copy groups issued after those that may stay in flight (the prologue)
    async_readers: bool = False  # the landed (or written) tiles are read by warpgroup MMAs: a proxy fence


@dataclass(frozen=True)
class PrologueStep:
    """The pipeline prologue: fetch the first ``stages − 1`` iterations of every pipelined input."""

    kind: ClassVar[str] = "prologue"
    stages: int
    iterators: tuple[InputIteratorContext, ...]


@dataclass(frozen=True)
class RowSumsStep:
    """``sums.add(tile)``: registers only, no barrier after it."""

    kind: ClassVar[str] = "row_sums"
    sums: RowSums


Step = (
    ChainStep
    | RegisterChainStep
    | OnlineSoftmaxStep
    | OnlineSoftmaxWriteBack
    | RowLoopSetup
    | RowLoopStep
    | RowLoopWriteBack
    | RowSumsStep
    | LoadStep
    | FillStep
    | FinalizeStep
    | StoreStep
    | BarrierStep
    | PrologueStep
)


@dataclass(frozen=True)
class Parameter:
    name: str
    element: str
    is_output: bool
    restrict: bool = True  # False: a cluster fold's partials, written and read in one kernel


@dataclass(frozen=True)
class KernelContext:
    """One ``extern "C" __global__`` kernel: everything ``kernel.j2`` renders."""

    name: str
    node: int  # the graph-defined op in the prepared graph
    threads: int
    min_blocks: int  # blocks per SM the registers must allow (__launch_bounds__)
    grid: tuple[int, int, int]
    smem_bytes: int  # the memory plan's bytes plus the reduction scratch after them
    forloop_range: int
    stages: int  # pipeline depth of the pipelined inputs (1: no pipeline)
    loads_after_barrier: bool  # each iteration: wait and barrier, then the loads (no barrier at its end)
    released_loop: bool  # TMA stages handed back through per-stage barriers: no block barrier in the loop
    direct_loop: DirectLoop | None  # the for-loop as a barrier-free row-local loop of direct reads
    l2_prefetch: tuple[tuple[str, int], ...]  # (iterator, first tiles) pulled into L2 before the wait
    parameters: tuple[Parameter, ...]  # outputs, then inputs (the launch's argument order)
    functions: tuple[ThreadFunction, ...]
    matmuls: tuple[MatmulType, ...]
    tiles: tuple[Tile, ...]  # tiles bound once (offset >= 0)
    iterators: tuple[InputIteratorContext, ...]
    registers: tuple[RegisterAccumulator, ...]
    row_sums: tuple[RowSums, ...]  # mean / rms accumulators summed in registers
    softmax: tuple[OnlineSoftmaxType, ...]  # register-resident online-softmax chains
    pre_loop: tuple[Step, ...]
    loop: tuple[Step, ...]
    post_loop: tuple[Step, ...]
    cluster_shape: tuple[int, int, int] = (1, 1, 1)  # blocks per cluster (multicast inputs)
    async_readers: bool = False  # pipelined tiles read by warpgroup MMAs (Pipeline<S, true>)
    # a computed causal mask's iterator that bounds the loop: the steps whose keys no row of the block
    # sees are not run, nor are their tiles copied ("": every step runs)
    causal_bound: str = ""
    # the grid axis that a bounding causal mask's rows lie along, launched from its far end (the blocks
    # of the last rows run the most steps; started first, they do not trail the rest): -1 for none
    heavy_first_axis: int = -1
    # pipelined program inputs whose first stages are copied before the dependency wait (early_loads)
    early_loads: tuple[InputIteratorContext, ...] = ()
    # the next kernel may launch only once this one's wait has returned (it reads program inputs early)
    signal_after_wait: bool = False
    # >= 0: a released loop's copies are issued by one more warp, threads [threads, threads + 32), which
    # computes nothing: it issues the first stages, joins the computing threads' block barriers before
    # the loop (this many), issues the rest as stages are released, and leaves
    # (OptimizerOptions.producer_warp)
    producer_joins: int = -1

    @property
    def producer_warp(self) -> bool:
        return self.producer_joins >= 0

    @property
    def launch_threads(self) -> int:
        """Threads a block is launched with: the computing threads, and the producer warp if any."""
        return self.threads + 32 * self.producer_warp

    @property
    def pipelined(self) -> tuple[InputIteratorContext, ...]:
        return tuple(i for i in self.iterators if i.pipelined)

    @property
    def generated(self) -> tuple[InputIteratorContext, ...]:
        return tuple(i for i in self.iterators if i.generated)

    @property
    def multicast(self) -> tuple[InputIteratorContext, ...]:
        return tuple(i for i in self.iterators if i.multicast > 1)

    @property
    def tma(self) -> tuple[InputIteratorContext, ...]:
        """Inputs copied through tensor maps: each adds a ``tmap<k>`` kernel parameter."""
        return tuple(i for i in self.iterators if i.tma)

    @property
    def cluster_dims(self) -> bool:
        """Whether the kernel is compiled with ``__cluster_dims__``."""
        return self.cluster_shape != (1, 1, 1)


@dataclass(frozen=True)
class FoldedKernel:
    """Two graph-defined ops in one ``extern "C" __global__`` kernel (optimizer.cluster_fold): each
    block runs ``producer``, meets its cluster at a barrier, then runs its consumer blocks."""

    name: str
    producer: KernelContext
    consumer: KernelContext
    consumer_parameters: tuple[Parameter, ...]  # the consumer's, its partials not __restrict__
    parameters: tuple[Parameter, ...]  # the kernel's: the launch's argument order
    producer_arguments: tuple[str, ...]  # the kernel parameter passed for each producer parameter
    consumer_arguments: tuple[str, ...]
    cluster: tuple[int, int, int]  # producer blocks per cluster, per grid axis
    clusters: tuple[int, int, int]  # clusters per grid axis
    rounds: int  # consumer blocks each block runs at most
    table: tuple[tuple[int, ...], ...]  # ClusterFold.table
    smem_bytes: int
    counter: bool = False  # a cluster's blocks meet at a counter in device memory (no __cluster_dims__)
    multicast = ()  # folds and multicast inputs do not mix (optimizer.multicast)

    @property
    def threads(self) -> int:
        return self.producer.threads

    @property
    def coherent(self) -> tuple[str, ...]:
        """The consumer's parameters that the producer writes (read back through L2)."""
        return tuple(p.name for p in self.consumer_parameters if not p.restrict)

    @property
    def min_blocks(self) -> int:
        return self.producer.min_blocks

    @property
    def cluster_size(self) -> int:
        x, y, z = self.cluster
        return x * y * z

    @property
    def cluster_dims(self) -> bool:
        """Whether the kernel is compiled with ``__cluster_dims__`` (a cluster fold of more than one
        block per cluster)."""
        return self.cluster_size > 1 and not self.counter
