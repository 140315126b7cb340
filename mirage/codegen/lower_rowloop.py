"""Lowering of a row-local loop body (:mod:`mirage.optimizer.row_loop`) to per-thread statements.

Each thread owns row ``tid / row_threads`` and the ``chunk`` consecutive columns starting at
``(tid % row_threads) · chunk`` of the wide ``[R, W]`` values; narrow ``[R, 1]`` values are computed
by every thread of the row (a few redundant flops instead of a barrier).  The statements
(:class:`~mirage.codegen.lower_context.Statement`) are rendered by ``templates/steps.j2``
(``row_loop``) as straight-line code over fp32 registers: a wide value is ``float name[kRowChunk]``,
a short one (RowLoop.short) its lane's ``float name[kShortChunk]`` from column ``short_col``, a narrow
one ``float name``.  A ragged row's padding (RowLoop.padded) is masked past ``kRowWidth``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mirage.codegen import lower_io as io
from mirage.codegen.lower_context import (
    RUNNING_MAX_START,
    DirectLoop,
    RowLoopSetup,
    RowLoopStep,
    RowLoopWriteBack,
    State,
    Statement,
    Value,
    initial_value,
)
from mirage.codegen.lower_ops import LoweringError
from mirage.mugraph.graph import AccumKind, Ref
from mirage.mugraph.ops import ELEMENTWISE, Op
from mirage.optimizer.row_loop import RowLoop

if TYPE_CHECKING:
    from mirage.codegen.lower import KernelLowering

READ_REGISTERS = 160  # registers per thread for the reads of one batch of a direct loop


def batch_size(iterations: int, most: int) -> int:
    """Iterations a batch of a direct loop: the fewest batches of at most ``most`` (at least one)
    that cover ``iterations``, made as even as they can be."""
    most = max(1, min(most, iterations))
    batches = -(-iterations // most)
    return -(-iterations // batches)


class RowLoopLowering:
    """The records of one kernel's row-local loop: states, the per-iteration statements, write-back."""

    def __init__(self, lowering: KernelLowering, plan: RowLoop) -> None:
        self.lowering = lowering
        self.plan = plan
        self.graph = lowering.graph
        self.members = set(plan.nodes)
        self.statements: list[Statement] = []
        self.values: dict[int, Value] = {}
        self._loaded: dict[int, Value] = {}  # tiles read from shared memory, by node

    @property
    def _layout(self) -> dict:
        """Where a thread's elements sit in its row (RowLoop.group): element e's column, and the
        groups of consecutive columns with their distance."""
        p = self.plan
        if p.transposed:  # element e of a thread's column is the tile's row e
            return {"column": "e", "groups": 1, "stride": 0, "transposed": True}
        if p.group == p.chunk:
            return {"column": "row_loop_col + e", "groups": 1, "stride": 0}
        stride = p.row_threads * p.group
        return {"column": f"row_loop_col + e / {p.group} * {stride} + e % {p.group}",
                "groups": p.chunk // p.group, "stride": stride}

    def _wide(self, shape: tuple[int, ...]) -> bool:
        return self.plan.width > 1 and shape[-2 if self.plan.transposed else -1] == self.plan.width

    def _value(self, name: str, shape: tuple[int, ...]) -> Value:
        """The registers of a value of ``shape``: wide, short (RowLoop.short) or narrow."""
        wide = self._wide(shape)
        return Value(name, wide, not wide and self.plan.short > 1 and shape[-1] == self.plan.short)

    def _operand(self, ref: Ref) -> Value:
        if ref.node in self.values:
            return self.values[ref.node]
        if ref.node not in self._loaded:
            value = self._value(f"x{ref.node}", self.graph.type_of(ref).shape)
            layout = self._layout
            if ref.node in self.plan.direct:
                self.statements.append(Statement("read", value, iterator=f"in{ref.node}",
                                                 groups=layout["groups"], stride=layout["stride"],
                                                 transposed=self.plan.transposed,
                                                 mask=self._mask(value)))
            else:
                self.statements.append(Statement("load", value, tile=self.lowering.operand(ref),
                                                 column=layout["column"], transposed=self.plan.transposed,
                                                 mask=self._mask(value)))
            self._loaded[ref.node] = value
        return self._loaded[ref.node]

    def states(self) -> tuple[State, ...]:
        out = []
        for i in self.plan.states:
            node = self.graph.nodes[i]
            value = Value(f"s{i}", self._wide(node.outputs[0].shape))
            tile = None if i in self.plan.untiled else self.lowering.tile(i)
            if node.op is Op.RUNNING_MAX:
                out.append(State(value, RUNNING_MAX_START, tile, f"s{i}_previous"))
            else:
                initial = initial_value(node.attrs.kind is AccumKind.MAX)
                out.append(State(value, initial, tile))
        return tuple(out)

    def _reduction(self, i: int, kind: str, **fields) -> Statement:
        """A ``reduce`` or ``rms`` statement of node ``i`` along the row (see Statement)."""
        node = self.graph.nodes[i]
        argument = self._operand(node.inputs[0])
        lanes = self.plan.row_threads if argument.wide else self.plan.short_lanes if argument.short else 1
        scratch = "nullptr"
        if lanes > 32:  # this reduction's floats after the memory plan, one per warp
            floats = self.plan.reductions.index(i) * self.lowering.threads // 32
            scratch = f"mirage::dev::shared_at<float>(shared, {self.lowering.row_scratch_offset}) + {floats}"
        result = self._value(f"v{i}", node.outputs[0].shape)
        return Statement(kind, result, (argument,), lanes=lanes, scratch=scratch,
                         mask=self._mask(argument), **fields)

    def _mask(self, value: Value) -> str:
        """Statement.mask of a statement over ``value``."""
        return self.plan.mask if value.wide else "short" if value.short else ""

    def setup(self) -> RowLoopSetup:
        p = self.plan
        return RowLoopSetup(p.rows, p.row_threads, p.chunk, p.group, self.states(), self.lowering.threads,
                            p.transposed, p.width if p.ragged else 0, p.short, p.short_lanes, p.short_chunk)

    def step(self) -> RowLoopStep:
        for i in self.plan.nodes:
            node = self.graph.nodes[i]
            shape = node.outputs[0].shape
            if node.op is Op.FUSED or node.op in ELEMENTWISE:
                arguments = tuple(self._operand(r) for r in node.inputs)
                value = self._value(f"v{i}", shape)
                self.statements.append(Statement("map", value, arguments, self.lowering.function(i)))
            elif node.op in (Op.REDUCTION, Op.REDUCTION_MAX) and (
                    i in self.plan.reductions or i in self.plan.short_reductions):
                combine = "max" if node.op is Op.REDUCTION_MAX else "add"
                self.statements.append(self._reduction(i, "reduce", combine=combine))
                value = self.statements[-1].result
            elif node.op is Op.RMS_NORM:
                count = self.graph.type_of(node.inputs[0]).shape[-1]
                self.statements.append(self._reduction(i, "rms", count=count, eps=node.attrs.eps))
                value = self.statements[-1].result
            elif node.op in (Op.REDUCTION, Op.REDUCTION_MAX):
                value = self._value(f"v{i}", shape)
                self.statements.append(Statement("copy", value, (self._operand(node.inputs[0]),)))
            elif node.op is Op.RUNNING_MAX:
                value = self._value(f"s{i}", shape)
                self.statements.append(Statement("running_max", value, (self._operand(node.inputs[0]),)))
            elif node.op in (Op.ACCUM, Op.ACCUM_RESCALE):
                value = self._value(f"s{i}", shape)
                argument = self._operand(node.inputs[0])
                rescale = None
                if node.op is Op.ACCUM_RESCALE:
                    m = node.inputs[1].node
                    rescale = (f"s{m}", f"s{m}_previous")
                combine = "max" if node.attrs.kind is AccumKind.MAX else "add"
                self.statements.append(Statement("accumulate", value, (argument,), combine=combine,
                                                 rescale=rescale))
            else:
                raise LoweringError(f"%{i} ({node.op.value}) has no row-local lowering")
            self.values[i] = value
        return RowLoopStep(self.plan.nodes, tuple(self.statements))

    def direct_loop(self, step: RowLoopStep) -> DirectLoop:
        """The loop in batches whose reads fill at most :data:`READ_REGISTERS` registers, as even as
        the range allows (32 iterations at most 26 a batch: two of 16, not 26 and 6)."""
        reads = tuple(t for t in step.statements if t.kind == "read")
        p = self.plan
        per_iteration = sum(p.chunk if t.result.wide else p.short_chunk if t.result.short else 1
                            for t in reads)
        scalar = p.transposed or p.mask == "element"
        vectors = () if scalar else tuple(sorted({t.iterator for t in reads if t.result.wide}))
        return DirectLoop(batch_size(self.graph.forloop_range, READ_REGISTERS // max(per_iteration, 1)),
                          reads, vectors, step)

    def write_back(self) -> RowLoopWriteBack:
        """After the loop: the post nodes from the states' registers, the states that keep a tile
        into it, and the savers' values into the outputs."""
        states = self.states()
        values = {i: state.value for i, state in zip(self.plan.states, states, strict=True)}
        statements = []
        for i in self.plan.post:
            node = self.graph.nodes[i]
            values[i] = Value(f"v{i}", self._wide(node.outputs[0].shape))
            arguments = tuple(values[r.node] for r in node.inputs)
            statements.append(Statement("map", values[i], arguments, self.lowering.function(i)))
        outputs = tuple((values[value], io.direct_saver(self.lowering, saver))
                        for value, saver in self.plan.outputs)
        return RowLoopWriteBack(tuple(s for s in states if s.tile is not None), outputs, tuple(statements),
                                mask=self.plan.mask, **self._layout)
