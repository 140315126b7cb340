"""Data types of tensors."""

from __future__ import annotations

import enum

import numpy as np


class DType(enum.Enum):
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def short(self) -> str:
        return _SHORT[self]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype used to hold values of this type on the CPU (bfloat16 widens to float32)."""
        return np.dtype(np.float32) if self is DType.BFLOAT16 else np.dtype(self.value)

    def torch(self):
        import torch

        return getattr(torch, self.value)

    @classmethod
    def parse(cls, value: object) -> DType:
        """Accept a DType, its name (``"float16"``, ``"f16"``), a numpy dtype or a torch dtype."""
        if isinstance(value, DType):
            return value
        text = str(value).removeprefix("torch.").lower()
        for dtype in cls:
            if text in (dtype.value, dtype.short):
                return dtype
        raise ValueError(f"unsupported dtype {value!r}; use one of {[d.value for d in cls]}")


_ITEMSIZE = {DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.FLOAT32: 4, DType.FLOAT64: 8}
_SHORT = {DType.FLOAT16: "f16", DType.BFLOAT16: "bf16", DType.FLOAT32: "f32", DType.FLOAT64: "f64"}

float16 = DType.FLOAT16
bfloat16 = DType.BFLOAT16
float32 = DType.FLOAT32
float64 = DType.FLOAT64
