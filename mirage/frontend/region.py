"""Building the kernel graph of one subprogram from torch values.

A :class:`RegionBuilder` holds the kernel graph under construction and the torch value each fx node
of the subprogram stands for (a :class:`Value`).  Tensors from outside the subprogram
(:class:`Boundary`) become graph inputs on first use, bound by an :class:`InputBinding` that says how
to view the torch tensor (an optional permutation, then a free row-major reshape).  The methods are
the building blocks of the lowering table in :mod:`mirage.frontend.lowering`; anything they cannot
express raises :class:`Unlowerable` with the reason, and the partitioner then cuts the subprogram
there or leaves the op in PyTorch.

Upcast islands: a program that widens float16 (or bfloat16) values to float32 for an accurate
computation, ``x.float().pow(2).mean(-1)``, keeps the values in the graph's tensors as they are (a
µGraph keeps one dtype per tensor).  The builder records which graph nodes compute values that
torch holds wider than their graph tensor (``widened``); the partitioner accepts a subprogram only
when none of them is live after pruning (the island was absorbed into an op that computes in
float32 internally, such as ``rms_norm``), unless the ``upcasts`` option says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.fx as fx

import mirage.mugraph as mg
from mirage.errors import GraphError
from mirage.frontend import shapes
from mirage.frontend.capture import PATTERN
from mirage.mugraph import patterns
from mirage.mugraph.builder import DTensor, declared_strides
from mirage.mugraph.graph import dense_strides, input_layout, merged_strides, output_strides
from mirage.mugraph.ops import ELEMENTWISE, Op

Shape = tuple[int, ...]
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Unlowerable(Exception):
    """This op (here) has no kernel-graph form; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _finite(value: float, what: str) -> None:
    """Scalars of a kernel graph are finite: an inf or nan one (``x * inf``) stays in PyTorch."""
    if not math.isfinite(value):
        raise Unlowerable(f"{what} the number {value} (not finite)")


@dataclass(frozen=True)
class Boundary:
    """A tensor computed outside the subprogram (an input, a parameter or a PyTorch result)."""

    node: fx.Node
    shape: Shape
    dtype: torch.dtype


@dataclass(frozen=True)
class Value:
    """A torch value computed inside: ``tensor`` reshaped to ``shape`` (reciprocal: ``1/tensor``).

    ``expanded_from`` is set on the result of an ``expand``: the tensor holds the value before the
    expand (of that shape), which element-wise ops broadcast just as they would the expanded one."""

    tensor: DTensor
    shape: Shape
    reciprocal: bool = False
    expanded_from: Shape | None = None

    @property
    def broadcast_shape(self) -> Shape:
        return self.shape if self.expanded_from is None else self.expanded_from


@dataclass(frozen=True)
class InputBinding:
    """Graph input ``i`` is ``source`` (an fx node name), permuted, then reshaped to ``shape``; with
    ``expand``, first broadcast to that shape (where the graph tensor it meets merges dims that the
    source broadcasts over, e.g. a key-padding mask against scores of (batch · heads) rows): a view
    where the reshape can keep one (the program may read it in place, its stride 0), else a copy."""

    source: str
    permute: tuple[int, ...] | None
    shape: Shape
    expand: Shape | None = None
    # where the graph input declares split dims (a head split's (batch · heads) at batch > 1): the
    # shape of the view with each of them as two, which a program reading it in place takes
    view: Shape | None = None

    def _unshaped(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.permute is not None:
            tensor = tensor.permute(self.permute)
        if self.expand is not None:  # a view (stride 0), which a program declaring it reads as it is
            tensor = tensor.expand(self.expand)
        return tensor

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = self._unshaped(tensor)
        return tensor if tensor.shape == self.shape else tensor.reshape(self.shape)

    def viewed(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the view of split dims (``view``), never a copy; :meth:`apply` without one."""
        return self.apply(tensor) if self.view is None else self._unshaped(tensor).view(self.view)


@dataclass(frozen=True)
class OutputBinding:
    """fx node ``node`` is graph output ``index`` reshaped to ``shape``, cast to ``dtype`` and, when
    ``expand`` is set, expanded to that shape (a view)."""

    node: str
    index: int
    shape: Shape
    dtype: torch.dtype
    expand: Shape | None = None

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.shape != self.shape:
            tensor = tensor.reshape(self.shape)
        if tensor.dtype != self.dtype:
            tensor = tensor.to(self.dtype)
        return tensor if self.expand is None else tensor.expand(self.expand)


Operand = Value | Boundary
Combine = Callable[[DTensor, bool, DTensor, bool], tuple[DTensor, bool]]


def broadcast_shape(x: Operand) -> Shape:
    """The shape an element-wise op broadcasts ``x`` from."""
    return x.broadcast_shape if isinstance(x, Value) else x.shape


@dataclass(frozen=True)
class Upcasts:
    """How a subprogram takes the widening float casts (float16/bfloat16 → float32) of a program.

    ``through``: casts of tensors from outside that the subprogram reads through (it binds the
    narrower source, which the cast holds exactly; the cast stays out of every subprogram).
    ``kept``: casts that run in PyTorch, because a value they widen would stay live in a narrower
    graph tensor.  Other upcasts of values computed in a subprogram are identities there."""

    through: frozenset[fx.Node] = frozenset()
    kept: frozenset[fx.Node] = frozenset()


NO_UPCASTS = Upcasts()


def _pattern(x: Boundary, binding: InputBinding) -> str:
    """The input pattern of ``x`` held as ``binding`` (node meta ``PATTERN``, set where capture built
    the tensor): kept where the view keeps its rows of keys and the values are the pattern's, else ""."""
    pattern = x.node.meta.get(PATTERN, "")
    value = x.node.meta.get("val")
    if (not pattern or binding.permute is not None or binding.expand is not None
            or binding.shape[-1:] != x.shape[-1:]):
        return ""
    try:
        patterns.check_shape(pattern, binding.shape)
        return pattern if patterns.matches(pattern, value.reshape(binding.shape)) else ""
    except (GraphError, RuntimeError, TypeError, AttributeError):  # a fake or foreign value: no promise
        return ""


def _strides(x: Boundary, binding: InputBinding) -> tuple[tuple | None, Shape | None]:
    """The element strides that input ``binding`` of ``x`` has, with ``x`` laid out as traced (a
    ``transpose`` node's view, a parameter, a head split's ``permute``), where the graph's input can
    declare them (``new_input(strides=...)``): a transposed view in its last two dims (``weight.T``,
    ``k.transpose(-1, -2)``) or a view stepping one of them by one element (``x.view(s, h, d)
    .transpose(0, 1)``), broadcasts among them (stride 0: a bias expanded over the heads), which
    kernels may read in place (mirage.codegen.column_major), and dims that two strides step (the
    (batch · heads) of a head split at batch > 1: ``new_input``'s pairs; the last dim only over a
    broadcast, a group norm's gain in rows of (channels · positions)), with the shape of the view
    that holds them as two dims; else (None, None): row-major, or copied so."""
    if len(binding.shape) < 2:
        return None, None
    value = x.node.meta.get("val")
    try:
        if isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(x.shape):
            base = torch.empty_strided(tuple(x.shape), tuple(value.stride()), device="meta")
        else:
            base = torch.empty(tuple(x.shape), device="meta")
        unshaped = binding._unshaped(base)
        try:
            view = unshaped.view(binding.shape)
        except RuntimeError:  # not one stride a dim: perhaps two
            strides = merged_strides(binding.shape, tuple(unshaped.shape), tuple(unshaped.stride()))
            if isinstance(strides[-1], tuple) and strides[-1][1][1] != 0:
                return None, None  # a row's own dim takes one stride, or two over a broadcast: else copied
            split = tuple(n for entry, d in zip(strides, binding.shape, strict=True)
                          for n in ((entry[0][0], entry[1][0]) if isinstance(entry, tuple) else (d,)))
            if split == tuple(binding.shape):
                return None, None
            # as new_input checks them: a column-major view's rows cannot be split (a 3-D input's
            # transpose(1, 2) merged to 2-D), which then is copied row-major
            declared_strides(tuple(binding.shape), strides)
            return strides, split
        input_layout(tuple(view.shape), tuple(view.stride()))
    except (RuntimeError, TypeError, ValueError):
        return None, None
    return tuple(view.stride()), None


def eager_strides(node: fx.Node) -> tuple[int, ...] | None:
    """The strides eager PyTorch gives ``node``'s value where they are not row-major but dense (an
    attention's output laid out as (batch, seq, heads, dim) behind its (batch, heads, seq, dim) shape,
    which the model views after a transpose); None otherwise."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.is_contiguous():
        return None
    stride = tuple(int(s) for s in value.stride())
    expected = 1  # dense: by increasing stride, each dim of size > 1 steps over all the dims before it
    for step, size in sorted((s, int(n)) for s, n in zip(stride, value.shape, strict=True) if n > 1):
        if step != expected:
            return None
        expected *= size
    return stride


_ATEN = torch.ops.aten
_PERMUTES = {_ATEN.permute.default, _ATEN.transpose.int}
_FLATTENS = {_ATEN.reshape.default, _ATEN.view.default, _ATEN._unsafe_view.default, _ATEN.clone.default,
             _ATEN.contiguous.default, _ATEN.flatten.using_ints}


def _merged_back(node: fx.Node) -> tuple[int, ...] | None:
    """Strides for ``node``'s value under which the PyTorch ops after it copy nothing, where its one
    user permutes it and every user of that only reshapes (heads merged back, ``o.permute(0, 2, 1,
    3).reshape(b, s, h·d)``): the layout in which the permuted value is row-major."""
    value = node.meta.get("val")
    if len(node.users) != 1 or not isinstance(value, torch.Tensor):
        return None
    (user,) = node.users
    if user.op != "call_function" or user.target not in _PERMUTES or not user.users or any(
            u.op != "call_function" or u.target not in _FLATTENS for u in user.users):
        return None
    permuted = user.meta.get("val")
    if not isinstance(permuted, torch.Tensor):
        return None
    try:
        order = ([int(d) % value.dim() for d in user.args[1]] if user.target is _ATEN.permute.default
                 else _swap(value.dim(), *user.args[1:3]))
    except (TypeError, ValueError):
        return None
    row_major = dense_strides(tuple(permuted.shape))
    strides = [0] * value.dim()
    for position, dim in enumerate(order):
        strides[dim] = row_major[position]
    return tuple(strides)


def _swap(rank: int, a: int, b: int) -> list[int]:
    order = list(range(rank))
    order[int(a) % rank], order[int(b) % rank] = order[int(b) % rank], order[int(a) % rank]
    return order


def output_strides_of(node: fx.Node, shape: Sequence[int]) -> tuple[int, ...] | None:
    """The strides a graph output of ``shape`` holding ``node``'s value declares
    (``mark_output(strides=...)``), so that the program writes it as the PyTorch ops after it need it:
    eager's own layout (:func:`eager_strides`), or the one that makes a head merge a view
    (:func:`_merged_back`); None for row-major, or where the graph's shape cannot view that layout."""
    wanted = eager_strides(node) or _merged_back(node)
    value = node.meta.get("val")
    if wanted is None or not isinstance(value, torch.Tensor):
        return None
    try:
        base = torch.empty_strided(tuple(value.shape), wanted, device="meta")
        try:
            held = base.view(tuple(shape))
        except RuntimeError:  # a dim of two strides (a head merge's (batch · heads) at batch > 1)?
            strides = merged_strides(tuple(shape), tuple(base.shape), tuple(base.stride()))
            if isinstance(strides[-1], tuple):
                return None
            output_strides(tuple(shape), strides)  # checks them: ValueError where mark_output would refuse
            return strides
        return output_strides(tuple(shape), tuple(held.stride())) or None
    except (RuntimeError, ValueError):
        return None


class RegionBuilder:
    """The kernel graph of one subprogram under construction.

    ``flat``: outside tensors are held with their leading dims merged (``(b, s, h)`` as ``(b·s, h)``),
    which suits matrix products with 2-D weights; otherwise in their own shape, which suits
    reductions over inner dims.  The partitioner tries both."""

    def __init__(self, name: str = "", flat: bool = True, upcasts: Upcasts = NO_UPCASTS) -> None:
        self.flat = flat
        self.upcasts = upcasts
        self.builder = mg.new_kernel_graph(name)
        self.values: dict[fx.Node, Value] = {}
        self.bindings: list[InputBinding] = []
        self._inputs: dict[InputBinding, DTensor] = {}
        self._boundaries: dict[int, Boundary] = {}  # graph input node -> the outside tensor it holds
        self.softmax_exps: list[int] = []
        self.wide: set[fx.Node] = set()  # fx nodes whose torch dtype is wider than their graph tensor
        self.widened: dict[int, fx.Node] = {}  # graph node -> the wide fx node it was emitted for
        self._emitted: dict[mg.Node, int] = {}  # each op node -> its index (common subexpressions)

    # ---- operands -----------------------------------------------------------------------------

    def operand(self, arg) -> Operand | float:
        if isinstance(arg, (Value, Boundary)):  # lowered already (a rule's operand in another form)
            return arg
        if isinstance(arg, fx.Node):
            if arg in self.values:
                return self.values[arg]
            if arg in self.upcasts.through:  # the narrower source holds the same numbers
                return self.operand(arg.args[0])
            val = arg.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise Unlowerable(f"operand {arg.name} is not a tensor")
            return Boundary(arg, tuple(int(s) for s in val.shape), val.dtype)
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return float(arg)
        raise Unlowerable(f"operand {arg!r} is neither a tensor nor a number")

    def tensor_operand(self, arg) -> Operand:
        x = self.operand(arg)
        if isinstance(x, float):
            raise Unlowerable("a number where a tensor is needed")
        return x

    def bind(self, x: Boundary, shape: Sequence[int], permute: tuple[int, ...] | None = None,
             expand: Shape | None = None) -> DTensor:
        if x.dtype not in FLOAT_DTYPES:
            raise Unlowerable(f"{x.node.name} has dtype {x.dtype}; µGraphs hold floating-point tensors")
        if 0 in x.shape:
            raise Unlowerable(f"{x.node.name}{list(x.shape)} is empty (a dimension of size 0)")
        binding = InputBinding(x.node.name, permute, tuple(int(s) for s in shape), expand)
        if binding not in self._inputs:
            if math.prod(binding.shape) != math.prod(expand or x.shape):
                raise Unlowerable(f"cannot view {x.node.name}{list(x.shape)} as {list(shape)}")
            strides, view = _strides(x, binding)
            self._inputs[binding] = self.builder.new_input(dims=binding.shape, dtype=mg.DType.parse(x.dtype),
                                                         name=x.node.name, pattern=_pattern(x, binding),
                                                         strides=strides)
            self.bindings.append(binding if view is None else replace(binding, view=view))
            self._boundaries[self._inputs[binding].ref.node] = x
        return self._inputs[binding]

    def raw(self, x: Operand, shape: Sequence[int] | None = None) -> tuple[DTensor, bool]:
        """The graph tensor holding ``x`` in graph shape ``shape`` (default: its own / flat 2-D)."""
        if isinstance(x, Boundary):
            return self.bind(x, self.default_shape(x.shape) if shape is None else shape), False
        if x.expanded_from is not None:
            raise Unlowerable("an expanded tensor feeds an op that is not element-wise")
        if shape is not None and tuple(x.tensor.dims) != tuple(shape):
            raise Unlowerable(f"a computed tensor is held as {list(x.tensor.dims)} but is needed as "
                              f"{list(shape)} here")
        return x.tensor, x.reciprocal

    def tensor(self, x: Operand, shape: Sequence[int] | None = None) -> DTensor:
        t, reciprocal = self.raw(x, shape)
        return self.reciprocal(t) if reciprocal else t

    def default_shape(self, logical: Shape) -> Shape:
        return shapes.flat2d(logical) if self.flat or len(logical) < 2 else tuple(logical)

    def frame(self, x: Operand) -> tuple[Shape, Shape]:
        """(graph shape, logical shape) of ``x``; outside tensors get the default shape."""
        if isinstance(x, Boundary):
            return self.default_shape(x.shape), x.shape
        return tuple(x.tensor.dims), x.shape

    @property
    def size(self) -> int:
        """The number of graph nodes so far."""
        return len(self.builder.graph.nodes)

    def mark_wide(self, node: fx.Node, first: int, rounded: bool) -> None:
        """``node``'s torch value is wider than its graph tensor: the graph nodes emitted for it from
        ``first`` on compute in the narrower dtype.  Inputs hold their tensors exactly and are not
        marked; nor, when ``rounded`` (every user narrows the value back right away), is the node
        holding the value, whose storage rounds it just as the user's cast does."""
        self.wide.add(node)
        holder = self.values[node].tensor.ref.node
        for i in range(first, self.size):
            if self.builder.graph.nodes[i].op is not Op.INPUT and not (rounded and i == holder):
                self.widened[i] = node

    # ---- graph ops with the checks turned into Unlowerable -----------------------------------

    def emit(self, method: str, *args, **kwargs) -> DTensor:
        """The builder's ``method`` applied, or the earlier node that computes the same (common
        subexpressions: ``var`` recomputes the mean that a LayerNorm written out already took; each
        op counted twice would cost the search its budget and the kernel its work)."""
        before = self.builder.graph
        try:
            made = getattr(self.builder, method)(*args, **kwargs)
        except GraphError as error:
            raise Unlowerable(str(error).splitlines()[0]) from None
        nodes = self.builder.graph.nodes
        if len(nodes) != len(before.nodes) + 1 or nodes[-1].op is Op.INPUT:
            return made
        try:
            earlier = self._emitted.setdefault(nodes[-1], len(nodes) - 1)
        except TypeError:  # an attribute that does not hash: no lookup, the node stands
            return made
        if earlier == len(nodes) - 1:
            return made
        self.builder.graph = before
        refs = [DTensor(self.builder, mg.Ref(earlier, j)) for j in range(len(nodes[-1].outputs))]
        return refs[0] if len(refs) == 1 else refs

    def node_of(self, t: DTensor) -> mg.Node:
        return self.builder.graph.nodes[t.ref.node]

    def reciprocal(self, t: DTensor) -> DTensor:
        """``1/t`` as ``clamp(t, 1, 1) / t``: the numerator is 1 wherever t is a number, ±inf
        included, so 1/±0 is ±inf and 1/±inf is 0 as in PyTorch (``sqrt(z)/z`` and ``(0·t + 1)/t``
        gave NaN at z = 0 or inf)."""
        return self.emit("div", self.emit("clamp", t, 1.0, 1.0), t)

    # ---- building blocks of the lowering rules ----------------------------------------------

    def unary(self, method: str, x: Operand, *extra) -> Value:
        return Value(self.emit(method, self.tensor(x), *extra), x.shape)

    def scale(self, x: Operand, factor: float) -> Value:
        """x · factor; a product of a product by a number is one product by both (``s / 8 / 50``,
        Gemma 2's scaled and soft-capped scores, is one op: each op counts against the search's
        budget of a kernel's ops)."""
        _finite(factor, "a product by")
        if factor == 1.0:
            return x if isinstance(x, Value) else Value(self.tensor(x), x.shape)
        t = self.tensor(x)
        node = self.node_of(t)
        if node.op is Op.MUL_SCALAR and math.isfinite(node.attrs.value * factor):
            t, factor = DTensor(self.builder, node.inputs[0]), node.attrs.value * factor
            if factor == 1.0:
                return Value(t, x.shape)
        return Value(self.emit("mul_scalar", t, factor), x.shape)

    def shift(self, x: Operand, offset: float) -> Value:
        _finite(offset, "a sum with")
        if offset == 0.0:
            return x if isinstance(x, Value) else Value(self.tensor(x), x.shape)
        return Value(self.emit("add_scalar", self.tensor(x), offset), x.shape)

    def elementwise(self, a: Operand, b: Operand, combine: Combine) -> Value:
        """Apply ``combine`` to both operands broadcast as torch broadcasts them."""
        sa, sb = broadcast_shape(a), broadcast_shape(b)
        try:
            out = tuple(torch.broadcast_shapes(sa, sb))
        except RuntimeError as error:
            raise Unlowerable(str(error)) from None
        pairs = ((a, sa), (b, sb))
        full = [tuple(x.tensor.dims) for x, s in pairs if isinstance(x, Value) and s == out]
        frames = full[:1] or list(dict.fromkeys([self.default_shape(out), shapes.rank3(out), tuple(out)]))
        targets = next((t for t in (self._targets(f, out, pairs) for f in frames) if t is not None), None)
        expanded: dict[int, Shape] = {}
        if targets is None and full:  # a computed operand holds merged dims an outside one broadcasts over
            targets, expanded, pairs = self._expanded_targets(full[0], out, pairs)
        if targets is None:
            raise Unlowerable(f"operands of shapes {list(sa)} and {list(sb)} are held in graph tensors that "
                              "do not broadcast")
        tensors = []
        for k, ((x, _), target) in enumerate(zip(pairs, targets, strict=True)):
            if isinstance(x, Value) and x.expanded_from is not None:
                x = Value(x.tensor, x.expanded_from, x.reciprocal)
            if k in expanded:
                tensors.append((self.bind(x, target, expand=expanded[k]), False))
                continue
            tensors.append(self.raw(x, target))
        (ta, ra), (tb, rb) = tensors
        result, reciprocal = combine(ta, ra, tb, rb)
        return Value(result, out, reciprocal)

    @staticmethod
    def _targets(frame: Shape, out: Shape, pairs) -> list[Shape] | None:
        """Graph shapes of both operands in ``frame``, or None when a computed one does not fit."""
        targets = []
        for x, s in pairs:
            target = shapes.broadcast_target(frame, out, shapes.pad(s, len(out)))
            if target is None:
                return None
            if isinstance(x, Value) and tuple(x.tensor.dims) != target:
                return None
            targets.append(target)
        return targets

    def _expanded_targets(self, frame: Shape, out: Shape,
                          pairs) -> tuple[list[Shape] | None, dict[int, Shape], tuple]:
        """Graph shapes of both operands in ``frame`` where the outside operands that do not fit it
        are expanded over the dims that a graph dim merges with others they do not broadcast over
        (bound with ``expand``: read through stride 0 where the program can, else copied), for
        those the shape they are expanded to (:func:`shapes.expanded_target`), and the operands,
        with a computed one that does not fit replaced by its recomputation in the frame
        (:meth:`_replayed`: DiT's ``x · (1 + scale[:, None])`` in rows of (batch · tokens))."""
        targets, expanded, operands = [], {}, list(pairs)
        for k, (x, s) in enumerate(pairs):
            target = self._targets(frame, out, ((x, s),))
            if target is not None:
                targets.append(target[0])
            elif isinstance(x, Boundary):
                held, expanded[k] = shapes.expanded_target(frame, out, shapes.pad(s, len(out)))
                targets.append(held)
            elif (again := self._replayed(x, frame, out)) is not None:
                operands[k] = (again, s)
                targets.append(tuple(again.tensor.dims))
            else:
                return None, {}, pairs
        return targets, expanded, tuple(operands)

    def _replayed(self, x: Value, frame: Shape, out: Shape) -> Value | None:
        """``x`` computed again in ``frame`` where it is an element-wise function of outside tensors
        alone, each bound as the frame needs it (expanded over merged dims, read through stride 0),
        or None. The first computation stays where other ops use it; the graph's pruning drops it
        where none does."""
        graph = self.builder.graph
        chain, stack = set(), [x.tensor.ref.node]
        while stack:
            i = stack.pop()
            if i in chain:
                continue
            chain.add(i)
            node = graph.nodes[i]
            if node.op is Op.INPUT:
                if i not in self._boundaries:
                    return None
            elif node.op in ELEMENTWISE:
                stack.extend(ref.node for ref in node.inputs)
            else:
                return None
        again: dict[int, DTensor] = {}
        for i in sorted(chain):
            node = graph.nodes[i]
            if node.op is Op.INPUT:
                leaf = self._boundaries[i]
                logical = shapes.pad(leaf.shape, len(out))
                fits = self._targets(frame, out, ((leaf, logical),))
                if fits is not None:
                    again[i] = self.bind(leaf, fits[0])
                else:
                    held, expand = shapes.expanded_target(frame, out, logical)
                    again[i] = self.bind(leaf, held, expand=expand)
                continue
            first = self.size
            again[i] = self.emit("apply", node.op, [again[ref.node] for ref in node.inputs], node.attrs)
            if i in self.widened:  # computed as narrowly as the first time
                for j in range(first, self.size):
                    self.widened[j] = self.widened[i]
        return Value(again[x.tensor.ref.node], x.shape, x.reciprocal)

    def add(self, a: Operand, b: Operand, sign: float = 1.0) -> Value:
        def combine(ta, ra, tb, rb):
            ta = self.reciprocal(ta) if ra else ta
            tb = self.reciprocal(tb) if rb else tb
            if sign == 1.0:
                return self.emit("add", ta, tb), False
            if sign == -1.0:
                return self.emit("sub", ta, tb), False
            return self.emit("add", ta, self.emit("mul_scalar", tb, sign)), False

        return self.elementwise(a, b, combine)

    def product(self, a: Operand, b: Operand, divide: bool = False) -> Value:
        """``a·b`` or ``a/b``, keeping reciprocals symbolic: ``x·(1/s) = x/s``."""

        def combine(ta, ra, tb, rb):
            rb = rb != divide
            if not ra and not rb:
                return self.emit("mul", ta, tb), False
            if not ra and rb:
                return self.divide(ta, tb), False
            if ra and not rb:
                return self.divide(tb, ta), False
            return self.emit("mul", ta, tb), True

        return self.elementwise(a, b, combine)

    def divide(self, x: DTensor, s: DTensor) -> DTensor:
        """``x / s``, or ``rms_norm(x, eps)`` when s is ``sqrt(mean(x²) + eps)`` over the last dim."""
        eps = self._rms_of(x, s)
        if eps is not None:
            return self.emit("rms_norm", x, eps=eps)
        return self.emit("div", x, s)

    def _rms_of(self, x: DTensor, s: DTensor) -> float | None:
        node = self.node_of(s)
        if node.op is not Op.SQRT:
            return None
        eps, (ref,) = 0.0, node.inputs
        node = self.builder.graph.nodes[ref.node]
        if node.op is Op.ADD_SCALAR:
            eps, (ref,) = node.attrs.value, node.inputs
            node = self.builder.graph.nodes[ref.node]
        n = x.dims[-1]
        if node.op is not Op.MUL_SCALAR or abs(node.attrs.value * n - 1.0) > 1e-9:
            return None
        node = self.builder.graph.nodes[node.inputs[0].node]
        if node.op is not Op.REDUCTION or node.attrs.dim != x.num_dims - 1:
            return None
        node = self.builder.graph.nodes[node.inputs[0].node]
        squares_x = (node.op is Op.SQUARE and node.inputs == (x.ref,)) or (
            node.op is Op.MUL and node.inputs == (x.ref, x.ref))
        return float(eps) if squares_x else None

    def reduce(self, x: Operand, dims, keepdim: bool, mean: bool) -> Value:
        logical = x.shape
        dims = shapes.normalize_dims(dims if dims not in ([], ()) else None, len(logical))
        if isinstance(x, Boundary):
            last_only = dims == (len(logical) - 1,)
            t = self.bind(x, self.default_shape(logical) if last_only else shapes.pad(logical, 2))
        else:
            t = self.tensor(x)
        current = list(logical)
        for d in dims:
            if current[d] == 1:
                continue
            g = shapes.graph_dim(t.dims, current, d)
            if g is None:
                raise Unlowerable(f"dim {d} of {list(logical)} is merged with others in the graph tensor "
                                  f"{list(t.dims)}")
            t = self.emit("reduction", t, g)
            current[d] = 1
        result = tuple(current) if keepdim else tuple(s for d, s in enumerate(current) if d not in dims)
        if mean:
            count = math.prod(logical[d] for d in dims)
            if count != 1:
                t = self.emit("mul_scalar", t, 1.0 / count)
        return Value(t, result)

    def matmul(self, a: Operand, b: Operand) -> Value:
        """``a @ b`` as torch.matmul takes it; a 1-D operand is a row (on the left) or a column (on the
        right) of a product whose result drops that dim (a matrix-vector product, ``W @ x``)."""
        la, lb = a.shape, b.shape
        if len(lb) == 1 and len(la) >= 2:
            rows = self.tensor(a, (math.prod(la[:-1]), la[-1]))
            return Value(self.emit("matmul", rows, self.tensor(b, (lb[0], 1))), la[:-1])
        if len(la) == 1 and len(lb) == 2:
            return Value(self.emit("matmul", self.tensor(a, (1, la[0])), self.tensor(b, lb)), lb[-1:])
        if len(la) < 2 or len(lb) < 2:
            raise Unlowerable("matmul with a 1-D operand and another of "
                              f"{max(len(la), len(lb))} dims (a dot product or a batched one)")
        if len(lb) == 2:
            ta = self.tensor(a, (math.prod(la[:-1]), la[-1]))
            tb = self.tensor(b, lb)
        elif la[:-2] == lb[:-2]:
            ta, tb = self._batched(a, la), self._batched(b, lb)
        else:
            raise Unlowerable(f"matmul batch dims {list(la[:-2])} and {list(lb[:-2])} broadcast")
        return Value(self.emit("matmul", ta, tb), (*la[:-1], lb[-1]))

    def _batched(self, x: Operand, logical: Shape) -> DTensor:
        """A batched product's operand: its batch dims merged into one (``(b, h, s, d)`` held as
        ``(b·h, s, d)``, the 3-D form the search's spaces map onto the grid); a computed tensor
        already held otherwise keeps its shape."""
        if len(logical) > 3 and (isinstance(x, Boundary) or len(x.tensor.dims) == 3):
            return self.tensor(x, (math.prod(logical[:-2]), *logical[-2:]))
        return self.tensor(x, logical)

    def transposed(self, x: Operand, merge_batch: bool = False) -> DTensor:
        """The last two dims of a boundary tensor swapped (a weight's ``t()``, the keys of attention);
        ``merge_batch``: its leading dims merged into one, as :meth:`_batched` holds them."""
        if not isinstance(x, Boundary):
            raise Unlowerable("transpose of a tensor computed in the same subprogram")
        rank = len(x.shape)
        permute = (*range(rank - 2), rank - 1, rank - 2)
        batch = (math.prod(x.shape[:-2]),) if merge_batch and rank > 3 else x.shape[:-2]
        return self.bind(x, (*batch, x.shape[-1], x.shape[-2]), permute)

    def softmax(self, x: Operand, dim: int) -> Value:
        """LAX form ``exp(x) / sum(exp(x))``; the exp is recorded for the online-softmax rewrite."""
        t, e, total = self._exp_sum(x, dim, "softmax")
        return Value(self.emit("div", e, total), x.shape)

    def log_softmax(self, x: Operand, dim: int) -> Value:
        """``x − log Σ exp(x)``: the online-softmax rewrite subtracts the row maximum from the exp and
        adds it back after the log (``log Σ exp(x − m) + m``), as PyTorch computes it."""
        t, _, total = self._exp_sum(x, dim, "log_softmax", last=True)
        return Value(self.emit("sub", t, self.emit("log", total)), x.shape)

    def logsumexp(self, x: Operand, dims, keepdim: bool) -> Value:
        """``log Σ exp(x)`` over one dim (stabilised as :meth:`log_softmax`)."""
        logical = x.shape
        dims = [d for d in shapes.normalize_dims(dims if dims not in ([], ()) else None, len(logical))
                if logical[d] != 1]
        if len(dims) != 1:
            raise Unlowerable(f"logsumexp over {len(dims)} dims of more than one value; one is lowered")
        _, _, total = self._exp_sum(x, dims[0], "logsumexp", last=True)
        shape = tuple(1 if d == dims[0] else s for d, s in enumerate(logical))
        if not keepdim:
            shape = shape[:dims[0]] + shape[dims[0] + 1:]
        return Value(self.emit("log", total), shape)

    def _exp_sum(self, x: Operand, dim: int, what: str,
                 last: bool = False) -> tuple[DTensor, DTensor, DTensor]:
        """x's graph tensor, ``exp(x)`` (recorded for the online-softmax rewrite) and its sum over
        ``dim``; ``last``: that dim must be the graph tensor's last, the one the rewrite's row maxima
        run over (a log of the sum needs them: without, it overflows or is log 0)."""
        logical = x.shape
        dim %= len(logical)
        if logical[dim] == 1:
            raise Unlowerable(f"{what} over a dim of size 1")
        if isinstance(x, Boundary):
            t = self.bind(x, self.default_shape(logical) if dim == len(logical) - 1 else logical)
        else:
            t = self.tensor(x)
        g = shapes.graph_dim(t.dims, logical, dim)
        if g is None:
            raise Unlowerable(f"{what} dim {dim} is merged with others in the graph tensor")
        if last and g != len(t.dims) - 1:
            raise Unlowerable(f"{what} over dim {dim} of {list(logical)}: only the last dim is stabilised")
        e = self.emit("exp", t)
        self.softmax_exps.append(e.ref.node)
        return t, e, self.emit("reduction", e, g)

    def expand(self, x: Operand, shape: Shape) -> Value:
        if not isinstance(x, Value) or x.expanded_from is not None:
            raise Unlowerable("expands of outside tensors run in PyTorch")
        return Value(x.tensor, tuple(shape), x.reciprocal, x.shape)

    def relabel(self, x: Operand, shape: Shape) -> Value:
        if not isinstance(x, Value):
            raise Unlowerable("views of outside tensors run in PyTorch")
        if x.expanded_from is not None:
            raise Unlowerable("a view of an expanded tensor")
        if math.prod(shape) != math.prod(x.shape):
            raise Unlowerable(f"view {list(x.shape)} -> {list(shape)} changes the element count")
        return Value(x.tensor, tuple(shape), x.reciprocal)
