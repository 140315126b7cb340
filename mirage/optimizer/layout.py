"""Layout selection: an exact small optimization with named costs (mirage-notes §5.1).

Variables (Mirage's ``resolve_tensor_layout``):

* the innermost (contiguous) dim of every tensor: device tensors of the kernel graph and the
  shared-memory tensors of every block graph (the outputs of its nodes);
* for shared tensors, whether each dim is swizzled (XOR / shift swizzle against bank conflicts; the
  code generator picks the concrete swizzle, mirage-notes §5.7);
* for every element-wise or reducing block op, the dim its threads walk along.

Constraints: graph inputs and outputs are row-major (torch gives and takes contiguous tensors; an
input declared column-major is planned so too, and mirage.codegen.column_major stores the tiles it
reads in place transposed within the planned buffer);
kernel-level matmuls want the innermost dim among the last two; kernel-level element-wise ops and
reductions keep the innermost dim; the innermost dim of a tile is never swizzled; a matmul operand
or result that is not contiguous along one of its last two dims swizzles that dim; an op walking
along a dim that is not contiguous in one of its tiles swizzles that dim there; reductions do not
walk along the reduced dim; the matmul operands of an online-softmax block graph are row-major (the
register chain reads them by rows).  Costs are :class:`LayoutCosts` (Mirage's constants, ×1000, plus one unit
per byte of padding).  :func:`select_layouts` solves the model with z3 and returns a
:class:`LayoutPlan`: a side table (layouts are not semantic, so graphs keep ``Layout.ROW_MAJOR`` and
still check), keyed by tensor, with strides in elements.

Strides follow Mirage's ``calc_tensor_strides``: dims ordered innermost first, then from the last dim
down; in shared memory the first dim of extent > 1 is padded to a multiple of 16 bytes, plus one
16-byte vector when the tile has a swizzled dim (``swizzle_by_padding``: the swizzle is realised as
a row shift, Mirage's "shift swizzle", as the device library's ``padded_pitch`` does).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mirage.mugraph.graph import AccumKind, BlockGraph, KernelGraph, Ref, TensorType
from mirage.mugraph.ops import ELEMENTWISE, Op
from mirage.mugraph.target import DEFAULT_TARGET, Target
from mirage.optimizer.layout_model import (
    All,
    Any_,
    Choice,
    Flag,
    Implies,
    Is,
    Not,
    Rule,
    Same,
    evaluate,
    solve,
)


@dataclass(frozen=True)
class LayoutCosts:
    """The costs of the layout model, in abstract units.  Rows are summed; z3 finds the least total."""

    # an input tile's innermost dim differs from its device tensor's: no 16-byte cp.async (cc >= 80)
    input_no_async_copy: int = 20_000
    # the same before cc 80: no 16-byte (uint128) loads
    input_no_wide_copy: int = 4_000
    # a saved tile's innermost dim differs from the device tensor's: no 16-byte stores
    output_no_wide_copy: int = 4_000
    # neither of a matmul operand's last two dims is innermost: no ldmatrix
    matmul_no_ldmatrix: int = 10_000
    # a kernel-level reduction reduces its innermost dim
    kernel_reduction_innermost: int = 4_000
    # per swizzled dim of a shared tile (address arithmetic)
    swizzle_dim: int = 1_000
    # per byte of shared memory that padding adds (16-byte rows, and the extra vector of swizzled rows)
    padding_byte: int = 1
    # per tensor whose innermost dim is not its last: breaks ties towards row-major
    not_row_major: int = 1
    # a matmul operand of an online-softmax block graph (one with a running max) is not row-major:
    # the register chain (softmax_chain) reads Q, K and V by ldmatrix rows
    chain_operand_not_row_major: int = 20_000


@dataclass(frozen=True)
class TensorLayout:
    shape: tuple[int, ...]
    innermost_dim: int
    swizzled_dims: tuple[int, ...]  # () for device tensors
    strides: tuple[int, ...]  # in elements
    physical_elements: int  # elements the storage spans, padding included

    @property
    def dim_order(self) -> tuple[int, ...]:
        """Dims from the fastest-varying to the slowest."""
        return _order(len(self.shape), self.innermost_dim)


@dataclass(frozen=True)
class LayoutPlan:
    """The chosen layouts: device tensors by kernel-graph ref, shared tensors by (kernel, node)."""

    device: tuple[tuple[Ref, TensorLayout], ...]
    shared: tuple[tuple[tuple[int, int], TensorLayout], ...]
    cost: int
    breakdown: tuple[tuple[str, int], ...]  # cost paid per rule name at the optimum
    assignment: tuple[tuple[str, int | bool], ...] = ()  # the solver's value of every model variable

    @functools.cached_property
    def _device(self) -> dict[Ref, TensorLayout]:
        return dict(self.device)

    @functools.cached_property
    def _shared(self) -> dict[tuple[int, int], TensorLayout]:
        return dict(self.shared)

    def of_device(self, ref: Ref) -> TensorLayout:
        return self._device[ref]

    def of_shared(self, kernel: int, node: int) -> TensorLayout:
        return self._shared[(kernel, node)]

    def of_kernel(self, kernel: int) -> dict[int, TensorLayout]:
        return {node: t for (k, node), t in self.shared if k == kernel}


def _order(rank: int, innermost: int) -> tuple[int, ...]:
    return (innermost, *[d for d in range(rank - 1, -1, -1) if d != innermost])


def strides(t: TensorType, innermost: int, pad: bool,
            extra_vector: bool = False) -> tuple[tuple[int, ...], int]:
    """Strides (elements) and the elements spanned, for ``t`` stored innermost-first.

    With ``pad`` the contiguous run (the first dim of extent > 1) is rounded up to 16 bytes; with
    ``extra_vector`` it gets one more 16-byte vector, which shifts consecutive rows across the
    shared-memory banks (a swizzle by padding, the device library's ``padded_pitch``).
    """
    align = max(16 // t.dtype.itemsize, 1) if pad else 1
    out = [0] * t.rank
    stride, padded = 1, False
    for d in _order(t.rank, innermost):
        out[d] = stride
        if t.shape[d] != 1:
            if padded:
                stride *= t.shape[d]
            else:
                stride *= -(-t.shape[d] // align) * align + (align if extra_vector else 0)
                padded = True
    return tuple(out), max(stride, align)


class _Model:
    def __init__(self, costs: LayoutCosts, target: Target, free_innermost: bool,
                 swizzle_by_padding: bool = True) -> None:
        self.costs, self.target, self.free = costs, target, free_innermost
        self.swizzle_by_padding = swizzle_by_padding
        self.rules: list[Rule] = []
        self.inner: dict[str, Choice] = {}
        self.types: dict[str, TensorType] = {}

    def tensor(self, key: str, t: TensorType, shared: bool) -> Choice:
        if key not in self.inner:
            self.inner[key] = Choice(f"inner_{key}", tuple(range(t.rank)))
            self.types[key] = t
            self.add("innermost_choice", key, Any_(tuple(Is(self.inner[key], d) for d in range(t.rank))))
            self.add("not_row_major", key, Not(Is(self.inner[key], t.rank - 1)), self.costs.not_row_major)
            if shared:
                self._shared_rules(key, t)
        return self.inner[key]

    def swizzle(self, key: str, dim: int) -> Flag:
        return Flag(f"swizzle_{key}_{dim}")

    def add(self, name: str, subject: str, when, cost: int | None = None) -> None:
        self.rules.append(Rule(name, subject, when, cost))

    def _shared_rules(self, key: str, t: TensorType) -> None:
        inner = self.inner[key]
        if not self.free:
            self.add("row_major_tiles", key, Is(inner, t.rank - 1))
        for d in range(t.rank):
            self.add("innermost_not_swizzled", key, Not(All((Is(inner, d), self.swizzle(key, d)))))
            self.add("swizzle_dim", key, self.swizzle(key, d), self.costs.swizzle_dim)
            padding = (strides(t, d, True)[1] - t.numel) * t.dtype.itemsize
            if padding:
                self.add("padding_byte", key, Is(inner, d), padding * self.costs.padding_byte)
            if self.swizzle_by_padding:  # a swizzled tile pays one more 16-byte vector per row
                extra = (strides(t, d, True, True)[1] - strides(t, d, True)[1]) * t.dtype.itemsize
                swizzled = Any_(tuple(self.swizzle(key, e) for e in range(t.rank)))
                if extra:
                    self.add("padding_byte", key, All((Is(inner, d), swizzled)),
                             extra * self.costs.padding_byte)

    def walk(self, subject: str, dims: int, tensors: list[tuple[str, TensorType]], avoid: int | None) -> None:
        """An op whose threads walk along one dim; a non-contiguous walked dim must be swizzled."""
        choice = Choice(f"walk_{subject}", tuple(d for d in range(dims) if d != avoid) or tuple(range(dims)))
        for d in choice.domain:
            for key, t in tensors:
                if d < t.rank and t.shape[d] > 1:
                    self.add("walk_swizzles", f"{subject} {key}",
                             Implies(All((Is(choice, d), Not(Is(self.inner[key], d)))), self.swizzle(key, d)))
        self.add("walk_choice", subject, Any_(tuple(Is(choice, d) for d in choice.domain)))


def _device_key(ref: Ref) -> str:
    return f"d{ref.node}_{ref.index}"


def _shared_key(kernel: int, node: int) -> str:
    return f"s{kernel}_{node}"


def layout_rules(graph: KernelGraph, costs: LayoutCosts = LayoutCosts(), target: Target = DEFAULT_TARGET,
                 free_innermost: bool = True, swizzle_by_padding: bool = True) -> list[Rule]:
    """The model of ``graph`` as rule rows (see the module docstring)."""
    return _build(graph, costs, target, free_innermost, swizzle_by_padding).rules


def _build(graph: KernelGraph, costs: LayoutCosts, target: Target, free_innermost: bool,
           swizzle_by_padding: bool = True) -> _Model:
    model = _Model(costs, target, free_innermost, swizzle_by_padding)
    for ref in graph.refs():
        t = graph.type_of(ref)
        inner = model.tensor(_device_key(ref), t, shared=False)
        if graph.nodes[ref.node].op is Op.INPUT or ref in graph.outputs:
            model.add("row_major_io", _device_key(ref), Is(inner, t.rank - 1))
    for k, node in enumerate(graph.nodes):
        if node.op is Op.CUSTOMIZED:
            _block_rules(model, graph, k)
        else:
            _kernel_op_rules(model, graph, k)
    return model


def _kernel_op_rules(model: _Model, graph: KernelGraph, k: int) -> None:
    node = graph.nodes[k]
    out_key = _device_key(Ref(k, 0))
    if node.op is Op.INPUT:
        return
    out = graph.type_of(Ref(k, 0))
    keys = [(_device_key(r), graph.type_of(r)) for r in node.inputs]
    if node.op is Op.MATMUL:
        for key, t in [*keys, (out_key, out)]:
            inner = model.inner[key]
            model.add("kernel_matmul_last_two", key, Any_((Is(inner, t.rank - 1), Is(inner, t.rank - 2))))
        return
    for key, t in keys:
        if t.shape == out.shape:
            model.add("kernel_keeps_innermost", f"%{k} {key}", Same(model.inner[key], model.inner[out_key]))
    if node.op in (Op.REDUCTION, Op.REDUCTION_MAX):
        key = keys[0][0]
        model.add("kernel_reduction_innermost", f"%{k}", Is(model.inner[key], node.attrs.dim),
                  model.costs.kernel_reduction_innermost)


def _reduced_dim(node, operand_types: tuple[TensorType, ...]) -> int | None:
    if node.op in (Op.REDUCTION, Op.REDUCTION_TO_DIMX, Op.REDUCTION_MAX):
        return node.attrs.dim
    if node.op is Op.RMS_NORM:
        return operand_types[0].rank - 1
    if node.op in (Op.ACCUM, Op.ACCUM_RESCALE) and node.attrs.kind not in (AccumKind.NONE, AccumKind.MAX):
        return operand_types[0].rank - 1
    return None


def _block_rules(model: _Model, graph: KernelGraph, k: int) -> None:
    kernel = graph.nodes[k]
    block: BlockGraph = kernel.attrs
    for i, node in enumerate(block.nodes):
        if node.op is not Op.OUTPUT:
            model.tensor(_shared_key(k, i), node.outputs[0], shared=True)
    if model.target.compute_capability >= 80:
        input_cost = ("input_no_async_copy", model.costs.input_no_async_copy)
    else:
        input_cost = ("input_no_wide_copy", model.costs.input_no_wide_copy)
    for b, i in enumerate(block.input_nodes):
        src = _device_key(kernel.inputs[b])
        tile = _shared_key(k, i)
        model.add(input_cost[0], f"kernel %{k} input %{i}", Not(Same(model.inner[src], model.inner[tile])),
                  input_cost[1])
    for j, i in enumerate(block.output_nodes):
        dst = _device_key(Ref(k, j))
        tile = _shared_key(k, block.nodes[i].inputs[0].node)
        model.add("output_no_wide_copy", f"kernel %{k} output %{i}",
                  Not(Same(model.inner[dst], model.inner[tile])), model.costs.output_no_wide_copy)
    online_softmax = any(node.op is Op.RUNNING_MAX for node in block.nodes)
    for i, node in enumerate(block.nodes):
        operands = [(_shared_key(k, r.node), block.type_of(r)) for r in node.inputs]
        out = (_shared_key(k, i), node.outputs[0])
        subject = f"kernel %{k} %{i} {node.op.value}"
        if node.op in (Op.MATMUL, Op.CONCAT_MATMUL):
            for key, t in operands:
                inner = model.inner[key]
                last_two = Any_((Is(inner, t.rank - 1), Is(inner, t.rank - 2)))
                model.add("matmul_no_ldmatrix", f"{subject} {key}", Not(last_two),
                          model.costs.matmul_no_ldmatrix)
                if online_softmax:
                    model.add("chain_operand_not_row_major", f"{subject} {key}", Not(Is(inner, t.rank - 1)),
                              model.costs.chain_operand_not_row_major)
            for key, t in [*operands, out]:
                for d in (t.rank - 1, t.rank - 2):
                    model.add("matmul_swizzles", f"{subject} {key}",
                              Implies(Not(Is(model.inner[key], d)), model.swizzle(key, d)))
        elif node.op in ELEMENTWISE or node.op in (Op.FUSED, Op.RUNNING_MAX, Op.ACCUM, Op.ACCUM_RESCALE) \
                or node.op in (Op.REDUCTION, Op.REDUCTION_TO_DIMX, Op.REDUCTION_MAX, Op.RMS_NORM):
            walked = operands[0][1] if _reduced_dim(node, block.operand_types(node)) is not None else out[1]
            model.walk(f"k{k}_{i}", walked.rank, [*operands, out],
                       _reduced_dim(node, block.operand_types(node)))


def select_layouts(graph: KernelGraph, target: Target = DEFAULT_TARGET, costs: LayoutCosts = LayoutCosts(),
                   free_innermost: bool = True, timeout_ms: int = 20_000,
                   swizzle_by_padding: bool = True) -> tuple[KernelGraph, LayoutPlan]:
    """Choose every tensor's layout (a pass: the graph is returned unchanged, the plan is the record).

    With ``swizzle_by_padding`` a shared tile with a swizzled dim gets one extra 16-byte vector per
    row in its strides (and size); without, the code generator must swizzle addresses itself.
    """
    model = _build(graph, costs, target, free_innermost, swizzle_by_padding)
    values, cost = solve(model.rules, timeout_ms)
    return graph, _plan(graph, model, values, cost, swizzle_by_padding)


def _plan(graph: KernelGraph, model: _Model, values, cost: int, swizzle_by_padding: bool) -> LayoutPlan:
    device, shared = [], []
    for key, choice in model.inner.items():
        t = model.types[key]
        inner = int(values[choice.name])
        if key.startswith("d"):
            node, index = map(int, key[1:].split("_"))
            st, span = strides(t, inner, pad=False)
            device.append((Ref(node, index), TensorLayout(t.shape, inner, (), st, span)))
        else:
            kernel, node = map(int, key[1:].split("_"))
            swizzled = tuple(d for d in range(t.rank) if values.get(model.swizzle(key, d).name, False))
            st, span = strides(t, inner, pad=True, extra_vector=swizzle_by_padding and bool(swizzled))
            shared.append(((kernel, node), TensorLayout(t.shape, inner, swizzled, st, span)))
    breakdown: dict[str, int] = {}
    for rule in model.rules:
        if rule.cost and evaluate([rule], values):
            breakdown[rule.name] = breakdown.get(rule.name, 0) + rule.cost
    return LayoutPlan(tuple(device), tuple(shared), cost, tuple(sorted(breakdown.items())),
                      tuple(sorted(values.items())))
