"""The optimizer pipeline and its result, the record the code generator reads.

``prepare(graph, target)`` runs :data:`PIPELINE`, a flat list of passes.  Each pass is a function
from a kernel graph to a kernel graph plus a small result record; the first two rewrite the graph
(online softmax, thread-graph fusion), the others analyse it (layouts, registers, schedule, memory)
and return it unchanged.  The result is a :class:`PreparedProgram`: the rewritten graph, and per
graph-defined op a :class:`PreparedKernel` with everything code generation needs.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> X = g.new_input(dims=(16, 1024), dtype=mi.float16)
>>> W = g.new_input(dims=(1024, 256), dtype=mi.float16)
>>> tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), forloop_range=16)
>>> acc = tb.forloop_accum(tb.matmul(tb.new_input(X, forloop_dim=1), tb.new_input(W, (1, -1, -1), 0)))
>>> tb.new_output(tb.silu(acc), output_map=(1, -1, -1))
>>> (O,) = g.customized([X, W], tb)
>>> g.mark_output(O)
>>> program = prepare(g)
>>> (kernel,) = program.kernels
>>> kernel.registers.accumulators  # the matmul accumulates in registers
(3,)
>>> kernel.smem_bytes  # X [16, 64] and W [64, 64] tiles, rows padded to 72, double-buffered
23040
>>> kernel.schedule.barriers_executed()  # 2 per iteration; write-back | silu | store after the loop
34
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mirage.mugraph import patterns
from mirage.mugraph.check import check
from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import BlockGraph, KernelGraph, KernelInput, Ref
from mirage.mugraph.ops import Op
from mirage.mugraph.target import DEFAULT_TARGET, Target
from mirage.optimizer.cluster_fold import MAX_CLUSTER, ClusterFold, find_folds
from mirage.optimizer.fusion import FusionResult, fuse_thread_graphs
from mirage.optimizer.graphs import customized_nodes
from mirage.optimizer.layout import LayoutCosts, LayoutPlan, TensorLayout, select_layouts
from mirage.optimizer.memory import MemoryPlan, pipeline_depth, plan_memory
from mirage.optimizer.multicast import Multicast, multicast_inputs
from mirage.optimizer.registers import RegisterOptions, RegisterPlan, plan_registers
from mirage.optimizer.row_loop import RowLoop
from mirage.optimizer.row_loop import match as match_row_loop
from mirage.optimizer.schedule import Schedule, build_schedule
from mirage.optimizer.softmax import SoftmaxResult, online_softmax
from mirage.optimizer.softmax_chain import SoftmaxChain, warpgroup_form
from mirage.optimizer.softmax_chain import match as match_softmax_chain
from mirage.optimizer.tma import tma_inputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptimizerOptions:
    online_softmax: bool = True  # run the online-softmax rewrite
    fusion: bool = True  # fuse element-wise chains into thread graphs
    wrap_single: bool = True  # wrap single element-wise ops into FUSED nodes too
    hoist_invariants: bool = True  # run loop-invariant ops before the for-loop
    register_softmax: bool = True  # attention chains in registers (softmax_chain), not op by op
    generated_masks: bool = True  # ...their masks that inputs name as causal computed from indices
    heavy_first: bool = True  # ...and the blocks of the rows that see the most keys launched first
    chain_key_norms: bool = False  # per-key values g(Σ K²) computed by the chain from its K fragments;
    # off: measured slower than their own step (docs/performance.md §3)
    warpgroup_key_norms: bool = True  # ...computed so by a warpgroup chain (the warpgroup_softmax form)
    row_loops: bool = True  # row-local loop bodies run per thread in registers (row_loop)
    direct_row_loads: bool = True  # ...reading their per-iteration inputs from global memory
    row_reductions: bool = True  # ...reducing along their rows (sum, max, rms_norm), one-iteration
    # kernels included: nGPT's update in registers from its inputs to its output (row_loop)
    row_epilogues: bool = True  # ...running element-wise work after the loop in registers too, and
    # writing results from registers to the outputs (a split-KV combine's O / l, row_loop)
    row_interleave: bool = True  # ...a thread's columns in groups of 8 interleaved across its row
    ragged_rows: bool = True  # ...and rows that no chunk of columns divides padded to one that covers
    # them (a split-row slice of 1,733 columns; row_loop), not lowered op by op through shared memory
    short_rows: bool = True  # ...and bodies that also reduce short values (a split reduction's partials)
    # spread over a warp's lanes and reduced by shuffles (row_loop)
    column_loops: bool = False  # ...and bodies that reduce over dim -2 as the loop of the transposed
    # tiles, a whole column a thread (row_loop); off: QKNorm's key norm measured slower than op by op
    # (docs/performance.md §3)
    two_blocks_per_sm: bool = False  # softmax-chain kernels of 256+ threads: registers for 2 blocks per SM
    l2_prefetch_iterations: int = 0  # tiles of each input pulled into L2 before the dependency wait
    register_row_sums: bool = True  # mean / rms accumulators of a tile summed in registers (gen::RowSums)
    fold_operand_scale: bool = True  # A = X·g (g a row vector) scaled in the matmul's A fragments
    direct_output_stores: bool = True  # one-iteration kernels: a result read only by its saver goes
    # from its chain straight to the device output (gen::GlobalSink), not through a shared tile
    softmax_output_stores: bool = False  # ...and so do an online-softmax chain's results after its loop;
    # off: its scattered 4-byte stores measured slower than the shared round trip (docs/performance.md §3)
    one_barrier_loops: bool = False  # pipelined loops: wait and barrier, then the next loads, so the
    # barrier at the end of each iteration goes (one barrier per iteration instead of two); off:
    # the loads then leave one wait later, and it measured within noise (docs/performance.md §3)
    stages: int = 2  # copies of each pipelined input tile (2 = double, 3 = triple buffering)
    prefetch_small_bytes: int = 8192  # loops loading at most this per iteration prefetch deeper...
    prefetch_stages: int = 8  # ...up to this many stages (memory.pipeline_depth)
    accumulator_dtype: DType = DType.FLOAT32  # element type of accumulators and running maxima
    registers: RegisterOptions = field(default_factory=RegisterOptions)
    layout_costs: LayoutCosts = field(default_factory=LayoutCosts)
    free_innermost: bool = True  # False: every shared tile is row-major (only swizzles are chosen)
    swizzle_by_padding: bool = True  # realise swizzled dims as one extra 16-byte vector per row
    layout_timeout_ms: int = 20_000
    evict_first_streams: bool = True  # pipelined input tiles that no other block reads (a GEMV's weight
    # strips) copied with an L2 evict-first policy: a stream read once leaves L2 first
    stagger_shared_loads: bool = False  # blocks that load the same tile (an input map leaving a grid axis
    # unmapped) start their copies at different rows, so that they do not all ask for the same lines at once
    cluster_folds: bool = False  # a light op reading a split kernel's partials runs at the end of that
    # kernel, after a cluster barrier (cluster_fold)
    max_cluster: int = 16  # blocks per cluster of a fold (more than 8: sm_90's non-portable sizes)
    counter_folds: bool = False  # the same folds, their blocks meeting at a counter in device memory
    # instead of a cluster barrier (no clusters: sm_70 and later; grids of at most one block per SM;
    # cluster_folds first)
    multicast_cluster: int = 0  # > 1: inputs that every block along a grid axis loads alike (a GEMV's X)
    # are read once per cluster of this many blocks and multicast into each block's shared memory
    # (sm_90; optimizer.multicast); clusters of 4 run in waves at one block per SM (docs/performance.md §3)
    warpgroup_softmax: bool = False  # sm_90a: online-softmax chains run both products as warpgroup MMAs
    # (wgmma) reading K and V in the 128-byte swizzled form (softmax_chain.warpgroup_form)
    defer_values: bool = False  # ...each sub-tile's P·V issued with the next sub-tile's Q·K (V keeps one
    # more ring slot); faster on some members, slower on others (docs/performance.md §3)
    q_fragments: bool = True  # ...their Q·K products read Q's fragments from registers (ldmatrix at each
    # sub-tile) instead of Q's tile from shared memory through descriptors (gqa_b1 7.21 → 6.86 µs, the
    # others within noise: docs/performance.md §3)
    softmax_pingpong: int = 0  # ...with two warpgroups a block, they take turns issuing their products
    # (FlashAttention-3's ping-pong; 1: each Q·K issue, 2: a Q·K's issue to its P·V's; docs/codegen.md)
    multicast_axes: tuple[int, ...] = (0,)  # the grid axes a multicast cluster may span; along z
    # (attention's K and V, shared by the query splits) it measured 1.3-1.6x slower
    tma_copies: bool = False  # sm_90: a warpgroup chain's pipelined K and V tiles copied by the TMA unit
    # (one thread, tensor maps encoded at launch) instead of every thread's cp.async (optimizer.tma)
    tma_release: bool = True  # ...and where every pipelined input is so copied and the loop is the chain's
    # step alone (P·V in step), stages handed back through per-stage barriers: no block barrier in the loop
    # (faster than the block barriers in 16 of 18 gqa builds, bit for bit the same: docs/performance.md §3)
    producer_warp: bool = False  # ...and such a released loop's copies issued by one more warp of its own
    # (warp specialization), where the computing threads' block barriers before the loop can be counted
    early_prologue: bool = True  # the loop's first stages fetched before the pre-loop steps instead of
    # after them (QKNorm's Q rms), so their copies and the pre-loop operands' fly together
    early_input_loads: bool = True  # a kernel after the program's first issues its first stages of program
    # inputs (a GEMV's weight) before it waits for the kernel before it, which signals only after its own
    # wait (codegen.early_loads)

    def __post_init__(self) -> None:
        for name in ("max_cluster", "multicast_cluster"):
            value = getattr(self, name)
            integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
            if not integral or not 0 <= value <= MAX_CLUSTER:
                raise ValueError(f"OptimizerOptions.{name}={value!r}: a thread-block cluster has at most "
                                 f"{MAX_CLUSTER} blocks on sm_90 (its non-portable size), so use an int "
                                 f"from 0 to {MAX_CLUSTER}; larger clusters compile but cannot launch")
        if type(self.softmax_pingpong) is not int or self.softmax_pingpong not in (0, 1, 2):
            raise ValueError(f"OptimizerOptions.softmax_pingpong={self.softmax_pingpong!r}: use 0 (no "
                             "turns), 1 (a turn around each Q·K issue) or 2 (from a Q·K's issue to its "
                             "P·V's)")


@dataclass(frozen=True)
class PreparedKernel:
    """Everything the code generator needs for one graph-defined op (see docs/optimizer.md)."""

    node: int  # index of the graph-defined op in PreparedProgram.graph
    block_graph: BlockGraph  # its block graph after the rewrites (FUSED thread graphs inside)
    schedule: Schedule  # steps and barriers in execution order
    registers: RegisterPlan  # epilogues, register-resident accumulators, register estimate
    memory: MemoryPlan  # shared-memory buffers with offsets, and the total
    layouts: tuple[TensorLayout | None, ...]  # per block node (None for output savers)
    input_layouts: tuple[TensorLayout, ...]  # device tensors read, in input-iterator order
    output_layouts: tuple[TensorLayout, ...]  # device tensors written, in output-saver order
    softmax_chain: SoftmaxChain | None = None  # an online-softmax chain run in registers
    row_loop: RowLoop | None = None  # a loop body run per thread in registers
    multicast: Multicast = Multicast()  # inputs read once per cluster of blocks (optimizer.multicast)
    tma_inputs: frozenset[int] = frozenset()  # inputs copied by tensor maps (optimizer.tma)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory to request at launch."""
        return self.memory.total

    @property
    def grid_dim(self) -> tuple[int, int, int]:
        return self.block_graph.grid_dim

    @property
    def block_dim(self) -> tuple[int, int, int]:
        return self.block_graph.block_dim


@dataclass(frozen=True)
class PassRecord:
    name: str
    result: Any  # the pass's result record
    seconds: float


@dataclass(frozen=True)
class PreparedProgram:
    source: KernelGraph  # the graph given to prepare
    graph: KernelGraph  # after the online-softmax rewrite and fusion
    kernels: tuple[PreparedKernel, ...]  # one per graph-defined op of ``graph``, in node order
    layouts: LayoutPlan  # every tensor's layout (device and shared)
    target: Target
    options: OptimizerOptions
    records: tuple[PassRecord, ...]  # what each pass did and how long it took
    folds: tuple[ClusterFold, ...] = ()  # graph-defined ops run inside the kernel before them

    def fold_of(self, node: int) -> ClusterFold | None:
        """The fold whose producer or consumer ``node`` is."""
        return next((f for f in self.folds if node in (f.producer, f.consumer)), None)

    def kernel(self, node: int) -> PreparedKernel:
        for k in self.kernels:
            if k.node == node:
                return k
        raise KeyError(f"%{node} is not a graph-defined op of the prepared graph")

    def record(self, name: str) -> Any:
        return next(r.result for r in self.records if r.name == name)

    @property
    def softmax(self) -> SoftmaxResult:
        return self.record("online_softmax")

    @property
    def fusion(self) -> FusionResult:
        return self.record("fuse_thread_graphs")


@dataclass
class PassState:
    """What passes may read: the target, the options and the records of earlier passes."""

    target: Target
    options: OptimizerOptions
    records: dict[str, Any] = field(default_factory=dict)
    graph: KernelGraph | None = None  # the kernel graph the running pass was given


PassFunction = Callable[[KernelGraph, PassState], tuple[KernelGraph, Any]]


@dataclass(frozen=True)
class Pass:
    name: str
    run: PassFunction
    doc: str


def _per_kernel(fn: Callable[[int, BlockGraph, PassState], Any]) -> PassFunction:
    def run(graph: KernelGraph, state: PassState):
        return graph, tuple((k, fn(k, graph.nodes[k].attrs, state)) for k in customized_nodes(graph))

    return run


def _softmax(graph: KernelGraph, state: PassState):
    return online_softmax(graph) if state.options.online_softmax else (graph, SoftmaxResult())


def _fusion(graph: KernelGraph, state: PassState):
    if not state.options.fusion:
        return graph, FusionResult(0, 0, 0, 0, 0)
    return fuse_thread_graphs(graph, state.options.wrap_single)


def _layouts(graph: KernelGraph, state: PassState):
    o = state.options
    return select_layouts(graph, state.target, o.layout_costs, o.free_innermost, o.layout_timeout_ms,
                          o.swizzle_by_padding)


def _registers(k: int, block: BlockGraph, state: PassState) -> RegisterPlan:
    return plan_registers(block, state.options.registers, state.options.hoist_invariants)


def _schedule(k: int, block: BlockGraph, state: PassState) -> Schedule:
    registers = dict(state.records["plan_registers"])[k]
    return build_schedule(block, registers, state.options.hoist_invariants)


def _softmax_chain(k: int, block: BlockGraph, state: PassState) -> SoftmaxChain | None:
    if not state.options.register_softmax:
        return None
    layouts = state.records["select_layouts"].of_kernel(k)
    schedule = dict(state.records["schedule"])[k]
    options = state.options

    def matched(key_norms: bool) -> SoftmaxChain | None:
        return _generated_mask(k, block, state, match_softmax_chain(block, schedule, layouts, key_norms))

    chain = matched(options.chain_key_norms)
    if chain is None or not options.warpgroup_softmax or state.target.compute_capability != 90:
        return chain
    if options.warpgroup_key_norms and not options.chain_key_norms:
        chain = matched(True) or chain
    warpgroup = warpgroup_form(block, chain, options.defer_values, options.q_fragments,
                               options.softmax_pingpong)
    if not warpgroup.warpgroup or warpgroup.swizzled & _multicast(block, state.target, options, chain).inputs:
        # not in the warpgroup form (a multicast copies whole rows, not swizzled tiles)
        return matched(options.chain_key_norms)
    return warpgroup


def _generated_mask(k: int, block: BlockGraph, state: PassState,
                    chain: SoftmaxChain | None) -> SoftmaxChain | None:
    """``chain`` with its mask computed from indices (``SoftmaxChain.mask_rows``) where the mask is a
    kernel input that names the causal pattern (mirage.mugraph.patterns) and the options allow it."""
    if chain is None or chain.mask_scale is None or not state.options.generated_masks or state.graph is None:
        return chain
    source = state.graph.nodes[state.graph.nodes[k].inputs[block.input_nodes.index(chain.column)].node]
    if source.op is not Op.INPUT or not source.attrs.pattern:
        return chain
    kind, period = patterns.parse(source.attrs.pattern)
    return dataclasses.replace(chain, mask_rows=period) if kind == patterns.CAUSAL else chain


def _row_loop(k: int, block: BlockGraph, state: PassState) -> RowLoop | None:
    if not state.options.row_loops or dict(state.records["plan_softmax_chain"])[k] is not None:
        return None
    o = state.options
    return match_row_loop(block, dict(state.records["schedule"])[k], o.direct_row_loads, o.row_reductions,
                          o.row_epilogues, o.row_interleave, o.column_loops, o.ragged_rows, o.short_rows)


def _memory(k: int, block: BlockGraph, state: PassState) -> MemoryPlan:
    o = state.options
    layouts = state.records["select_layouts"].of_kernel(k)
    stages = pipeline_depth(block, layouts, o.stages, o.prefetch_small_bytes, o.prefetch_stages)
    in_registers: frozenset[int] = frozenset()
    chain = dict(state.records["plan_softmax_chain"])[k]
    for plan in (chain, dict(state.records["plan_row_loop"])[k]):
        if plan is not None:
            in_registers |= plan.register_only
    # the chain's step reads Q, K and V where it runs (its anchor), not at its first product's place
    read_at = {n: chain.anchor for n in chain.computed} if chain is not None else {}
    swizzled, late = (chain.swizzled, chain.late) if chain is not None else (frozenset(), frozenset())
    return plan_memory(block, dict(state.records["schedule"])[k], dict(state.records["plan_registers"])[k],
                       layouts, state.target, stages, o.accumulator_dtype, in_registers, read_at,
                       _multicast(block, state.target, o, chain).inputs, swizzled, late,
                       _tma(block, chain, state.target, o, k, state.graph), o.early_prologue,
                       _declared_transposed(k, state.graph) if chain is not None else frozenset())


def _declared_transposed(k: int, graph: KernelGraph | None) -> frozenset[int]:
    """The block inputs of kernel ``k`` whose kernel inputs are declared column-major (``layout="col"``):
    tiles the code generator may read in place, transposed (codegen.column_major).  Their slots are
    sized for the padded transposed tile in an online-softmax chain only, whose warp form cannot take
    the 128-byte swizzle (it means the warpgroup form there): without the padding, the 128-key K tile
    of a 64-wide head was stored dense, and the kernel ran 25.8 µs against 12.7 row-major
    (column_major_h200_2026-11-29_attention_forms.json; padded: 13.2); elsewhere the swizzle serves."""
    return _inputs_declared(k, graph, lambda attrs: attrs.layout == "col")


def _inputs_declared(k: int, graph: KernelGraph | None, declared) -> frozenset[int]:
    """The block inputs of kernel ``k`` whose kernel inputs' ``KernelInput`` satisfies ``declared``."""
    if graph is None:
        return frozenset()
    block, sources = graph.nodes[k].attrs, [graph.nodes[ref.node].attrs for ref in graph.nodes[k].inputs]
    return frozenset(block.input_nodes[p] for p, attrs in enumerate(sources)
                     if isinstance(attrs, KernelInput) and declared(attrs))


def _tma(block: BlockGraph, chain: SoftmaxChain | None, target: Target, o: OptimizerOptions, k: int,
         graph: KernelGraph | None) -> frozenset[int]:
    """The inputs copied by tensor maps, less broadcast views (a zero stride, which a tensor map cannot
    describe) and views with split dims (whose tiles the map's coordinates would have to split):
    copied by threads through their strides."""
    broadcast = _inputs_declared(k, graph, lambda attrs: 0 in attrs.strides or bool(attrs.split_strides))
    return tma_inputs(block, chain, target, o.tma_copies, o.cluster_folds or o.counter_folds) - broadcast


def _multicast(block: BlockGraph, target: Target, o: OptimizerOptions,
               chain: SoftmaxChain | None = None) -> Multicast:
    """The inputs multicast to clusters, less a chain's mask computed from indices (never copied)."""
    multicast = multicast_inputs(block, target, o.multicast_cluster, o.one_barrier_loops,
                                 o.cluster_folds or o.counter_folds, o.multicast_axes)
    if chain is None or not chain.mask_rows or chain.column not in multicast.inputs:
        return multicast
    inputs = multicast.inputs - {chain.column}
    return dataclasses.replace(multicast, inputs=inputs) if inputs else Multicast()


PIPELINE: tuple[Pass, ...] = (
    Pass("online_softmax", _softmax, "make exp of LAX attention numerically stable"),
    Pass("fuse_thread_graphs", _fusion, "element-wise chains → FUSED thread graphs in registers"),
    Pass("select_layouts", _layouts, "innermost dim and swizzles of every tensor (z3)"),
    Pass("plan_registers", _per_kernel(_registers), "epilogues and register-resident accumulators"),
    Pass("schedule", _per_kernel(_schedule), "steps by depth, barriers between depths"),
    Pass("plan_softmax_chain", _per_kernel(_softmax_chain), "attention chains kept in registers"),
    Pass("plan_row_loop", _per_kernel(_row_loop), "row-local loop bodies kept in registers"),
    Pass("plan_memory", _per_kernel(_memory), "shared-memory offsets from lifetimes"),
)


def run_pipeline(graph: KernelGraph, state: PassState,
                 passes: tuple[Pass, ...] = PIPELINE) -> tuple[KernelGraph, list[PassRecord]]:
    records = []
    for p in passes:
        start = time.perf_counter()
        state.graph = graph
        graph, result = p.run(graph, state)
        seconds = time.perf_counter() - start
        state.records[p.name] = result
        records.append(PassRecord(p.name, result, seconds))
        log.debug("pass %s: %.3f s", p.name, seconds)
    return graph, records


def prepare(graph, target: Target = DEFAULT_TARGET,
            options: OptimizerOptions = OptimizerOptions()) -> PreparedProgram:
    """Optimize ``graph`` (a kernel graph or a builder) for ``target``: see the module docstring."""
    from mirage.mugraph.builder import as_graph

    source = as_graph(graph)
    check(source, target)
    state = PassState(target, options)
    result, records = run_pipeline(source, state)
    # shared memory is checked by the memory plan, with real lifetimes, not check's estimate
    check(result, dataclasses.replace(target, smem_per_block=1 << 40))
    layouts: LayoutPlan = state.records["select_layouts"]
    plans = {name: dict(state.records[name])
             for name in ("plan_registers", "schedule", "plan_softmax_chain", "plan_row_loop", "plan_memory")}
    kernels = []
    for k in customized_nodes(result):
        node = result.nodes[k]
        block: BlockGraph = node.attrs
        shared = layouts.of_kernel(k)
        kernels.append(PreparedKernel(
            node=k, block_graph=block, schedule=plans["schedule"][k], registers=plans["plan_registers"][k],
            memory=plans["plan_memory"][k],
            layouts=tuple(shared.get(i) for i in range(len(block.nodes))),
            input_layouts=tuple(layouts.of_device(r) for r in node.inputs),
            output_layouts=tuple(layouts.of_device(Ref(k, j)) for j in range(len(node.outputs))),
            softmax_chain=plans["plan_softmax_chain"][k], row_loop=plans["plan_row_loop"][k],
            multicast=_multicast(block, target, options, plans["plan_softmax_chain"][k]),
            tma_inputs=_tma(block, plans["plan_softmax_chain"][k], target, options, k, result)))
    clusters = options.cluster_folds and target.compute_capability >= 90
    folds = find_folds(result, options.max_cluster) if clusters else ()
    if not clusters and options.counter_folds:
        folds = find_folds(result, sm_count=target.sm_count)
    total = sum(r.seconds for r in records)
    log.info("prepared %s: %d kernels in %.2f s", source.name or "graph", len(kernels), total)
    return PreparedProgram(source, result, tuple(kernels), layouts, target, options, tuple(records), folds)
