"""Search states: immutable records of a kernel graph (or a block graph) under construction.

A state carries, beside its graph, what the enumeration needs at every step without recomputing it:
the flat list of tensors (canonical indices), each tensor's abstract expression, how often each
tensor is consumed, the canonical order of the last op, and the memory in use.

The canonical order (Mirage's ``Order``, mirage-notes §4.1): an op's order is the tuple of its input
tensor indices followed by its op-type rank; tuples compare lexicographically, a prefix is smaller.
Python's tuple comparison is exactly that, so an order is ``(inputs, rank)`` and an op may be added
only if its order is greater than the last op's.
"""

from __future__ import annotations

from dataclasses import dataclass

from mirage.generator.abstract_expr import Term
from mirage.mugraph.graph import Dim3, KernelGraph, Node, Ref, TensorType

Order = tuple[tuple[int, ...], int]
INPUT_ORDER: Order = ((), -1)


@dataclass(frozen=True)
class KernelState:
    graph: KernelGraph
    tensors: tuple[Ref, ...]  # every tensor, in canonical order
    terms: tuple[Term, ...]  # abstract expression of each tensor
    uses: tuple[int, ...]  # number of consumers of each tensor
    last: Order
    graph_defined: int  # graph-defined ops so far
    memory_bytes: int  # device memory of all tensors
    type_ids: tuple[int, ...] = ()  # interned tensor types (a per-process cache key)
    values: tuple[int | None, ...] = ()  # the reference node each tensor recomputes (``guide.py``)

    @property
    def types(self) -> tuple[TensorType, ...]:
        return tuple(self.graph.type_of(r) for r in self.tensors)

    def sinks(self) -> list[int]:
        return [i for i, n in enumerate(self.uses) if n == 0]


@dataclass(frozen=True)
class BlockHeader:
    """A graph-defined op's inputs (kernel tensor indices) and the block graph's dims and maps."""

    inputs: tuple[int, ...]
    grid_dim: Dim3
    block_dim: Dim3
    forloop_range: int
    input_maps: tuple[Dim3, ...]
    forloop_dims: tuple[int, ...]
    tiles: tuple[TensorType, ...]  # the tile each input iterator yields per block and iteration
    outputs: tuple[int, int] = (1, 2)  # how many outputs the block graph may have (least, most)
    final: bool = False  # nothing can follow the op: its outputs are the µGraph's outputs
    spans: Dim3 = (0, 0, 0)  # per grid axis, the dim size it splits unevenly (BlockGraph.spans)


@dataclass(frozen=True)
class BlockState:
    """A block graph under construction, independent of the header: input nodes are placeholders
    whose outputs are the tiles, so one body serves every header with the same tiles."""

    nodes: tuple[Node, ...]
    types: tuple[TensorType, ...]  # one output per block node
    terms: tuple[Term, ...]
    uses: tuple[int, ...]
    last: Order
    memory_bytes: int  # shared memory (Mirage's estimate)
    num_inputs: int
    type_ids: tuple[int, ...] = ()  # interned tensor types (a per-process cache key)
    sink_count: int = 0  # tensors nobody consumes
    open_count: int = 0  # sinks that cannot be outputs yet (inputs, or not accumulated)
    values: tuple[int | None, ...] = ()  # the reference node each tensor recomputes (``guide.py``)

    def sinks(self) -> list[int]:
        return [i for i, n in enumerate(self.uses) if n == 0]


@dataclass(frozen=True)
class Body:
    """A block graph that can be closed: its op nodes (after the inputs) and its sink tensors."""

    nodes: tuple[Node, ...]
    sinks: tuple[int, ...]
    terms: tuple[Term, ...]  # the sinks' abstract expressions
    position: int  # pre-order index of its state in the block search of its key


@dataclass(frozen=True)
class BodyList:
    bodies: tuple[Body, ...]
    states: int  # block states the search of this key visits
