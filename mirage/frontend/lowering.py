"""The lowering table: one row per aten op, from a captured torch program to kernel-graph ops.

Each row names the aten op, says whether it computes (``COMPUTE``) or only relabels a value
(``LAYOUT``: views, reshapes, order-keeping transposes, float casts), and gives the rule that builds
its kernel-graph form with a :class:`~mirage.frontend.region.RegionBuilder`.  A rule raises
:class:`~mirage.frontend.region.Unlowerable` with a reason for the cases it cannot express (the
partitioner then cuts the subprogram there, or leaves the op in PyTorch with a one-line notice).

>>> sorted(LOWERINGS)[:4]
['_log_softmax', '_safe_softmax', '_softmax', '_to_copy']
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from mirage.frontend import shapes
from mirage.frontend.capture import GROUPED_MASK
from mirage.frontend.region import FLOAT_DTYPES, Operand, RegionBuilder, Unlowerable, Value
from mirage.mugraph.ops import SOFTPLUS_THRESHOLD, SOFTPLUS_THRESHOLD_MIN


class Kind(enum.Enum):
    COMPUTE = "compute"  # becomes kernel-graph ops
    LAYOUT = "layout"  # relabels the shape of a value computed in the same subprogram


Rule = Callable[[RegionBuilder, fx.Node, dict[str, Any]], Value]


@dataclass(frozen=True)
class Lowering:
    op: str  # aten op name (all overloads)
    kind: Kind
    rule: Rule
    doc: str


def params(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    out: dict[str, Any] = {}
    for i, argument in enumerate(schema.arguments):
        if i < len(node.args) and not argument.kwarg_only:
            out[argument.name] = node.args[i]
        elif argument.name in node.kwargs:
            out[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            out[argument.name] = argument.default_value
    return out


def _result_shape(node: fx.Node) -> tuple[int, ...]:
    return tuple(int(s) for s in node.meta["val"].shape)


# ---- rules ----------------------------------------------------------------------------------------


def _add(sign: float) -> Rule:
    def rule(b: RegionBuilder, node, p):
        x, y = b.operand(p["self"]), b.operand(p["other"])
        alpha = float(p.get("alpha", 1))
        if isinstance(y, float):
            if isinstance(x, float):
                raise Unlowerable("arithmetic on two numbers")
            return b.shift(x, sign * alpha * y)
        if isinstance(x, float):
            return b.shift(b.scale(y, sign * alpha), x)
        return b.add(x, y, sign * alpha)

    return rule


def _rsub(b: RegionBuilder, node, p):  # other − alpha·self
    x, y = b.tensor_operand(p["self"]), b.operand(p["other"])
    alpha = float(p.get("alpha", 1))
    if isinstance(y, float):
        return b.shift(b.scale(x, -alpha), y)
    return b.add(y, x, -alpha)


def _mul(b: RegionBuilder, node, p):
    x, y = b.operand(p["self"]), b.operand(p["other"])
    if isinstance(x, float):
        x, y = y, x
    if isinstance(x, float):
        raise Unlowerable("arithmetic on two numbers")
    if isinstance(y, float):
        return b.scale(x, y)
    return b.product(x, y)


def _div(b: RegionBuilder, node, p):
    if p.get("rounding_mode") is not None:
        raise Unlowerable(f"division with rounding_mode={p['rounding_mode']!r}")
    x, y = b.operand(p["self"]), b.operand(p["other"])
    if isinstance(y, float):
        if isinstance(x, float):
            raise Unlowerable("arithmetic on two numbers")
        if y == 0.0:
            raise Unlowerable("division by the number 0 (inf and nan run in PyTorch)")
        return b.scale(x, 1.0 / y)
    if isinstance(x, float):  # c / y
        t, reciprocal = b.raw(y)
        if reciprocal:
            return b.scale(Value(t, y.shape), x)
        return b.scale(Value(t, y.shape, True), x) if x != 1.0 else Value(t, y.shape, True)
    return b.product(x, y, divide=True)


def power(b: RegionBuilder, x, exponent: float) -> Value:
    """x**e for e in ±{1/2, 1, 2, 3, 4}; negative powers stay symbolic reciprocals."""
    t, reciprocal = b.raw(x)
    magnitude = abs(exponent)
    if magnitude == 0.5:
        t = b.emit("sqrt", t)
    elif magnitude == 2:
        t = b.emit("square", t)
    elif magnitude == 3:
        t = b.emit("mul", b.emit("square", t), t)
    elif magnitude == 4:
        t = b.emit("square", b.emit("square", t))
    elif magnitude != 1:
        raise Unlowerable(f"pow with exponent {exponent} (supported: ±0.5, ±1, ±2, 3, 4)")
    return Value(t, x.shape, reciprocal != (exponent < 0))


def _pow(b: RegionBuilder, node, p):
    exponent = p.get("exponent")
    if not isinstance(exponent, (int, float)) or isinstance(exponent, bool):
        raise Unlowerable("pow with a tensor exponent")
    return power(b, b.tensor_operand(p["self"]), float(exponent))


def _fixed_power(exponent: float) -> Rule:
    return lambda b, node, p: power(b, b.tensor_operand(p["self"]), exponent)


def _unary(method: str) -> Rule:
    return lambda b, node, p: b.unary(method, b.tensor_operand(p["self"]))


def _gelu(b: RegionBuilder, node, p):
    approximate = p.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Unlowerable(f"gelu(approximate={approximate!r})")
    return b.unary("gelu" if approximate == "tanh" else "gelu_erf", b.tensor_operand(p["self"]))


def _clamp(b: RegionBuilder, node, p):
    """clamp, hardtanh, clamp_min and clamp_max; a missing bound is ±inf (± the dtype's largest value
    would turn ±inf into it)."""
    low, high = p.get("min", p.get("min_val")), p.get("max", p.get("max_val"))
    x = b.tensor_operand(p["self"])
    if any(bound is not None and not isinstance(bound, (int, float)) for bound in (low, high)):
        raise Unlowerable(f"{node.target.__name__.split('.')[0]} with a tensor bound")
    if low is None and high is None:
        raise Unlowerable("clamp without bounds")
    if low == 0 and high is None:
        return b.unary("relu", x)
    low = -math.inf if low is None else float(low)
    return b.unary("clamp", x, low, math.inf if high is None else float(high))


def _relu_parts(b: RegionBuilder, x: Value, negative_slope: float) -> Value:
    """relu(x) − slope · relu(−x): abs for slope −1, leaky ReLU for a small positive slope."""
    negative = b.unary("relu", b.scale(x, -1.0))
    return b.add(b.unary("relu", x), b.scale(negative, -negative_slope))


def _abs(b: RegionBuilder, node, p):
    return _relu_parts(b, b.tensor_operand(p["self"]), -1.0)


def _leaky_relu(b: RegionBuilder, node, p):
    return _relu_parts(b, b.tensor_operand(p["self"]), float(p.get("negative_slope", 0.01)))


def _softshrink(b: RegionBuilder, node, p):
    """``x − λ`` above λ, ``x + λ`` below −λ, 0 between: ``relu(x − λ) − relu(−x − λ)`` (NaN and ±inf
    as PyTorch gives them)."""
    x, lam = b.tensor_operand(p["self"]), float(p.get("lambd", 0.5))
    if lam < 0:
        raise Unlowerable(f"softshrink with a negative lambda {lam}")
    above = b.unary("relu", b.shift(x, -lam))
    below = b.unary("relu", b.shift(b.scale(x, -1.0), -lam))
    return b.add(above, below, -1.0)


def _logit(b: RegionBuilder, node, p):
    """``ln(x / (1 − x))`` as ``ln x − ln(1 + (−x))``: ±inf at 1 and 0, NaN outside [0, 1], exact near
    both ends; ``eps`` clamps x to [eps, 1 − eps] first."""
    x = b.tensor_operand(p["self"])
    eps = p.get("eps")
    if eps is not None:
        x = b.unary("clamp", x, float(eps), 1.0 - float(eps))
    return b.add(b.unary("log", x), b.unary("log1p", b.scale(x, -1.0)), -1.0)


SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805  # torch.nn.SELU's constants


def _elu(b: RegionBuilder, node, p):
    """``scale · (x if x > 0 else alpha · (exp(input_scale · x) − 1))`` as ``relu(x) − relu(alpha · (1 −
    exp(input_scale · x)))``: the two relus never both hold, and at ±inf and NaN it gives what PyTorch
    gives.  ``selu`` and ``celu`` are such elus (``celu``'s input scale is 1 / alpha)."""
    name = node.target.overloadpacket.__name__  # type: ignore[union-attr]
    x = b.tensor_operand(p["self"])
    alpha, scale = float(p.get("alpha", 1.0)), float(p.get("scale", 1.0))
    input_scale = float(p.get("input_scale", 1.0))
    if name == "selu":
        alpha, scale = SELU_ALPHA, SELU_SCALE
    elif name == "celu":
        if alpha == 0.0:
            raise Unlowerable("celu with alpha 0")
        input_scale = 1.0 / alpha
    if alpha < 0.0:
        raise Unlowerable(f"elu with a negative alpha {alpha:g}")
    if alpha == 0.0:  # relu: alpha · (1 − exp(x)) would be 0 · −inf = NaN where exp overflows
        return b.scale(b.unary("relu", x), scale)
    below = b.scale(b.shift(b.scale(b.unary("exp", b.scale(x, input_scale)), -1.0), 1.0), alpha)
    return b.scale(b.add(b.unary("relu", x), b.unary("relu", below), -1.0), scale)


def _extremum(b: RegionBuilder, node, p):
    """maximum and minimum of two tensors stay in PyTorch: the µGraph ops have no exact form of them
    (``x + relu(y − x)`` is NaN where both are inf of one sign, and ``max(−1e20, 3.3)`` comes out 0)."""
    raise Unlowerable(f"{node.target.__name__.split('.')[0]} of two tensors (no exact form among the "
                      "µGraph ops: x + relu(y − x) gives NaN at inf and loses the smaller operand)")


def _exp2(b: RegionBuilder, node, p):
    return b.unary("exp", b.scale(b.tensor_operand(p["self"]), math.log(2.0)))


def _log(base: float) -> Rule:
    """log, log2 and log10: ln x, times 1/ln(base) for the other bases."""
    def rule(b: RegionBuilder, node, p):
        natural = b.unary("log", b.tensor_operand(p["self"]))
        return natural if base == math.e else b.scale(natural, 1.0 / math.log(base))

    return rule


def _softplus(b: RegionBuilder, node, p):
    """softplus(β x) / β. PyTorch returns x itself where β x passes its threshold; the IR's softplus
    does so past 20, where ln(1 + eʸ) and y agree to float32's precision, and so is the same function
    for any threshold from 15 up (at 15 the two differ by 3·10⁻⁷, half an ulp of 15)."""
    beta, threshold = float(p.get("beta", 1.0)), float(p.get("threshold", SOFTPLUS_THRESHOLD))
    if beta == 0.0 or not math.isfinite(beta):
        raise Unlowerable(f"softplus with beta {beta:g}")
    if threshold < SOFTPLUS_THRESHOLD_MIN:
        raise Unlowerable(f"softplus with threshold {threshold:g} (below {SOFTPLUS_THRESHOLD_MIN:g} its "
                          "linear part is not the same function as the IR's softplus)")
    return b.scale(b.unary("softplus", b.scale(b.tensor_operand(p["self"]), beta)), 1.0 / beta)


def _mish(b: RegionBuilder, node, p):
    x = b.tensor_operand(p["self"])
    return b.product(x, b.unary("tanh", b.unary("softplus", x)))


def _log_sigmoid(b: RegionBuilder, node, p):
    return b.scale(b.unary("softplus", b.scale(b.tensor_operand(p["self"]), -1.0)), -1.0)


def _hard(gated: bool) -> Rule:
    """hardsigmoid: clamp(x + 3, 0, 6) / 6; hardswish: x times that."""
    def rule(b: RegionBuilder, node, p):
        x = b.tensor_operand(p["self"])
        gate = b.scale(b.unary("clamp", b.shift(x, 3.0), 0.0, 6.0), 1.0 / 6.0)
        return b.product(x, gate) if gated else gate

    return rule


def _reduce(mean: bool) -> Rule:
    def rule(b: RegionBuilder, node, p):
        x = b.tensor_operand(p["self"])
        dtype = p.get("dtype")
        if dtype is not None and dtype != p["self"].meta["val"].dtype:  # capture makes it a cast first
            raise Unlowerable(f"reduction with dtype={dtype}")
        return b.reduce(x, p.get("dim"), bool(p.get("keepdim", False)), mean)

    return rule


def _vector_norm(b: RegionBuilder, node, p):  # sqrt(sum(x²)) over dims
    order = p.get("ord", p.get("p", 2))  # linalg_vector_norm's ord; norm's p (None: the 2-norm)
    if float(2 if order is None else order) != 2.0:
        raise Unlowerable(f"vector norm of order {order} (only the 2-norm)")
    if p.get("dtype") is not None:
        raise Unlowerable("vector norm with a dtype")
    squares = power(b, b.tensor_operand(p["self"]), 2.0)
    return power(b, b.reduce(squares, p.get("dim"), bool(p.get("keepdim", False)), mean=False), 0.5)


def _variance(b: RegionBuilder, p) -> Value:
    """Σ (x − mean)² / (n − correction) over ``dim`` (all dims when none): ``var`` and ``std``."""
    x = b.tensor_operand(p["self"])
    dims = shapes.normalize_dims(p.get("dim") or None, len(x.shape))
    if "correction" in p:
        correction = 1.0 if p["correction"] is None else float(p["correction"])
    else:
        correction = 1.0 if p.get("unbiased", True) else 0.0
    count = math.prod(x.shape[d] for d in dims)
    if count - correction <= 0:
        raise Unlowerable(f"variance of {count} element(s) with correction {correction:g}")
    centered = b.add(x, b.reduce(x, list(dims), True, mean=True), -1.0)
    squares = b.reduce(power(b, centered, 2.0), list(dims), bool(p.get("keepdim", False)), mean=False)
    return b.scale(squares, 1.0 / (count - correction))


def _var(b: RegionBuilder, node, p):
    return _variance(b, p)


def _std(b: RegionBuilder, node, p):
    return power(b, _variance(b, p), 0.5)


def _matmul(b: RegionBuilder, node, p):
    return b.matmul(b.tensor_operand(p["self"]), b.tensor_operand(p.get("other", p.get("mat2"))))


def _linear(b: RegionBuilder, node, p):
    x, weight = b.tensor_operand(p["input"]), b.tensor_operand(p["weight"])
    if len(weight.shape) != 2 or len(x.shape) < 1:
        raise Unlowerable("linear needs a 2-D weight")
    w_t = b.transposed(weight)
    rows = math.prod(x.shape[:-1])
    out = Value(b.emit("matmul", b.tensor(x, (rows, x.shape[-1])), w_t), (*x.shape[:-1], weight.shape[0]))
    if p.get("bias") is not None:
        out = b.add(out, b.tensor_operand(p["bias"]))
    return out


def _add_product(first: str, second: str) -> Rule:
    """beta·self + alpha·(first @ second): ``addmm`` (mat1, mat2), ``baddbmm`` (batch1, batch2) and
    ``addmv`` (mat, vec).
    With beta 0, PyTorch ignores ``self``, whose NaN and inf then do not propagate (Hugging Face's
    GPT-2 passes ``torch.empty(...)`` so): the product alone."""

    def rule(b: RegionBuilder, node, p):
        product = b.matmul(b.tensor_operand(p[first]), b.tensor_operand(p[second]))
        alpha, beta = float(p.get("alpha", 1)), float(p.get("beta", 1))
        if beta == 0.0:
            return b.scale(product, alpha)
        # beta · (bias + (alpha / beta) · product): the bias meets the product as it arrives, so that
        # it is held in the product's frame (a matrix-vector product's column)
        return b.scale(b.add(b.scale(product, alpha / beta), b.tensor_operand(p["self"])), beta)

    return rule


def _lerp(b: RegionBuilder, node, p):  # x + w·(y − x), w a number or a tensor
    x, weight = b.tensor_operand(p["self"]), p["weight"]
    step = b.add(b.tensor_operand(p["end"]), x, -1.0)
    if isinstance(weight, fx.Node):
        step = b.product(step, b.tensor_operand(weight))
    else:
        step = b.scale(step, float(weight))
    return b.add(x, step)


def _softmax(b: RegionBuilder, node, p):
    if p.get("half_to_float") or p.get("dtype") not in (None, p["self"].meta["val"].dtype):
        raise Unlowerable("softmax that changes the dtype")  # capture writes the dtype as a cast first
    return b.softmax(b.tensor_operand(p["self"]), int(p["dim"]))


def _log_softmax(b: RegionBuilder, node, p):
    if p.get("half_to_float") or p.get("dtype") not in (None, p["self"].meta["val"].dtype):
        raise Unlowerable("log_softmax that changes the dtype")
    return b.log_softmax(b.tensor_operand(p["self"]), int(p["dim"]))


def _logsumexp(b: RegionBuilder, node, p):
    return b.logsumexp(b.tensor_operand(p["self"]), p["dim"], bool(p.get("keepdim", False)))


def _as_rows(b: RegionBuilder, x: Operand, normalized: int) -> Operand:
    """``x`` with its last ``normalized`` dims as one: a norm over them is a norm over rows of their
    product (a LayerNorm over (H, W) takes one reduction, not one a dim), its weight one row."""
    if normalized == 1:
        return x
    rank = len(x.shape)
    merged = (*x.shape[:rank - normalized], math.prod(x.shape[rank - normalized:]))
    if isinstance(x, Value):
        return b.relabel(x, merged)
    return Value(b.tensor(x, b.default_shape(merged)), merged)


def _rms_norm(b: RegionBuilder, node, p):
    rows = _as_rows(b, b.tensor_operand(p["input"]), len(p["normalized_shape"]))
    if len(p["normalized_shape"]) > 1:  # as rows of the normalized dims' product, viewed back after
        weight = p.get("weight")
        w = None if weight is None else _as_rows(b, b.tensor_operand(weight), len(p["normalized_shape"]))
        out = _rms_norm(b, node, {**p, "input": rows, "weight": w, "normalized_shape": rows.shape[-1:]})
        return b.relabel(out, tuple(node.meta["val"].shape))
    x = rows
    eps = p.get("eps")
    eps = float(torch.finfo(node.meta["val"].dtype).eps) if eps is None else float(eps)
    graph_shape, logical = b.frame(x)
    t = b.tensor(x, graph_shape)
    if shapes.graph_dim(t.dims, logical, len(logical) - 1) != len(t.dims) - 1:
        raise Unlowerable("rms_norm of a tensor whose last dim is not the graph's last dim")
    out = Value(b.emit("rms_norm", t, eps=eps), logical)
    if p.get("weight") is not None:
        out = b.product(out, b.tensor_operand(p["weight"]))
    return out


def _layer_norm(b: RegionBuilder, node, p):  # (x − mean) / sqrt(mean((x − mean)²) + eps) · weight + bias
    """Over the last dims that ``normalized_shape`` names (one, or several: a (C, H, W) norm)."""
    x = b.tensor_operand(p["input"])
    eps = float(p.get("eps", 1e-5))
    rank, normalized = len(x.shape), len(p["normalized_shape"])
    if not 1 <= normalized <= rank:
        raise Unlowerable(f"layer_norm over {normalized} dims of a tensor of {rank}")
    if normalized > 1:  # as rows of the normalized dims' product, viewed back after
        parts = {k: None if p.get(k) is None else _as_rows(b, b.tensor_operand(p[k]), normalized)
                 for k in ("weight", "bias")}
        rows = _as_rows(b, x, normalized)
        out = _layer_norm(b, node, {**p, **parts, "input": rows, "normalized_shape": rows.shape[-1:]})
        return b.relabel(out, tuple(x.shape))
    last = list(range(rank - normalized, rank))
    centered = b.add(x, b.reduce(x, last, True, mean=True), -1.0)
    variance = b.reduce(power(b, centered, 2.0), last, True, mean=True)
    out = b.product(centered, power(b, b.shift(variance, eps), 0.5), divide=True)
    if p.get("weight") is not None:
        out = b.product(out, b.tensor_operand(p["weight"]))
    if p.get("bias") is not None:
        out = b.add(out, b.tensor_operand(p["bias"]))
    return out


def _attention(b: RegionBuilder, node, p):
    """softmax(q @ kᵀ · scale + mask) @ v, grouped-query heads folded into the query rows."""
    q, k, v = (b.tensor_operand(p[name]) for name in ("query", "key", "value"))
    if float(p.get("dropout_p", 0.0)) != 0.0:
        raise Unlowerable("attention dropout")
    if p.get("is_causal"):
        raise Unlowerable("is_causal=True (pass an explicit additive float mask instead)")
    if min(len(q.shape), len(k.shape), len(v.shape)) < 3:
        raise Unlowerable("attention without a heads dim")
    *prefix, heads, length, dim = q.shape
    *k_prefix, kv_heads, keys, _ = k.shape
    if k_prefix != prefix or v.shape[:-1] != k.shape[:-1] or heads % kv_heads:
        raise Unlowerable(f"attention shapes q{list(q.shape)} k{list(k.shape)} v{list(v.shape)}")
    group = heads // kv_heads
    if group > 1 and not p.get("enable_gqa"):
        raise Unlowerable("query and key heads differ without enable_gqa=True")
    # (batch, heads, ...) merged into one dim, the 3-D form the attention space maps onto its grids
    tq = b.tensor(q, (math.prod(prefix) * kv_heads, group * length, dim))
    scores = b.emit("matmul", tq, b.transposed(k, merge_batch=True))
    scale = p.get("scale")
    scores = b.emit("mul_scalar", scores, 1.0 / math.sqrt(dim) if scale is None else float(scale))
    grouped = node.meta.get(GROUPED_MASK) if p.get("attn_mask") is not None and group > 1 else None
    if grouped is not None:  # causal and grouped: the mask as built for the folded rows (capture)
        rows = b.raw(b.tensor_operand(grouped), (1, group * length, keys))[0]
        scores = b.emit("add", scores, rows)
    weights = Value(scores, (*prefix, heads, length, keys))
    if p.get("attn_mask") is not None and grouped is None:
        weights = b.add(weights, b.tensor_operand(p["attn_mask"]))
    probabilities = b.softmax(weights, -1)
    tv = b.tensor(v, (math.prod(prefix) * kv_heads, *v.shape[-2:]))
    out = b.emit("matmul", b.tensor(probabilities), tv)
    return Value(out, (*prefix, heads, length, v.shape[-1]))


# ---- layout rules -------------------------------------------------------------------------------


def _view(b: RegionBuilder, node, p):
    return b.relabel(b.tensor_operand(p["self"]), _result_shape(node))


def _permutation(node: fx.Node, p) -> tuple[int, ...]:
    rank = len(node.meta["val"].shape)
    name = node.target.overloadpacket.__name__  # type: ignore[union-attr]
    order = list(range(rank))
    if name == "permute":
        return tuple(d % rank for d in p["dims"])
    if name == "transpose":
        i, j = p["dim0"] % rank, p["dim1"] % rank
        order[i], order[j] = order[j], order[i]
        return tuple(order)
    return tuple(reversed(order)) if rank <= 2 else (*order[:-2], order[-1], order[-2])


def _transpose(b: RegionBuilder, node, p):
    x = b.tensor_operand(p["self"])
    if not shapes.keeps_order(x.shape, _permutation(node, p)):
        raise Unlowerable("a transpose of a computed tensor (µGraph tensors are row-major)")
    return b.relabel(x, _result_shape(node))


def _identity(b: RegionBuilder, node, p):
    return b.relabel(b.tensor_operand(p["self"]), _result_shape(node))


def _dropout(b: RegionBuilder, node, p):
    if p.get("train") and float(p.get("p", 0.0)) != 0.0:
        raise Unlowerable("dropout in training (random)")
    return b.relabel(b.tensor_operand(p["input"]), _result_shape(node))  # eval, or nothing dropped


def _cast(b: RegionBuilder, node, p):
    x = b.tensor_operand(p["self"])
    out = node.meta["val"]
    if out.dtype not in FLOAT_DTYPES:
        raise Unlowerable(f"cast to {out.dtype}")
    device = p.get("device")
    if device is not None and torch.device(device) != out.device:
        raise Unlowerable("a device copy")
    source = p["self"]
    if is_upcast(node) and isinstance(source, fx.Node) and _is_narrowing_cast(source):
        raise Unlowerable(f"a round trip through {source.meta['val'].dtype} (its rounding and "
                          "overflow are the point; µGraph values between ops keep the wider dtype)")
    if isinstance(x, Value) and not (is_upcast(node) and node not in b.upcasts.kept):
        held = x.tensor.dtype.torch()
        if out.dtype != held and (out.dtype.itemsize >= held.itemsize or held == torch.bfloat16):
            raise Unlowerable(f"a cast from {held} to {out.dtype} (µGraph tensors keep one dtype; a "
                              "subprogram would compute in the lower precision)")
    # a narrowing cast: computed wider, rounded at the output; an upcast: an island (module docstring)
    return b.relabel(x, _result_shape(node))


UPCASTS = frozenset({(torch.float16, torch.float32), (torch.bfloat16, torch.float32)})


def cast_values(node: fx.Node) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The example values before and after ``node`` when it is a float cast of a tensor."""
    row = lowering_of(node)
    source = node.args[0] if node.args else None
    if row is None or row.rule is not _cast or not isinstance(source, fx.Node):
        return None
    before, after = source.meta.get("val"), node.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return None
    return before, after


def is_upcast(node: fx.Node) -> bool:
    """Is ``node`` a widening float cast (float16 or bfloat16 to float32, on the same device)?"""
    values = cast_values(node)
    return values is not None and (values[0].dtype, values[1].dtype) in UPCASTS and \
        values[0].device == values[1].device


def _is_narrowing_cast(node: fx.Node) -> bool:
    """Is ``node`` a float cast to a dtype of fewer bytes (float32 to float16 or bfloat16)?"""
    values = cast_values(node)
    return values is not None and values[1].dtype.itemsize < values[0].dtype.itemsize


def _expand(b: RegionBuilder, node, p):
    return b.expand(b.tensor_operand(p["self"]), _result_shape(node))


C, L = Kind.COMPUTE, Kind.LAYOUT

LOWERINGS: dict[str, Lowering] = {
    row.op: row
    for row in [
        Lowering("linear", C, _linear, "x @ wᵀ + b (the weight is viewed transposed)"),
        Lowering("matmul", C, _matmul, "batched or 2-D matrix product"),
        Lowering("mm", C, _matmul, "matrix product"),
        Lowering("bmm", C, _matmul, "batched matrix product"),
        Lowering("addmm", C, _add_product("mat1", "mat2"), "beta·bias + alpha·(a @ b)"),
        Lowering("addmv", C, _add_product("mat", "vec"), "beta·bias + alpha·(W @ x), x a vector"),
        Lowering("baddbmm", C, _add_product("batch1", "batch2"), "beta·bias + alpha·(a @ b), batched"),
        Lowering("lerp", C, _lerp, "x + w·(y − x), w a number or a tensor"),
        Lowering("add", C, _add(1.0), "x + alpha·y (numbers become add_scalar)"),
        Lowering("sub", C, _add(-1.0), "x − alpha·y"),
        Lowering("rsub", C, _rsub, "y − alpha·x"),
        Lowering("mul", C, _mul, "x·y (numbers become mul_scalar; x·(1/s) becomes x/s)"),
        Lowering("div", C, _div, "x / y"),
        Lowering("neg", C, lambda b, n, p: b.scale(b.tensor_operand(p["self"]), -1.0), "−x"),
        Lowering("exp", C, _unary("exp"), "eˣ"),
        Lowering("sqrt", C, _fixed_power(0.5), "√x"),
        Lowering("rsqrt", C, _fixed_power(-0.5), "1/√x (kept symbolic: x·rsqrt(s) becomes x/√s)"),
        Lowering("reciprocal", C, _fixed_power(-1.0), "1/x (kept symbolic)"),
        Lowering("square", C, _fixed_power(2.0), "x²"),
        Lowering("pow", C, _pow, "x**e for e in ±0.5, ±1, ±2, 3, 4"),
        Lowering("silu", C, _unary("silu"), "x·sigmoid(x)"),
        Lowering("gelu", C, _gelu, "gelu: exact (erf) or tanh approximation"),
        Lowering("relu", C, _unary("relu"), "max(x, 0)"),
        Lowering("sigmoid", C, _unary("sigmoid"), "1/(1+e⁻ˣ)"),
        Lowering("tanh", C, _unary("tanh"), "tanh(x)"),
        Lowering("maximum", C, _extremum, "runs in PyTorch: no exact form (x + relu(y − x) is NaN at inf)"),
        Lowering("minimum", C, _extremum, "runs in PyTorch: no exact form (x − relu(x − y) is NaN at inf)"),
        Lowering("clamp", C, _clamp, "min(max(x, lo), hi)"),
        Lowering("clamp_min", C, _clamp, "max(x, lo): relu, or clamp to [lo, inf]"),
        Lowering("clamp_max", C, _clamp, "min(x, hi): clamp to [−inf, hi]"),
        Lowering("abs", C, _abs, "relu(x) + relu(−x)"),
        Lowering("leaky_relu", C, _leaky_relu, "relu(x) − slope·relu(−x)"),
        Lowering("softshrink", C, _softshrink, "relu(x − λ) − relu(−x − λ)"),
        Lowering("logit", C, _logit, "ln x − ln(1 − x), x clamped to [eps, 1 − eps] with eps"),
        Lowering("special_expit", C, _unary("sigmoid"), "as sigmoid"),
        Lowering("elu", C, _elu, "relu(x) − relu(alpha·(1 − exp(x))), times its scale"),
        Lowering("selu", C, _elu, "an elu of SELU's alpha and scale"),
        Lowering("celu", C, _elu, "an elu of input scale 1/alpha"),
        Lowering("hardtanh", C, _clamp, "clamp to [min_val, max_val]"),
        Lowering("hardsigmoid", C, _hard(gated=False), "clamp(x + 3, 0, 6) / 6"),
        Lowering("hardswish", C, _hard(gated=True), "x · clamp(x + 3, 0, 6) / 6"),
        Lowering("exp2", C, _exp2, "e^(x·ln 2)"),
        Lowering("log", C, _log(math.e), "ln x"),
        Lowering("log2", C, _log(2.0), "ln x / ln 2"),
        Lowering("log10", C, _log(10.0), "ln x / ln 10"),
        Lowering("log1p", C, _unary("log1p"), "ln(1 + x), exact near 0"),
        Lowering("expm1", C, _unary("expm1"), "eˣ − 1, exact near 0"),
        Lowering("erf", C, _unary("erf"), "the error function"),
        Lowering("sin", C, _unary("sin"), "sin x"),
        Lowering("cos", C, _unary("cos"), "cos x"),
        Lowering("softplus", C, _softplus, "ln(1 + e^(βx)) / β; x past the threshold (15 or more)"),
        Lowering("mish", C, _mish, "x · tanh(softplus(x))"),
        Lowering("log_sigmoid", C, _log_sigmoid, "−softplus(−x)"),
        Lowering("sum", C, _reduce(mean=False), "sum over dims (one reduction per dim)"),
        Lowering("mean", C, _reduce(mean=True), "sum over dims, then · 1/n"),
        Lowering("var", C, _var, "Σ (x − mean)² / (n − correction) over dims"),
        Lowering("std", C, _std, "√var"),
        Lowering("softmax", C, _softmax, "LAX form exp(x)/Σexp(x), marked for online softmax"),
        Lowering("_softmax", C, _softmax, "as softmax"),
        Lowering("_safe_softmax", C, _softmax, "as softmax (a row all −inf: NaN here, zeros in PyTorch)"),
        Lowering("log_softmax", C, _log_softmax, "x − log Σexp(x), the row maximum out of the exp and "
                 "back after the log (last dim)"),
        Lowering("_log_softmax", C, _log_softmax, "as log_softmax"),
        Lowering("special_log_softmax", C, _log_softmax, "as log_softmax"),
        Lowering("special_logsumexp", C, _logsumexp, "as logsumexp"),
        Lowering("logsumexp", C, _logsumexp, "log Σexp(x) over one dim, stabilised as log_softmax "
                 "(a +inf value: NaN here, inf in PyTorch)"),
        Lowering("linalg_vector_norm", C, _vector_norm, "2-norm: sqrt(Σx²) over dims"),
        Lowering("norm", C, _vector_norm, "Tensor.norm, p = 2: as linalg_vector_norm"),
        Lowering("rms_norm", C, _rms_norm, "rms_norm(x, eps) · weight over the last dim"),
        Lowering("layer_norm", C, _layer_norm, "(x − mean) / √(var + eps) · weight + bias, last dims"),
        Lowering("scaled_dot_product_attention", C, _attention,
                 "softmax(q kᵀ·scale + mask) v, decomposed; grouped-query heads folded into rows"),
        Lowering("view", L, _view, "relabel"),
        Lowering("reshape", L, _view, "relabel"),
        Lowering("_unsafe_view", L, _view, "relabel"),
        Lowering("flatten", L, _view, "relabel"),
        Lowering("unflatten", L, _view, "relabel"),
        Lowering("unsqueeze", L, _view, "relabel"),
        Lowering("squeeze", L, _view, "relabel"),
        Lowering("transpose", L, _transpose, "relabel when only size-1 dims move"),
        Lowering("t", L, _transpose, "relabel when only size-1 dims move"),
        Lowering("permute", L, _transpose, "relabel when only size-1 dims move"),
        Lowering("expand", L, _expand, "kept symbolic for element-wise consumers"),
        Lowering("expand_as", L, _expand, "kept symbolic for element-wise consumers"),
        Lowering("contiguous", L, _identity, "identity"),
        Lowering("clone", L, _identity, "identity"),
        Lowering("alias", L, _identity, "identity"),
        Lowering("detach", L, _identity, "identity"),
        Lowering("lift_fresh_copy", L, _identity, "identity"),
        Lowering("dropout", C, _dropout, "identity in eval mode or with p = 0 (random in training: PyTorch)"),
        Lowering("_to_copy", L, _cast, "narrowing float casts (the value stays wider until the output) "
                 "and upcasts (identities: upcast islands)"),
        Lowering("to", L, _cast, "as _to_copy"),
        Lowering("type_as", L, _cast, "as _to_copy, to the other tensor's dtype (only its dtype is read)"),
    ]
}


def lowering_of(node: fx.Node) -> Lowering | None:
    """The table row for an fx node, or None (not an aten op, or not in the table)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    if node.target.namespace != "aten":
        return None
    return LOWERINGS.get(node.target.overloadpacket.__name__)


def lower_node(builder: RegionBuilder, node: fx.Node) -> Value:
    row = lowering_of(node)
    if row is None:
        raise Unlowerable(f"{node.target} has no µGraph lowering")
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unlowerable(f"{node.target} does not produce one tensor")
    first = builder.size
    value = row.rule(builder, node, params(node))
    if tuple(value.shape) != tuple(val.shape):  # a rule bug, not a user error
        raise AssertionError(f"lowering {node.target} gave shape {value.shape}, torch has {tuple(val.shape)}")
    builder.values[node] = value
    held = value.tensor.dtype.torch()
    if val.dtype.itemsize > held.itemsize:  # in an upcast island: torch holds the value wider
        rounded = not value.reciprocal and all(_narrows_to(user, held) for user in node.users)
        builder.mark_wide(node, first, rounded)
    return value


def _narrows_to(node: fx.Node, dtype: torch.dtype) -> bool:
    """Is ``node`` a cast to ``dtype``?"""
    row = lowering_of(node)
    val = node.meta.get("val")
    return row is not None and row.rule is _cast and isinstance(val, torch.Tensor) and val.dtype == dtype
