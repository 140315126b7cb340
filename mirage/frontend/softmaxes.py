"""Softmaxes spelled with their row maximum, written at capture as the plain ``softmax`` they equal.

The generated kernels subtract the running row maximum themselves (the online softmax), and the
search works on the LAX form ``exp(x) / Σ exp(x)``, in which a maximum has no finite-field meaning.
A maximum left in the program would run in PyTorch and split the attention around it, so two
spellings of the same function are rewritten:

* :func:`stable_softmaxes`: ``e = exp(x − max(x, d)); e / Σ_d e`` becomes ``softmax(x, d)``;
* :func:`shifted_softmaxes`: ``softmax(x − max(x, d), d)`` (x-transformers' and several papers'
  ``sim - sim.amax(dim=-1, keepdim=True).detach()`` before the softmax) becomes ``softmax(x, d)``,
  since a softmax does not change when its row is shifted by a constant.

The row maximum is ``amax(x, [d], keepdim=True)`` or ``max(x, d, keepdim=True).values``, over the
softmax's own dim and of the same tensor; anything else stays as written.

>>> import torch
>>> s = torch.randn(4, 16)
>>> torch.allclose(torch.softmax(s - s.amax(-1, keepdim=True), -1), torch.softmax(s, -1))
True
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from mirage.frontend.fill_masks import erase_unused

aten = torch.ops.aten
# the softmax targets that capture sees: ``softmax.int`` from modules and functions, ``_softmax`` and
# ``_safe_softmax`` from decompositions (SDPA's math path); each takes (x, dim, …)
_SOFTMAXES = (aten.softmax.int, aten._softmax.default, aten._safe_softmax.default)


_DETACHES = (aten.detach.default, aten.alias.default)  # no change to values (``.detach()``)


def _undetached(node: object) -> list:
    """``node`` and the nodes it reads through detaches, outermost first."""
    chain = [node]
    while isinstance(chain[-1], fx.Node) and chain[-1].target in _DETACHES:
        chain.append(chain[-1].args[0])
    return chain


def row_max_of(node: object) -> tuple[fx.Node, int] | None:
    """(x, dim) when ``node`` is ``amax(x, [dim], keepdim=True)`` or ``max(x, dim, keepdim=True)[0]``,
    detached or not."""
    node = _undetached(node)[-1]
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    if node.target is aten.amax.default:
        x, dims = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", ())
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        return (x, dims[0]) if keep and len(dims) == 1 else None
    if node.target is operator.getitem and node.args[1] == 0:
        source = node.args[0]
        if isinstance(source, fx.Node) and source.target is aten.max.dim:
            keep = source.args[2] if len(source.args) > 2 else source.kwargs.get("keepdim", False)
            return (source.args[0], source.args[1]) if keep else None
    return None


def _shifted_by_row_max(shifted: object, dim: int) -> fx.Node | None:
    """x when ``shifted`` is ``x − max(x, dim)`` (kept dims, no alpha); else None."""
    if not (isinstance(shifted, fx.Node) and shifted.target is aten.sub.Tensor and len(shifted.args) == 2
            and shifted.kwargs.get("alpha", 1) == 1):
        return None
    x, row_max = shifted.args
    found = row_max_of(row_max)
    if found is None or found[0] is not x or not isinstance(x, fx.Node):
        return None
    rank = x.meta["val"].dim()
    return x if found[1] % rank == dim % rank else None


def _finish(gm: fx.GraphModule, changed: bool) -> None:
    if changed:
        gm.graph.lint()
        gm.recompile()


def stable_softmaxes(gm: fx.GraphModule) -> None:
    """Write ``e = exp(x − max(x, d)); e / Σ_d e`` as ``softmax(x, d)``. ``e`` stays where other ops
    read it."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.div.Tensor:
            continue
        e, total = node.args[0], node.args[1]
        if not (isinstance(e, fx.Node) and e.target is aten.exp.default and isinstance(total, fx.Node)
                and total.target is aten.sum.dim_IntList and total.args[0] is e):
            continue
        dims = total.args[1] if len(total.args) > 1 else ()
        keep = total.args[2] if len(total.args) > 2 else total.kwargs.get("keepdim", False)
        if not keep or len(dims) != 1 or total.kwargs.get("dtype"):
            continue
        shifted = e.args[0]
        x = _shifted_by_row_max(shifted, dims[0])
        if x is None:
            continue
        with gm.graph.inserting_before(node):
            softmax = gm.graph.call_function(aten.softmax.int, (x, dims[0] % x.meta["val"].dim()))
        softmax.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(softmax)
        gm.graph.erase_node(node)
        erase_unused(gm.graph, total)
        changed = True
    _finish(gm, changed)


def shifted_softmaxes(gm: fx.GraphModule) -> None:
    """Write ``softmax(x − max(x, d), d)`` as ``softmax(x, d)``. The shifted scores stay where other
    ops read them."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SOFTMAXES or len(node.args) < 2:
            continue
        shifted = node.args[0]
        x = _shifted_by_row_max(shifted, node.args[1])
        if x is None:
            continue
        node.update_arg(0, x)
        erase_unused(gm.graph, shifted)
        changed = True
    _finish(gm, changed)
