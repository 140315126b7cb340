"""Rotary embedding's rearrangements written as products by a signed selection matrix, at capture.

Rotary embeddings rotate pairs of a head's columns.  Hugging Face's ``rotate_half`` concatenates the
two halves, the second negated (``cat([-x[..., d/2:], x[..., :d/2]], -1)``); GPT-J's form, and the
models after it, interleave them (``stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)``).  Either is
``x @ S`` for a matrix ``S`` whose every column holds one ±1: exact in float16 and bfloat16, the
dtypes it is written for, and a product the lowering takes, where slices, concatenations and stacks
would stay in PyTorch and cut the subprogram.  ``S`` is a buffer of the captured module.

>>> import torch.fx as fx
>>> def rotate_every_two(x):
...     return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
>>> x = torch.randn(3, 8).half()
>>> gm = torch.export.export(fx.symbolic_trace(rotate_every_two), (x,)).module()
>>> interleaved_stacks_as_products(gm)
>>> [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"]
['matmul.default']
>>> torch.equal(gm(x), rotate_every_two(x))
True
"""

from __future__ import annotations

import torch
import torch.fx as fx

from mirage.frontend.fill_masks import erase_unused

SELECTION = "_selection_"  # the buffers of rearranged slices written as products
aten = torch.ops.aten


def _signed_slice(piece: object, rank: int) -> tuple[fx.Node, int, int, int, float] | None:
    """(x, start, stop, step, sign) when ``piece`` is ``x[..., start:stop:step]`` or its negation."""
    sign = 1.0
    if isinstance(piece, fx.Node) and piece.target is aten.neg.default:
        piece, sign = piece.args[0], -1.0
    if not (isinstance(piece, fx.Node) and piece.target is aten.slice.Tensor):
        return None
    x, dim = piece.args[0], piece.args[1] if len(piece.args) > 1 else 0
    start = piece.args[2] if len(piece.args) > 2 else 0
    stop = piece.args[3] if len(piece.args) > 3 else None
    step = piece.args[4] if len(piece.args) > 4 else 1
    if not isinstance(x, fx.Node) or dim % rank != rank - 1 or not isinstance(step, int) or step < 1:
        return None
    width = int(x.meta["val"].shape[-1])
    start, stop = slice(start, stop).indices(width)[:2]
    return (x, start, stop, step, sign) if stop > start else None


def _half_precision(value: object) -> bool:
    # float16 and bfloat16 only: a float32 product may run on TF32 tensor cores, which round x
    return isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16)


def _as_product(gm: fx.GraphModule, node: fx.Node, x: fx.Node, selection: torch.Tensor) -> None:
    """Replace ``node`` by ``x @ selection`` (a new buffer) and erase what led to it, as far as
    nothing else reads it (the concatenation or stack, the slices, their negations)."""
    name = f"{SELECTION}{sum(1 for n, _ in gm.named_buffers() if n.startswith(SELECTION))}"
    gm.register_buffer(name, selection.to(node.meta["val"].device))
    with gm.graph.inserting_before(node):
        weights = gm.graph.get_attr(name)
        weights.meta["val"] = getattr(gm, name)
        product = gm.graph.call_function(aten.matmul.default, (x, weights))
    product.meta["val"] = node.meta["val"]
    node.replace_all_uses_with(product)
    erase_unused(gm.graph, node)


def _selection(x: fx.Node, out: torch.Tensor, slices: list, interleaved: bool) -> torch.Tensor | None:
    """The signed selection matrix that takes ``x``'s columns to ``out``'s: the slices one after
    another, or (``interleaved``) column k of slice j to output column k · len(slices) + j."""
    width, columns = int(x.meta["val"].shape[-1]), int(out.shape[-1])
    selection = torch.zeros(width, columns, dtype=out.dtype)
    column = 0
    for j, (_, start, stop, step, sign) in enumerate(slices):
        for k, source in enumerate(range(start, stop, step)):
            target = k * len(slices) + j if interleaved else column + k
            if target >= columns:
                return None
            selection[source, target] = sign
        column += len(range(start, stop, step))
    return selection if int((selection != 0).sum()) == columns else None


def _rewrite(gm: fx.GraphModule, match) -> None:
    """Each node that ``match`` takes to (its value, the pieces, their rank, interleaved or not) and
    whose pieces are signed slices of one tensor, written as that tensor times its selection matrix."""
    changed = False
    for node in list(gm.graph.nodes):
        found = match(node) if node.op == "call_function" else None
        if found is None:
            continue
        out, pieces, rank, interleaved = found
        slices = [_signed_slice(p, rank) for p in pieces]
        if (any(s is None or (s[3] != 1 and not interleaved) for s in slices)
                or len({s[0] for s in slices}) != 1):
            continue
        x = slices[0][0]
        selection = _selection(x, out, slices, interleaved)
        if tuple(x.meta["val"].shape[:-1]) != tuple(out.shape[:-1]) or selection is None:
            continue
        _as_product(gm, node, x, selection)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def slice_concats_as_products(gm: fx.GraphModule) -> None:
    """``cat([±x[..., a:b], …], dim=-1)`` (``rotate_half``) as ``x @ S``."""

    def match(node: fx.Node):
        if node.target is not aten.cat.default:
            return None
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        out = node.meta.get("val")
        if not (_half_precision(out) and dim % out.dim() == out.dim() - 1):
            return None
        return out, node.args[0], out.dim(), False

    _rewrite(gm, match)


_FLATTENS = {aten.flatten.using_ints, aten.view.default, aten.reshape.default, aten._unsafe_view.default}


def interleaved_stacks_as_products(gm: fx.GraphModule) -> None:
    """``stack([±x[..., a::n], …], dim=-1)`` flattened into its last dim (GPT-J's ``rotate_every_two``)
    as ``x @ S``: output column k · n + j is column k of slice j."""

    def match(node: fx.Node):
        if node.target not in _FLATTENS or not node.args:
            return None
        stack, out = node.args[0], node.meta.get("val")
        if not (isinstance(stack, fx.Node) and stack.target is aten.stack.default and len(stack.users) == 1
                and _half_precision(out)):
            return None
        stacked = stack.meta.get("val")
        dim = stack.args[1] if len(stack.args) > 1 else stack.kwargs.get("dim", 0)
        if not (isinstance(stacked, torch.Tensor) and dim % stacked.dim() == stacked.dim() - 1
                and tuple(out.shape) == (*stacked.shape[:-2], stacked.shape[-2] * stacked.shape[-1])):
            return None  # not the stack's last two dims merged into one
        return out, stack.args[0], stacked.dim() - 1, True

    _rewrite(gm, match)
