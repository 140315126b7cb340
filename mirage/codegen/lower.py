"""Lowering: from one prepared graph-defined op to a :class:`~mirage.codegen.lower_context.KernelContext`.

The optimizer (:func:`mirage.optimizer.prepare`) has decided everything about the kernel: which
thread graphs are fused, which ops run as another op's epilogue, which matmul accumulators stay in
registers, the schedule with its barriers and the shared-memory offsets.  This module only turns
those decisions into records the templates render; it decides nothing about speed itself, so that
speed (deeper pipelines, TMA, other matmul engines) comes in through the optimizer's records and new
producer or step kinds, not by rewriting the walk below.

The walk (:meth:`KernelLowering.steps`) follows ``schedule.items``:

* a LOAD step of a non-pipelined input iterator issues its cp.async copies (``LoadStep``); pipelined
  inputs load at the top of each iteration, ``stages − 1`` iterations ahead;
* a COMPUTE or ACCUMULATE step whose node is no one's epilogue starts a chain: the node's producer,
  the epilogue consumers that follow it (``registers.epilogues``) as links, and a sink for the last
  one (:meth:`KernelLowering.chain`);
* FINALIZE writes a register accumulator back, or scales a mean / rms accumulator; STORE saves;
* barriers wait for outstanding copies when some were issued since the last barrier.  The last
  pre-loop barrier also clears the loop state and runs the pipeline prologue before it (the memory
  plan starts their lifetimes at that level).
"""

from __future__ import annotations

import math

from mirage.codegen import lower_context as ctx
from mirage.codegen import lower_io as io
from mirage.codegen import lower_registers as registers
from mirage.codegen import lower_softmax as softmax
from mirage.codegen.lower_functions import single_op_graph, thread_function
from mirage.codegen.lower_ops import (
    LoweringError,
    element_type,
    functor,
    plan_pitch,
    rank4,
    rank4_dim,
    tile_layout,
    transposed_layout,
    vector_copies,
)
from mirage.codegen.lower_rowloop import RowLoopLowering
from mirage.mugraph.graph import AccumKind, BlockGraph, Ref
from mirage.mugraph.ops import ELEMENTWISE, Op
from mirage.optimizer.memory import BufferKind
from mirage.optimizer.pipeline import PreparedKernel
from mirage.optimizer.schedule import Action, Barrier, Phase, Step

MATMULS = frozenset({Op.MATMUL, Op.CONCAT_MATMUL})


class KernelLowering:
    """Lowers one prepared graph-defined op (see the module docstring)."""

    def __init__(
        self,
        kernel: PreparedKernel,
        name: str,
        accumulator_element: str = "float",
        smem_limit: int | None = None,
        two_blocks_per_sm: bool = False,
        l2_prefetch_iterations: int = 0,
        register_row_sums: bool = True,
        fold_operand_scale: bool = True,
        direct_output_stores: bool = True,
        one_barrier_loops: bool = False,
        stagger_shared_loads: bool = False,
        tma_release: bool = False,
        heavy_first: bool = False,
        evict_first_streams: bool = False,
        producer_warp: bool = False,
        softmax_output_stores: bool = False,
        transposed: frozenset[int] = frozenset(),
        output_strides: tuple[tuple[int, ...] | None, ...] = (),
    ) -> None:
        self.kernel, self.output_strides, self.transposed = kernel, output_strides, transposed
        self.softmax_output_stores = softmax_output_stores
        self.producer_warp = producer_warp
        self.evict_first_streams = evict_first_streams
        self.tma_release, self.heavy_first = tma_release, heavy_first
        self.released_loop = False  # set by steps(): stages handed back through barriers, none in the loop
        self.stagger_shared_loads = stagger_shared_loads
        self.name = name
        self.smem_limit = smem_limit
        self.two_blocks_per_sm = two_blocks_per_sm
        self.l2_prefetch_iterations = l2_prefetch_iterations
        self.graph: BlockGraph = kernel.block_graph
        self.accumulator_element = accumulator_element
        self.threads = math.prod(self.graph.block_dim)
        # Block-wide reductions (several warps per output) combine through a scratch of one float
        # per warp after the planned buffers, when the target's shared memory has room for it.
        offset = -(-kernel.smem_bytes // 16) * 16
        scratch_end = offset + 4 * max(self.threads // 32, 1)
        self.scratch = offset if smem_limit is None or scratch_end <= smem_limit else None
        self.scratch_used = False
        self.epilogue_consumer = {producer: consumer for consumer, producer in kernel.registers.epilogues}
        self.prologues = dict(kernel.registers.prologues)  # element-wise producer → its reduction
        self.in_registers = frozenset(kernel.registers.accumulators)
        self.functions: dict[int, ctx.ThreadFunction] = {}
        self.matmuls: dict[int, ctx.MatmulType] = {}
        self._tiles: dict[tuple[int, int], ctx.Tile] = {}
        # matmul → (A's element-wise product node, the full operand, the row vector scaling its columns)
        self.scaled_operands = registers.scaled_operands(self) if fold_operand_scale else {}
        self.folded = frozenset(p for p, _, _ in self.scaled_operands.values())
        self._check_nodes()
        self.softmax = kernel.softmax_chain
        # a warpgroup chain reads its K and V tiles through the async proxy (Pipeline<S, true>)
        self.async_readers = self.softmax is not None and self.softmax.warpgroup
        self.softmax_scratch = 0  # bytes of the key-group merge scratch after the plan
        if self.softmax is not None:
            softmax.place(self, smem_limit)
        # a row-local body's cross-warp combines (RowLoop.scratch_floats) after the block-wide scratch
        self.row_scratch_offset = -(-scratch_end // 16) * 16
        self.row_loop = RowLoopLowering(self, kernel.row_loop) if kernel.row_loop is not None else None
        self.iterators = tuple(io.iterator(self, k, i) for k, i in enumerate(self.graph.input_nodes))
        # a multicast input's ring has one slot more than the pipeline's stages (optimizer.multicast), as
        # has a tile that a warpgroup chain reads one iteration late (its V)
        late = self.softmax.late if self.softmax is not None else frozenset()
        pipelined = {it.stages - (it.multicast > 1 or it.node in late)
                     for it in self.iterators if it.pipelined}
        if len(pipelined) > 1:
            raise LoweringError(f"pipelined inputs of {name} have different stage counts {sorted(pipelined)}")
        self.stages = pipelined.pop() if pipelined else 1
        self.registers = tuple(self._register_accumulator(i) for i in sorted(self.in_registers))
        self.row_sums = registers.row_sums(self) if register_row_sums else {}
        # result node → (output index, saver node) for results stored straight into the output
        self.direct_outputs = registers.direct_outputs(self) if direct_output_stores else {}
        self.stored_directly: set[int] = set()  # those whose chain step got the global sink
        self.one_barrier_loops = one_barrier_loops
        self.loads_after_barrier = False  # set by steps(): the loop issues its loads after the wait

    # ---- checks ------------------------------------------------------------------------------

    def _check_nodes(self) -> None:
        for i, node in enumerate(self.graph.nodes):
            if node.op in (Op.INPUT, Op.OUTPUT):
                element_type(node.outputs[0].dtype, f"node %{i} ({node.op.value})")
            elif node.op not in LOWERED_OPS:
                raise LoweringError(
                    f"block op {node.op.value} (node %{i} of {self.name}) has no CUDA "
                    f"lowering; lowered ops: {sorted(o.value for o in LOWERED_OPS)}"
                )
            if node.op is Op.ACCUM_RESCALE:
                maximum = self.graph.nodes[node.inputs[1].node]
                if maximum.op is not Op.RUNNING_MAX:
                    raise LoweringError(
                        f"accum_rescale %{i} of {self.name} rescales by %{node.inputs[1].node} "
                        f"({maximum.op.value}); only a running_max has a lowering (the "
                        "rescale reads its value before and after this iteration)"
                    )
            if node.op is Op.FUSED:
                for inner in node.attrs.nodes:
                    if inner.op is not Op.INPUT:
                        functor(inner.op)
            if node.op in ELEMENTWISE:
                functor(node.op)

    # ---- tiles -------------------------------------------------------------------------------


    def element(self, i: int) -> str:
        node = self.graph.nodes[i]
        if node.op in (Op.ACCUM, Op.ACCUM_RESCALE, Op.RUNNING_MAX):
            return self.accumulator_element
        return element_type(node.outputs[0].dtype, f"node %{i} ({node.op.value})")

    def tile(self, i: int, slot: int = 0) -> ctx.Tile:
        """The shared tile holding node ``i``'s result (slot 1 of a running max: its previous value)."""
        key = (i, slot)
        if key not in self._tiles:
            try:
                buffer = self.kernel.memory.buffer_of(i)
            except KeyError:
                raise LoweringError(
                    f"node %{i} of {self.name} has no shared-memory buffer but is read from shared memory"
                ) from None
            plan = self.kernel.layouts[i]
            shape = self.graph.nodes[i].outputs[0].shape
            row_major = plan is None or plan.innermost_dim == len(shape) - 1
            element = self.element(i)
            pitch = plan_pitch(shape, plan.strides) if plan is not None and row_major else None
            if i in self.transposed:  # (self.softmax is not set yet: operand folds ask first)
                layout = transposed_layout(shape, element, buffer.slot_bytes, not self.kernel.softmax_chain)
            else:
                layout = tile_layout(shape, element, buffer.slot_bytes, row_major, pitch)
            chain = self.kernel.softmax_chain
            if chain is not None and i in chain.swizzled:  # a warpgroup chain's Q, K or V (K maybe in place)
                layout = ctx.TileLayout(layout.dims, 64, swizzled=True, transposed=layout.transposed)
            pipelined = buffer.kind is BufferKind.INPUT_STAGES
            name = f"t{i}" if slot == 0 else f"t{i}_previous"
            offset = -1 if pipelined else buffer.offset + slot * buffer.slot_bytes
            self._tiles[key] = ctx.Tile(name, element, layout, offset)
        return self._tiles[key]

    def generated_tile(self, i: int) -> ctx.Tile:
        """The tile of input ``i`` whose values the chain computes (no shared memory: its dense layout)."""
        shape = self.graph.nodes[i].outputs[0].shape
        element = self.element(i)
        return ctx.Tile(f"t{i}", element, tile_layout(shape, element, 1 << 30, False), -1)

    def operand(self, ref: Ref) -> ctx.Tile:
        return self.tile(ref.node)

    # ---- thread functions and matmuls ----------------------------------------------------------

    def function(self, i: int) -> str:
        """The device functor computing element-wise node ``i`` (a FUSED thread graph or a single op)."""
        if i not in self.functions:
            node = self.graph.nodes[i]
            graph = node.attrs if node.op is Op.FUSED else single_op_graph(node, self.graph)
            chain = self.softmax
            # the warp form's key-norm chain sits at 255 registers and spills once a / sqrt(b) has no
            # slow-path calls left (ptxas then schedules its key chunks together): IEEE there
            exact = chain is not None and chain.key_norm is not None and not chain.warpgroup
            self.functions[i] = thread_function(f"{self.name}_f{i}", graph, fuse_div_sqrt=not exact)
        return self.functions[i].name

    def matmul(self, i: int) -> tuple[ctx.MatmulType, tuple[ctx.Tile, ...]]:
        node = self.graph.nodes[i]
        refs = node.inputs
        if i in self.scaled_operands:  # A·B with A = X·g: the product reads X, scales its fragments
            refs = (self.scaled_operands[i][1], refs[1])
        tiles = tuple(self.operand(r) for r in refs)
        if node.op is Op.CONCAT_MATMUL:  # (W ‖ X) @ (Y ‖ Z) = W @ Y + X @ Z
            w, x, y, z = tiles
            pairs = ((w, y), (x, z))
        else:
            pairs = ((tiles[0], tiles[1]),)
        if i not in self.matmuls:
            registers.check_simt_size(self, i, refs)
            self.matmuls[i] = ctx.MatmulType(f"mm{i}", pairs)
        return self.matmuls[i], tuple(t for pair in pairs for t in pair)

    def column_scale(self, i: int) -> ctx.Tile | None:
        """The row vector scaling the columns of matmul ``i``'s A operand, when that is folded."""
        return self.operand(self.scaled_operands[i][2]) if i in self.scaled_operands else None

    def _register_accumulator(self, i: int) -> ctx.RegisterAccumulator:
        root = self.chain_root(i)
        if self.graph.nodes[root].op not in MATMULS:
            raise LoweringError(
                f"accumulator %{i} of {self.name} is kept in registers but its epilogue chain "
                f"starts at {self.graph.nodes[root].op.value}, not a matmul"
            )
        node = self.graph.nodes[i]
        initial = ctx.initial_value(node.op is Op.ACCUM and node.attrs.kind is AccumKind.MAX)
        return ctx.RegisterAccumulator(f"registers{i}", i, self.matmul(root)[0], initial)

    def register_accumulator(self, i: int) -> ctx.RegisterAccumulator:
        return next(r for r in self.registers if r.node == i)

    # ---- chains --------------------------------------------------------------------------------

    def chain_root(self, i: int) -> int:
        producer_of = {consumer: producer for producer, consumer in self.epilogue_consumer.items()}
        while i in producer_of:
            i = producer_of[i]
        return i

    def chain_nodes(self, root: int) -> list[int]:
        nodes = [root]
        while nodes[-1] in self.epilogue_consumer:
            nodes.append(self.epilogue_consumer[nodes[-1]])
        return nodes

    def chain(self, root: int) -> ctx.Step:
        nodes = self.chain_nodes(root)
        last = nodes[-1]
        links = tuple(
            self._link(previous, node)
            for previous, node in zip(nodes, nodes[1:], strict=False)
            if self.graph.nodes[node].op is Op.FUSED
        )
        index_layout = self.result_layout(root)
        if self.softmax is not None and last == self.softmax.column:
            links += (softmax.column_factor(self),)  # the chain's only reader wants f(1, c), not c
        if last in self.in_registers:
            return self._register_chain(root, last, links, index_layout)
        producer, input_node = self.producer(root)
        return ctx.ChainStep(root, producer, links, self.sink(last, input_node), index_layout)

    def result_layout(self, i: int) -> ctx.TileLayout:
        """The logical (dense) layout of node ``i``'s result: what linear indices in its chain mean."""
        dims = rank4(self.graph.nodes[i].outputs[0].shape)
        return ctx.TileLayout(dims, dims[3])

    def _link(self, previous: int, i: int) -> ctx.Link:
        node = self.graph.nodes[i]
        arguments = tuple(None if r.node == previous else self.operand(r) for r in node.inputs)
        return ctx.Link(i, self.function(i), arguments)

    def producer(self, i: int) -> tuple[ctx.Producer, int | None]:
        """Node ``i``'s producer, and (for accumulators) the node whose state the sink updates."""
        node = self.graph.nodes[i]
        layout = self.result_layout(i)
        match node.op:
            case Op.FUSED:
                return ctx.MapProducer(
                    self.function(i), layout, tuple(self.operand(r) for r in node.inputs)
                ), None
            case op if op in ELEMENTWISE:
                return ctx.MapProducer(
                    self.function(i), layout, tuple(self.operand(r) for r in node.inputs)
                ), None
            case Op.MATMUL | Op.CONCAT_MATMUL:
                matmul, operands = self.matmul(i)
                return ctx.MatmulProducer(matmul, operands), None
            case Op.REDUCTION | Op.REDUCTION_MAX:
                reducer = ctx.Reducer.SUM if node.op is Op.REDUCTION else ctx.Reducer.MAX
                dim = rank4_dim(node.outputs[0].rank, node.attrs.dim)
                source, prologue = node.inputs[0], "mirage::dev::Identity"
                if source.node in self.prologues:  # an element-wise op on each element read
                    prologue = self.function(source.node)
                    source = self.graph.nodes[source.node].inputs[0]
                return ctx.ReduceProducer(reducer, dim, prologue, self.operand(source), self._scratch()), None
            case Op.REDUCTION_TO_DIMX:
                dim = rank4_dim(node.outputs[0].rank, node.attrs.dim)
                return ctx.ReduceToDimxProducer(
                    dim, self.graph.reduction_dimx, self.operand(node.inputs[0])
                ), None
            case Op.RMS_NORM:
                return ctx.RmsNormProducer(
                    node.attrs.eps, self.operand(node.inputs[0]), self._scratch()
                ), None
            case Op.RUNNING_MAX:
                return ctx.MapProducer("mirage::dev::Identity", layout, (self.operand(node.inputs[0]),)), i
            case Op.ACCUM | Op.ACCUM_RESCALE:
                return self._accumulator_producer(i), i
        raise LoweringError(f"block op {node.op.value} has no producer")

    def _scratch(self) -> int | None:
        """The scratch offset for a reduction producer (and note that the kernel needs it)."""
        if self.scratch is not None:
            self.scratch_used = True
        return self.scratch

    def _accumulator_producer(self, i: int) -> ctx.Producer:
        node = self.graph.nodes[i]
        source = self.operand(node.inputs[0])
        match node.attrs.kind:
            case AccumKind.NONE | AccumKind.MAX:
                return ctx.MapProducer("mirage::dev::Identity", self.result_layout(i), (source,))
            case AccumKind.SUM | AccumKind.MEAN:
                return ctx.ReduceProducer(
                    ctx.Reducer.SUM, 3, "mirage::dev::Identity", source, self._scratch()
                )
            case AccumKind.RMS:
                return ctx.ReduceProducer(ctx.Reducer.SUM, 3, "mirage::dev::Square", source, self._scratch())
            case AccumKind.SUM_TODIMX:
                return ctx.ReduceToDimxProducer(3, self.graph.reduction_dimx, source)
        raise LoweringError(f"accumulator kind {node.attrs.kind.value} has no lowering")

    def stores_once(self, i: int) -> bool:
        """An accumulator of a one-iteration for-loop: its update ``acc = 0 ⊕ x`` is a plain store
        (every producer emits each element once), so it needs neither clearing nor a read."""
        return self.graph.forloop_range == 1 and self.graph.nodes[i].op in (Op.ACCUM, Op.ACCUM_RESCALE)

    def sink(self, last: int, state: int | None) -> ctx.Sink:
        node = self.graph.nodes[last]
        if last in self.direct_outputs:
            j, i = self.direct_outputs[last]
            self.stored_directly.add(last)
            return ctx.Sink(last, ctx.SinkKind.GLOBAL, (self.tile(last),), io.saver(self, j, i))
        if self.stores_once(last):
            return ctx.Sink(last, ctx.SinkKind.STORE, (self.tile(last),))
        match node.op:
            case Op.RUNNING_MAX:
                return ctx.Sink(last, ctx.SinkKind.RUNNING_MAX, (self.tile(last), self.tile(last, 1)))
            case Op.ACCUM:
                kind = ctx.SinkKind.MAX if node.attrs.kind is AccumKind.MAX else ctx.SinkKind.ADD
                return ctx.Sink(last, kind, (self.tile(last),))
            case Op.ACCUM_RESCALE:
                maximum = node.inputs[1].node
                return ctx.Sink(
                    last, ctx.SinkKind.RESCALE, (self.tile(last), self.tile(maximum), self.tile(maximum, 1))
                )
        return ctx.Sink(last, ctx.SinkKind.STORE, (self.tile(last),))

    def _register_chain(
        self, root: int, last: int, links: tuple[ctx.Link, ...], index_layout: ctx.TileLayout
    ) -> ctx.RegisterChainStep:
        matmul, operands = self.matmul(root)
        node = self.graph.nodes[last]
        rescale = None
        combine = "mirage::dev::Add"
        if node.op is Op.ACCUM_RESCALE:
            maximum = node.inputs[1].node
            rescale = (self.tile(maximum), self.tile(maximum, 1))
        elif node.attrs.kind is AccumKind.MAX:
            combine = "mirage::dev::Maximum"
        return ctx.RegisterChainStep(
            root,
            self.register_accumulator(last),
            ctx.MatmulProducer(matmul, operands, self.column_scale(root)),
            links,
            combine,
            rescale,
            index_layout,
        )

    # ---- the walk ------------------------------------------------------------------------------

    def loop_state(self, prologue: bool = True) -> list[ctx.Step]:
        """Clear accumulators (0, or −inf for max) and running maxima (−inf) before the loop, then
        (``prologue``) fetch the first stages of the pipelined inputs."""
        fills: list[ctx.Step] = []
        computed = self.in_registers_loop()
        for i, node in enumerate(self.graph.nodes):
            if i in computed:
                continue  # the chain's registers start cleared
            if (
                node.op in (Op.ACCUM, Op.ACCUM_RESCALE)
                and i not in self.in_registers
                and i not in self.row_sums
                and not self.stores_once(i)
            ):
                fills.append(ctx.FillStep(self.tile(i), ctx.initial_value(node.attrs.kind is AccumKind.MAX)))
            elif node.op is Op.RUNNING_MAX:
                fills += [
                    ctx.FillStep(self.tile(i), ctx.RUNNING_MAX_START),
                    ctx.FillStep(self.tile(i, 1), ctx.RUNNING_MAX_START),
                ]
        if prologue and (step := self.prologue()) is not None:
            fills.append(step)
        return fills

    def prologue(self) -> ctx.PrologueStep | None:
        pipelined = tuple(it for it in self.iterators if it.pipelined)
        return ctx.PrologueStep(self.stages, pipelined) if pipelined else None

    def _copies_only(self) -> bool:
        """Every pipelined input fills its stages by copies that land by themselves (16-byte
        vectors: cp.async, or plain stores where a pointer is misaligned), none staged through
        registers and stored at a later load call (``InputIterator::kRegisterStaged``), whose
        stores would need a barrier after the loads."""
        return all(vector_copies(it.tile) for it in self.iterators if it.pipelined)

    @property
    def barrier_free_loop(self) -> bool:
        """The loop is a row-local loop reading every per-iteration input from global memory: it
        touches no shared memory, so it needs no barrier (and may be unrolled)."""
        return self.row_loop is not None and bool(self.row_loop.plan.direct)

    def _releases(self, loop: list[ctx.Step]) -> bool:
        """Whether the loop's stages go back through per-stage barriers (``tma_release``): every pipelined
        input is copied by TMA, and the loop is the warpgroup chain's step alone. With each P·V in its
        step, a thread that has returned from it reads no stage of it (it waits for its products); a
        deferred P·V's V (``late``) is handed back after the next step, which waits for that product."""
        pipelined = [it for it in self.iterators if it.pipelined]
        return (self.tma_release and bool(pipelined) and all(it.tma for it in pipelined)
                and self.softmax is not None and self.softmax.warpgroup
                and all(isinstance(s, ctx.OnlineSoftmaxStep | ctx.BarrierStep) for s in loop))

    def _producer_joins(self, pre_loop: list[ctx.Step]) -> int:
        """The block barriers the computing threads pass before the loop, which a producer warp
        (``producer_warp``) joins after its first stages, or -1 for no producer warp: not asked for, the
        loop not released, multicast copies, or a pre-loop step whose barriers are its own (a reduction)."""
        countable = all(isinstance(s, ctx.LoadStep | ctx.PrologueStep | ctx.BarrierStep | ctx.FillStep)
                        for s in pre_loop)
        if not (self.producer_warp and self.released_loop and countable) or self.kernel.multicast.inputs:
            return -1
        return sum(isinstance(s, ctx.BarrierStep) for s in pre_loop)

    def in_registers_loop(self) -> frozenset[int]:
        """Loop nodes computed by a register step (softmax chain or row-local loop)."""
        if self.softmax is not None:
            return self.softmax.computed
        if self.row_loop is not None:
            return frozenset(self.row_loop.plan.nodes) | frozenset(self.row_loop.plan.post)
        return frozenset()

    def finalize(self, i: int) -> ctx.Step:
        node = self.graph.nodes[i]
        if i in self.in_registers:
            return ctx.FinalizeStep(
                i, ctx.FinalizeKind.WRITE_BACK, self.tile(i), accumulator=self.register_accumulator(i)
            )
        count = self.graph.forloop_range * self.graph.type_of(node.inputs[0]).shape[-1]
        sums = self.row_sums.get(i)
        if node.attrs.kind is AccumKind.MEAN:
            return ctx.FinalizeStep(i, ctx.FinalizeKind.MEAN, self.tile(i), count, row_sums=sums)
        if node.attrs.kind is AccumKind.RMS:
            eps = node.attrs.eps
            return ctx.FinalizeStep(i, ctx.FinalizeKind.RMS, self.tile(i), count, eps, row_sums=sums)
        raise LoweringError(f"accumulator %{i} ({node.attrs.kind.value}) has nothing to finalize")

    def steps(self) -> dict[Phase, list[ctx.Step]]:
        items = self.kernel.schedule.items
        out: dict[Phase, list[ctx.Step]] = {phase: [] for phase in Phase}
        last_barrier = {item.phase: k for k, item in enumerate(items) if isinstance(item, Barrier)}
        has_pre_loop = any(isinstance(item, Step) and item.phase is Phase.PRE_LOOP for item in items)
        # the prologue before the first pre-loop barrier (the memory plan started the stages there):
        # its copies fly while that barrier waits for the pre-loop copies, which are older
        early = self.kernel.memory.early_prologue and has_pre_loop and self.prologue() is not None
        written = {saver for _, saver in self.row_loop.plan.outputs} if self.row_loop is not None else set()
        savers = {i: io.saver(self, j, i) for j, i in enumerate(self.graph.output_nodes) if i not in written}
        iterators = {it.node: it for it in self.iterators}
        if not has_pre_loop:
            out[Phase.PRE_LOOP] += self.loop_state()
            if self.stages == 1 and out[Phase.PRE_LOOP]:
                out[Phase.PRE_LOOP].append(ctx.BarrierStep("loop state cleared", False, 0))
        pending_copies = False
        emitted = False
        computed = self.in_registers_loop()
        if self.softmax is not None:
            out[Phase.POST_LOOP] += [
                softmax.write_back(self),
                ctx.BarrierStep("online-softmax results in shared memory", False),
            ]
        row_loop_pending = self.row_loop is not None
        if self.row_loop is not None:
            out[Phase.PRE_LOOP].insert(0, self.row_loop.setup())
            out[Phase.POST_LOOP] += [
                self.row_loop.write_back(),
                ctx.BarrierStep("row-local loop results in shared memory", False),
            ]
        for k, item in enumerate(items):
            steps = out[item.phase]
            if isinstance(item, Barrier):
                if item.phase is Phase.LOOP and self.barrier_free_loop:
                    continue
                in_flight = 0
                if (item.phase is Phase.PRE_LOOP and self.barrier_free_loop and not self.loop_state()
                        and all(isinstance(x, ctx.RowLoopSetup | ctx.BarrierStep) for x in steps)):
                    continue  # nothing before the loop wrote shared memory: the barrier orders nothing
                if early and item.phase is Phase.PRE_LOOP:
                    if not any(isinstance(x, ctx.PrologueStep) for x in steps):
                        steps.append(self.prologue())
                        in_flight = self.stages - 1
                    if k == last_barrier[Phase.PRE_LOOP]:
                        steps += self.loop_state(prologue=False)
                elif item.phase is Phase.PRE_LOOP and k == last_barrier[Phase.PRE_LOOP]:
                    steps += self.loop_state()
                    in_flight = self.stages - 1
                elif item.phase is Phase.LOOP and not emitted and k != last_barrier[Phase.LOOP]:
                    continue  # only pipelined loads since the last barrier: the pipeline's wait synced
                elif (item.phase is Phase.LOOP and k == last_barrier[Phase.LOOP] and self.stages > 1
                      and self.one_barrier_loops and not pending_copies and self._copies_only()):
                    # the next iteration's wait barrier comes before its loads and its steps: every
                    # thread is then done with this iteration's tiles and stage (one barrier after
                    # the loop instead, for what reads the last iteration's tiles)
                    self.loads_after_barrier = True
                    continue
                # copies landed, or (before the loop) tiles the threads wrote, read by warpgroup MMAs
                fence = self.async_readers and (pending_copies or item.phase is Phase.PRE_LOOP)
                steps.append(ctx.BarrierStep(item.reason, pending_copies, in_flight if pending_copies else 0,
                                             fence))
                pending_copies = emitted = False
                continue
            if item.epilogue_of is not None or item.prologue_of is not None:
                continue  # runs inside its producer's chain (or inside its reduction)
            if item.node in self.folded:
                continue  # scales its matmul's A operand (accumulate_scaled): never stored
            if item.node in computed and item.action is not Action.LOAD:
                if self.row_loop is not None and row_loop_pending and item.phase is Phase.LOOP:
                    steps.append(self.row_loop.step())  # registers only: no barrier after it
                    row_loop_pending = False
                if self.softmax is not None and item.node == self.softmax.anchor:
                    # registers only: the step writes no shared memory, and the tiles it reads (Q,
                    # K, V) are alive the whole loop, so it needs no barrier after it
                    steps.append(ctx.OnlineSoftmaxStep(item.node, softmax.chain_type(self)))
                continue  # computed by the chain's step (or written back after the loop)
            match item.action:
                case Action.LOAD:
                    it = iterators[item.node]
                    if not (it.pipelined or it.direct or it.generated):
                        steps.append(ctx.LoadStep(iterators[item.node]))
                        pending_copies = emitted = True
                case Action.COMPUTE | Action.ACCUMULATE if item.node in self.row_sums:
                    steps.append(ctx.RowSumsStep(self.row_sums[item.node]))  # registers only
                case Action.COMPUTE | Action.ACCUMULATE:
                    steps.append(self.chain(item.node))
                    emitted = True
                case Action.FINALIZE:
                    steps.append(self.finalize(item.node))
                case Action.STORE if (self.graph.nodes[item.node].inputs[0].node in self.stored_directly
                                       or item.node in written):
                    pass  # its result went from its chain (or the row-local loop) straight into the output
                case Action.STORE:
                    steps.append(ctx.StoreStep(savers[item.node]))
        if self.loads_after_barrier:
            out[Phase.POST_LOOP].insert(0, ctx.BarrierStep("the last iteration's tiles", False))
        if self._releases(out[Phase.LOOP]):
            self.released_loop = True
            out[Phase.LOOP] = [s for s in out[Phase.LOOP] if not isinstance(s, ctx.BarrierStep)]
            out[Phase.POST_LOOP].insert(0, ctx.BarrierStep("every warp is done with the last stages", False))
        # a barrier with nothing after it in the kernel orders nothing (the last results went to
        # global memory from registers); one that waits for copies stays
        post = out[Phase.POST_LOOP]
        while post and isinstance(post[-1], ctx.BarrierStep) and not post[-1].wait_copies:
            post.pop()
        return out

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory of the kernel: the plan, and the reduction scratch if a step uses it."""
        if self.softmax_scratch:
            return softmax.scratch_offset(self) + self.softmax_scratch
        if self.row_loop is not None and self.row_loop.plan.scratch_floats:
            return self.row_scratch_offset + 4 * self.row_loop.plan.scratch_floats
        if self.scratch_used and self.scratch is not None:
            return self.scratch + 4 * max(self.threads // 32, 1)
        return self.kernel.smem_bytes

    def min_blocks(self) -> int:
        """Blocks per SM to ask registers for (``__launch_bounds__``'s second argument): 2 for a
        softmax-chain kernel when two blocks' shared memory fits an SM, so that the compiler keeps
        each thread within half the register file (the chain's latency needs a second block to
        hide); 1 otherwise."""
        per_sm = (self.smem_limit or 0) + 1024  # an SM's shared memory: the block limit + 1 KB reserved
        fits = 2 * (self.smem_bytes + 1024) <= per_sm
        if self.two_blocks_per_sm and self.softmax is not None and self.threads >= 256 and fits:
            return 2
        return 1

    def _l2_prefetch(self) -> tuple[tuple[str, int], ...]:
        """(iterator, tiles) pulled into L2 before the dependency wait: the first
        ``l2_prefetch_iterations`` tiles of each input (one for inputs without a for-loop dim)."""
        if self.l2_prefetch_iterations <= 0:
            return ()
        first = min(self.l2_prefetch_iterations, self.graph.forloop_range)
        return tuple((it.name, first if it.forloop_dim >= 0 else 1)
                     for it in self.iterators if not it.generated)

    def _direct_loop(self, loop: list[ctx.Step]) -> ctx.DirectLoop | None:
        if not self.barrier_free_loop:
            return None
        (step,) = loop  # the row-local loop is all the loop has: its loads are its reads
        assert isinstance(step, ctx.RowLoopStep) and self.row_loop is not None
        return self.row_loop.direct_loop(step)

    def context(self) -> ctx.KernelContext:
        steps = self.steps()
        causal_bound = softmax.causal_bound(self, steps[Phase.LOOP])
        bound = {t.name: t for t in self._tiles.values() if t.offset >= 0}
        return ctx.KernelContext(
            name=self.name,
            node=self.kernel.node,
            threads=self.threads,
            min_blocks=self.min_blocks(),
            grid=self.graph.grid_dim,
            smem_bytes=self.smem_bytes,
            forloop_range=self.graph.forloop_range,
            stages=self.stages,
            loads_after_barrier=self.loads_after_barrier,
            released_loop=self.released_loop,
            producer_joins=self._producer_joins(steps[Phase.PRE_LOOP]),
            direct_loop=self._direct_loop(steps[Phase.LOOP]),
            l2_prefetch=self._l2_prefetch(),
            parameters=io.parameters(self),
            functions=tuple(self.functions[i] for i in sorted(self.functions)),
            matmuls=tuple(self.matmuls[i] for i in sorted(self.matmuls)),
            tiles=tuple(bound[n] for n in sorted(bound, key=_tile_order)),
            iterators=self.iterators,
            registers=self.registers,
            row_sums=tuple(self.row_sums.values()),
            softmax=(softmax.chain_type(self),) if self.softmax is not None else (),
            pre_loop=tuple(steps[Phase.PRE_LOOP]),
            loop=tuple(steps[Phase.LOOP]),
            post_loop=tuple(steps[Phase.POST_LOOP]),
            cluster_shape=self._multicast_cluster(steps[Phase.LOOP]),
            async_readers=self.async_readers,
            causal_bound=causal_bound,
            heavy_first_axis=softmax.heavy_first_axis(self, causal_bound),
        )

    def _multicast_cluster(self, loop: list[ctx.Step]) -> tuple[int, int, int]:
        """Blocks per cluster along each grid axis: the multicast inputs' ((1, 1, 1) without). Their slots
        are released after the barrier that ends each iteration, so the loop must end with one."""
        if not any(it.multicast for it in self.iterators):
            return (1, 1, 1)
        if self.loads_after_barrier or not loop or not isinstance(loop[-1], ctx.BarrierStep):
            raise LoweringError(f"{self.name}: multicast inputs need a barrier at the end of each iteration; "
                                "build without OptimizerOptions.multicast_cluster")
        return self.kernel.multicast.shape


LOWERED_OPS = (
    frozenset(
        {
            Op.MATMUL,
            Op.CONCAT_MATMUL,
            Op.FUSED,
            Op.REDUCTION,
            Op.REDUCTION_MAX,
            Op.REDUCTION_TO_DIMX,
            Op.RMS_NORM,
            Op.ACCUM,
            Op.ACCUM_RESCALE,
            Op.RUNNING_MAX,
        }
    )
    | ELEMENTWISE
)


def _tile_order(name: str) -> tuple[int, str]:
    digits = "".join(c for c in name[1:] if c.isdigit()) or "0"
    return int(digits), name
