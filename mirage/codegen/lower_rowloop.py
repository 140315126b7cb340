"""Lowering of a row-local loop body (:mod:`mirage.optimizer.row_loop`) to per-thread statements.

Each thread owns row ``tid / row_threads`` and the ``chunk`` consecutive columns starting at
``(tid % row_threads) · chunk`` of the wide ``[R, W]`` values; narrow ``[R, 1]`` values are computed
by every thread of the row (a few redundant flops instead of a barrier).  The statements below are
rendered by ``templates/steps.j2`` (``row_loop``) as straight-line code over fp32 registers: a
wide value is ``float name[kChunk]``, a narrow one ``float name``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from mirage.codegen import lower_context as ctx
from mirage.codegen.lower_ops import LoweringError
from mirage.mugraph.graph import AccumKind, Ref
from mirage.mugraph.ops import ELEMENTWISE, Op
from mirage.optimizer.row_loop import RowLoop

if TYPE_CHECKING:
    from mirage.codegen.lower import KernelLowering


@dataclass(frozen=True)
class Value:
    name: str
    wide: bool


@dataclass(frozen=True)
class Statement:
    """One statement of the loop body (``kind`` picks the template's spelling):

    * ``load``: ``result = tile[row, col + e]`` (or ``tile[row, 0]`` when narrow, broadcast)
    * ``map``: ``result = function(arguments...)`` element by element
    * ``copy``: ``result = arguments[0]``
    * ``running_max``: ``previous = state; state = max(state, arguments[0])``
    * ``accumulate``: ``state = state · factor + arguments[0]`` (``combine`` add) or
      ``max(state, arguments[0])``; ``factor = exp(previous − current)`` of ``rescale``, else 1
    """

    kind: str
    result: Value
    arguments: tuple[Value, ...] = ()
    function: str = ""
    tile: ctx.Tile | None = None
    combine: str = "add"
    rescale: tuple[str, str] | None = None  # (current, previous) names of a running max


@dataclass(frozen=True)
class State:
    """A register accumulator or running max: declared before the loop, written back after it."""

    value: Value
    initial: str
    tile: ctx.Tile
    previous: str | None = None  # running maxima keep their value before this iteration


@dataclass(frozen=True)
class RowLoopSetup:
    """Before the loop: the thread's row and columns, and its states."""

    kind: ClassVar[str] = "row_loop_setup"
    rows: int
    row_threads: int
    chunk: int
    states: tuple[State, ...]


@dataclass(frozen=True)
class RowLoopStep:
    kind: ClassVar[str] = "row_loop"
    nodes: tuple[int, ...]
    statements: tuple[Statement, ...]


@dataclass(frozen=True)
class RowLoopWriteBack:
    kind: ClassVar[str] = "row_loop_write_back"
    states: tuple[State, ...]


NEGATIVE_INFINITY = "mirage::gen::negative_infinity()"


class RowLoopLowering:
    def __init__(self, lowering: KernelLowering, plan: RowLoop) -> None:
        self.lowering = lowering
        self.plan = plan
        self.graph = lowering.graph
        self.members = set(plan.nodes)
        self.statements: list[Statement] = []
        self.values: dict[int, Value] = {}
        self._loaded: dict[int, Value] = {}  # tiles read from shared memory, by node

    def _wide(self, shape: tuple[int, ...]) -> bool:
        return self.plan.width > 1 and shape[-1] == self.plan.width

    def _operand(self, ref: Ref) -> Value:
        if ref.node in self.values:
            return self.values[ref.node]
        if ref.node not in self._loaded:
            value = Value(f"x{ref.node}", self._wide(self.graph.type_of(ref).shape))
            self.statements.append(Statement("load", value, tile=self.lowering.operand(ref)))
            self._loaded[ref.node] = value
        return self._loaded[ref.node]

    def states(self) -> tuple[State, ...]:
        out = []
        for i in self.plan.states:
            node = self.graph.nodes[i]
            value = Value(f"s{i}", self._wide(node.outputs[0].shape))
            if node.op is Op.RUNNING_MAX:
                out.append(State(value, NEGATIVE_INFINITY, self.lowering.tile(i), f"s{i}_previous"))
            else:
                initial = NEGATIVE_INFINITY if node.attrs.kind is AccumKind.MAX else "0.0f"
                out.append(State(value, initial, self.lowering.tile(i)))
        return tuple(out)

    def setup(self) -> RowLoopSetup:
        return RowLoopSetup(self.plan.rows, self.plan.row_threads, self.plan.chunk, self.states())

    def step(self) -> RowLoopStep:
        for i in self.plan.nodes:
            node = self.graph.nodes[i]
            wide = self._wide(node.outputs[0].shape)
            if node.op is Op.FUSED or node.op in ELEMENTWISE:
                arguments = tuple(self._operand(r) for r in node.inputs)
                value = Value(f"v{i}", wide)
                self.statements.append(Statement("map", value, arguments, self.lowering.function(i)))
            elif node.op in (Op.REDUCTION, Op.REDUCTION_MAX):
                value = Value(f"v{i}", wide)
                self.statements.append(Statement("copy", value, (self._operand(node.inputs[0]),)))
            elif node.op is Op.RUNNING_MAX:
                value = Value(f"s{i}", wide)
                self.statements.append(Statement("running_max", value, (self._operand(node.inputs[0]),)))
            elif node.op in (Op.ACCUM, Op.ACCUM_RESCALE):
                value = Value(f"s{i}", wide)
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

    def write_back(self) -> RowLoopWriteBack:
        return RowLoopWriteBack(self.states())
