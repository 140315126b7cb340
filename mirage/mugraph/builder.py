"""The builder API, spelled as Mirage's so that its scripts port over.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> X = g.new_input(dims=(2, 4096), dtype=mi.float16)
>>> W = g.new_input(dims=(4096, 6144), dtype=mi.float16)
>>> tb = mi.new_threadblock_graph(grid_dim=(64, 1, 1), block_dim=(128, 1, 1), forloop_range=64,
...                               reduction_dimx=64)
>>> bx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
>>> bw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
>>> r = tb.forloop_accum(bx, acc="rms")
>>> m = tb.forloop_accum(tb.matmul(bx, bw))
>>> tb.new_output(tb.div(m, r), output_map=(1, -1, -1))
>>> O, = g.customized([X, W], tb)
>>> g.mark_output(O)
>>> O.dims
(2, 6144)
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import Any

from mirage.errors import (
    AttributeValueError,
    DTypeError,
    ForloopDimError,
    GraphError,
    GridError,
    InputMapError,
    OutputMapError,
    ShapeError,
)
from mirage.mugraph import build, patterns
from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import (
    INPUT_LAYOUTS,
    Accum,
    AccumKind,
    BlockGraph,
    Clamp,
    KernelGraph,
    KernelInput,
    Reduce,
    Ref,
    RmsNorm,
    Scalar,
    TensorType,
    dense_strides,
    input_layout,
    output_strides,
    split_pairs,
    split_triples,
    split_view,
)
from mirage.mugraph.ops import Op


class _Tensor:
    """A handle on a tensor of a graph under construction."""

    def __init__(self, builder: Any, ref: Ref) -> None:
        self._builder = builder
        self.ref = ref

    @property
    def type(self) -> TensorType:
        return self._builder.graph.type_of(self.ref)

    @property
    def dims(self) -> tuple[int, ...]:
        return self.type.shape

    shape = dims

    @property
    def num_dims(self) -> int:
        return len(self.dims)

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def dim(self, i: int) -> int:
        return self.dims[i]

    def __repr__(self) -> str:
        ref = f"%{self.ref.node}.{self.ref.index}"
        return f"{type(self).__name__}({ref}: {self.dtype.short}{list(self.dims)})"

    # operator sugar
    def __add__(self, other):
        return self._builder.add(self, other)

    def __sub__(self, other):
        return self._builder.sub(self, other)

    def __mul__(self, other):
        return self._builder.mul(self, other)

    def __truediv__(self, other):
        return self._builder.div(self, other)

    def __matmul__(self, other):
        return self._builder.matmul(self, other)


class DTensor(_Tensor):
    """A device-memory tensor of a kernel graph."""


class STensor(_Tensor):
    """A shared-memory tensor of a block graph."""

    @property
    def after_accum(self) -> bool:
        return self.type.after_accum


class _Builder:
    tensor_type: type[_Tensor] = _Tensor

    def __init__(self, graph) -> None:
        self.graph = graph

    def _ref(self, t) -> Ref:
        if not isinstance(t, _Tensor) or t._builder is not self:
            raise GraphError(f"{t!r} is not a tensor of this graph; pass tensors created by this "
                             f"{type(self).__name__}")
        return t.ref

    def _add(self, op: Op, inputs: Sequence, attrs=None, outputs=None):
        refs = tuple(self._ref(t) for t in inputs)
        try:
            self.graph, index = build.append(self.graph, op, refs, attrs, outputs)
        except GraphError as error:
            build.rethrow(error, self.graph, None, _pending_line(op, refs, attrs))
        node = self.graph.nodes[index]
        outs = [self.tensor_type(self, Ref(index, j)) for j in range(len(node.outputs))]
        return outs[0] if len(outs) == 1 else outs

    def apply(self, op: Op, inputs: Sequence, attrs=None):
        """``op`` with ``attrs`` on ``inputs``: a node of another graph copied by its op, not its name."""
        return self._add(op, inputs, attrs)

    # element-wise and matrix ops shared by the kernel and block levels
    def matmul(self, a, b):
        return self._add(Op.MATMUL, (a, b))

    def exp(self, a):
        return self._add(Op.EXP, (a,))

    def sqrt(self, a):
        return self._add(Op.SQRT, (a,))

    def square(self, a):
        return self._add(Op.SQUARE, (a,))

    def silu(self, a):
        return self._add(Op.SILU, (a,))

    def gelu(self, a):
        return self._add(Op.GELU, (a,))

    def gelu_erf(self, a):
        return self._add(Op.GELU_ERF, (a,))

    def relu(self, a):
        return self._add(Op.RELU, (a,))

    def sigmoid(self, a):
        return self._add(Op.SIGMOID, (a,))

    def tanh(self, a):
        return self._add(Op.TANH, (a,))

    def log(self, a):
        return self._add(Op.LOG, (a,))

    def softplus(self, a):
        return self._add(Op.SOFTPLUS, (a,))

    def log1p(self, a):
        return self._add(Op.LOG1P, (a,))

    def expm1(self, a):
        return self._add(Op.EXPM1, (a,))

    def erf(self, a):
        return self._add(Op.ERF, (a,))

    def sin(self, a):
        return self._add(Op.SIN, (a,))

    def cos(self, a):
        return self._add(Op.COS, (a,))

    def clamp(self, a, min_value: float, max_value: float):
        return self._add(Op.CLAMP, (a,), Clamp(_real(min_value, "clamp's min_value"),
                                               _real(max_value, "clamp's max_value")))

    def mul_scalar(self, a, scalar: float):
        return self._add(Op.MUL_SCALAR, (a,), Scalar(_real(scalar, "mul_scalar's scalar")))

    def add_scalar(self, a, scalar: float):
        return self._add(Op.ADD_SCALAR, (a,), Scalar(_real(scalar, "add_scalar's scalar")))

    def add(self, a, b):
        return self._add(Op.ADD, (a, b))

    def sub(self, a, b):
        return self._add(Op.SUB, (a, b))

    def mul(self, a, b):
        return self._add(Op.MUL, (a, b))

    def div(self, a, b):
        return self._add(Op.DIV, (a, b))

    def reduction(self, a, dim: int):
        return self._add(Op.REDUCTION, (a,), Reduce(self._reduce_dim(Op.REDUCTION, a, dim)))

    def reduction_max(self, a, dim: int):
        return self._add(Op.REDUCTION_MAX, (a,), Reduce(self._reduce_dim(Op.REDUCTION_MAX, a, dim)))

    def _reduce_dim(self, op: Op, a, dim) -> int:
        """``dim`` of ``a`` counted from 0; a negative one counts from the end, as in numpy."""
        self._ref(a)
        rank = a.num_dims
        if not _is_int(dim) or not -rank <= dim < rank:
            shown = dim if _is_int(dim) else repr(dim)
            error = AttributeValueError(
                f"{op.value} dim {shown} is out of range for shape {list(a.dims)}; use an int from "
                f"{-rank} to {rank - 1} (negative dims count from the end)")
            build.rethrow(error, self.graph, None, f"  >>> {op.value}({_ref_text(a.ref)}) dim={shown}"
                          "  <-- this op")
        return int(dim) + rank if dim < 0 else int(dim)

    def rms_norm(self, a, normalized_shape: Sequence[int] | int | None = None, eps: float = 0.0):
        """``a / sqrt(mean(a², last dim) + eps)``; ``normalized_shape`` (an int or a 1-tuple, as in
        ``torch.nn.RMSNorm``) must name the last dim."""
        self._ref(a)
        if normalized_shape is not None:
            shape = (normalized_shape,) if _is_int(normalized_shape) else normalized_shape
            if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable) \
                    or tuple(shape) != a.dims[-1:]:
                raise GraphError(f"rms_norm normalizes the last dim only; normalized_shape "
                                 f"{normalized_shape!r} must be {a.dims[-1]} or {a.dims[-1:]}")
        return self._add(Op.RMS_NORM, (a,), RmsNorm(_real(eps, "rms_norm's eps")))

    def __str__(self) -> str:
        from mirage.mugraph.text import to_text

        return to_text(self.graph)


def _is_int(value) -> bool:
    """An integer (Python or numpy), but not a bool and not a float such as 2.5 or 2.0."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _ref_text(r: Ref) -> str:
    return f"%{r.node}" + (f".{r.index}" if r.index else "")


def _parse_dtype(dtype):
    try:
        return DType.parse(dtype)
    except ValueError as error:
        raise DTypeError(f"{error} (e.g. mi.float16)") from None


def _parse_accum(acc):
    try:
        return AccumKind.parse(acc)
    except ValueError as error:
        raise AttributeValueError(f"forloop accumulator: {error}") from None


def _real(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AttributeValueError(f"{what} must be a number, got {value!r}")
    return float(value)


def _pending_line(op: Op, refs, attrs) -> str:
    args = ", ".join(_ref_text(r) for r in refs)
    return f"  >>> {op.value}({args}) {attrs if attrs is not None else ''}  <-- this op"


def declared_strides(shape: tuple[int, ...], strides) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """``new_input``'s strides as ``KernelInput``'s layout, strides and split strides; ValueError where
    they are not ints, or pairs ((outer size, outer stride), (inner size, inner stride)) for a dim that
    two strides step (not the last, unless its inner stride is 0, nor in a column-major view the
    second-to-last), or not a view the kernels can read."""
    flat, splits = split_pairs(shape, strides)
    view_shape, view_strides = split_view(shape, flat, splits)
    if len(shape) - 1 in splits:  # a broadcast inner part of the last dim: the rest row-major
        layout, _ = input_layout(view_shape[:-1], view_strides[:-1])
        if layout:
            raise ValueError(f"strides {tuple(strides)}: a last dim split over a broadcast takes its outer "
                             "stride as a row-major view's last")
        return "", tuple(s if n > 1 else 1 for s, n in zip(flat, shape, strict=True)), split_triples(splits)
    layout, viewed = input_layout(view_shape, view_strides)
    if not splits:
        return layout, viewed, ()
    if layout == "col" and len(shape) - 2 in splits:
        raise ValueError(f"dim {len(shape) - 2} cannot split in a column-major view: its rows are stored "
                         "along it")
    return layout, tuple(s if n > 1 else 1 for s, n in zip(flat, shape, strict=True)), split_triples(splits)


class KNGraph(_Builder):
    """A kernel graph under construction (``mi.new_kernel_graph()``)."""

    tensor_type = DTensor

    def __init__(self, name: str = "") -> None:
        super().__init__(KernelGraph(nodes=(), outputs=(), name=name))

    def new_input(self, dims: Sequence[int], dtype: Any = DType.FLOAT16, strides=None, name: str = "",
                  pattern: str = "", layout: str = ""):
        """A device tensor the graph reads. ``strides``: row-major (the default), column-major in the
        last two dims (a transposed view of a row-major tensor, such as ``weight.T``), or any other
        strides stepping one of the last two dims by one element (a view, such as a head split
        ``x.view(s, h, d).transpose(0, 1)``), which kernels can then read in place; calls may pass any
        layout (another is copied). A dim before the last may take two strides,
        ``((outer size, outer stride), (inner size, inner stride))``, as the (batch · heads) dim of a head
        split at batch > 1 needs; calls then pass the view with that dim as two (``split_view``).
        ``layout="col"`` says column-major without strides. ``pattern``: a promise that every call
        passes the values it names (:mod:`mirage.mugraph.patterns`, e.g.
        ``"causal:512"``), which the generated code may then compute instead of reading; the search and
        the verifier treat the input as any other."""
        shape = _input_dims(dims)
        if layout not in INPUT_LAYOUTS or (layout and len(shape) < 2):
            raise GraphError(f"input layout {layout!r} is not one of {sorted(INPUT_LAYOUTS)} for a tensor of "
                             f"rank {len(shape)} ('col' needs 2 or more dims)")
        viewed: tuple[int, ...] = ()
        split: tuple[int, ...] = ()
        if strides is not None:
            try:
                layout, viewed, split = declared_strides(shape, strides)
            except ValueError as error:
                raise GraphError(
                    f"{error}: inputs are row-major (strides {dense_strides(shape)}), column-major in their "
                    f"last two dims (strides {dense_strides(shape, 'col')}) or views stepping one of those "
                    "dims by one element, a dim before the last by one or two strides "
                    "((outer size, outer stride), (inner size, inner stride)); make the tensor contiguous "
                    "first") from None
        if not isinstance(name, str):
            raise GraphError(f"an input's name must be a str, got {name!r}")
        if not isinstance(pattern, str):
            raise GraphError(f"an input's pattern must be a str such as 'causal:128' (or '' for none), got "
                             f"{pattern!r}")
        if pattern:
            patterns.check_shape(pattern, shape)
        t = TensorType(shape, _parse_dtype(dtype))
        return self._add(Op.INPUT, (), KernelInput(name, pattern, layout, viewed, split), (t,))

    def customized(self, inputs: Sequence[DTensor], block_graph: TBGraph) -> list[DTensor]:
        if not isinstance(block_graph, TBGraph):
            raise GraphError(f"customized takes a block graph made by mi.new_threadblock_graph(...) as "
                             f"its second argument, got {block_graph!r}")
        if isinstance(inputs, (_Tensor, str, bytes)) or not isinstance(inputs, Iterable):
            raise GraphError(f"customized takes a list of the kernel graph's tensors, got {inputs!r}; "
                             "write g.customized([X, W], tb)")
        inputs = list(inputs)
        refs = tuple(self._ref(t) for t in inputs)
        for k, t in enumerate(inputs):
            bound = block_graph._bound[k] if k < len(block_graph._bound) else None
            if bound is not None and bound is not t:
                from mirage.errors import BindingError

                raise BindingError(f"customized input {k} is {t!r} but the block graph's input iterator "
                                 f"{k} was created from {bound!r}")
        from mirage.mugraph.check import check

        check(block_graph.graph)
        try:
            self.graph, index = build.add_customized(self.graph, refs, block_graph.graph)
        except GraphError as error:
            build.rethrow(error, self.graph, None, "  >>> customized(...)  <-- this op")
        n = len(self.graph.nodes[index].outputs)
        return [DTensor(self, Ref(index, j)) for j in range(n)]

    def mark_output(self, t: DTensor, strides=None) -> None:
        """Make ``t`` an output of the graph, written row-major or, with ``strides``, laid out with
        those element strides (a dense permutation of its dims: ``mugraph.graph.output_strides``)."""
        ref = self._ref(t)
        declared = ()
        if strides is not None:
            try:
                declared = output_strides(self.graph.type_of(ref).shape, strides)
            except ValueError as error:
                raise GraphError(f"mark_output: {error}") from None
        previous = tuple(self.graph.output_stride(k) for k in range(len(self.graph.outputs)))
        every = previous + (declared,)
        self.graph = KernelGraph(self.graph.nodes, self.graph.outputs + (ref,), self.graph.name,
                                 every if any(every) else ())

    def freeze(self) -> KernelGraph:
        """The finished, checked, immutable graph."""
        from mirage.mugraph.check import check

        check(self.graph)
        return self.graph

    # conveniences on the finished graph
    def superoptimize(self, config: str | None = None, **options):
        from mirage import superoptimize

        return superoptimize(self.freeze(), config=config, **options)

    def to_json(self, path=None) -> str:
        return self.freeze().to_json(path)

    def visualize(self, path: str, format: str | None = None) -> str:
        from mirage.mugraph.visualize import render

        return render(self.freeze(), path, format)

    def content_hash(self) -> str:
        return self.freeze().content_hash()


class TBGraph(_Builder):
    """A block (thread-block) graph under construction (``mi.new_threadblock_graph(...)``)."""

    tensor_type = STensor

    def __init__(self, grid_dim, block_dim=(128, 1, 1), forloop_range: int = 1,
                 reduction_dimx: int = 64, spans=(0, 0, 0)) -> None:
        grid = _dim3(grid_dim, "grid_dim", GridError, positive=True)
        given = len(spans) if isinstance(spans, (tuple, list)) else 1
        spans = tuple(v if axis < given else 0 for axis, v in enumerate(_dim3(spans, "spans", GridError)))
        block = _dim3(block_dim, "block_dim", GridError, positive=True)
        for what, value in (("forloop_range", forloop_range), ("reduction_dimx", reduction_dimx)):
            if not _is_int(value) or value < 1:
                raise GridError(f"{what} must be a positive int, got {value!r}")
        super().__init__(BlockGraph((), grid, block, int(forloop_range), int(reduction_dimx), spans))
        from mirage.mugraph.check import check_block_header

        check_block_header(self.graph)
        self._bound: list[DTensor] = []

    def new_input(self, dtensor: DTensor, input_map=(-1, -1, -1), forloop_dim: int = -1,
                  store_in_dmem: bool = False) -> STensor:
        if not isinstance(dtensor, DTensor):
            raise GraphError(f"tb.new_input takes a kernel-graph tensor, got {dtensor!r}")
        imap = _dim3(input_map, "input_map", InputMapError)
        _check_forloop_dim(forloop_dim)
        try:
            self.graph, index = build.add_input_iterator(self.graph, dtensor.type, imap, int(forloop_dim))
        except GraphError as error:
            build.rethrow(error, self.graph, None, f"  >>> input(#{len(self._bound)}) input_map="
                          f"{tuple(input_map)} forloop_dim={forloop_dim}  <-- this op")
        self._bound.append(dtensor)
        return STensor(self, Ref(index, 0))

    def new_output(self, stensor: STensor, output_map=(-1, -1, -1), forloop_dim: int = -1) -> None:
        ref = self._ref(stensor)
        omap = _dim3(output_map, "output_map", OutputMapError)
        _check_forloop_dim(forloop_dim)
        try:
            self.graph, _ = build.add_output_saver(self.graph, ref, omap, int(forloop_dim))
        except GraphError as error:
            build.rethrow(error, self.graph, None, f"  >>> output(...) output_map={tuple(output_map)}"
                          "  <-- this op")

    def reduction_to_dimx(self, a, dim: int):
        return self._add(Op.REDUCTION_TO_DIMX, (a,), Reduce(self._reduce_dim(Op.REDUCTION_TO_DIMX, a, dim)))

    def concat_matmul(self, w, x, y, z):
        """(W ‖ X) @ (Y ‖ Z), the LoRA op: W @ Y + X @ Z in one tensor-core pass."""
        return self._add(Op.CONCAT_MATMUL, (w, x, y, z))

    def forloop_accum(self, a, acc: str | None = None, eps: float = 0.0):
        return self._add(Op.ACCUM, (a,), Accum(_parse_accum(acc), _real(eps, "eps")))

    def forloop_accum_max(self, a):
        return self._add(Op.ACCUM, (a,), Accum(AccumKind.MAX))

    def forloop_accum_rescale(self, a, running_max, acc: str | None = None):
        """acc ← acc·exp(m_prev − m) + a, with ``m`` the running max of this iteration."""
        return self._add(Op.ACCUM_RESCALE, (a, running_max), Accum(_parse_accum(acc)))

    def running_max(self, a):
        return self._add(Op.RUNNING_MAX, (a,))


def _input_dims(dims) -> tuple[int, ...]:
    """``dims`` of a kernel-graph input as a tuple of positive ints, or a ShapeError saying why not."""
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Iterable):
        hint = f"; write ({dims},) for a 1-dim tensor" if _is_int(dims) else ""
        raise ShapeError(f"input dims must be a tuple of positive ints such as (4, 8), got {dims!r}{hint}")
    dims = tuple(dims)
    if not dims or not all(_is_int(d) and d > 0 for d in dims):
        raise ShapeError(f"input dims must be a tuple of positive ints such as (4, 8), got {tuple(dims)!r}")
    return tuple(int(d) for d in dims)


def _dim3(value, what: str, error: type[GraphError], positive: bool = False) -> tuple[int, int, int]:
    """``value`` (an int, a tuple of up to 3 ints or a dim3 with x, y, z) as 3 ints. Missing axes are
    filled as an absent axis means: extent 1 for sizes (``positive``), -1 (maps no dim) for maps."""
    if hasattr(value, "x") and hasattr(value, "y") and hasattr(value, "z"):
        items: Any = (value.x, value.y, value.z)
    elif _is_int(value):
        items = (value,)
    elif isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        items = tuple(value)
    else:
        items = None
    kind = "positive ints" if positive else "ints"
    if items is None or not 1 <= len(items) <= 3 or not all(_is_int(v) for v in items) \
            or (positive and any(v < 1 for v in items)):
        raise error(f"{what} must be an int or a tuple of up to 3 {kind} such as "
                    f"{'(64, 1, 1)' if positive else '(0, -1, -1)'}, got {value!r}")
    fill = 1 if positive else -1
    return tuple(int(v) for v in items) + (fill,) * (3 - len(items))  # type: ignore[return-value]


def _check_forloop_dim(forloop_dim) -> None:
    if not _is_int(forloop_dim):
        raise ForloopDimError(f"forloop_dim must be an int (-1 for no split), got {forloop_dim!r}")


def new_kernel_graph(name: str = "") -> KNGraph:
    return KNGraph(name)


def new_threadblock_graph(grid_dim, block_dim=(128, 1, 1), forloop_range: int = 1,
                          reduction_dimx: int = 64, spans=(0, 0, 0)) -> TBGraph:
    """A block graph of ``grid_dim`` blocks.  ``spans``: per grid axis, the size of a dim its blocks
    split although they do not divide it (0 where they do): ``spans=(0, 197, 0)`` with 4 blocks along y
    gives every tensor mapped there tiles of 50 entries, the last starting at 147.  Such a dim must
    index the outputs and never be reduced in the block (the blocks write the overlap twice)."""
    return TBGraph(grid_dim, block_dim, forloop_range, reduction_dimx, spans)


def as_graph(graph) -> KernelGraph:
    """Accept a builder or a frozen graph."""
    if isinstance(graph, KNGraph):
        return graph.freeze()
    if isinstance(graph, KernelGraph):
        return graph
    raise GraphError(f"expected a kernel graph or a builder, got {type(graph).__name__}")
