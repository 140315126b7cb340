"""The SASS tuner on the kernels mirage's code generator produces.

A compiled µGraph (:class:`mirage.codegen.runtime.Program`) holds one cubin with one kernel per
graph-defined op, and a launch description for each (``program.cuda.kernels``: grid, block, dynamic
shared memory, tensor arguments outputs first).  :func:`launch_specs` turns those into the tuner's
:class:`~mirage.sass.launch.LaunchSpec` records, one per kernel; :func:`tune_program` tunes every
kernel and returns a program whose cubin carries the schedules that were *accepted*:

* the tuner's verification of the chosen schedule on fresh inputs passed, and
* its re-timed speedup stands out of the noise floor (:attr:`~mirage.sass.tune.TuneResult.significant`),

otherwise the kernel keeps its original schedule and :func:`decide` says why.  The tuned cubin is
written next to the original, named by the hash of its bytes, and the original is never touched.

>>> program = compile_program(graph)                                  # doctest: +SKIP
>>> [spec.kernel for spec in launch_specs(program)]                   # doctest: +SKIP
['gatedmlp_k3']
>>> tuned, results = tune_program(program, TuneOptions())             # doctest: +SKIP
>>> [decide(result).reason for result in results]                     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mirage.sass.elf import Cubin
from mirage.sass.errors import SassError
from mirage.sass.evaluate import CandidateStatus
from mirage.sass.launch import BufferArgument, LaunchSpec, TensorMapArgument
from mirage.sass.mutation import MoveSet
from mirage.sass.search import Budget, SearchOptions
from mirage.sass.tune import TuneOptions, TuneResult, tune_cubin

if TYPE_CHECKING:
    from mirage.codegen.lower_program import CudaProgram, KernelLaunch
    from mirage.codegen.runtime import Program
    from mirage.mugraph.graph import KernelGraph, Ref

log = logging.getLogger(__name__)

TUNED_PREFIX = "sass-"  # tuned cubins are <original stem>.sass-<hash>.cubin beside the original
DECISIONS = "sass-decisions.json"  # beside the original cubin: what tuning decided there, per GPU
Tuner = Callable[[Cubin, LaunchSpec, TuneOptions], TuneResult]


class ProgramTuningError(SassError):
    """A program cannot be tuned as given (not compiled, or a kernel name the program lacks)."""


# ---- launch descriptions ------------------------------------------------------------------------


def tensor_name(graph: KernelGraph, ref: Ref) -> str:
    """A readable, unique buffer name for a kernel-graph tensor: ``X%0`` for input ``X``, ``%3.0``
    for the first output of node 3.  Equal tensors get equal names, so a tensor passed twice is one
    buffer in the sandbox, as on the device."""
    from mirage.mugraph.graph import KernelInput

    attributes = graph.nodes[ref.node].attrs
    if isinstance(attributes, KernelInput):
        return f"{attributes.name or 'input'}%{ref.node}"
    return f"%{ref.node}.{ref.index}"


def _declared_layout(cuda: CudaProgram, ref: Ref) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """The shape and strides (elements; None: row-major) through which kernels read tensor ``ref``:
    a program input read in place through declared strides or as a view, else the graph's shape."""
    graph = cuda.graph
    shape = tuple(graph.type_of(ref).shape)
    if ref.index != 0 or ref.node not in graph.input_nodes:
        return shape, None
    position = graph.input_nodes.index(ref.node)
    view = cuda.input_views.get(position)
    layout = view if view is not None else (shape, cuda.input_strides.get(position))
    shape, strides = tuple(layout[0]), layout[1]
    return shape, (tuple(strides) if strides is not None and len(strides) == len(shape) else None)


def _strided_extent(cuda: CudaProgram, ref: Ref) -> int:
    """Elements a kernel may address in program input ``ref`` when it reads it in place through
    declared strides (a slice of a wider tensor spans more than its own elements), else 0."""
    shape, strides = _declared_layout(cuda, ref)
    if strides is None or 0 in shape:
        return 0
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(shape, strides, strict=True))


def _tensor_map(cuda: CudaProgram, launch: KernelLaunch, k: int) -> TensorMapArgument:
    """The ``k``-th tensor map of ``launch``, encoded in the sandbox from its input's buffer."""
    spec = launch.tensor_maps[k]
    ref = launch.inputs[spec.input]
    shape, strides = _declared_layout(cuda, ref)
    if strides is None:  # row-major
        strides = tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))
    return TensorMapArgument(f"tmap{k}", tensor_name(cuda.graph, ref), shape, strides, spec.box, spec.swizzle,
                             spec.transposed)


def launch_spec(cuda: CudaProgram, launch: KernelLaunch, scale: float = 1.0) -> LaunchSpec:
    """The tuner's launch description of one generated kernel: a buffer per tensor argument with
    the graph's shape and dtype, outputs flagged, inputs drawn from N(0, ``scale``²).  An input read
    in place through declared strides gets a flat buffer of every element those strides reach.
    Outputs are compared bit for bit: reordering instructions changes no arithmetic."""
    graph = cuda.graph
    arguments = []
    for ref in launch.arguments:
        tensor = graph.type_of(ref)
        shape = tensor.shape
        extent = 0 if ref in launch.outputs else _strided_extent(cuda, ref)
        if extent > tensor.numel:
            shape = (extent,)
        arguments.append(BufferArgument(tensor_name(graph, ref), shape, tensor.dtype.value,
                                        output=ref in launch.outputs, scale=scale))
    arguments.extend(_tensor_map(cuda, launch, k) for k in range(len(launch.tensor_maps)))
    return LaunchSpec(kernel=launch.name, grid=launch.grid, block=launch.block, arguments=tuple(arguments),
                      shared_memory_bytes=launch.smem_bytes, exact=True,
                      notes={"graph": graph.name or "graph", "node": str(launch.node)})


def launch_specs(program: Program | CudaProgram, scale: float = 1.0) -> list[LaunchSpec]:
    """One :class:`LaunchSpec` per generated kernel of ``program``, in launch order."""
    from mirage.codegen.lower_program import CudaProgram

    cuda = program if isinstance(program, CudaProgram) else program.cuda
    return [launch_spec(cuda, launch, scale) for launch in cuda.kernels]


# ---- the acceptance rule -----------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    kernel: str
    accepted: bool
    reason: str


def decide(result: TuneResult) -> Decision:
    """Whether a tuned schedule replaces the original: only a verified schedule whose re-timed
    speedup beats the noise floor does."""
    gain = (f"{result.gain_percent:+.2f}% ± {result.spread_percent:.2f}% "
            f"(noise ± {result.noise_percent:.2f}%)")
    if result.verification.status is not CandidateStatus.OK:
        return Decision(result.kernel, False, f"verification failed ({result.verification.status.value}: "
                                              f"{result.verification.detail})")
    if result.best.data == result.original.data or result.changed_positions == 0:
        return Decision(result.kernel, False, "no schedule beat the original when re-timed")
    if not result.significant:
        return Decision(result.kernel, False, f"gain {gain} does not stand out of the noise floor")
    return Decision(result.kernel, True, f"gain {gain}, verified on {result.verification.detail}")


# ---- writing the tuned cubin --------------------------------------------------------------------


def tuned_cubin_path(original: Path, data: bytes) -> Path:
    """Where a tuned image of ``original`` lives: beside it, named by the hash of its bytes.

    >>> tuned_cubin_path(Path("cubins/ab/kernel.cubin"), b"tuned bytes").as_posix()
    'cubins/ab/kernel.sass-44b105a48070f23d.cubin'
    """
    digest = hashlib.sha256(data).hexdigest()[:16]
    return original.with_name(f"{original.stem}.{TUNED_PREFIX}{digest}{original.suffix}")


def write_tuned_cubin(original: Path, cubin: Cubin) -> Path:
    """Write ``cubin`` beside ``original`` under its content address (atomically; an existing file
    of that name already holds these bytes).  Never writes to ``original`` itself."""
    path = tuned_cubin_path(original, cubin.data)
    if path.resolve() == original.resolve():  # only if the original were itself named by this hash
        raise ProgramTuningError(f"refusing to overwrite the original cubin {original}")
    if path.is_file() and path.read_bytes() == cubin.data:
        return path
    handle, temporary = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(cubin.data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def with_kernel_texts(program: Program, texts: Mapping[str, bytes]) -> Program:
    """A program like ``program`` whose cubin has the given kernels' ``.text`` replaced (same
    lengths: schedules only), written beside the original cubin.  No texts: ``program`` itself."""
    original = _cubin_path(program)
    cubin = Cubin.read(original)
    edited = cubin
    for kernel, text in texts.items():
        edited = edited.with_text(kernel, text)
    if edited.data == cubin.data:
        return program
    # the same launch modes (dependent launch, spread blocks); kernels load afresh from the new cubin
    return dataclasses.replace(program, cubin=write_tuned_cubin(original, edited), _functions={})


def _cubin_path(program: Program) -> Path:
    if program.cubin is None:
        raise ProgramTuningError("the program has no cubin (no graph-defined op, or not compiled): "
                                 "compile it with mirage.codegen.compile_program first")
    return Path(program.cubin)


# ---- tuning -------------------------------------------------------------------------------------


def default_options(candidates: int = 200, time_s: float = 120.0, progress: bool = True) -> TuneOptions:
    """The options ``superoptimize(..., sass_tune=True)`` uses: annealing over all adjacent swaps
    with stall repair, bounded per kernel by a candidate count and a time limit."""
    return TuneOptions(policy="annealing", budget=Budget(candidates=candidates, time_s=time_s),
                       search=SearchOptions(move_set=MoveSet.SWAP, repair_stalls=True, progress=progress))


def tune_program(program: Program, options: TuneOptions | None = None, *,
                 kernels: Iterable[str] | None = None, require_significant: bool = True,
                 tuner: Tuner | None = None, scale: float = 1.0) -> tuple[Program, list[TuneResult]]:
    """Tune every generated kernel of ``program`` (or those named in ``kernels``) on this machine's
    GPU, each against the original cubin, and return a program with the accepted schedules (see
    :func:`decide`; ``require_significant=False`` accepts any verified schedule whose median beat
    the original) and the tuner's result for every kernel.  When nothing is accepted the program
    returned is ``program`` itself.  ``tuner`` is the entry point that tunes one kernel
    (:func:`~mirage.sass.tune.tune_cubin`; tests pass a CPU stand-in)."""
    options = options or default_options()
    tuner = tuner or tune_cubin
    cubin = Cubin.read(_cubin_path(program))
    specs = {spec.kernel: spec for spec in launch_specs(program, scale)}
    wanted = list(specs) if kernels is None else list(kernels)
    unknown = [name for name in wanted if name not in specs]
    if unknown:
        raise ProgramTuningError(f"the program has no kernel named {', '.join(unknown)}; its kernels: "
                                 f"{', '.join(specs) or 'none'}")
    results: list[TuneResult] = []
    texts: dict[str, bytes] = {}
    for name in wanted:
        result = tuner(cubin, specs[name], options)
        results.append(result)
        decision = decide(result)
        accepted = decision.accepted or (
            not require_significant and result.verification.status is CandidateStatus.OK
            and result.best.data != cubin.data)
        if accepted:
            texts[name] = result.best.text(name)
        log.info("%s: %s (%s)", name, "tuned schedule taken" if accepted else "original kept",
                 decision.reason)
    return with_kernel_texts(program, texts), results


# ---- decisions kept across processes ------------------------------------------------------------


def _decisions_path(program: Program) -> Path:
    return _cubin_path(program).with_name(DECISIONS)


def recorded_tuning(program: Program, device: str) -> Program | None:
    """The program as an earlier :func:`record_tuning` on a GPU named ``device`` left it (its tuned
    cubin, or ``program`` itself where every kernel kept its schedule), or None where none was
    recorded, or the record cannot be used (unreadable, its tuned cubin gone or of other kernels: the
    caller tunes again).  The original cubin is content-addressed, so a record belongs to this code."""
    path = _decisions_path(program)
    try:
        entry = json.loads(path.read_text()).get(device)
        if entry is None:
            return None
        if entry["cubin"] is None:
            return program
        tuned = Cubin.read(path.with_name(entry["cubin"]))
        return with_kernel_texts(program, {kernel: tuned.text(kernel) for kernel in entry["kernels"]})
    except FileNotFoundError:
        return None
    except Exception as error:  # noqa: BLE001 - a damaged record costs a tuning, never a wrong kernel
        log.warning("ignoring the SASS tuning record %s (%s: %s); tuning again", path, type(error).__name__,
                    str(error).splitlines()[0] if str(error) else "")
        return None


def record_tuning(program: Program, tuned: Program, results: Iterable[TuneResult], device: str) -> None:
    """Keep what :func:`tune_program` decided for ``program`` on a GPU named ``device`` beside its
    cubin, so that a later process takes the same schedules without tuning (delete the file to tune
    again).  Written whole, then renamed into place."""
    path = _decisions_path(program)
    try:
        data = json.loads(path.read_text())
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    results = list(results)
    taken = []
    if tuned is not program:
        before, after = Cubin.read(_cubin_path(program)), Cubin.read(_cubin_path(tuned))
        taken = [r.kernel for r in results if after.text(r.kernel) != before.text(r.kernel)]
    data[device] = {"cubin": _cubin_path(tuned).name if taken else None, "kernels": taken,
                    "reasons": {r.kernel: decide(r).reason for r in results}}
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".sass-decisions-")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1)
        os.replace(temporary, path)
    except OSError as error:  # the tuned program still runs; a later process tunes again
        log.warning("could not keep the SASS tuning record %s (%s)", path, error)
