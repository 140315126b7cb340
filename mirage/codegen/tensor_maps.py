"""Tensor maps of the inputs that a kernel copies by TMA (``OptimizerOptions.tma_copies``,
``mirage/tma.cuh``): which input, and the box that one copy moves, recorded with the launch; the
CUtensorMap itself (128 bytes, a ``__grid_constant__`` kernel parameter) encoded by the driver from the
tensor at each launch, and kept for the next launch of the same tensor. The runtime copies an input
that starts off a 16-byte boundary into aligned storage first (``aligned``)."""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Any

from mirage.errors import MirageError

SWIZZLE_BYTES = 128  # the box's inner dim: 64 16-bit elements, 128-byte swizzled (Swizzled128Layout)
SWIZZLES = (0, 32, 64, 128)  # the spans the driver offers (CU_TENSOR_MAP_SWIZZLE_*)


class TensorMapError(MirageError):
    """The driver could not describe an input for TMA copies."""


@dataclass(frozen=True)
class TensorMapSpec:
    """Input ``input`` of a launch (its index among the launch's inputs) copied in boxes of ``box``
    elements (its four dims as the kernel sees them, outermost first)."""

    input: int
    box: tuple[int, int, int, int]
    swizzle: int = SWIZZLE_BYTES  # bytes of the swizzle span, 0 for rows landed as they are
    # the input arrives column-major in its last two dims and is read in place (codegen.column_major):
    # the map describes the row-major tensor it is a transposed view of, ``box`` that tensor's box
    transposed: bool = False

    def __post_init__(self) -> None:
        if self.swizzle not in SWIZZLES:
            raise TensorMapError(f"a tensor map swizzles 0, 32, 64 or 128 bytes, not {self.swizzle}")

    def to_dict(self) -> dict[str, Any]:
        d = {"input": self.input, "box": list(self.box), "swizzle": self.swizzle}
        return {**d, "transposed": True} if self.transposed else d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorMapSpec:
        return cls(int(d["input"]), tuple(int(b) for b in d["box"]),  # type: ignore[arg-type]
                   int(d.get("swizzle", SWIZZLE_BYTES)), bool(d.get("transposed", False)))


def aligned(tensor):
    """``tensor``, or a copy of it in fresh (256-byte aligned) storage where it starts off a 16-byte
    boundary, as a slice of a larger tensor may: what a tensor map needs, and the cp.async path's
    element copies did not."""
    return tensor.clone() if tensor.data_ptr() % 16 else tensor


def encode(tensor, spec: TensorMapSpec) -> bytes:
    """The CUtensorMap of ``tensor`` (a CUDA tensor of 16-bit elements, rank ≤ 4) for ``spec``: the
    elements are copied as 16-bit words, so fp16 and bf16 alike."""
    return encode_at(tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.element_size(),
                     spec)


def encode_at(address: int, shape: tuple[int, ...], strides: tuple[int, ...], size: int,
              spec: TensorMapSpec) -> bytes:
    """The CUtensorMap for ``spec`` of the tensor at device ``address`` with this ``shape`` and these
    ``strides`` (elements) of ``size``-byte elements, as :func:`encode` takes them from a tensor."""
    if spec.transposed:
        shape, strides = (*shape[:-2], shape[-1], shape[-2]), (*strides[:-2], strides[-1], strides[-2])
    pad = 4 - len(shape)
    return _encode(address, (1,) * pad + tuple(shape), (0,) * pad + tuple(strides), size, spec.box,
                   spec.swizzle)


@functools.lru_cache(maxsize=256)
def _encode(address: int, shape: tuple[int, ...], strides: tuple[int, ...], size: int,
            box: tuple[int, ...], swizzle: int = SWIZZLE_BYTES) -> bytes:
    if size != 2 or strides[3] != 1:
        raise TensorMapError(f"a tensor of {size}-byte elements and innermost stride {strides[3]} cannot be "
                             "copied by TMA here; pass a contiguous fp16/bf16 tensor or build without "
                             "OptimizerOptions.tma_copies")
    dims = [shape[3], shape[2], shape[1], shape[0]]  # innermost first, as the driver takes them
    pitches = [strides[3 - k] * size for k in (1, 2, 3)]  # bytes between steps of map dims 1..3
    if address % 16 or any(p % 16 for p, dim in zip(pitches, dims[1:], strict=True) if dim > 1):
        raise TensorMapError(f"TMA copies need a 16-byte aligned tensor whose rows are whole 16 bytes "
                             f"(address {address:#x}, strides {strides}); copy the input with .contiguous() "
                             "or build without OptimizerOptions.tma_copies")
    from cuda.bindings import driver

    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    boxes = [box[3], box[2], box[1], box[0]]
    for k in range(3):  # a dim of one element is never stepped: give it a pitch the driver accepts
        if dims[k + 1] == 1:
            pitches[k] = (pitches[k - 1] * dims[k]) if k else dims[0] * size
    pitches = [max(p, 16) for p in pitches]
    error, descriptor = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, address,
        [u64(d) for d in dims], [u64(p) for p in pitches], [u32(b) for b in boxes], [u32(1)] * 4,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(driver.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}B" if swizzle else
                "CU_TENSOR_MAP_SWIZZLE_NONE"),
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if error != driver.CUresult.CUDA_SUCCESS:
        raise TensorMapError(f"cuTensorMapEncodeTiled failed with {error!r} (shape {shape}, strides "
                             f"{strides}, box {box}); build without OptimizerOptions.tma_copies")
    return struct.pack("<16Q", *(int(w) for w in descriptor.opaque))
