"""The op registry: one row per op holds everything about it.

A row (:class:`OpSpec`) gives the levels where the op exists, its arity, its attribute type, its
shape rule, its *formula* (its meaning over any :class:`~mirage.mugraph.algebra.Algebra`, which
serves the float interpreter, the finite-field fingerprint, the abstract expressions and the CUDA
thread code at once), the device-library functor that implements it element-wise, and a cost hint
(floating-point operations per output element).  Adding an op means adding one row; an element-wise
op outside the LAX fragment (an uninterpreted function of one input) also names its float reference
in :data:`OPAQUE_UNARY`, and the device library and the torch runtime (``codegen/runtime.py``) each
hold its implementation.

Ops whose meaning depends on the for-loop (input iterators, output savers, accumulators) have no
formula: the interpreter gives them their meaning, because they are about *where* and *when*, not
*what*.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from mirage.errors import AttributeValueError, DTypeError, ShapeError
from mirage.mugraph.graph import (
    Accum,
    AccumKind,
    BlockGraph,
    Clamp,
    InputIterator,
    KernelInput,
    Level,
    OutputSaver,
    Reduce,
    RmsNorm,
    Scalar,
    TensorType,
    ThreadGraph,
    ThreadInput,
)


class Op(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    MATMUL = "matmul"
    # element-wise unary
    EXP = "exp"
    SQRT = "sqrt"
    SQUARE = "square"
    SILU = "silu"
    GELU = "gelu"
    GELU_ERF = "gelu_erf"
    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    LOG = "log"
    SOFTPLUS = "softplus"
    LOG1P = "log1p"
    EXPM1 = "expm1"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    CLAMP = "clamp"
    MUL_SCALAR = "mul_scalar"
    ADD_SCALAR = "add_scalar"
    # element-wise binary (numpy broadcasting between equal ranks)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    # reductions and normalization
    REDUCTION = "reduction"
    REDUCTION_TO_DIMX = "reduction_to_dimx"
    REDUCTION_MAX = "reduction_max"
    RMS_NORM = "rms_norm"
    CONCAT_MATMUL = "concat_matmul"
    # block-level for-loop ops
    ACCUM = "accum"
    ACCUM_RESCALE = "accum_rescale"
    RUNNING_MAX = "running_max"
    # nesting
    CUSTOMIZED = "customized"
    FUSED = "fused"


UNARY = frozenset({Op.EXP, Op.SQRT, Op.SQUARE, Op.SILU, Op.GELU, Op.GELU_ERF, Op.RELU, Op.SIGMOID, Op.TANH,
                   Op.LOG, Op.SOFTPLUS, Op.LOG1P, Op.EXPM1, Op.ERF, Op.SIN, Op.COS, Op.CLAMP, Op.MUL_SCALAR,
                   Op.ADD_SCALAR})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV})
ELEMENTWISE = UNARY | BINARY
COMMUTATIVE = frozenset({Op.ADD, Op.MUL})
REDUCTIONS = frozenset({Op.REDUCTION, Op.REDUCTION_TO_DIMX, Op.REDUCTION_MAX})
ACCUMULATORS = frozenset({Op.ACCUM, Op.ACCUM_RESCALE})
FORLOOP_STATEFUL = ACCUMULATORS | {Op.RUNNING_MAX}
# where a running maximum starts, not at −inf: a row whose scores so far are all −inf (a tile that an
# additive mask hides whole) keeps a finite maximum, so exp(x − m) is 0 and the rescale
# exp(m_prev − m) is 1 there instead of NaN (FlashAttention's guard). No score reaches it.
RUNNING_MAX_FLOOR = -1e30
# ops whose meaning uses an order (max): no finite-field fingerprint exists for them
ORDERED = frozenset({Op.REDUCTION_MAX, Op.RUNNING_MAX, Op.ACCUM_RESCALE, Op.RELU, Op.CLAMP})
# the LAX fragment (mirage-notes §2): multi-linear ops, division, exponentiation
LAX = frozenset({Op.INPUT, Op.OUTPUT, Op.MATMUL, Op.EXP, Op.SQRT, Op.SQUARE, Op.MUL_SCALAR, Op.ADD_SCALAR,
                 Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.REDUCTION, Op.REDUCTION_TO_DIMX, Op.RMS_NORM,
                 Op.CONCAT_MATMUL, Op.ACCUM, Op.CUSTOMIZED, Op.FUSED})


@dataclass(frozen=True)
class ShapeContext:
    """What a shape rule may need to know about the enclosing graph."""

    level: Level
    forloop_range: int = 1
    reduction_dimx: int = 64


ShapeRule = Callable[[ShapeContext, tuple[TensorType, ...], Any], tuple[TensorType, ...]]
Formula = Callable[..., Any]


@dataclass(frozen=True)
class OpSpec:
    op: Op
    levels: frozenset[Level]
    arity: int | None  # None: any number of inputs
    attrs_type: type | None
    shape: ShapeRule
    formula: Formula | None = None  # (A, attrs, input_types, *values) -> value
    functor: str | None = None  # device-library functor for element-wise ops
    flops: float = 0.0  # per output element (matmul: per multiply-add)
    doc: str = ""


# ---- shape rules ----------------------------------------------------------------------------------


def _same_dtype(inputs: tuple[TensorType, ...]) -> None:
    dtypes = {t.dtype for t in inputs}
    if len(dtypes) > 1:
        raise DTypeError(f"operands have different dtypes {sorted(d.value for d in dtypes)}; "
                         "cast them to one dtype first")


def _same_flag(inputs: tuple[TensorType, ...]) -> bool:
    flags = {t.after_accum for t in inputs}
    if len(flags) > 1:
        from mirage.errors import AfterAccumError

        raise AfterAccumError("operands mix tensors from before and after the for-loop accumulators; "
                              "accumulate both operands first or neither")
    return flags.pop() if flags else False


def _unary_shape(ctx, inputs, attrs):
    return (inputs[0],)


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if len(a) != len(b):
        raise ShapeError(f"element-wise operands need equal rank, got {list(a)} and {list(b)}; "
                         "reshape the smaller one with size-1 dims")
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and 1 not in (x, y):
            raise ShapeError(f"shapes {list(a)} and {list(b)} do not broadcast (sizes {x} and {y})")
        out.append(max(x, y))
    return tuple(out)


def _binary_shape(ctx, inputs, attrs):
    _same_dtype(inputs)
    flag = _same_flag(inputs)
    a, b = inputs
    return (TensorType(broadcast_shapes(a.shape, b.shape), a.dtype, flag),)


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if len(a) != len(b) or len(a) < 2:
        raise ShapeError(f"matmul needs operands of equal rank ≥ 2, got {list(a)} and {list(b)}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul inner dims differ: {list(a)} @ {list(b)} ({a[-1]} vs {b[-2]})")
    if a[:-2] != b[:-2]:
        raise ShapeError(f"matmul batch dims differ: {list(a[:-2])} vs {list(b[:-2])}")
    return (*a[:-1], b[-1])


def _matmul_shape(ctx, inputs, attrs):
    _same_dtype(inputs)
    flag = _same_flag(inputs)
    a, b = inputs
    return (TensorType(matmul_shape(a.shape, b.shape), a.dtype, flag),)


def _check_dim(dim: int, t: TensorType) -> None:
    if not 0 <= dim < t.rank:
        raise AttributeValueError(f"reduction dim {dim} is out of range for shape {list(t.shape)}")


def _reduce_shape(ctx, inputs, attrs):
    (t,) = inputs
    _check_dim(attrs.dim, t)
    shape = list(t.shape)
    shape[attrs.dim] = 1
    return (t.with_shape(tuple(shape)),)


def _reduce_to_dimx_shape(ctx, inputs, attrs):
    (t,) = inputs
    _check_dim(attrs.dim, t)
    n, dimx = t.shape[attrs.dim], ctx.reduction_dimx
    if n % dimx != 0:
        from mirage.errors import DivisibilityError

        raise DivisibilityError(f"reduction_to_dimx: dim {attrs.dim} has size {n}, not a multiple of "
                                f"reduction_dimx={dimx}")
    shape = list(t.shape)
    shape[attrs.dim] = dimx
    return (t.with_shape(tuple(shape)),)


def _rms_norm_shape(ctx, inputs, attrs):
    return (inputs[0],)


def _concat_matmul_shape(ctx, inputs, attrs):
    # (W ‖ X) @ (Y ‖ Z) = W @ Y + X @ Z
    _same_dtype(inputs)
    flag = _same_flag(inputs)
    w, x, y, z = inputs
    left = matmul_shape(w.shape, y.shape)
    right = matmul_shape(x.shape, z.shape)
    if left != right:
        raise ShapeError(f"concat_matmul halves give {list(left)} and {list(right)}")
    return (TensorType(left, w.dtype, flag),)


def _accum_shape(ctx, inputs, attrs):
    from mirage.errors import AfterAccumError, DivisibilityError

    t = inputs[0]
    if any(i.after_accum for i in inputs):
        raise AfterAccumError("an accumulator's input is already accumulated; "
                              "every input→output path needs exactly one accumulator")
    shape = list(t.shape)
    match attrs.kind:
        case AccumKind.SUM | AccumKind.MEAN | AccumKind.RMS:
            shape[-1] = 1
        case AccumKind.SUM_TODIMX:
            if shape[-1] % ctx.reduction_dimx != 0:
                raise DivisibilityError(f"accumulator sum_todimx: last dim {shape[-1]} is not a "
                                        f"multiple of reduction_dimx={ctx.reduction_dimx}")
            shape[-1] = ctx.reduction_dimx
    return (TensorType(tuple(shape), t.dtype, True),)


def _accum_rescale_shape(ctx, inputs, attrs):
    x, m = inputs
    if attrs.kind not in (AccumKind.NONE, AccumKind.SUM):
        raise AttributeValueError(f"accum_rescale supports kinds none and sum, not {attrs.kind.value}")
    (out,) = _accum_shape(ctx, (x,), attrs)
    broadcast_shapes(out.shape, m.shape)
    return (out,)


def _running_max_shape(ctx, inputs, attrs):
    from mirage.errors import AfterAccumError

    if inputs[0].after_accum:
        raise AfterAccumError("running_max must be applied inside the for-loop")
    return (inputs[0],)


def _no_shape(ctx, inputs, attrs):  # nodes whose outputs are given by the builder
    raise NotImplementedError


# ---- formulas -------------------------------------------------------------------------------------


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu(x: np.ndarray) -> np.ndarray:  # tanh approximation, as torch's gelu(approximate="tanh")
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_erf(x: np.ndarray) -> np.ndarray:  # the exact form, torch's gelu(approximate="none")
    import torch

    return torch.nn.functional.gelu(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# softplus's linear part begins where log(1 + e^x) and x agree to float32's precision (PyTorch's
# default threshold): a torch softplus of another threshold of at least SOFTPLUS_THRESHOLD_MIN lowers
SOFTPLUS_THRESHOLD = 20.0
SOFTPLUS_THRESHOLD_MIN = 15.0


def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), x itself above the threshold (torch's softplus with beta 1, threshold 20)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        return np.where(x > SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))


def _quiet(function: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """``function`` without numpy's warnings at poles and outside its domain (log(0), log(−1))."""
    def quiet(x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return function(x)

    return quiet


def _erf(x: np.ndarray) -> np.ndarray:
    import torch

    return torch.special.erf(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def _axis(attrs: Reduce, in_types) -> int:
    return attrs.dim - in_types[0].rank  # negative: works under leading block axes too


def _sum_last(A, x, n: int):
    return A.sum(x, axis=-1)


def rms(A, x, n: int, eps: float):
    """sqrt(Σ x² / n + eps) over the last axis: shared by rms_norm and the rms accumulator."""
    mean = A.mul(A.sum(A.mul(x, x), axis=-1), A.const(Fraction(1, n), x))
    if eps:
        mean = A.add(mean, A.const(float(eps), x))
    return A.sqrt(mean)


def reduce_to_dimx(A, x, axis: int, dimx: int):
    """out[j] = Σ_k x[j + dimx·k] along ``axis`` (negative): the strided sum of mirage-notes §1.2."""

    def split(v):
        shape = v.shape
        pos = len(shape) + axis
        return v.reshape(*shape[:pos], shape[pos] // dimx, dimx, *shape[pos + 1:])

    return A.sum(A.structural(split, x), axis=axis - 1, keepdims=False)


def _clamp(attrs):
    return lambda v: np.clip(v, attrs.min, attrs.max)


# element-wise ops outside the LAX fragment, of one input and no attributes: uninterpreted functions
# (``Algebra.opaque``) everywhere but in float arithmetic, where the reference gives their values
OPAQUE_UNARY: dict[Op, Callable[[np.ndarray], np.ndarray]] = {
    Op.SILU: _silu,
    Op.GELU: _gelu,
    Op.GELU_ERF: _gelu_erf,
    Op.RELU: _relu,
    Op.SIGMOID: _sigmoid,
    Op.TANH: np.tanh,
    Op.LOG: _quiet(np.log),
    Op.SOFTPLUS: _softplus,
    Op.LOG1P: _quiet(np.log1p),
    Op.EXPM1: _quiet(np.expm1),
    Op.ERF: _erf,
    Op.SIN: np.sin,
    Op.COS: np.cos,
}


def _opaque(op: Op) -> Formula:
    name, reference = op.value, OPAQUE_UNARY[op]
    return lambda A, at, it, x: A.opaque(name, x, reference)


_F = {
    Op.MATMUL: lambda A, at, it, x, y: A.matmul(x, y),
    Op.EXP: lambda A, at, it, x: A.exp(x),
    Op.SQRT: lambda A, at, it, x: A.sqrt(x),
    Op.SQUARE: lambda A, at, it, x: A.mul(x, x),
    **{op: _opaque(op) for op in OPAQUE_UNARY},
    Op.CLAMP: lambda A, at, it, x: A.opaque(f"clamp[{at.min},{at.max}]", x, _clamp(at)),
    Op.MUL_SCALAR: lambda A, at, it, x: A.mul(x, A.const(float(at.value), x)),
    Op.ADD_SCALAR: lambda A, at, it, x: A.add(x, A.const(float(at.value), x)),
    Op.ADD: lambda A, at, it, x, y: A.add(x, y),
    Op.SUB: lambda A, at, it, x, y: A.sub(x, y),
    Op.MUL: lambda A, at, it, x, y: A.mul(x, y),
    Op.DIV: lambda A, at, it, x, y: A.div(x, y),
    Op.REDUCTION: lambda A, at, it, x: A.sum(x, axis=_axis(at, it)),
    Op.REDUCTION_MAX: lambda A, at, it, x: A.max(x, axis=_axis(at, it)),
    Op.RMS_NORM: lambda A, at, it, x: A.div(x, rms(A, x, it[0].shape[-1], at.eps)),
    Op.CONCAT_MATMUL: lambda A, at, it, w, x, y, z: A.add(A.matmul(w, y), A.matmul(x, z)),
}

_K, _B, _T = Level.KERNEL, Level.BLOCK, Level.THREAD
_ALL = frozenset({_K, _B, _T})
_KB = frozenset({_K, _B})


def _row(op, levels, arity, attrs_type, shape, functor=None, flops=0.0, doc=""):
    return OpSpec(op, frozenset(levels), arity, attrs_type, shape, _F.get(op), functor, flops, doc)


REGISTRY: dict[Op, OpSpec] = {
    row.op: row
    for row in [
        _row(Op.INPUT, _ALL, 0, None, _no_shape, doc="kernel input / input iterator / thread input"),
        _row(Op.OUTPUT, {_B}, 1, OutputSaver, _no_shape, doc="output saver"),
        _row(Op.MATMUL, _KB, 2, None, _matmul_shape, flops=2.0, doc="batched matrix product"),
        _row(Op.EXP, _ALL, 1, None, _unary_shape, "Exp", 1, "e^x"),
        _row(Op.SQRT, _ALL, 1, None, _unary_shape, "Sqrt", 1, "√x"),
        _row(Op.SQUARE, _ALL, 1, None, _unary_shape, "Square", 1, "x²"),
        _row(Op.SILU, _ALL, 1, None, _unary_shape, "Silu", 4, "x·sigmoid(x)"),
        _row(Op.GELU, _ALL, 1, None, _unary_shape, "Gelu", 8, "gelu (tanh approximation)"),
        _row(Op.GELU_ERF, _ALL, 1, None, _unary_shape, "Gelu", 8, "gelu (exact: x·Φ(x), with erf)"),
        _row(Op.RELU, _ALL, 1, None, _unary_shape, "Relu", 1, "max(x, 0)"),
        _row(Op.SIGMOID, _ALL, 1, None, _unary_shape, "Sigmoid", 3, "1/(1+e^-x)"),
        _row(Op.TANH, _ALL, 1, None, _unary_shape, "Tanh", 3, "tanh(x)"),
        _row(Op.LOG, _ALL, 1, None, _unary_shape, "Log", 1, "ln x"),
        _row(Op.SOFTPLUS, _ALL, 1, None, _unary_shape, "Softplus", 3, "ln(1 + eˣ); x above 20"),
        _row(Op.LOG1P, _ALL, 1, None, _unary_shape, "Log1p", 1, "ln(1 + x), exact near 0"),
        _row(Op.EXPM1, _ALL, 1, None, _unary_shape, "Expm1", 1, "eˣ − 1, exact near 0"),
        _row(Op.ERF, _ALL, 1, None, _unary_shape, "Erf", 4, "the error function"),
        _row(Op.SIN, _ALL, 1, None, _unary_shape, "Sin", 2, "sin x"),
        _row(Op.COS, _ALL, 1, None, _unary_shape, "Cos", 2, "cos x"),
        _row(Op.CLAMP, _ALL, 1, Clamp, _unary_shape, "Clamp", 2, "min(max(x, lo), hi)"),
        _row(Op.MUL_SCALAR, _ALL, 1, Scalar, _unary_shape, "MulScalar", 1, "x·c"),
        _row(Op.ADD_SCALAR, _ALL, 1, Scalar, _unary_shape, "AddScalar", 1, "x + c"),
        _row(Op.ADD, _ALL, 2, None, _binary_shape, "Add", 1, "x + y"),
        _row(Op.SUB, _ALL, 2, None, _binary_shape, "Sub", 1, "x − y"),
        _row(Op.MUL, _ALL, 2, None, _binary_shape, "Mul", 1, "x·y"),
        _row(Op.DIV, _ALL, 2, None, _binary_shape, "Div", 1, "x / y"),
        _row(Op.REDUCTION, _KB, 1, Reduce, _reduce_shape, flops=1, doc="sum of dim (keepdim)"),
        _row(Op.REDUCTION_TO_DIMX, {_B}, 1, Reduce, _reduce_to_dimx_shape, flops=1,
             doc="strided sum of dim down to reduction_dimx"),
        _row(Op.REDUCTION_MAX, _KB, 1, Reduce, _reduce_shape, flops=1, doc="max of dim (keepdim)"),
        _row(Op.RMS_NORM, _KB, 1, RmsNorm, _rms_norm_shape, flops=4, doc="x / rms(x) of last dim"),
        _row(Op.CONCAT_MATMUL, {_B}, 4, None, _concat_matmul_shape, flops=2,
             doc="(W‖X) @ (Y‖Z) = W@Y + X@Z"),
        _row(Op.ACCUM, {_B}, 1, Accum, _accum_shape, flops=1, doc="for-loop accumulator"),
        _row(Op.ACCUM_RESCALE, {_B}, 2, Accum, _accum_rescale_shape, flops=3,
             doc="online-softmax accumulator: acc·exp(m_prev − m) + x"),
        _row(Op.RUNNING_MAX, {_B}, 1, None, _running_max_shape, flops=1,
             doc="max over the iterations so far (inside the loop)"),
        _row(Op.CUSTOMIZED, {_K}, None, BlockGraph, _no_shape, doc="graph-defined kernel"),
        _row(Op.FUSED, {_B}, None, ThreadGraph, _no_shape, doc="thread graph of element-wise ops"),
    ]
}

ATTRS_TYPES = {KernelInput, Reduce, Scalar, Clamp, RmsNorm, Accum, InputIterator, OutputSaver,
               ThreadInput}


def spec(op: Op | str) -> OpSpec:
    """The registry row of ``op`` (an :class:`Op` or its name)."""
    if isinstance(op, str):
        try:
            op = Op(op)
        except ValueError:
            from mirage.errors import UnknownOpError

            known = ", ".join(o.value for o in Op)
            raise UnknownOpError(f"unknown op {op!r}; known ops: {known}") from None
    return REGISTRY[op]
