"""Scores hidden with ``masked_fill(scores, mask, -inf)`` (nanoGPT's and many hand-written attentions),
captured as the additive form the search takes: ``scores + fill``, where ``fill`` is −inf where the
boolean ``mask`` is True and 0 elsewhere.  The two agree wherever the scores are finite.

A mask computed only from the module's buffers (``self.bias[:, :, :t, :t] == 0``) or from constants
(``torch.ones(t, t).triu(1).bool()`` in the forward) is folded: a
:class:`FoldedConstant` submodule computes it from those buffers once and again only when one of them
changes (its version counter), and the fill is converted once per mask (:func:`fill_mask`), so a call
runs no kernel for either.  Where that fill holds the causal pattern (``mirage.mugraph.patterns``)
its node names the pattern, and the generated kernels compute the mask instead of reading it; a
buffer changed since then is checked again when the fill is recomputed, and a mask that no longer
holds the pattern raises :class:`MaskPatternError` instead of running kernels that assume it.

An additive mask kept as a buffer (``att + self.mask[:t, :t]``, or SDPA's float ``attn_mask``) whose
values are the causal pattern gets the same promise and the same check (:func:`causal_buffers`).
"""

from __future__ import annotations

import contextlib
import math
import operator
import weakref

import torch
import torch.fx as fx
import torch.nn as nn

from mirage.errors import MirageError
from mirage.frontend import graphs
from mirage.mugraph import patterns

aten = torch.ops.aten
# tensors made from constants alone (no randomness): a mask built in the forward from them is constant
CREATION = frozenset({
    aten.ones.default, aten.zeros.default, aten.full.default, aten.arange.default, aten.arange.start,
    aten.arange.start_step, aten.scalar_tensor.default,
})
# the ops a mask of buffers and constants may be computed with (pure, cheap, no randomness)
FOLDABLE = CREATION | frozenset({
    aten.alias.default, aten.slice.Tensor, aten.select.int, aten.view.default, aten.reshape.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.expand.default, aten.clone.default,
    aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.eq.Scalar, aten.ne.Scalar,
    aten.lt.Scalar, aten.le.Scalar,
    aten.gt.Scalar, aten.ge.Scalar, aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor, aten.le.Tensor,
    aten.gt.Tensor, aten.ge.Tensor, aten.sub.Tensor, aten.abs.default, aten.logical_not.default,
    aten.bitwise_not.default, aten.logical_and.default, aten.logical_or.default, aten.triu.default,
    aten.tril.default,
})
FOLDED = "_mirage_folded_"


class MaskPatternError(MirageError):
    """A mask that the generated kernels compute from its pattern no longer holds that pattern."""


class FoldedConstant(nn.Module):
    """A tensor computed from buffers and constants alone: computed again only when a buffer has
    changed, and then
    checked against ``pattern`` where the generated kernels assume it."""

    def __init__(self, function: fx.GraphModule, pattern: str = "", visible_rows: bool = False) -> None:
        super().__init__()
        self.function = function
        self.pattern = pattern
        # a mask (True: hidden) that must leave a key of every row visible: its fill stands for a
        # finite lowest value before a softmax, which equals −inf there only while a row keeps a key
        self.visible_rows = visible_rows
        # the pattern that the kernels assume of a value computed from this one (the additive form of
        # GPT-2's causal mask), checked where that value is computed
        self.derived_pattern = ""
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def forward(self, *buffers: torch.Tensor) -> torch.Tensor:
        key = _versions(buffers)
        if graphs.capturing(buffers):  # recorded in a caller's CUDA graph: a replay runs no Python to
            # check versions (nor can the pattern check sync with the host here)
            unchanged = key is not None and key == self._key and self._value is not None
            promised = self.pattern or self.derived_pattern
            if unchanged and (promised or not graphs.recording_constants(buffers)):
                # a capture standing for calls from Python (graphs.standing_for_calls), or a value that
                # the kernels' pattern fixes: while the promise holds, computing it again gives the
                # same tensor (for GPT-2's causal mask, three kernels a replay); a buffer changed so
                # that it breaks, which calls refuse (MaskPatternError), is unsupported in graphs too
                return self._value
            return self.function(*buffers)
        if key is None or key != self._key or self._value is None:
            value = self.function(*buffers)
            if self.pattern and not patterns.matches(self.pattern, value):
                raise _broken(self.pattern)
            if self.visible_rows and bool(value.all(-1).any()):
                raise MaskPatternError(
                    "a mask built from buffers now hides every key of some row; the generated kernels "
                    "fill hidden scores with -inf where the program writes the lowest finite value, which "
                    "only agree while each row keeps a key: superoptimize the model again")
            self._value, self._key = value, key
        return self._value


def _broken(pattern: str) -> MaskPatternError:
    return MaskPatternError(
        f"a mask that the generated kernels compute as the {pattern!r} pattern now holds other values "
        "(a buffer it is computed from changed since the capture); superoptimize the model again, or "
        "keep the buffer unchanged")


def _versions(tensors) -> tuple | None:
    try:
        return tuple((id(t), t._version) for t in tensors)
    except RuntimeError:  # an inference tensor keeps no version counter: compute every time
        return None


# each boolean mask converted, by the mask's id: (a weak reference to the mask, its version, dtype,
# which value hides, the additive mask)
_FILLS: dict[int, tuple[weakref.ref, int, torch.dtype, bool, torch.Tensor]] = {}


def fill_mask(mask: torch.Tensor, dtype: torch.dtype, pattern: str = "", hides: bool = True) -> torch.Tensor:
    """The additive form of boolean ``mask`` in ``dtype``: −inf where it is ``hides`` (True: a
    ``masked_fill`` mask; False: SDPA's ``attn_mask``, True where the key takes part), 0 elsewhere.
    A mask converted before and unchanged since (the same tensor, its version counter where it has
    one) gives the same tensor again, so a constant mask is converted once and one updated in place
    again. A result that ``pattern`` names is checked when it is computed. Inside a CUDA-graph capture a
    cached value would be baked into the graph, so the mask is converted again, unless ``pattern`` names
    it: its values are then the pattern's while the promise holds (see :class:`FoldedConstant`)."""
    capturing = graphs.capturing((mask,))
    try:
        version = mask._version
    except RuntimeError:  # an inference tensor keeps no version counter: convert every time
        version = None
    entry = _FILLS.get(id(mask))
    if (version is not None and (pattern or not capturing) and entry is not None and entry[0]() is mask
            and entry[1:4] == (version, dtype, hides)):
        return entry[4]
    # two kernels, not three (no ~mask): each is a launch of its own in a caller's CUDA graph
    if hides:
        fill = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))
    else:
        fill = torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device).masked_fill_(mask, 0.0)
    if pattern and not capturing and not patterns.matches(pattern, fill):
        raise _broken(pattern)
    if version is not None and not capturing and not torch.compiler.is_compiling():
        for key in [k for k, e in _FILLS.items() if e[0]() is None]:  # masks freed since
            del _FILLS[key]
        _FILLS[id(mask)] = (weakref.ref(mask), version, dtype, hides, fill)
    return fill


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SDPA's boolean ``attn_mask`` (True: the key takes part) as 0 and −inf (:func:`fill_mask`)."""
    return fill_mask(mask, dtype, hides=False)


_NOTS = (aten.bitwise_not.default, aten.logical_not.default)
_SOFTMAXES = (aten.softmax.int, aten._softmax.default)


def _hiding(value, dtype: torch.dtype) -> bool:
    """Whether a fill ``value`` is −inf or at most ``dtype``'s lowest finite value (what models write
    for hidden scores: ``torch.finfo(dtype).min``)."""
    return isinstance(value, float) and value < 0 and (math.isinf(value) or value <= torch.finfo(dtype).min)


def _softmax_of_last_dim(node: fx.Node) -> bool:
    """Whether ``node``'s one user is a softmax over its last dim (where a lowest finite fill and −inf
    give the same probabilities, as long as a row keeps a visible key)."""
    users = list(node.users)
    if len(users) != 1 or users[0].op != "call_function" or users[0].target not in _SOFTMAXES:
        return False
    softmax = users[0]
    return softmax.args[0] is node and softmax.args[1] in (-1, node.meta["val"].dim() - 1)


def where_fills(gm: fx.GraphModule) -> None:
    """Rewrite ``where(keep, x, full([], v))`` as the ``masked_fill(x, ~keep, v)`` it equals (Hugging
    Face's GPT-2 hides scores so, with ``v`` the dtype's lowest value), where ``keep`` broadcasts to
    ``x``'s shape, so that :func:`additive_fills` takes it (in place)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.where.self or len(node.args) != 3:
            continue
        keep, x, other = node.args
        vals = [n.meta.get("val") if isinstance(n, fx.Node) else None for n in (keep, x, node)]
        if (not all(isinstance(v, torch.Tensor) for v in vals) or vals[0].dtype is not torch.bool
                or not vals[1].is_floating_point() or vals[2].shape != vals[1].shape
                or vals[2].dtype != vals[1].dtype or not isinstance(other, fx.Node)
                or other.target is not aten.full.default or list(other.args[0]) != []
                or not isinstance(other.args[1], (int, float))):
            continue
        with gm.graph.inserting_before(node):
            hidden = gm.graph.call_function(aten.bitwise_not.default, (keep,))
            filled = gm.graph.call_function(aten.masked_fill.Scalar, (x, hidden, float(other.args[1])))
        hidden.meta["val"], filled.meta["val"] = ~vals[0], vals[2]
        node.replace_all_uses_with(filled)
        gm.graph.erase_node(node)
        if not other.users:
            gm.graph.erase_node(other)
    gm.recompile()


def additive_fills(gm: fx.GraphModule) -> None:
    """Rewrite every ``masked_fill(x, mask, -inf)`` of ``gm`` as ``x + fill_mask(mask)`` (in place)."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.masked_fill.Scalar or len(node.args) != 3:
            continue
        x, mask, value = node.args
        mask_value = mask.meta.get("val") if isinstance(mask, fx.Node) else None
        x_value = x.meta.get("val") if isinstance(x, fx.Node) else None
        if (not isinstance(mask_value, torch.Tensor) or mask_value.dtype is not torch.bool
                or not isinstance(x_value, torch.Tensor) or not x_value.is_floating_point()
                or not _hiding(value, x_value.dtype)):
            continue
        # a finite lowest fill (not −inf) only before a softmax of the last dim, from a mask of buffers
        finite = not math.isinf(value)
        if finite and not _softmax_of_last_dim(node):
            continue
        pattern, original, hides = "", mask, True
        folded = _fold(gm, mask, f"{FOLDED}{count}", visible_rows=finite)
        if finite and (folded is None or bool(folded.meta["val"].all(-1).any())):
            if folded is not None:  # a row hides every key: eager's uniform row is not −inf's
                gm.graph.erase_node(folded)
                delattr(gm, str(folded.target))
            continue
        negated = mask.args[0] if mask.op == "call_function" and mask.target in _NOTS else None
        negated_value = negated.meta.get("val") if isinstance(negated, fx.Node) else None
        if folded is None and isinstance(negated_value, torch.Tensor) and negated_value.dtype is torch.bool:
            # masked_fill(x, ~m, -inf): the fill of m's False entries, kept while m is unchanged (the
            # negation is a new tensor every call)
            mask, hides = mask.args[0], False
        if folded is not None:
            count += 1
            mask = folded
            fill_value = fill_mask(folded.meta["val"], x_value.dtype)
            if fill_value.dim() >= 2:
                candidate = patterns.causal(int(fill_value.shape[-2]))
                if patterns.matches(candidate, fill_value):
                    pattern = candidate
                    gm.get_submodule(str(folded.target)).derived_pattern = pattern
        with gm.graph.inserting_before(node):
            fill = gm.graph.call_function(fill_mask, (mask, x_value.dtype, pattern, hides))
            added = gm.graph.call_function(aten.add.Tensor, (x, fill))
        with getattr(x_value, "fake_mode", None) or contextlib.nullcontext():
            fill.meta["val"] = torch.zeros(mask_value.shape, dtype=x_value.dtype, device=x_value.device)
            added.meta["val"] = x_value + fill.meta["val"]
        if pattern:
            from mirage.frontend.capture import PATTERN

            fill.meta["val"] = fill_mask(mask.meta["val"], x_value.dtype)
            fill.meta[PATTERN] = pattern
        node.replace_all_uses_with(added)
        gm.graph.erase_node(node)
        if folded is not None or not hides:
            erase_unused(gm.graph, original)
    gm.recompile()


def causal_buffers(gm: fx.GraphModule) -> None:
    """Promise the causal pattern on additive masks read from buffers (in place): the operand of an
    ``add`` or an attention's float ``attn_mask`` that is computed from buffers alone and holds the
    causal mask's values (``self.mask[:t, :t]`` of 0 and −inf) is folded, its node names the pattern,
    and a buffer changed away from it raises :class:`MaskPatternError` at the next call."""
    from mirage.frontend.capture import PATTERN

    sdpa = aten.scaled_dot_product_attention.default
    count = sum(1 for name, _ in gm.named_children() if name.startswith(FOLDED))
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.add.Tensor:
            operands = [a for a in node.args[:2] if isinstance(a, fx.Node)]
        elif node.target is sdpa:
            mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
            operands = [mask] if isinstance(mask, fx.Node) else []
        else:
            continue
        for operand in operands:
            if operand.meta.get(PATTERN):  # a mask capture built itself (is_causal=True): kept as it is
                continue
            value = buffer_value(gm, operand)
            if value is None or not value.is_floating_point() or value.dim() < 2 or min(value.shape[-2:]) < 2:
                continue  # a column of zeros (a norm's bias of one value a row) is no mask
            if any(isinstance(attribute(gm, str(b.target)), nn.Parameter) for b in _ancestors(operand)[1]):
                continue  # a parameter may be trained: a zero bias may hold other values later
            pattern = patterns.causal(int(value.shape[-2]))
            if not patterns.matches(pattern, value):
                continue
            folded = _fold(gm, operand, f"{FOLDED}{count}", pattern)
            if folded is None:
                continue
            count += 1
            folded.meta[PATTERN] = pattern
            node.replace_input_with(operand, folded)
            erase_unused(gm.graph, operand)
    gm.recompile()


def buffer_value(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor | None:
    """The value of ``node`` where it is computed from buffers alone through foldable ops (else None)."""
    nodes, buffers = _ancestors(node)
    if nodes is None or not (buffers or nodes):
        return None
    env = {b: attribute(gm, str(b.target)) for b in buffers}
    with torch.no_grad():
        for n in gm.graph.nodes:
            if n in nodes:
                args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
                env[n] = n.target(*args, **kwargs)
    value = env[node]
    return value if isinstance(value, torch.Tensor) else None


def _ancestors(node: fx.Node) -> tuple[dict | None, dict]:
    """The foldable ops ``node`` is computed with and the buffers it reads (None: something else)."""
    nodes, buffers, stack = {}, {}, [node]
    while stack:
        n = stack.pop()
        if n in nodes or n in buffers:
            continue
        if n.op == "get_attr":
            buffers[n] = None
        elif n.op == "call_function" and n.target in FOLDABLE:
            nodes[n] = None
            stack.extend(n.all_input_nodes)
        else:
            return None, buffers
    return nodes, buffers


def erase_unused(graph: fx.Graph, node: fx.Node) -> None:
    """Erase ``node`` and then its operands, as far as nothing else reads them (a folded mask's ops, a
    rewritten softmax's row maximum); a multi-output op's unread results (``max``'s indices) with it."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.op not in ("call_function", "get_attr"):
            continue
        for user in list(n.users):
            if user.target is operator.getitem and not user.users:
                graph.erase_node(user)
        if n.users:
            continue
        operands = n.all_input_nodes
        graph.erase_node(n)
        stack.extend(operands)


def _fold(gm: fx.GraphModule, mask: fx.Node, name: str, pattern: str = "",
          visible_rows: bool = False) -> fx.Node | None:
    """A ``call_module`` node of a :class:`FoldedConstant` computing ``mask`` from ``gm``'s buffers
    and constants (checked against ``pattern`` whenever it is computed), with its real value, inserted
    after ``mask``; None where ``mask`` depends on anything else."""
    nodes, buffers = _ancestors(mask)
    if nodes is None or not (buffers or nodes):
        return None
    graph = fx.Graph()
    env = {b: graph.placeholder(f"buffer{k}") for k, b in enumerate(buffers)}
    for n in gm.graph.nodes:  # in graph order: operands before their users
        if n in nodes:
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[mask])
    module = FoldedConstant(fx.GraphModule(gm, graph), pattern)
    gm.add_submodule(name, module)
    values = [attribute(gm, str(b.target)) for b in buffers]
    with torch.no_grad():
        value = module(*values)
    module.visible_rows = visible_rows  # checked from the next computation on (the caller checks this one)
    with gm.graph.inserting_after(mask):  # after every buffer it reads, before every user
        folded = gm.graph.call_module(name, tuple(buffers))
    folded.meta["val"] = value
    return folded


def attribute(gm: fx.GraphModule, target: str) -> torch.Tensor:
    """The module attribute ``target`` (a dotted path) of ``gm``: a buffer or parameter."""
    owner = gm
    *path, last = target.split(".")
    for part in path:
        owner = getattr(owner, part)
    return getattr(owner, last)
