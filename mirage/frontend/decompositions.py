"""Composite ops that ``torch.export`` keeps whole and the lowering table has no row for, written at
capture as the ops they stand for, so that they fuse with their neighbours instead of running in
PyTorch:

* by PyTorch's own decompositions (:data:`_TORCH`): ``einsum`` (permutes, views and a batched
  product), ``glu`` (its halves as views, a sigmoid and a product), ``addcmul``, ``addcdiv``,
  ``relu6`` (``hardtanh``), ``outer`` and ``dot``, the 2-norm ``linalg_norm``, ``cosine_similarity``
  (norms clamped by a 0-d constant, which capture makes a number), ``pairwise_distance`` (a 2-norm
  of the difference plus eps), and the losses
  ``mse_loss``, ``l1_loss``, ``binary_cross_entropy_with_logits`` (through ``log_sigmoid``) and
  ``cross_entropy`` (a ``log_softmax`` over the classes, then ``nll_loss``'s pick of each target's
  log-probability, a gather that stays in PyTorch), and ``kl_div`` (with ``log_target=True``
  ``exp(t) · (t − x)``; without, ``xlogy(t, t) − t · x``, whose ``xlogy`` stays in PyTorch);
* by the functions here: ``prelu`` (:func:`prelu`), ``batch_norm`` in eval mode (:func:`batch_norm`,
  each channel's affine map from the running statistics), ``instance_norm`` (:func:`instance_norm`)
  and ``group_norm`` (:func:`group_norm`; PyTorch's ``native_group_norm`` decomposition ends in
  ``var_mean`` and ``as_strided``, which no µGraph lowers).

Forms that update running statistics (a batch norm in training, an instance norm that tracks them)
are left whole (:func:`present`). Dropouts that drop nothing (eval mode, or p = 0) are removed
(:func:`drop_identity_dropouts`): on a tensor computed outside a subprogram they would cut it (a
Transformer layer's residual adds after its attention and its MLP).

>>> x = torch.randn(2, 8, 3, 3)
>>> w, b = torch.randn(8), torch.randn(8)
>>> torch.allclose(group_norm(x, 4, w, b, 1e-5), torch.nn.functional.group_norm(x, 4, w, b, 1e-5), atol=1e-5)
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.fx as fx

aten = torch.ops.aten


def group_norm(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5,
               cudnn_enabled: bool = True) -> torch.Tensor:
    """``F.group_norm`` as views, a mean, a subtraction and ``rms_norm``: each group of channels
    centred and normalized over its channels and positions (``rms_norm`` accumulates in float32, as
    PyTorch's group norm does for 16-bit inputs), then each channel's gain and bias."""
    n, channels = x.shape[0], x.shape[1]
    groups = x.reshape(n, num_groups, -1)
    centered = groups - groups.mean(-1, keepdim=True)
    out = torch.rms_norm(centered, (centered.shape[-1],), eps=eps).reshape(x.shape)
    per_channel = (1, channels) + (1,) * (x.dim() - 2)
    if weight is not None:
        out = out * weight.reshape(per_channel)
    if bias is not None:
        out = out + bias.reshape(per_channel)
    return out


def prelu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.prelu`` as ``relu(x) − w · relu(−x)``, ``w`` one slope for all or one a channel (dim 1).
    PyTorch's own decomposition compares (``where(x > 0, …)``), which no µGraph op does; this form
    gives what PyTorch gives at ±inf and NaN too."""
    shape = (1,) * x.dim() if weight.numel() == 1 else (1, weight.numel()) + (1,) * (x.dim() - 2)
    return torch.relu(x) - weight.reshape(shape) * torch.relu(-x)


def batch_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float,
               eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``F.batch_norm`` in eval mode (``_native_batch_norm_legit_no_training``, what torch.export makes
    of it) as each channel's (dim 1) affine map: ``(x − mean) / √(var + eps) · w + b`` from the running
    statistics, in ``x``'s dtype; with the op's two other results, empty as PyTorch's."""
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 2)
    out = (x - running_mean.reshape(shape)) * torch.rsqrt(running_var.reshape(shape) + eps)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out.to(x.dtype), x.new_empty((0,)), x.new_empty((0,))


def instance_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                  running_mean: torch.Tensor | None, running_var: torch.Tensor | None, use_input_stats: bool,
                  momentum: float, eps: float, cudnn_enabled: bool = True) -> torch.Tensor:
    """``F.instance_norm``: with the input's statistics (:func:`present` offers no form that updates
    running ones), a :func:`group_norm` of a group a channel; with the running statistics, each
    channel's affine map as :func:`batch_norm` computes it."""
    if use_input_stats:
        return group_norm(x, x.shape[1], weight, bias, eps)
    return batch_norm(x, weight, bias, running_mean, running_var, momentum, eps)[0]


_OWN: dict[Callable, Callable] = {aten.group_norm.default: group_norm, aten.prelu.default: prelu,
                                  aten.batch_norm.default: batch_norm,
                                  aten.instance_norm.default: instance_norm}
# ops that torch.export decomposes by itself first: the decomposition here is of what it makes of them
_VIA = {aten.batch_norm.default: aten._native_batch_norm_legit_no_training.default}
# the ops whose PyTorch decompositions serve (the module docstring says what they become)
_TORCH = (aten.einsum.default, aten.glu.default, aten.addcmul.default, aten.addcdiv.default,
          aten.relu6.default, aten.outer.default, aten.dot.default, aten.linalg_norm.default,
          aten.mse_loss.default, aten.l1_loss.default, aten.binary_cross_entropy_with_logits.default,
          aten.cosine_similarity.default, aten.pairwise_distance.default,
          aten.cross_entropy_loss.default, aten.kl_div.default)


def described() -> list[tuple[str, str]]:
    """(op name, what capture writes it as) for each op decomposed here, for ``mirage ops``."""
    own = {aten.group_norm.default: "views into groups, a mean, the centred values' rms_norm, affine",
           aten.prelu.default: "relu(x) − w · relu(−x), a slope a channel or one for all",
           aten.batch_norm.default: "eval mode: each channel's affine map from the running statistics",
           aten.instance_norm.default: "a group norm of a group a channel (or the running statistics' map)"}
    rows = [(op.overloadpacket.__name__, doc) for op, doc in own.items()]
    rows += [(op.overloadpacket.__name__, "PyTorch's decomposition") for op in _TORCH]
    return sorted(rows)


def present(graph: fx.Graph) -> set:
    """The ops that ``graph`` calls, less those it calls in a form no decomposition here takes (a
    ``batch_norm`` in training mode, which updates its running statistics)."""
    ops = {node.target for node in graph.nodes if node.op == "call_function"}
    if any(node.target is aten.batch_norm.default and _training(node) for node in graph.nodes):
        ops.discard(aten.batch_norm.default)
    if any(node.target is aten.instance_norm.default and _tracking(node) for node in graph.nodes):
        ops.discard(aten.instance_norm.default)
    return ops


def _tracking(node: fx.Node) -> bool:
    """An ``instance_norm`` that normalizes by the input's statistics and updates running ones."""
    use_input_stats = node.args[5] if len(node.args) > 5 else node.kwargs.get("use_input_stats", True)
    running = node.args[3:5] if len(node.args) > 4 else (None, None)
    return use_input_stats is not False and any(r is not None for r in running)


def _training(node: fx.Node) -> bool:
    training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training", True)
    running = node.args[3:5] if len(node.args) > 4 else (None, None)
    return training is not False or any(r is None for r in running)


def composite(ops: Iterable) -> list:
    """Those of ``ops`` that capture decomposes."""
    return [op for op in ops if op in _OWN or op in _TORCH]


def table(ops: Iterable) -> dict:
    """The decompositions of ``ops`` (those :func:`composite` names) for ``run_decompositions``."""
    defaults = torch.export.default_decompositions()
    return {_VIA.get(op, op): _OWN.get(op) or defaults[op] for op in composite(ops)
            if op in _OWN or op in defaults}


def drop_identity_dropouts(gm: fx.GraphModule) -> None:
    """Replace each ``dropout`` that drops nothing (``train=False``, or ``p`` = 0) by its input."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.dropout.default:
            continue
        p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
        if (train is False or p == 0) and isinstance(node.args[0], fx.Node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.recompile()
