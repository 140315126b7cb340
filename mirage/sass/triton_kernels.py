"""Tune the cubin of a compiled Triton kernel.

Triton hands over the machine code as ``compiled.asm["cubin"]``.  The launch description is built
from the call's arguments: tensors become buffers (``outputs`` names the indices of the ones the
kernel writes), Python ints and floats become 32-bit scalars.  Triton drops ``constexpr`` arguments
and specializes integer arguments equal to 1 away; the kernel's parameter table in ``.nv.info``
decides which of those are really passed.  Trailing parameters the call does not name (the scratch
pointers of newer Triton versions) are passed as null pointers when Triton allotted no scratch.
"""

from __future__ import annotations

from collections.abc import Sequence

from mirage.sass.elf import Cubin
from mirage.sass.errors import LaunchSpecError
from mirage.sass.launch import BufferArgument, LaunchSpec, ScalarArgument, check_against_cubin
from mirage.sass.nvinfo import kernel_parameters
from mirage.sass.tune import TuneOptions, TuneResult, tune_cubin


def _metadata(compiled, name: str, default=None):
    metadata = getattr(compiled, "metadata", None)
    if isinstance(metadata, dict):
        return metadata.get(name, default)
    return getattr(metadata, name, default)


def _describe(arguments: Sequence, outputs: Sequence[int]) -> list:
    converted: list = []
    for index, value in enumerate(arguments):
        if hasattr(value, "data_ptr"):
            dtype = str(value.dtype).replace("torch.", "")
            converted.append(BufferArgument(f"arg{index}", tuple(value.shape), dtype,
                                            output=index in outputs))
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            width = "int64" if abs(value) >= 2**31 else "int32"
            converted.append(ScalarArgument(f"arg{index}", width, value))
        elif isinstance(value, float):
            converted.append(ScalarArgument(f"arg{index}", "float32", value))
        else:
            raise LaunchSpecError(f"argument {index} ({type(value).__name__}) cannot be described; pass "
                                  "tensors, ints and floats in the kernel's order")
    return converted


def _passed_arguments(compiled, arguments: Sequence) -> list[list]:
    """Candidate lists of the arguments Triton really passes, best guess first."""
    guesses = []
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if isinstance(signature, dict):
        types = list(signature.values())
        guesses.append([value for index, value in enumerate(arguments)
                        if index >= len(types) or types[index] != "constexpr"])
    guesses.append(list(arguments))
    guesses.append([value for value in arguments if not (isinstance(value, int) and value == 1)])
    return guesses


def launch_spec_from_triton(compiled, arguments: Sequence, grid: Sequence[int], outputs: Sequence[int],
                            *, exact: bool = True) -> LaunchSpec:
    cubin = Cubin.from_bytes(compiled.asm["cubin"])
    name = _metadata(compiled, "name") or cubin.kernel_names()[0]
    parameters = kernel_parameters(cubin, name)
    grid3 = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    errors = []
    for guess in _passed_arguments(compiled, arguments):
        output_positions = [position for position, value in enumerate(guess)
                            if any(value is arguments[i] for i in outputs)]
        converted = _describe(guess, output_positions)
        try:
            for parameter in parameters[len(converted):]:
                if parameter.size != 8:
                    raise LaunchSpecError(f"kernel {name}: parameter {parameter.ordinal} ({parameter.size} "
                                          "bytes) is not named by the call and is no pointer")
                for scratch in ("global_scratch_size", "profile_scratch_size"):
                    if _metadata(compiled, scratch, 0):
                        size = _metadata(compiled, scratch)
                        raise LaunchSpecError(f"kernel {name} needs {scratch}={size}; launching it outside "
                                              "Triton is not supported")
                converted.append(ScalarArgument(f"scratch{parameter.ordinal}", "pointer", 0))
            threads = 32 * int(_metadata(compiled, "num_warps", 4))
            shared = int(_metadata(compiled, "shared", 0))
            spec = LaunchSpec(kernel=name, grid=grid3, block=(threads, 1, 1), arguments=tuple(converted),
                              shared_memory_bytes=shared, exact=exact)
            check_against_cubin(spec, cubin)
            return spec
        except LaunchSpecError as error:
            errors.append(str(error))
    raise LaunchSpecError("the call's arguments do not fit the kernel's parameters: " + "; ".join(errors))


def tune_triton(compiled, arguments: Sequence, grid: Sequence[int], outputs: Sequence[int],
                options: TuneOptions | None = None) -> TuneResult:
    """Tune a compiled Triton kernel (``kernel.warmup(...)`` or the handle a launch returns)."""
    spec = launch_spec_from_triton(compiled, arguments, grid, outputs)
    return tune_cubin(Cubin.from_bytes(compiled.asm["cubin"]), spec, options)
