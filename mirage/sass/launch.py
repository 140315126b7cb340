"""Launch descriptions: what a kernel needs to run, as a small frozen record.

>>> spec = LaunchSpec(
...     kernel="scaled_add", grid=(4096, 1, 1), block=(256, 1, 1),
...     arguments=(BufferArgument("x", (1 << 20,), "float32"), BufferArgument("y", (1 << 20,), "float32"),
...                BufferArgument("out", (1 << 20,), "float32", output=True),
...                ScalarArgument("alpha", "float32", 0.5), ScalarArgument("n", "int32", 1 << 20)))
>>> [a.name for a in spec.outputs]
['out']
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from mirage.sass.elf import Cubin
from mirage.sass.errors import LaunchSpecError
from mirage.sass.nvinfo import kernel_parameters

ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
                 "int32": 4, "int64": 8, "uint32": 4, "uint64": 8}
POINTER_BYTES = 8
TENSOR_MAP_BYTES = 128  # a CUtensorMap, passed by value


@dataclass(frozen=True)
class BufferArgument:
    """A device buffer passed by pointer.  Inputs are filled from a seeded generator: ``normal``
    (``scale`` × N(0,1)), ``uniform`` (in ``[0, scale)``) or ``integers`` (in ``[0, scale)``);
    outputs are poisoned before every run so that unwritten elements are caught."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    output: bool = False
    init: str = "normal"
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.dtype not in ELEMENT_BYTES:
            raise LaunchSpecError(
                f"buffer {self.name}: dtype {self.dtype!r} is not one of {sorted(ELEMENT_BYTES)}")
        if self.init not in ("normal", "uniform", "integers"):
            raise LaunchSpecError(
                f"buffer {self.name}: init {self.init!r} is not normal, uniform or integers")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def bytes(self) -> int:
        return self.elements * ELEMENT_BYTES[self.dtype]

    @property
    def parameter_bytes(self) -> int:
        return POINTER_BYTES


@dataclass(frozen=True)
class ScalarArgument:
    """A scalar passed by value; ``dtype`` ``pointer`` passes a raw address (0 for a null pointer)."""

    name: str
    dtype: str
    value: float | int

    def __post_init__(self) -> None:
        if self.dtype != "pointer" and self.dtype not in ELEMENT_BYTES:
            raise LaunchSpecError(f"scalar {self.name}: dtype {self.dtype!r} is not a known scalar type")

    @property
    def parameter_bytes(self) -> int:
        return POINTER_BYTES if self.dtype == "pointer" else ELEMENT_BYTES[self.dtype]


@dataclass(frozen=True)
class TensorMapArgument:
    """A TMA tensor map passed by value (a 128-byte ``CUtensorMap``), encoded in the sandbox from the
    address of buffer ``source``, read as a tensor of ``shape`` and ``strides`` (elements), copied in
    boxes of ``box`` with a ``swizzle``-byte swizzle (:class:`mirage.codegen.tensor_maps.TensorMapSpec`;
    ``transposed``: the map describes the row-major tensor that ``source`` is a transposed view of)."""

    name: str
    source: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, int, int, int]
    swizzle: int = 128
    transposed: bool = False

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.strides) or not 1 <= len(self.shape) <= 4 or len(self.box) != 4:
            raise LaunchSpecError(f"tensor map {self.name}: shape {self.shape}, strides {self.strides} and "
                                  f"box {self.box} do not describe a tensor of rank 1 to 4 in a 4-dim box")
        for key in ("shape", "strides", "box"):
            object.__setattr__(self, key, tuple(int(d) for d in getattr(self, key)))

    @property
    def parameter_bytes(self) -> int:
        return TENSOR_MAP_BYTES


Argument = BufferArgument | ScalarArgument | TensorMapArgument


_KINDS = {BufferArgument: "buffer", ScalarArgument: "scalar", TensorMapArgument: "tensor_map"}


@dataclass(frozen=True)
class LaunchSpec:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    arguments: tuple[Argument, ...]
    shared_memory_bytes: int = 0
    exact: bool = True  # outputs must match the original bit for bit (reordering changes no arithmetic)
    atol: float = 0.0
    rtol: float = 0.0
    notes: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name, value in (("grid", self.grid), ("block", self.block)):
            if len(value) != 3 or any(int(v) < 1 for v in value):
                raise LaunchSpecError(f"{name} must be three positive integers, got {value!r}")
        object.__setattr__(self, "grid", tuple(int(v) for v in self.grid))
        object.__setattr__(self, "block", tuple(int(v) for v in self.block))
        if not any(isinstance(a, BufferArgument) and a.output for a in self.arguments):
            raise LaunchSpecError(f"launch of {self.kernel}: no argument is marked output=True, so no result "
                                  "could be compared")
        buffers = {a.name: a for a in self.arguments if isinstance(a, BufferArgument)}
        for m in self.tensor_maps:
            source = buffers.get(m.source)
            if source is None or source.output or ELEMENT_BYTES[source.dtype] != 2:
                raise LaunchSpecError(f"launch of {self.kernel}: tensor map {m.name} reads {m.source!r}, "
                                      "which is not an input buffer of 16-bit elements of this launch")

    @property
    def outputs(self) -> tuple[BufferArgument, ...]:
        return tuple(a for a in self.arguments if isinstance(a, BufferArgument) and a.output)

    @property
    def tensor_maps(self) -> tuple[TensorMapArgument, ...]:
        return tuple(a for a in self.arguments if isinstance(a, TensorMapArgument))

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"arguments": [{"kind": _KINDS[type(a)], **asdict(a)}
                                                        for a in self.arguments]}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> LaunchSpec:
        data = json.loads(text)
        arguments = []
        for item in data.pop("arguments"):
            kind = item.pop("kind")
            if kind == "buffer":
                item["shape"] = tuple(item["shape"])
                arguments.append(BufferArgument(**item))
            elif kind == "tensor_map":
                arguments.append(TensorMapArgument(**item))
            else:
                arguments.append(ScalarArgument(**item))
        data["grid"], data["block"] = tuple(data["grid"]), tuple(data["block"])
        return cls(arguments=tuple(arguments), **data)


def check_against_cubin(spec: LaunchSpec, cubin: Cubin) -> None:
    """Raise :class:`LaunchSpecError` unless the arguments match the kernel's parameter table."""
    parameters = kernel_parameters(cubin, spec.kernel)
    if not parameters:
        return  # no EIATTR_KPARAM_INFO: nothing to check against
    if len(parameters) != len(spec.arguments):
        raise LaunchSpecError(
            f"kernel {spec.kernel} takes {len(parameters)} parameters "
            f"({', '.join(str(p.size) + ' bytes' for p in parameters)}); "
            f"the launch gives {len(spec.arguments)}")
    for parameter, argument in zip(parameters, spec.arguments, strict=True):
        if parameter.size != argument.parameter_bytes:
            raise LaunchSpecError(
                f"kernel {spec.kernel}: parameter {parameter.ordinal} is {parameter.size} bytes, argument "
                f"{argument.name!r} is {argument.parameter_bytes}")
