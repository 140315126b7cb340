"""Exception types.  Every error a user can cause is a subclass of :class:`MirageError`.

Graph errors carry the offending node and print the neighbouring lines of the graph's text form,
so the message shows *where* the problem is and says what to change.
"""

from __future__ import annotations


class MirageError(Exception):
    """Base class of all errors raised by mirage."""


class GraphError(MirageError):
    """A graph is structurally invalid.  ``context`` holds the surrounding text-form lines."""

    def __init__(self, message: str, *, node: str | None = None, context: str | None = None) -> None:
        self.node = node
        self.context = context
        text = message if node is None else f"{node}: {message}"
        if context:
            text = f"{text}\n{context}"
        super().__init__(text)


class ShapeError(GraphError):
    """Operand shapes do not fit the op (matmul inner dims, broadcasting, rank)."""


class DTypeError(GraphError):
    """Operands have different or unsupported data types."""


class ArityError(GraphError):
    """An op got the wrong number of inputs."""


class LevelError(GraphError):
    """An op was used at a level (kernel, block, thread) where it does not exist."""


class AttributeValueError(GraphError):
    """An op attribute is out of range (a reduction dim past the rank, an unknown kind, ...)."""


class InputMapError(GraphError):
    """An input iterator's ``input_map`` is illegal for the grid or the tensor."""


class ForloopDimError(GraphError):
    """An input iterator's ``forloop_dim`` is illegal."""


class DivisibilityError(GraphError):
    """A tensor dimension is not divisible by the grid or forloop split applied to it."""


class OutputMapError(GraphError):
    """An output saver's ``output_map`` is illegal for the grid."""


class AfterAccumError(GraphError):
    """The for-loop rule is broken: every input→output path needs exactly one accumulator."""


class GridError(GraphError):
    """Grid, block or forloop dimensions are out of range."""


class SharedMemoryError(GraphError):
    """A block graph needs more shared memory than the target has."""


class BindingError(GraphError):
    """A graph-defined op's inputs do not match its block graph's input iterators."""


class DanglingTensorError(GraphError):
    """A block-graph tensor is produced but never consumed or saved."""


class UnknownOpError(GraphError):
    """An op name is not in the registry."""


class ParseError(GraphError):
    """The text form of a graph could not be parsed."""


class SerializationError(MirageError):
    """A saved graph (JSON) is corrupt or from an incompatible version."""


class InterpretError(MirageError):
    """The interpreter got inputs that do not match the graph."""


class OverlapError(InterpretError, ValueError):
    """Two blocks of an uneven grid axis (``BlockGraph.spans``) computed different values for the entries
    their tiles share: the block graph mixes entries along that dim, which an uneven axis must not."""
