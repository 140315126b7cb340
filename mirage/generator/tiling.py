"""Which block headers tile the reference as one kernel can: the visiting order of headers.

A graph-defined op splits its inputs over a grid of blocks (input maps) and may iterate over a dim
of each tile (for-loop dims).  Whether a header can compute the reference's outputs tile by tile
follows from the reference's *dim classes*: the dims of its tensors that index the same positions.
An element-wise op puts dim d of its result and dim d of each operand in one class (a broadcast
dim of size 1 in none), a matmul its operands' inner dims (and its result's rows and columns with
theirs), a reduction every dim but the reduced one, an RMS norm every dim.  A class is

* *reduced* when some op sums over it (a matmul's inner dim, a reduction's dim, the last dim of an
  RMS norm), and
* an *output* class when it indexes an output of the reference (a dim of size > 1).

The outputs of a block are independent only along the *parallel* classes (output, not reduced), and
a for-loop accumulates over its iterations, so a header *fits* when

1. each split grid axis maps one parallel class, in every input that has a dim of that class;
2. the for-loop (range > 1) iterates one class that is not an output class (a matmul's inner dim,
   a reduced dim that the outputs lose), in every input that has a dim of that class.

The rows of a row-wise norm or softmax (reduced, and an output class) are thus neither split nor
iterated: each block holds whole rows.  A header that misfits may still be part of a µGraph (a
split reduction whose partial results another kernel combines: FlashDecoding), so nothing is cut:
the search visits the headers that fit first, then the others, each group in canonical order.
Inputs that recompute no reference value (the outputs of an earlier graph-defined op) say nothing
and never make a header misfit.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(8, 2048), dtype=mi.float16)
>>> gain = g.new_input(dims=(1, 2048), dtype=mi.float16)
>>> g.mark_output(g.mul(g.rms_norm(x, eps=1e-6), gain))
>>> classes = DimClasses.of(g.freeze())
>>> rows, columns = classes.class_of(0, 0), classes.class_of(0, 1)
>>> rows in classes.parallel, columns in classes.parallel, classes.class_of(1, 1) == columns
(True, False, True)
>>> classes.misfits((0, 1), ((0, -1, -1), (-1, -1, -1)), (-1, -1), (8, 1, 1), 1)
0
>>> classes.misfits((0, 1), ((1, -1, -1), (1, -1, -1)), (-1, -1), (64, 1, 1), 1)  # splits each row
1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mirage.mugraph.graph import Dim3, KernelGraph, Reduce
from mirage.mugraph.ops import ELEMENTWISE, REDUCTIONS, Op

Key = tuple[int, int]  # (reference node, dim)
_MEMO_LIMIT = 200_000  # verdicts kept per reference (a header's verdict recurs at every kernel state)


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}

    def add(self, key: Key) -> None:
        self.parent.setdefault(key, key)

    def find(self, key: Key) -> Key:
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:
            self.parent[key], key = root, self.parent[key]
        return root

    def union(self, a: Key, b: Key) -> None:
        if a in self.parent and b in self.parent:
            self.parent[self.find(a)] = self.find(b)


@dataclass(frozen=True)
class DimClasses:
    """The dim classes of a reference's values (node indices): which are parallel, reduced, output."""

    classes: dict[Key, int]  # (node, dim of size > 1) -> class
    shapes: dict[int, tuple[int, ...]]  # node -> shape of its (single) output
    parallel: frozenset[int]  # output classes that no op reduces
    output: frozenset[int]  # classes that index an output
    unknown: frozenset[int]  # classes an op we do not follow reads or writes: never a misfit
    _verdicts: dict = field(default_factory=dict, compare=False, repr=False)  # misfits, memoized

    @classmethod
    def of(cls, reference: KernelGraph) -> DimClasses:
        if not isinstance(reference, KernelGraph):
            raise TypeError(f"dim classes need a kernel graph, not {type(reference).__name__}")
        uf = _UnionFind()
        shapes: dict[int, tuple[int, ...]] = {}
        reduced: set[Key] = set()
        unknown: set[Key] = set()
        for index, node in enumerate(reference.nodes):
            if node.op is Op.OUTPUT or len(node.outputs) != 1:
                continue
            shape = node.outputs[0].shape
            shapes[index] = shape
            for d, size in enumerate(shape):
                if size > 1:
                    uf.add((index, d))
            if node.op is Op.INPUT:
                continue
            operands = [(r.node, reference.type_of(r).shape) for r in node.inputs]
            if any(r.index != 0 or r.node not in shapes for r in node.inputs) or not _follow(
                node.op, node.attrs, index, shape, operands, uf, reduced
            ):
                unknown.update((index, d) for d in range(len(shape)))
                unknown.update((n, d) for n, s in operands for d in range(len(s)))
        output: set[Key] = set()
        for ref in reference.outputs:
            if ref.index == 0 and ref.node in shapes:
                output.update((ref.node, d) for d in range(len(shapes[ref.node])))
        roots = {key: uf.find(key) for key in uf.parent}
        ids: dict[Key, int] = {}
        classes = {key: ids.setdefault(root, len(ids)) for key, root in roots.items()}

        def of_keys(keys: set[Key]) -> set[int]:
            return {classes[k] for k in keys if k in classes}

        output_classes, reduced_classes = of_keys(output), of_keys(reduced)
        return cls(
            classes,
            shapes,
            frozenset(output_classes - reduced_classes),
            frozenset(output_classes),
            frozenset(of_keys(unknown)),
        )

    def class_of(self, value: int, dim: int) -> int | None:
        """The class of dim ``dim`` of reference node ``value`` (``None``: size 1 or not followed)."""
        return self.classes.get((value, dim))

    def misfits(
        self,
        values: Sequence[int | None],
        input_maps: Sequence[Dim3],
        forloop_dims: Sequence[int],
        grid: Dim3,
        forloop_range: int,
    ) -> int:
        """How many of the two conditions (per split grid axis, and the for-loop) a header breaks.
        ``values`` are the reference values of the header's inputs (``None``: not known)."""
        key = (tuple(values), tuple(input_maps), tuple(forloop_dims), grid, forloop_range)
        verdict = self._verdicts.get(key)
        if verdict is None:
            if not len(values) == len(input_maps) == len(forloop_dims):
                raise ValueError(
                    f"a header has one input map and one for-loop dim per input: got {len(values)} "
                    f"inputs, {len(input_maps)} input maps and {len(forloop_dims)} for-loop dims"
                )
            if len(self._verdicts) >= _MEMO_LIMIT:
                self._verdicts.clear()
            verdict = self._verdicts[key] = self._misfits(*key)
        return verdict

    def axis_fits(self, values: Sequence[int | None], input_maps: Sequence[Dim3], axis: int) -> bool:
        """Whether grid axis ``axis`` of a header maps one parallel class (condition 1 alone)."""
        known = [(v, imap[axis]) for v, imap in zip(values, input_maps, strict=True)
                 if v is not None and v in self.shapes]
        return self._fits_memo(True, tuple(known))

    def _misfits(self, values, input_maps, forloop_dims, grid: Dim3, forloop_range: int) -> int:
        known = [
            (v, imap, fmap)
            for v, imap, fmap in zip(values, input_maps, forloop_dims, strict=True)
            if v is not None and v in self.shapes
        ]
        count = 0
        for axis in range(3):
            if grid[axis] > 1:
                count += not self._fits_memo(True, tuple((v, imap[axis]) for v, imap, _ in known))
        if forloop_range > 1:
            count += not self._fits_memo(False, tuple((v, fmap) for v, _, fmap in known))
        return count

    def _fits_memo(self, grid_axis: bool, dims: tuple[tuple[int, int], ...]) -> bool:
        """:meth:`_fits` for a grid axis (parallel classes) or the for-loop (non-output classes),
        memoized: headers differ in one input's map at a time, so most of their axes recur."""
        key = (grid_axis, dims)
        verdict = self._verdicts.get(key)
        if verdict is None:
            allowed = self.parallel.__contains__ if grid_axis else (lambda c: c not in self.output)
            verdict = self._verdicts[key] = self._fits(list(dims), allowed)
        return verdict

    def _fits(self, dims: list[tuple[int, int]], allowed) -> bool:
        """Every input that maps a dim here (``dims``: value, dim or -1) maps the same class, one
        that ``allowed`` accepts, and no input keeps the whole extent of that class."""
        chosen = {self.class_of(v, d) for v, d in dims if d != -1}
        if not chosen or chosen & self.unknown:
            return True  # nothing known is mapped here, or an op we do not follow reads it
        if len(chosen) != 1 or None in chosen:
            return False
        (cls,) = chosen
        if not allowed(cls):
            return False
        return not any(
            d == -1 and any(self.class_of(v, k) == cls for k in range(len(self.shapes[v]))) for v, d in dims
        )


def _follow(op: Op, attrs, index: int, shape, operands, uf: _UnionFind, reduced: set[Key]) -> bool:
    """Unite the dims of node ``index`` with its operands' dims; ``False`` for an op not followed."""
    rank = len(shape)
    if op in ELEMENTWISE or op is Op.RMS_NORM:
        for node, s in operands:
            if len(s) != rank:
                return False
            for d in range(rank):
                if s[d] == shape[d]:
                    uf.union((index, d), (node, d))
        if op is Op.RMS_NORM:
            reduced.add((index, rank - 1))
        return True
    if op is Op.MATMUL and len(operands) == 2:
        (a, sa), (b, sb) = operands
        if len(sa) != rank or len(sb) != rank:
            return False
        for d in range(rank - 2):
            uf.union((index, d), (a, d))
            uf.union((index, d), (b, d))
        uf.union((index, rank - 2), (a, rank - 2))
        uf.union((index, rank - 1), (b, rank - 1))
        uf.union((a, rank - 1), (b, rank - 2))
        reduced.add((a, rank - 1))
        return True
    if op in REDUCTIONS and isinstance(attrs, Reduce):
        ((a, sa),) = operands
        for d in range(rank):
            if d != attrs.dim:
                uf.union((index, d), (a, d))
        reduced.add((a, attrs.dim))
        return True
    return False
