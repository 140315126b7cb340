"""Activations spelled out by hand, written at capture as the op they equal, so that the search sees
one op where the program wrote five: a GELU written with ``erf`` (BERT's original code, older Hugging
Face models), ``0.5 · x · (1 + erf(x / √2))``, becomes ``gelu(x)`` (its exact form, which PyTorch's
``F.gelu`` computes). Each factor may stand in any of the orders PyTorch programs write them in
(``x · 0.5 · (…)``, ``x · (…) / 2``); the constants must be √2 (or 1/√2) and ½ to float32's
precision, so that a rounded √2 (1.41421) is left as written: that is another function.

>>> import math, torch
>>> x = torch.randn(8, dtype=torch.float64)
>>> torch.allclose(0.5 * x * (1 + torch.erf(x / math.sqrt(2.0))), torch.nn.functional.gelu(x))
True
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from mirage.frontend.fill_masks import erase_unused

aten = torch.ops.aten
SQRT2 = math.sqrt(2.0)
_PRECISION = 2.0**-24  # float32's unit roundoff: a constant this close is the one meant


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _is(value: object, wanted: float) -> bool:
    number = _number(value)
    return number is not None and abs(number - wanted) <= _PRECISION * abs(wanted)


def _product_by(node: object, wanted: float) -> fx.Node | None:
    """x when ``node`` is ``x · wanted`` or ``x / (1 / wanted)`` (a number), else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    if node.target is aten.mul.Tensor:
        if isinstance(a, fx.Node) and _is(b, wanted):
            return a
        return b if isinstance(b, fx.Node) and _is(a, wanted) else None
    if node.target is aten.div.Tensor and isinstance(a, fx.Node):
        return a if _is(b, 1.0 / wanted) else None
    return None


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _gelu_of(one_plus: fx.Node, x: fx.Node) -> fx.Node | None:
    """The node that completes ``½ · x · one_plus`` from ``one_plus`` = 1 + erf(x / √2), if any."""
    for user in list(one_plus.users):
        if user.op != "call_function" or user.target is not aten.mul.Tensor or len(user.args) != 2:
            continue
        other = user.args[1] if user.args[0] is one_plus else user.args[0]
        if _product_by(other, 0.5) is x:  # (x · ½) · (1 + erf)
            return user
        after = _only_user(user)
        if other is x and after is not None and _product_by(after, 0.5) is user:  # x · (1 + erf) · ½
            return after
        if _is(other, 0.5) and after is not None and after.target is aten.mul.Tensor and x in after.args \
                and user in after.args and len(after.args) == 2:  # (1 + erf) · ½ · x
            return after
    return None


def _adds_one(node: fx.Node, erf: fx.Node) -> bool:
    """Whether ``node`` is ``erf + 1`` (either order, no alpha)."""
    if node.target is not aten.add.Tensor or len(node.args) != 2 or node.kwargs or erf not in node.args:
        return False
    return _is(node.args[1] if node.args[0] is erf else node.args[0], 1.0)


def erf_gelus(gm: fx.GraphModule) -> None:
    """Write each ``0.5 · x · (1 + erf(x / √2))`` of a floating ``x`` as ``gelu(x)``."""
    changed = False
    for erf in list(gm.graph.nodes):
        if erf.op != "call_function" or erf.target is not aten.erf.default:
            continue
        x = _product_by(erf.args[0], 1.0 / SQRT2)
        value = x.meta.get("val") if isinstance(x, fx.Node) else None
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        one_plus = next((u for u in erf.users if _adds_one(u, erf)), None)
        gelu = _gelu_of(one_plus, x) if one_plus is not None else None
        if gelu is None:
            continue
        with gm.graph.inserting_before(gelu):
            exact = gm.graph.call_function(aten.gelu.default, (x,))
        exact.meta["val"] = gelu.meta["val"]
        gelu.replace_all_uses_with(exact)
        erase_unused(gm.graph, gelu)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
