"""Products of one input by several weights, rewritten at capture so that each becomes the product
the rest of the program needs.

Two opposite cases, told apart by what reads the products:

* :func:`split_products`: one ``linear`` whose output is split along its last dim and whose pieces go
  into element-wise ops (a fused gate and up projection chunked in two) becomes one ``linear`` a
  piece, so that each joins the element-wise ops reading it in one subprogram (SwiGLU as GatedMLP).
* :func:`merged_products`: sibling ``linear`` ops of the same input whose outputs are only reshaped
  (BERT's or Llama's query, key and value projections, each split into heads) become one ``linear``
  by the weights stacked, and each output a slice of it.  Such products run alone, each its own
  subprogram, and one product of ``3n`` columns is much faster than three of ``n`` at a prompt's
  size; the heads read the slices in place through their strides.

Both only rewrite products whose weights (and biases) are attributes of the module. The pieces of
:func:`split_products` view the parameter. For :func:`merged_products` the parameters move into one
tensor, their rows of it (:class:`StackedParameters`): the module's parameters keep their values and
identities, updates in place are seen, and the weights are not held twice.
"""

from __future__ import annotations

import contextlib
import operator

import torch
import torch.fx as fx

from mirage.frontend.fill_masks import FoldedConstant
from mirage.mugraph.graph import dense_strides

_ATEN = torch.ops.aten
_SPLITS = {_ATEN.chunk.default, _ATEN.split.Tensor, _ATEN.split_with_sizes.default}
# ops that only change how a value is laid out or indexed: a product read by nothing else runs alone
_RESHAPES = {_ATEN.view.default, _ATEN.reshape.default, _ATEN._unsafe_view.default, _ATEN.permute.default,
             _ATEN.transpose.int, _ATEN.unsqueeze.default, _ATEN.expand.default}
_NOT_ELEMENT_WISE = {"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "scaled_dot_product_attention",
                     "sum", "mean", "var", "std", "softmax", "_softmax", "_safe_softmax",
                     "linalg_vector_norm", "rms_norm", "layer_norm", "dropout"}
MERGED = "_mirage_merged_"


def _fake_mode(value):
    """The fake mode of a traced value, to compute a new node's value in (or no context)."""
    return value.fake_mode if hasattr(value, "fake_mode") else contextlib.nullcontext()


def _constant_operands(product: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None] | None:
    """``(x, weight, bias)`` of a ``linear`` whose weight and bias (if any) are module attributes."""
    if product.op != "call_function" or product.target is not _ATEN.linear.default or product.kwargs:
        return None
    x, weight, bias = (*product.args, None)[:3]
    if not isinstance(x, fx.Node) or not all(isinstance(t, fx.Node) and t.op == "get_attr"
                                              for t in (weight, bias) if t is not None):
        return None
    return x, weight, bias


def split_products(gm: fx.GraphModule) -> None:
    """Write the pieces of a ``linear`` split along its last dim (a fused gate and up projection
    chunked in two, a fused q, k, v projection split in three) as one ``linear`` each, of the rows of
    the weight (and bias) it computes: each piece then joins the ops that read it (SwiGLU's gate and
    up products in one subprogram, as in GatedMLP), where a slice of a computed value cannot.  The
    weight's rows are attributes that view the parameter, so an update in place is seen.  Only where
    every piece goes into element-wise ops: pieces that are reshaped into heads (q, k, v) would
    make three products where one feeds the attention."""
    from mirage.frontend.lowering import LOWERINGS, Kind

    def element_wise(node: fx.Node) -> bool:
        row = LOWERINGS.get(node.target.__name__.split(".")[0]) if node.op == "call_function" else None
        return row is not None and row.kind is Kind.COMPUTE and row.op not in _NOT_ELEMENT_WISE

    count = 0
    for split in list(gm.graph.nodes):
        if split.op != "call_function" or split.target not in _SPLITS:
            continue
        product, pieces = split.args[0], split.meta.get("val")
        dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        operands = _constant_operands(product) if isinstance(product, fx.Node) else None
        if (operands is None or len(product.users) != 1 or not isinstance(pieces, (list, tuple))
                or dim not in (-1, product.meta["val"].dim() - 1)
                or any(u.target is not operator.getitem for u in split.users)
                or not all(element_wise(n) for u in split.users for n in u.users)):
            continue
        x, weight, bias = operands
        start, replaced = 0, {}
        for k, piece in enumerate(pieces):
            end = start + int(piece.shape[-1])
            with gm.graph.inserting_before(product):
                rows = _row_view(gm, weight, start, end, f"_mirage_rows_{count}")
                part = [_row_view(gm, bias, start, end, f"_mirage_rows_{count + 1}")] if bias else []
                replaced[k] = gm.graph.call_function(_ATEN.linear.default, (x, rows, *part))
            count += 2
            with _fake_mode(piece):
                rows.meta["val"] = weight.meta["val"][start:end]
                for p in part:
                    p.meta["val"] = bias.meta["val"][start:end]
                replaced[k].meta["val"] = _ATEN.linear.default(
                    x.meta["val"], rows.meta["val"], *(p.meta["val"] for p in part))
            start = end
        for user in list(split.users):
            user.replace_all_uses_with(replaced[user.args[1]])
            gm.graph.erase_node(user)
        gm.graph.erase_node(split)
        gm.graph.erase_node(product)
        for node in replaced.values():  # a piece the program does not read (``a, _ = ...chunk(2)``)
            if not node.users:
                rows = node.all_input_nodes[1:]
                gm.graph.erase_node(node)
                for attribute in rows:
                    gm.graph.erase_node(attribute)
    gm.recompile()


def _row_view(gm: fx.GraphModule, attribute: fx.Node, start: int, end: int, name: str) -> fx.Node:
    """A ``get_attr`` of rows ``start:end`` of ``attribute``'s tensor, registered on ``gm`` as a view
    (the same storage and version counter: in-place updates of the parameter are seen)."""
    tensor = operator.attrgetter(str(attribute.target))(gm)
    gm.register_buffer(name, tensor.detach()[start:end], persistent=False)
    return gm.graph.get_attr(name)


def _sibling_groups(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """The ``linear`` ops that :func:`merged_products` merges, in groups of two or more, each in graph
    order: the same input, weights of the same columns, dtype and device, all with a bias or none,
    and outputs read only by reshapes."""
    groups: dict[tuple, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        operands = _constant_operands(node)
        if operands is None or not node.users or any(
                u.op != "call_function" or u.target not in _RESHAPES for u in node.users):
            continue
        x, weight, bias = operands
        w = weight.meta.get("val")
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            continue
        key = (x, int(w.shape[1]), w.dtype, w.device, bias is not None)
        groups.setdefault(key, []).append(node)
    return [group for group in groups.values() if len(group) > 1]


class StackedParameters(FoldedConstant):
    """The parameters ``parts`` stacked along dim 0, in one tensor whose rows the parameters become
    views of (``p.data`` re-pointed: the same values and the same ``Parameter`` objects, no second copy
    of the weights). While they stay so, a call returns that tensor as it is, in a caller's CUDA
    graph too: an update of a parameter in place is an update of its rows. Parameters that do not own
    their storage alone (tied to another tensor by sharing it, or rows of another stack already, in
    another order: another specialization's) are left as they are, as is a parameter given other
    storage since (``module.to(...)``, ``p.data = ...``): the stack is then a :class:`FoldedConstant`,
    stacked anew whenever a part changes, and at every replay of a caller's graph. ``others``: the
    storages of the module's other tensors."""

    def __init__(self, function: fx.GraphModule, parts: list[torch.Tensor],
                 names: tuple[str, ...] = (), others: frozenset[int] = frozenset()) -> None:
        super().__init__(function)
        self.names = names  # the parameters' names in the module, for the report
        self._rows: list[tuple[int, torch.Size]] = []
        start = 0
        for p in parts:
            self._rows.append((start, p.shape))
            start += p.shape[0]
        shape = (start, *parts[0].shape[1:])
        first = parts[0].detach()
        self._stack: torch.Tensor | None
        try:  # the rows of one stack already (another specialization's): read that stack, no copy
            self._stack = first.as_strided(shape, dense_strides(shape))
        except RuntimeError:  # past the end of the first part's storage
            self._stack = None
        if self._stack is not None and self._viewed(parts):
            return
        self._stack = None
        if _alone(parts, others):
            with torch.no_grad():
                self._stack = torch.cat([p.detach() for p in parts], 0)
            for p, (row, size) in zip(parts, self._rows, strict=True):
                p.data = self._stack[row:row + size[0]]

    def _viewed(self, parts: tuple[torch.Tensor, ...]) -> bool:
        stack = self._stack
        return stack is not None and len(parts) == len(self._rows) and all(
            p.shape == shape and p.device == stack.device and p.dtype == stack.dtype
            and p.data_ptr() == stack.data_ptr() + start * stack.stride(0) * stack.element_size()
            for p, (start, shape) in zip(parts, self._rows, strict=True))

    def forward(self, *parts: torch.Tensor) -> torch.Tensor:
        return self._stack if self._viewed(parts) else super().forward(*parts)  # type: ignore[return-value]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _alone(parts: list[torch.Tensor], others: frozenset[int]) -> bool:
    """Whether each of ``parts`` is the whole of a storage, row-major, that no other part and no
    tensor of ``others`` (storages) shares: re-pointing it into a stack then unties nothing and keeps
    its strides."""
    storages = [_storage(p) for p in parts]
    return len(set(storages)) == len(parts) and not set(storages) & others and all(
        p.is_contiguous() and p.storage_offset() == 0
        and p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in parts)


def _stacked(gm: fx.GraphModule, attributes: list[fx.Node], name: str, before: fx.Node) -> fx.Node:
    """A ``call_module`` node of :class:`StackedParameters` of ``attributes``' tensors, inserted before
    ``before`` and registered on ``gm`` as ``name``."""
    graph = fx.Graph()
    parts = [graph.placeholder(f"part{k}") for k in range(len(attributes))]
    graph.output(graph.call_function(_ATEN.cat.default, (parts, 0)))
    tensors = [operator.attrgetter(str(a.target))(gm) for a in attributes]
    mine = {id(t) for t in tensors}
    others = frozenset(_storage(t) for _, t in (*gm.named_parameters(remove_duplicate=False),
                                                *gm.named_buffers(remove_duplicate=False))
                       if id(t) not in mine)
    gm.add_submodule(name, StackedParameters(fx.GraphModule(gm, graph), tensors,
                                             tuple(str(a.target) for a in attributes), others))
    with gm.graph.inserting_before(before):
        reads = [gm.graph.get_attr(str(a.target)) for a in attributes]  # defined before the stack
        stacked = gm.graph.call_module(name, tuple(reads))
    for read, attribute in zip(reads, attributes, strict=True):
        read.meta["val"] = attribute.meta["val"]
    with _fake_mode(attributes[0].meta["val"]):
        stacked.meta["val"] = _ATEN.cat.default([a.meta["val"] for a in attributes], 0)
    return stacked


def _restride(piece: fx.Node) -> None:
    """Trace again the views of ``piece`` (and their views): their traced values still have the strides
    of the product they were taken from, and the subprograms reading them declare those strides."""
    stack = list(piece.users)
    while stack:
        view = stack.pop()
        if view.op != "call_function" or not getattr(view.target, "is_view", False):
            continue
        args, kwargs = fx.node.map_arg((view.args, view.kwargs), lambda a: a.meta["val"])
        with _fake_mode(piece.meta["val"]):
            view.meta["val"] = view.target(*args, **kwargs)
        stack.extend(view.users)


def merged_products(gm: fx.GraphModule) -> int:
    """Merge sibling products that are only reshaped (see the module docstring) into one ``linear``
    by their weights stacked, each sibling's output a slice of its columns.  Returns the number of
    products merged away."""
    merged = 0
    for k, group in enumerate(_sibling_groups(gm)):
        first = group[0]
        operands = [_constant_operands(node) for node in group]
        x = operands[0][0]
        weight = _stacked(gm, [w for _, w, _ in operands], f"{MERGED}{k}_weight", first)
        bias = ([_stacked(gm, [b for _, _, b in operands], f"{MERGED}{k}_bias", first)]
                if operands[0][2] is not None else [])
        with gm.graph.inserting_before(first):
            product = gm.graph.call_function(_ATEN.linear.default, (x, weight, *bias))
        with _fake_mode(first.meta["val"]):
            product.meta["val"] = _ATEN.linear.default(
                x.meta["val"], weight.meta["val"], *(b.meta["val"] for b in bias))
        start, pieces = 0, []
        for node in group:  # every slice placed before any sibling is erased
            end = start + int(node.meta["val"].shape[-1])
            with gm.graph.inserting_before(first):
                piece = gm.graph.call_function(_ATEN.slice.Tensor, (product, -1, start, end))
            with _fake_mode(first.meta["val"]):
                piece.meta["val"] = _ATEN.slice.Tensor(product.meta["val"], -1, start, end)
            pieces.append(piece)
            start = end
        for node, piece in zip(group, pieces, strict=True):
            node.replace_all_uses_with(piece)
            _restride(piece)
            attributes = node.all_input_nodes[1:]
            gm.graph.erase_node(node)
            for attribute in attributes:
                if not attribute.users:
                    gm.graph.erase_node(attribute)
        merged += len(group) - 1
    gm.recompile()
    return merged
