"""The µGraph IR: tensors, nodes, and graphs at the kernel, block and thread levels.

Graphs are immutable values.  A graph is a tuple of nodes in topological order; a node names its
op, its inputs (references ``Ref(node, index)`` to outputs of earlier nodes), its typed attributes,
and the types of its outputs.  Edits make new graphs (``dataclasses.replace``).

* A :class:`KernelGraph` holds device tensors.  Its ``CUSTOMIZED`` (graph-defined) nodes carry a
  :class:`BlockGraph` as their attributes.
* A :class:`BlockGraph` holds shared-memory tensors.  Its ``INPUT`` nodes are input iterators
  (attributes :class:`InputIterator`), its ``OUTPUT`` nodes output savers (:class:`OutputSaver`).
  The i-th input iterator binds to the i-th input of the graph-defined op, the j-th output saver
  produces its j-th output.
* A :class:`ThreadGraph` is a fused chain of element-wise ops that runs in registers; it is the
  attribute of a block-level ``FUSED`` node (built by the optimizer's fusion pass).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from mirage.mugraph.dtypes import DType

if TYPE_CHECKING:
    from mirage.mugraph.ops import Op


class Level(enum.Enum):
    KERNEL = "kernel"
    BLOCK = "block"
    THREAD = "thread"


class Layout(enum.Enum):
    """Where the innermost (contiguous) dimension is; chosen by the optimizer, never semantic."""

    ROW_MAJOR = "row"
    COLUMN_MAJOR = "col"


class AccumKind(enum.Enum):
    """What a for-loop accumulator sums (R = forloop range, d = the last dim of its input)."""

    NONE = "none"  # out = Σ_r in_r, element-wise
    SUM = "sum"  # out = Σ_r Σ_j in_r[..., j]           (last dim → 1)
    MEAN = "mean"  # SUM / (R·d)                          (last dim → 1)
    RMS = "rms"  # sqrt(Σ_r Σ_j in_r² / (R·d) + eps)    (last dim → 1)
    SUM_TODIMX = "sum_todimx"  # Σ_r reduction_to_dimx(in_r)  (last dim → reduction_dimx)
    MAX = "max"  # out = max_r in_r, element-wise (stable-softmax helper)

    @classmethod
    def parse(cls, value: object) -> AccumKind:
        if isinstance(value, AccumKind):
            return value
        if value is None:
            return AccumKind.NONE
        for kind in cls:
            if str(value).lower() == kind.value:
                return kind
        raise ValueError(f"unknown accumulator {value!r}; use None, {[k.value for k in cls][1:]}")


Dim3 = tuple[int, int, int]


@dataclass(frozen=True)
class TensorType:
    """Shape, data type, layout and (in block graphs) whether the tensor is past the accumulator."""

    shape: tuple[int, ...]
    dtype: DType
    after_accum: bool = False
    layout: Layout = Layout.ROW_MAJOR

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return functools.reduce(lambda a, b: a * b, self.shape, 1)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return dataclasses.replace(self, shape=tuple(shape))


@dataclass(frozen=True)
class Ref:
    """The ``index``-th output of node number ``node`` in the same graph."""

    node: int
    index: int = 0


# ---- typed attributes ---------------------------------------------------------------------------


# attribute fields written (to files and text) only where set, so that graphs without them keep their
# files, texts and content hashes
OMITTED_AT_DEFAULT = frozenset({"pattern", "layout", "strides", "split_strides"})


@dataclass(frozen=True)
class KernelInput:
    name: str = ""
    # values every call passes, which the generated code may compute instead of reading (patterns.py)
    pattern: str = ""
    # how every call is expected to lay the tensor out in memory: "" row-major, "col" its last two dims
    # transposed (a transposed view of a row-major tensor, as nn.Linear's weight.T); kernels that can
    # read such a tile in place do (codegen.column_major), others get a row-major copy
    layout: str = ""
    # the element strides every call is expected to pass where they are not the dense ones of the
    # layout: a view such as a head split, ``x.view(s, h, d).transpose(0, 1)`` (strides (d, h·d, 1)),
    # or its keys transposed, with "col" (strides (d, 1, h·d)); kernels read it through them in place
    # (codegen.column_major), others get a dense copy
    strides: tuple[int, ...] = ()
    # dims that one stride cannot step, such as the (batch · heads) dim of a head split at batch > 1:
    # triples (dim, inner, outer), index i of that dim at (i // inner) · outer + (i % inner) · strides[dim]
    # (:func:`split_view` gives the view of two dims that calls pass); not, in the col layout, the
    # second-to-last (the dim its rows are stored along); the last only in the row-major layout and
    # where its inner part is a broadcast (stride 0, ``split_last``): a group norm's gain, one value a
    # channel, read as rows of (channels of a group · positions)
    split_strides: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.layout not in INPUT_LAYOUTS:
            raise ValueError(f"unknown input layout {self.layout!r}: one of {sorted(INPUT_LAYOUTS)}")
        inner = -2 if self.layout == "col" else -1
        broadcast_rows = self.layout == "" and self.split_last
        if self.strides and (len(self.strides) < 2 or self.strides[inner] != (0 if broadcast_rows else 1)
                             or any(s < 0 for s in self.strides)):
            dim = "second-to-last" if inner == -2 else "last"
            raise ValueError(f"input strides {self.strides} must be positive or 0 (a broadcast), with 1 for "
                             f"the {dim} dim (layout {self.layout!r})")
        splits = self.split_strides
        last = len(self.strides) - (2 if self.layout == "col" else 1) + (1 if broadcast_rows else 0)
        if splits and (not self.strides or len(splits) % 3 or any(
                not 0 <= d < last or inner < 2 or outer < 0
                for d, inner, outer in zip(splits[::3], splits[1::3], splits[2::3], strict=True))):
            raise ValueError(f"split strides {splits} must be triples (dim, inner, outer) of dims before the "
                             f"stored rows of strides {self.strides} (layout {self.layout!r}), inner ≥ 2 and "
                             "outer ≥ 0")

    def splits(self) -> dict[int, tuple[int, int]]:
        """The split dims: dim → (inner extent, outer stride)."""
        return split_dims(self.split_strides)

    @property
    def split_last(self) -> bool:
        """Whether the last dim is split (its inner part then a broadcast, stride 0)."""
        return bool(self.strides) and len(self.strides) - 1 in split_dims(self.split_strides)


INPUT_LAYOUTS = frozenset({"", "col"})


def dense_strides(shape: Sequence[int], layout: str = "") -> tuple[int, ...]:
    """The element strides of a dense tensor of ``shape``: row-major, or with ``layout="col"`` a
    transposed view of a row-major tensor (its last two dims swapped in memory)."""
    swapped = layout == "col" and len(shape) >= 2
    dims = (*shape[:-2], shape[-1], shape[-2]) if swapped else tuple(shape)
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    strides.reverse()
    return (*strides[:-2], strides[-1], strides[-2]) if swapped else tuple(strides)


def split_view(shape: Sequence[int], strides: Sequence[int],
               splits: dict[int, tuple[int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape and strides of the view a call passes for an input of ``shape`` declared with
    ``strides`` and split dims ``splits`` (``KernelInput.splits``): each split dim as two, outer first."""
    view_shape: list[int] = []
    view_strides: list[int] = []
    for d, (n, s) in enumerate(zip(shape, strides, strict=True)):
        if d in splits:
            inner, outer = splits[d]
            view_shape += [n // inner, inner]
            view_strides += [outer, s]
        else:
            view_shape.append(n)
            view_strides.append(s)
    return tuple(view_shape), tuple(view_strides)


def split_dims(triples: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Split dims written as (dim, inner size, outer stride) triples (``KernelInput.split_strides``, the
    tail of a ``KernelGraph.output_strides`` entry) as dim → (inner size, outer stride)."""
    return {d: (inner, outer)
            for d, inner, outer in zip(triples[::3], triples[1::3], triples[2::3], strict=True)}


def split_triples(splits: dict[int, tuple[int, int]]) -> tuple[int, ...]:
    """:func:`split_dims` backwards."""
    return tuple(v for d in sorted(splits) for v in (d, *splits[d]))


def rank4_split(splits: dict[int, tuple[int, int]], rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``dev::Strides``'s ``outer`` and ``inner`` for split dims of a tensor of ``rank`` dims (four, the
    leading ones of one element added; 0 where a dim is not split)."""
    outer, inner = [0] * 4, [0] * 4
    for d, (n, o) in splits.items():
        inner[d + 4 - rank], outer[d + 4 - rank] = n, o
    return tuple(outer), tuple(inner)


def split_pairs(shape: Sequence[int], strides: Sequence) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """``new_input``'s or ``mark_output``'s strides, where a dim before the last may be a pair
    ((outer size, outer stride), (inner size, inner stride)), as the inner stride of each dim and the
    split dims (dim → (inner size, outer stride)); ValueError for any other entry or a pair that does
    not split its dim."""
    given = None if isinstance(strides, (str, bytes)) or not isinstance(strides, Iterable) else tuple(strides)
    if given is None or len(given) != len(shape):
        raise ValueError(f"strides must be a sequence of {len(shape)} entries, got {strides!r}")
    flat: list[int] = []
    splits: dict[int, tuple[int, int]] = {}
    for d, (n, s) in enumerate(zip(shape, given, strict=True)):
        if type(s) is int:
            flat.append(s)
            continue
        try:
            (outer_n, outer), (inner_n, inner) = s
            if not all(type(v) is int for v in (outer_n, outer, inner_n, inner)):
                raise TypeError
        except (TypeError, ValueError):
            raise ValueError(f"stride {s!r} of dim {d} is neither an int nor ((outer size, outer stride), "
                             "(inner size, inner stride))") from None
        # the last dim splits only as a broadcast within its inner part (a group norm's gain, one value
        # a channel, against rows of (channels of a group · positions)): its elements are not stepped
        last = d == len(shape) - 1
        if outer_n * inner_n != n or min(outer_n, inner_n) < 2 or (last and inner != 0):
            raise ValueError(f"dim {d} of {n} elements cannot split as {outer_n} × {inner_n} (a split dim "
                             "comes before the last, or is the last with an inner stride of 0; its sizes "
                             "≥ 2 and their product its size)")
        splits[d] = (inner_n, outer)
        flat.append(inner)
    return flat, splits


def merged_strides(shape: Sequence[int], view_shape: Sequence[int],
                   view_strides: Sequence[int]) -> tuple[int | tuple[tuple[int, int], tuple[int, int]], ...]:
    """Per dim of ``shape``, how a view of ``view_shape`` and ``view_strides`` reshaped to ``shape`` steps
    it: a stride, where the view's dims merged into that dim step it by one, or ((outer size, outer
    stride), (inner size, inner stride)) where they step it by two (a head split's (batch · heads) at
    batch > 1), the form ``new_input(strides=...)`` takes.  A dim of the view that the reshape splits
    over several dims (a grouped-query fold's heads, (kv heads, group)) is split as a view would be.
    ValueError where a reshape cannot split a dim so, or merges dims of three or more strides."""
    dims = [(int(n), int(s)) for n, s in zip(view_shape, view_strides, strict=True) if n != 1]
    out: list = []
    at = 0
    for n in shape:
        run, size = [], 1
        while size < n and at < len(dims):
            m, stride = dims[at]
            if size * m > n and m % (n // size) == 0 and n % size == 0:  # split it: its outer part here
                part = n // size
                dims[at] = (m // part, stride)
                run.append((part, stride * (m // part)))
                size *= part
                break
            run.append(dims[at])
            size *= m
            at += 1
        if size != n:
            raise ValueError(f"a view of shape {list(view_shape)} does not merge into shape {list(shape)}")
        merged: list[tuple[int, int]] = []
        for m, s in run:
            if merged and merged[-1][1] == s * m:
                merged[-1] = (merged[-1][0] * m, s)
            else:
                merged.append((m, s))
        if len(merged) > 2:
            raise ValueError(f"a dim of {n} elements steps by {len(merged)} strides ({merged})")
        out.append(1 if not merged else merged[0][1] if len(merged) == 1 else tuple(merged))
    if at != len(dims):
        raise ValueError(f"a view of shape {list(view_shape)} does not merge into shape {list(shape)}")
    return tuple(out)


def same_strides(shape: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether strides ``a`` and ``b`` address a tensor of ``shape`` alike (a dim of one element is
    never stepped, so its stride does not count)."""
    return len(a) == len(b) == len(shape) and all(
        x == y for n, x, y in zip(shape, a, b, strict=True) if n > 1)


def input_layout(shape: Sequence[int], strides: Sequence[int]) -> tuple[str, tuple[int, ...]]:
    """``KernelInput``'s (layout, strides) for a tensor of ``shape`` with element ``strides``: row-major
    or column-major in its last two dims, dense or not (a view, and in it broadcast dims of stride 0);
    ValueError for strides that repeat elements otherwise or step neither of the last two dims by one."""
    strides = tuple(int(s) for s in strides)
    if len(strides) != len(shape):
        raise ValueError(f"{len(strides)} strides for a tensor of rank {len(shape)}")
    stepped = sorted((s, n) for s, n in zip(strides, shape, strict=True) if n > 1 and s != 0)
    if any(s < 0 for s in strides) or any(t < s * n for (s, n), (t, _) in zip(stepped, stepped[1:],
                                                                               strict=False)):
        raise ValueError(f"strides {strides} of a tensor of shape {list(shape)} repeat elements")
    for layout in ("", "col") if len(shape) >= 2 else ("",):
        inner = len(shape) - (2 if layout == "col" else 1)
        if same_strides(shape, strides, dense_strides(shape, layout)):
            return layout, ()
        if shape[inner] == 1 or strides[inner] == 1:
            if layout == "" and len(shape) >= 2 and shape[-1] == 1:
                continue  # a column: read as the col layout's rows where it is one
            return layout, tuple(s if n > 1 else 1 for s, n in zip(strides, shape, strict=True))
    raise ValueError(f"strides {strides} of a tensor of shape {list(shape)} step neither of its last "
                     "two dims by one element")


def output_strides(shape: Sequence[int], strides: Sequence) -> tuple[int, ...]:
    """The strides an output of ``shape`` declares for element ``strides`` (``KernelGraph.output_strides``):
    () where they are row-major; ValueError unless they lay the tensor out densely (its dims in some
    order, no gaps, no overlap) with its last dim stepped by one element. A dim before the last may
    take two strides, ((outer size, outer stride), (inner size, inner stride)), as a head merge's
    (batch · heads) at batch > 1: the declaration is then the inner strides followed by a triple
    (dim, inner size, outer stride) per such dim (:func:`output_view` reads it), and the output is
    the view with that dim as two."""
    if len(strides) != len(shape):
        raise ValueError(f"{len(strides)} strides for a tensor of rank {len(shape)}")
    if any(isinstance(s, (tuple, list)) for s in strides):
        inner_strides, splits = split_pairs(shape, strides)
        view_shape, view_strides = split_view(shape, inner_strides, splits)
        if not output_strides(view_shape, view_strides):
            raise ValueError(f"strides {tuple(strides)} lay out a tensor of shape {list(shape)} row-major: "
                             "declare them as one stride a dim")
        unit = tuple(s if n > 1 else 1 for s, n in zip(inner_strides, shape, strict=True))
        return unit + split_triples(splits)
    strides = tuple(int(s) for s in strides)
    if same_strides(shape, strides, dense_strides(shape)):
        return ()
    step = 1
    for s, n in sorted((s, n) for s, n in zip(strides, shape, strict=True) if n > 1):
        if s != step:
            raise ValueError(f"strides {strides} do not lay out a tensor of shape {list(shape)} densely")
        step *= n
    if shape[-1] > 1 and strides[-1] != 1:
        raise ValueError(f"strides {strides} of an output of shape {list(shape)} do not step its last "
                         "dim by one element")
    return tuple(s if n > 1 else 1 for s, n in zip(strides, shape, strict=True))


def output_view(shape: Sequence[int], declared: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape and strides of the tensor that holds an output of ``shape`` declared with ``declared``
    (``KernelGraph.output_strides``; () row-major): the graph's shape, or with split dims the view
    that holds each of them as two."""
    rank = len(shape)
    if not declared:
        return tuple(shape), dense_strides(shape)
    return split_view(shape, declared[:rank], split_dims(declared[rank:]))


@dataclass(frozen=True)
class Reduce:
    """Reduce ``dim`` (keeping the rank) to size 1, or to ``reduction_dimx`` for REDUCTION_TO_DIMX."""

    dim: int


@dataclass(frozen=True)
class Scalar:
    value: float


@dataclass(frozen=True)
class Clamp:
    min: float
    max: float


@dataclass(frozen=True)
class RmsNorm:
    """x / sqrt(mean(x², last dim) + eps)."""

    eps: float = 0.0


@dataclass(frozen=True)
class Accum:
    kind: AccumKind = AccumKind.NONE
    eps: float = 0.0


@dataclass(frozen=True)
class InputIterator:
    """Loads the tile of ``source`` for each block and iteration (mirage-notes §1.3)."""

    source: TensorType
    input_map: Dim3 = (-1, -1, -1)
    forloop_dim: int = -1


@dataclass(frozen=True)
class OutputSaver:
    """Writes each block's tile to its place in the device tensor."""

    output_map: Dim3 = (-1, -1, -1)
    forloop_dim: int = -1


@dataclass(frozen=True)
class ThreadInput:
    index: int


Attrs = Union[
    KernelInput, Reduce, Scalar, Clamp, RmsNorm, Accum, InputIterator, OutputSaver, ThreadInput,
    "BlockGraph", "ThreadGraph", None,
]


@dataclass(frozen=True)
class Node:
    op: Op
    inputs: tuple[Ref, ...]
    attrs: Attrs
    outputs: tuple[TensorType, ...]


@dataclass(frozen=True)
class _GraphBase:
    nodes: tuple[Node, ...]

    def type_of(self, ref: Ref) -> TensorType:
        return self.nodes[ref.node].outputs[ref.index]

    def operand_types(self, node: Node) -> tuple[TensorType, ...]:
        return tuple(self.type_of(r) for r in node.inputs)

    def refs(self) -> list[Ref]:
        """Every tensor of the graph, in canonical order (node, then output index)."""
        return [Ref(i, j) for i, n in enumerate(self.nodes) for j in range(len(n.outputs))]

    def consumers(self) -> dict[Ref, list[int]]:
        uses: dict[Ref, list[int]] = {r: [] for r in self.refs()}
        for i, node in enumerate(self.nodes):
            for r in node.inputs:
                uses.setdefault(r, []).append(i)
        return uses

    def upstream(self, node: int) -> set[int]:
        """Every node that ``node`` is computed from: its inputs' nodes, theirs, and so on."""
        return _reached(node, lambda i: [r.node for r in self.nodes[i].inputs])

    def downstream(self, node: int) -> set[int]:
        """Every node computed from ``node``: its readers, theirs, and so on."""
        readers: dict[int, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for r in n.inputs:
                readers.setdefault(r.node, []).append(i)
        return _reached(node, lambda i: readers.get(i, []))


def _reached(start: int, step) -> set[int]:
    """The nodes ``step`` reaches from ``start`` in one or more steps."""
    seen: set[int] = set()
    todo = list(step(start))
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo.extend(step(i))
    return seen


@dataclass(frozen=True)
class ThreadGraph(_GraphBase):
    """A fused chain of element-wise ops; ``INPUT`` nodes carry :class:`ThreadInput`."""

    outputs: tuple[Ref, ...] = ()

    level = Level.THREAD


@dataclass(frozen=True)
class BlockGraph(_GraphBase):
    grid_dim: Dim3 = (1, 1, 1)
    block_dim: Dim3 = (128, 1, 1)
    forloop_range: int = 1
    reduction_dimx: int = 64
    # per grid axis, the size of the dim its blocks partition where they do not divide it (0: they do):
    # each block's tile then has ceil(span / blocks) entries there and the last one starts at
    # span - tile, overlapping the one before it (see :func:`mirage.mugraph.build.tile_start`)
    spans: Dim3 = (0, 0, 0)

    level = Level.BLOCK

    @property
    def num_blocks(self) -> int:
        x, y, z = self.grid_dim
        return x * y * z

    @property
    def input_nodes(self) -> list[int]:
        from mirage.mugraph.ops import Op

        return [i for i, n in enumerate(self.nodes) if n.op is Op.INPUT]

    @property
    def output_nodes(self) -> list[int]:
        from mirage.mugraph.ops import Op

        return [i for i, n in enumerate(self.nodes) if n.op is Op.OUTPUT]

    @property
    def source_types(self) -> tuple[TensorType, ...]:
        return tuple(self.nodes[i].attrs.source for i in self.input_nodes)  # type: ignore[union-attr]

    @property
    def result_types(self) -> tuple[TensorType, ...]:
        return tuple(self.nodes[i].outputs[0] for i in self.output_nodes)


@dataclass(frozen=True)
class KernelGraph(_GraphBase):
    outputs: tuple[Ref, ...] = ()
    name: str = field(default="", compare=True)
    # per output, the element strides it is written with where they are not row-major (a dense
    # permutation: an attention's [heads, s, d] result laid out as [s, heads, d], which the program
    # views after a transpose, :func:`output_strides`); () for every output written row-major
    output_strides: tuple[tuple[int, ...], ...] = ()

    level = Level.KERNEL

    @property
    def input_nodes(self) -> list[int]:
        from mirage.mugraph.ops import Op

        return [i for i, n in enumerate(self.nodes) if n.op is Op.INPUT]

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        return tuple(self.nodes[i].outputs[0] for i in self.input_nodes)

    @property
    def output_types(self) -> tuple[TensorType, ...]:
        return tuple(self.type_of(r) for r in self.outputs)

    def output_stride(self, k: int) -> tuple[int, ...]:
        """The strides output ``k`` is declared with, or () for row-major."""
        return self.output_strides[k] if k < len(self.output_strides) else ()

    def strided_writes(self) -> dict[Ref, tuple[int, ...]]:
        """The outputs that the kernels producing them write with their declared strides: those no
        other op of the graph reads (a reader takes its inputs row-major; such an output is written
        row-major and laid out afterwards)."""
        read = {r for node in self.nodes for r in node.inputs}
        return {r: self.output_stride(m) for m, r in enumerate(self.outputs)
                if self.output_stride(m) and r not in read and self._writes_split(r, self.output_stride(m))}

    def _writes_split(self, ref: Ref, declared: tuple[int, ...]) -> bool:
        """Whether the kernel producing ``ref`` can write it with ``declared`` strides: true without split
        dims; with them, where it is a graph-defined op whose saver's tile never straddles a split (its
        extent along each split dim divides the inner size)."""
        rank = len(self.type_of(ref).shape)
        if len(declared) == rank:
            return True
        node = self.nodes[ref.node]
        if not isinstance(node.attrs, BlockGraph):
            return False  # run through torch: laid out afterwards
        saver = node.attrs.nodes[node.attrs.output_nodes[ref.index]]
        tile = node.attrs.type_of(saver.inputs[0]).shape
        return all(inner % tile[d] == 0 for d, (inner, _) in split_dims(declared[rank:]).items())

    def block_graphs(self) -> list[BlockGraph]:
        return [n.attrs for n in self.nodes if isinstance(n.attrs, BlockGraph)]

    # conveniences that delegate to the rest of the package
    def __str__(self) -> str:
        from mirage.mugraph.text import to_text

        return to_text(self)

    def content_hash(self) -> str:
        from mirage.mugraph.serialize import content_hash

        return content_hash(self)

    def to_json(self, path=None) -> str:
        from mirage.mugraph.serialize import save

        return save(self, path)


Graph = KernelGraph | BlockGraph | ThreadGraph
