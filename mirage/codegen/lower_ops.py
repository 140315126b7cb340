"""Tables the lowering reads: element types, element-wise functors, and tile layouts.

``FUNCTORS`` maps every element-wise op to the device functor that computes it.  It is built from
the registry's ``functor`` column; :data:`FUNCTOR_OVERRIDES` names the rows where the device
library has no functor of that meaning (the IR's gelu is the tanh approximation, the library's
``Gelu`` the erf form, which is the IR's gelu_erf) or none at all (``AddScalar``), which
``mirage/gen/kernel.cuh`` supplies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mirage.codegen.lower_context import TileLayout
from mirage.errors import MirageError
from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import Clamp, Scalar
from mirage.mugraph.ops import ELEMENTWISE, REGISTRY, Op
from mirage.optimizer.memory import transposed_padded_elements


class LoweringError(MirageError):
    """A µGraph has no CUDA lowering (an op, a dtype or a combination the generator cannot emit)."""


ELEMENT_TYPES: dict[DType, str] = {
    DType.FLOAT16: "__half",
    DType.BFLOAT16: "__nv_bfloat16",
    DType.FLOAT32: "float",
}

# functors defined in mirage/elementwise.cuh (namespace mirage::dev)
DEVICE_FUNCTORS = frozenset(
    {
        "Identity",
        "Exp",
        "Log",
        "Sqrt",
        "Square",
        "Sigmoid",
        "Tanh",
        "Softplus",
        "Log1p",
        "Expm1",
        "Erf",
        "Sin",
        "Cos",
        "Silu",
        "Gelu",
        "Relu",
        "MulScalar",
        "Clamp",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Maximum",
    }
)
# functors defined in mirage/gen/kernel.cuh (namespace mirage::gen)
GEN_FUNCTORS = frozenset({"AddScalar", "GeluTanh"})
# ops whose registry functor does not exist in the device library, or means something else there
FUNCTOR_OVERRIDES: dict[Op, str] = {
    Op.GELU: "GeluTanh",  # the IR's gelu is tanh-approximated; dev::Gelu is the erf form
}


@dataclass(frozen=True)
class Functor:
    op: Op
    name: str  # qualified C++ name
    constants: Callable[[object], tuple[float, ...]]  # constructor arguments from the op's attributes


def _no_constants(attrs: object) -> tuple[float, ...]:
    return ()


def _scalar(attrs: object) -> tuple[float, ...]:
    assert isinstance(attrs, Scalar)
    return (attrs.value,)


def _clamp(attrs: object) -> tuple[float, ...]:
    assert isinstance(attrs, Clamp)
    return (attrs.min, attrs.max)


_CONSTANTS: dict[Op, Callable[[object], tuple[float, ...]]] = {
    Op.MUL_SCALAR: _scalar,
    Op.ADD_SCALAR: _scalar,
    Op.CLAMP: _clamp,
}


def _qualified(name: str) -> str | None:
    if name in GEN_FUNCTORS:
        return f"mirage::gen::{name}"
    if name in DEVICE_FUNCTORS:
        return f"mirage::dev::{name}"
    return None


def _functor_table() -> dict[Op, Functor]:
    table = {}
    for op in ELEMENTWISE:
        name = FUNCTOR_OVERRIDES.get(op, REGISTRY[op].functor)
        qualified = _qualified(name) if name else None
        if qualified is not None:
            table[op] = Functor(op, qualified, _CONSTANTS.get(op, _no_constants))
    return table


FUNCTORS: dict[Op, Functor] = _functor_table()


def functor(op: Op) -> Functor:
    try:
        return FUNCTORS[op]
    except KeyError:
        raise LoweringError(
            f"element-wise op {op.value} has no device functor (registry functor "
            f"{REGISTRY[op].functor!r}); add one to mirage/gen/kernel.cuh and to "
            "mirage.codegen.lower_ops.FUNCTORS"
        ) from None


def element_type(dtype: DType, what: str) -> str:
    try:
        return ELEMENT_TYPES[dtype]
    except KeyError:
        raise LoweringError(
            f"{what} is {dtype.value}, which generated kernels do not support; use "
            f"one of {[d.value for d in ELEMENT_TYPES]}"
        ) from None


def element_size(element: str) -> int:
    return 4 if element == "float" else 2


def vector_copies(tile) -> bool:
    """Whether an input tile's rows are copied in 16-byte vectors (cp.async, or plain stores where a
    pointer is misaligned), not staged through registers (``InputIterator::kRegisterStaged``)."""
    vector = 16 // element_size(tile.element)
    return tile.layout.dims[3] % vector == 0 and tile.layout.pitch % vector == 0


def rank4(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """A shape of rank 1 to 4 padded with leading 1s (the device library's four dims)."""
    if not 1 <= len(shape) <= 4:
        raise LoweringError(
            f"tensors of rank {len(shape)} ({list(shape)}) have no lowering; the device "
            "library handles ranks 1 to 4"
        )
    padded = (1,) * (4 - len(shape)) + tuple(shape)
    return padded[0], padded[1], padded[2], padded[3]


def rank4_dim(rank: int, dim: int) -> int:
    return -1 if dim < 0 else dim + 4 - rank


def rank4_map(rank: int, dim_map: tuple[int, int, int], grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """A grid map in rank-4 dims, -1 on grid axes of extent 1 (they select nothing)."""
    x, y, z = (rank4_dim(rank, d) if g > 1 else -1 for d, g in zip(dim_map, grid, strict=True))
    return x, y, z


def tile_layout(
    shape: tuple[int, ...],
    element: str,
    capacity_bytes: int,
    row_major_plan: bool,
    planned_pitch: int | None = None,
) -> TileLayout:
    """The layout of a shared tile of ``shape``: the optimizer's row pitch, else rows padded to 16
    bytes where the buffer allows.

    ``row_major_plan``: the optimizer's layout keeps the last dim innermost (so it sized the buffer
    for padded rows); other plans get dense rows (layouts never change results, only speed).
    ``planned_pitch``: the row stride of that layout (``plan_pitch``), which may add one 16-byte
    vector per row (a swizzle by padding: ldmatrix and row-wise accesses free of bank conflicts).
    """
    dims = rank4(shape)
    itemsize = element_size(element)
    rows = dims[0] * dims[1] * dims[2]
    pitch = dims[3]
    if row_major_plan and dims[3] > 1:
        align = 16 // itemsize
        whole_vectors = -(-dims[3] // align) * align
        for candidate in (planned_pitch, whole_vectors):
            if (
                candidate is not None
                and candidate >= whole_vectors
                and candidate % align == 0
                and rows * candidate * itemsize <= capacity_bytes
            ):
                pitch = candidate
                break
    if rows * pitch * itemsize > capacity_bytes:
        raise LoweringError(
            f"a {element} tile of shape {list(shape)} needs {rows * pitch * itemsize} bytes "
            f"but its shared-memory buffer has {capacity_bytes}"
        )
    return TileLayout(dims, pitch)


def transposed_layout(shape: tuple[int, ...], element: str, capacity_bytes: int,
                      swizzle: bool = True) -> TileLayout:
    """The layout of an input tile of ``shape`` copied in place from a column-major tensor
    (:mod:`mirage.codegen.column_major`): stored as its transpose, rows padded by one 16-byte vector
    where the buffer allows (ldmatrix free of bank conflicts), else 128-byte swizzled where the shape
    allows (and ``swizzle``: not for a softmax chain's K, whose swizzle means the warpgroup form), else
    dense."""
    dims = rank4(shape)
    stored = (dims[0], dims[1], dims[3], dims[2])
    itemsize = element_size(element)
    rows, cols = stored[0] * stored[1] * stored[2], stored[3]
    align = 16 // itemsize
    whole = -(-cols // align) * align
    if transposed_padded_elements(shape, itemsize) * itemsize <= capacity_bytes:  # what the memory plan sized
        return TileLayout(dims, whole + align, transposed=True)
    swizzled = TileLayout(stored, 64, swizzled=True)
    if (swizzle and itemsize == 2 and stored[0] * stored[1] == 1 and cols % 64 == 0 and rows % 8 == 0
            and swizzled.storage * itemsize <= capacity_bytes):
        return TileLayout(dims, 64, swizzled=True, transposed=True)
    if rows * whole * itemsize > capacity_bytes:
        need = rows * whole * itemsize
        raise LoweringError(f"a transposed {element} tile of shape {list(shape)} needs {need} bytes but "
                            f"its shared-memory buffer has {capacity_bytes}")
    return TileLayout(dims, whole, transposed=True)


def plan_pitch(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The row pitch (elements) of a row-major planned layout: the stride of the nearest dim before
    the last whose extent exceeds 1 (None for a single row)."""
    for d in range(len(shape) - 2, -1, -1):
        if shape[d] > 1:
            return strides[d]
    return None
