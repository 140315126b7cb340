"""Running a compiled µGraph: generated kernels through the CUDA driver (or CuPy), pre-defined ops
through torch.

A :class:`Program` runs the kernel graph of a :class:`~mirage.codegen.lower_program.CudaProgram`
node by node: a graph-defined op launches its generated kernel (loaded from the cubin through CuPy,
launched through ``cuLaunchKernelEx`` with its arguments packed once, see
:class:`~mirage.codegen.dependent_launch.PackedLaunch`; through CuPy where the device cannot take
that), any other kernel-level op runs through torch (:class:`TorchAlgebra` evaluates the op's
registry formula, so a kernel-level matmul is a cuBLAS call).  Launches go to the current torch
stream and take torch tensors without copies (inputs that are not contiguous are made so, or
column-major where the program reads them so: ``CudaProgram.transposed_inputs``), so a
program can be captured in a CUDA graph once it has run (or :meth:`Program.load` was called)
outside the capture.  What the program returns is allocated in each call; a tensor that only its own
kernels read is kept from call to call, one per stream (see :meth:`Program._scratch`).

``poison=True`` fills every tensor a generated kernel writes with NaN before the launch, so that an
element the kernel fails to write shows up in the comparison (:mod:`mirage.codegen.gpu_check`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mirage.codegen import column_major, dependent_launch, tensor_maps
from mirage.errors import MirageError
from mirage.mugraph.graph import KernelGraph, Ref, output_view, same_strides
from mirage.mugraph.ops import REGISTRY, Op
from mirage.optimizer.cluster_fold import PORTABLE_CLUSTER

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from mirage.codegen.compile import CompileOptions
    from mirage.codegen.lower_program import CudaProgram, KernelLaunch
    from mirage.mugraph.target import Target
    from mirage.optimizer.pipeline import OptimizerOptions


class LaunchError(MirageError):
    """A compiled kernel could not be loaded or launched, or got tensors it cannot take."""


class TorchAlgebra:
    """The registry formulas over torch tensors (kernel-level pre-defined ops, on any device)."""

    def const(self, value, like):
        return float(value) if isinstance(value, Fraction) else value

    def zeros(self, shape):
        import torch

        return torch.zeros(shape)

    def add(self, x, y):
        return x + y

    def sub(self, x, y):
        return x - y

    def mul(self, x, y):
        return x * y

    def div(self, x, y):
        return x / y

    def exp(self, x):
        return x.exp()

    def sqrt(self, x):
        return x.sqrt() if hasattr(x, "sqrt") else x**0.5

    def matmul(self, x, y):
        return x @ y

    def sum(self, x, axis, keepdims=True):
        return x.sum(dim=axis, keepdim=keepdims)

    def opaque(self, name, x, reference):
        import torch.nn.functional as F

        table = {
            "silu": F.silu,
            "gelu": lambda v: F.gelu(v, approximate="tanh"),
            "gelu_erf": F.gelu,
            "relu": F.relu,
            "sigmoid": lambda v: v.sigmoid(),
            "tanh": lambda v: v.tanh(),
            "log": lambda v: v.log(),
            "softplus": F.softplus,
            "log1p": lambda v: v.log1p(),
            "expm1": lambda v: v.expm1(),
            "erf": lambda v: v.erf(),
            "sin": lambda v: v.sin(),
            "cos": lambda v: v.cos(),
        }
        if name in table:
            return table[name](x)
        if name.startswith("clamp["):
            lo, hi = (float(v) for v in name[6:-1].split(","))
            return x.clamp(lo, hi)
        raise LaunchError(f"no torch implementation of {name}")

    def max(self, x, axis, keepdims=True):
        return x.amax(dim=axis, keepdim=keepdims)

    def maximum(self, x, y):
        import torch

        return torch.maximum(x, y)

    def neg_inf(self, shape):
        import torch

        return torch.full(shape, float("-inf"))

    def structural(self, fn, *xs):
        raise LaunchError("structural ops run inside generated kernels, not through torch")

    def shape(self, x):
        return tuple(x.shape)


@dataclass
class Program:
    """A compiled µGraph, callable on CUDA torch tensors: ``outputs = program(*inputs)``."""

    cuda: CudaProgram
    cubin: Path | None  # None when the graph has no graph-defined op
    poison: bool = False
    dependent_launch: bool = True  # overlap each launch with the kernel before it (dependent_launch)
    spread_blocks: bool = False  # grids of at most one wave: one block per SM (see _shared_bytes)
    # with dependent_launch: the program's first kernel without the overlap, so that a call's first
    # kernel does not start under the previous call's last one (see overlaps; explored, not among
    # the selection's launch modes)
    first_plain: bool = False
    _functions: dict[str, Any] = field(default_factory=dict, repr=False)
    _plan: tuple | None = field(default=None, init=False, repr=False, compare=False)  # see _steps
    # each kernel's driver launch by (device index, kernel name); False where the device takes none
    _packed: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _scratches: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # see _scratch
    _maps: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # see _tensor_map

    @property
    def graph(self) -> KernelGraph:
        return self.cuda.graph

    @property
    def transposed_inputs(self) -> tuple[int, ...]:
        """Inputs read in place column-major (:mod:`mirage.codegen.column_major`)."""
        return self.cuda.transposed_inputs

    @property
    def input_strides(self) -> dict[int, tuple[int, ...]]:
        """Inputs read in place through the strides they are declared with (a head split's view)."""
        return self.cuda.input_strides

    @property
    def input_views(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """Inputs read in place with split dims, and the view calls may pass for each (its shape and
        strides; the graph's shape is taken too, and copied)."""
        return self.cuda.input_views

    @property
    def source(self) -> str:
        return self.cuda.code

    def with_poison(self, poison: bool = True) -> Program:
        """The same program (sharing loaded kernels) that NaN-fills kernel outputs before launches."""
        return dataclasses.replace(self, poison=poison, _functions=self._functions)

    def load(self) -> None:
        """Load the cubin on the current device and set each kernel's shared-memory limit (do it
        outside graph capture)."""
        for launch in self.cuda.kernels:
            self._function(launch)

    def _function(self, launch: KernelLaunch):
        """The kernel of ``launch`` loaded on the current device (once per device)."""
        try:
            import cupy
        except ImportError as error:
            raise LaunchError("running generated kernels needs CuPy: pip install 'mirage[gpu]'") from error
        key = (cupy.cuda.Device().id, launch.name)
        fn = self._functions.get(key)
        if fn is None:
            if self.cubin is None:
                raise LaunchError("this program was not compiled (no cubin)")
            module = cupy.RawModule(path=str(self.cubin))
            fn = module.get_function(launch.name)
            smem = max(launch.smem_bytes, _one_block_per_sm_bytes())
            if smem > 0:  # opt in always (dynamic plus static may pass 48 KiB), for the padded size too
                fn.max_dynamic_shared_size_bytes = smem
            if launch.counter and math.prod(launch.grid) > _sm_count():
                raise LaunchError(
                    f"{launch.name} is a counter fold of {math.prod(launch.grid)} blocks, but this GPU has "
                    f"{_sm_count()} SMs: its blocks would wait for blocks that cannot start; build it "
                    "without OptimizerOptions.counter_folds for this GPU")
            if launch.cluster_size > PORTABLE_CLUSTER:
                dependent_launch.allow_large_clusters(fn.kernel.ptr)
            if launch.cluster_size > 1:
                _warn_on_cluster_waves(fn, launch, self._shared_bytes(launch))
            self._functions[key] = fn
        return fn

    def _shared_bytes(self, launch: KernelLaunch) -> int:
        """The launch's dynamic shared memory.  With ``spread_blocks``, a grid of at most one block
        per SM asks for more than half an SM's shared memory, so that no two of its blocks share an
        SM: blocks launched early (dependent launch) are otherwise placed where the previous kernel
        left room, some SMs get two and others none, and a bandwidth-bound kernel loses SMs."""
        if not self.spread_blocks or math.prod(launch.grid) > _sm_count():
            return launch.smem_bytes
        return max(launch.smem_bytes, _one_block_per_sm_bytes())

    def __call__(self, *inputs):
        return self.launch(inputs)

    def launch(self, inputs: Sequence) -> list:
        """Run the program on ``inputs`` (torch CUDA tensors of the graph's shapes and dtypes)."""
        import torch

        checks, steps, outputs = self._steps()
        if len(inputs) != len(checks):
            raise LaunchError(f"the program takes {len(checks)} inputs, got {len(inputs)}")
        needs_cuda = bool(self.cuda.kernels)
        views = self.cuda.declared_views
        for i, (x, (shape, dtype)) in enumerate(zip(inputs, checks, strict=True)):
            if not isinstance(x, torch.Tensor):
                raise LaunchError(f"input {i} is a {type(x).__name__}; pass torch tensors")
            if x.shape != shape and (i not in views or tuple(x.shape) != views[i][0]):
                also = f" or its view {views[i][0]}" if i in views else ""
                raise LaunchError(f"input {i} has shape {tuple(x.shape)}, expected {shape}{also}")
            if x.dtype != dtype:
                raise LaunchError(f"input {i} is {x.dtype}, expected {dtype}: cast it first")
            if needs_cuda and not x.is_cuda:
                raise LaunchError(f"input {i} is on {x.device}; generated kernels need CUDA tensors")
        return self.run(inputs)

    def run(self, inputs: Sequence) -> list:
        """:meth:`launch` without its input checks, for a caller that checked inputs of these shapes,
        dtypes and device before (the frontend's executor, after its first call)."""
        _, steps, outputs = self._steps()
        values: dict[Ref, Any] = {}
        feed = iter(enumerate(inputs))
        transposed = self.cuda.transposed_inputs
        strides = self.cuda.input_strides
        views = self.cuda.input_views
        dense = {p: v for p, v in self.cuda.declared_views.items() if p not in views}  # copied dense
        algebra = None
        scratch = None
        try:
            for step, (kind, ref, detail) in enumerate(steps):
                if kind == "input":
                    position, value = next(feed)
                    if position in dense and tuple(value.shape) == dense[position][0]:
                        value = value.reshape(self.graph.type_of(ref).shape)
                    values[ref] = column_major.in_layout(value, position in transposed, strides.get(position),
                                                         views.get(position))
                elif kind == "kernel":
                    args = [values[r] for r in detail.inputs]
                    device = args[0].device
                    if scratch is None:
                        stream = _raw_stream(device.index)
                        scratch = self._scratch(device, stream)
                        scratch.lock.acquire()  # another thread's call on this stream waits for this one's
                    outs = scratch.outputs(step, ref)
                    self._launch(detail, outs, args, stream)
                    values.update(zip(detail.outputs, outs, strict=True))
                else:
                    algebra = algebra or TorchAlgebra()
                    node = self.graph.nodes[ref.node]
                    values[ref] = _pre_defined(node, self.graph, [values[r] for r in node.inputs], algebra)
        finally:
            if scratch is not None:
                scratch.lock.release()
        return [laid_out(values[r], self.graph.output_stride(m), self.graph.type_of(r).shape)
                for m, r in enumerate(outputs)]

    def _steps(self) -> tuple:
        """What a launch does, worked out once per program: each input's (shape, torch dtype), the
        steps in node order (an input to feed, a kernel to launch with its outputs' shapes, dtypes and
        whether only later kernels of the program read them, a pre-defined op to run through torch)
        and the refs of the outputs."""
        if self._plan is None:
            graph = self.graph
            launches = {k.node: k for k in self.cuda.kernels}
            folded = {k.consumer for k in self.cuda.kernels}  # results come with the kernel folded into
            read_elsewhere = {r for node in graph.nodes if node.op is not Op.CUSTOMIZED for r in node.inputs}
            returned = set(graph.outputs) | read_elsewhere
            declared = graph.strided_writes()
            steps: list[tuple] = []
            for i, node in enumerate(graph.nodes):
                if node.op is Op.INPUT:
                    steps.append(("input", Ref(i, 0), None))
                elif node.op is Op.CUSTOMIZED and i not in folded:
                    launch = launches[i]
                    shapes = tuple((graph.type_of(r).shape, graph.type_of(r).dtype.torch(),
                                    r not in returned, declared.get(r, ())) for r in launch.outputs)
                    steps.append(("kernel", shapes, launch))
                elif i not in folded:
                    steps.append(("torch", Ref(i, 0), None))
            checks = tuple((t.shape, t.dtype.torch()) for t in graph.input_types)
            self._plan = (checks, tuple(steps), tuple(graph.outputs))
        return self._plan

    def _allocate(self, shape, dtype, device, strides=()):
        """A tensor for a kernel's output, row-major or laid out with declared ``strides``; NaN-filled
        where ``poison``."""
        import torch

        if strides:  # with split dims, the view that holds each as two (output_view)
            shape, strides = output_view(shape, strides)
        tensor = (torch.empty_strided(shape, strides, dtype=dtype, device=device) if strides
                  else torch.empty(shape, dtype=dtype, device=device))
        return tensor.fill_(float("nan")) if self.poison else tensor

    def _scratch(self, device, stream: int) -> _Scratch:
        """Where the tensors that only the program's own kernels read live on ``stream``: kept from
        call to call (launches on one stream run in order, so a call's kernels write them only after
        the call before has read them), fresh in every call under CUDA graph capture or ``poison``."""
        import torch

        if self.poison or torch.cuda.is_current_stream_capturing():
            return _Scratch(self, device, keep=False)
        key = (device.index, stream)
        scratch = self._scratches.pop(key, None) or _Scratch(self, device, keep=True)
        self._scratches[key] = scratch  # most recent last; a few streams at most are kept
        while len(self._scratches) > MAX_SCRATCH_STREAMS:
            self._scratches.pop(next(iter(self._scratches)))
        return scratch

    def _launch(self, launch: KernelLaunch, outputs: Sequence, inputs: Sequence,
                stream: int | None = None) -> None:
        """Launch one kernel on ``stream`` (a ``CUstream`` handle; default: torch's current stream)."""
        device = (outputs or inputs)[0].device
        if launch.tensor_maps:  # a tensor map needs 16-byte aligned storage: copy an input that is not
            inputs = list(inputs)
            for m in launch.tensor_maps:
                inputs[m.input] = tensor_maps.aligned(inputs[m.input])
        pointers = [t.data_ptr() for t in outputs] + [t.data_ptr() for t in inputs]
        stream = _raw_stream(device.index) if stream is None else stream
        packed = self._packed.get((device.index, launch.name))
        if packed is None:
            packed = self._packed[(device.index, launch.name)] = self._pack(launch, device.index)
        if packed:
            maps = [self._tensor_map(launch, k, inputs[m.input]) for k, m in enumerate(launch.tensor_maps)]
            if _current_device() == device.index:
                packed(stream, pointers, maps)
            else:
                import cupy

                with cupy.cuda.Device(device.index):
                    packed(stream, pointers, maps)
            return
        if launch.tensor_maps:
            raise LaunchError(f"{launch.name} copies inputs by TMA, which needs an sm_90 GPU and the "
                              "cuda-bindings package; build without OptimizerOptions.tma_copies")
        self._launch_cupy(launch, pointers, device, stream)

    def _tensor_map(self, launch: KernelLaunch, k: int, tensor) -> bytes:
        """The ``k``-th tensor map of ``launch`` for ``tensor``: by the tensor's address alone, since a
        launch's inputs have fixed shapes and are contiguous (as :meth:`run` and the aligned copy make
        them), encoded by :func:`tensor_maps.encode` on a miss."""
        key = (launch.name, k, tensor.data_ptr())
        blob = self._maps.get(key)
        if blob is None:
            if len(self._maps) >= 256:
                self._maps.clear()
            blob = self._maps[key] = tensor_maps.encode(tensor, launch.tensor_maps[k])
        return blob

    def overlaps(self, launch: KernelLaunch) -> bool:
        """Whether ``launch`` may start under the kernel before it (programmatic dependent launch)."""
        first = bool(self.cuda.kernels) and launch.name == self.cuda.kernels[0].name
        return self.dependent_launch and not (self.first_plain and first)

    def _pack(self, launch: KernelLaunch, device_index: int) -> dependent_launch.PackedLaunch | bool:
        """The kernel's launches through the driver, or False where the device cannot take them."""
        if not dependent_launch.available(device_index):
            return False
        import cupy

        with cupy.cuda.Device(device_index):
            fn = self._function(launch)
        return dependent_launch.PackedLaunch(fn.kernel.ptr, launch.grid, launch.block,
                                             self._shared_bytes(launch), len(launch.arguments),
                                             len(launch.tensor_maps), overlap=self.overlaps(launch))

    def _launch_cupy(self, launch: KernelLaunch, pointers: list[int], device, stream: int) -> None:
        import cupy
        import numpy as np

        with warnings.catch_warnings():
            # CuPy 14 deprecates ExternalStream for objects with __cuda_stream__; a raw handle still needs it
            warnings.simplefilter("ignore", DeprecationWarning)
            external = cupy.cuda.ExternalStream(stream, device.index)
        with cupy.cuda.Device(device.index), external:
            fn = self._function(launch)
            fn(launch.grid, launch.block, tuple(np.uint64(p) for p in pointers),
               shared_mem=self._shared_bytes(launch))


MAX_SCRATCH_STREAMS = 4


def laid_out(value, strides: tuple[int, ...], shape=None):
    """A program's output of ``shape`` (default: ``value``'s) with the ``strides`` the graph declares for
    it (``KernelGraph.output_strides``; () row-major): as its kernel wrote it, or a copy where an op run
    through torch computed it row-major; with split dims, the view that holds each as two."""
    if not strides:
        return value
    view_shape, view_strides = output_view(tuple(value.shape) if shape is None else tuple(shape), strides)
    if tuple(value.shape) == view_shape and same_strides(view_shape, value.stride(), view_strides):
        return value
    return column_major.torch_strided(value.reshape(view_shape), view_strides)


class _Scratch:
    """A program's tensors that only its own kernels read, for calls on one stream and device: kept
    from call to call (``keep``) or made afresh in each.  A call holds ``lock`` while it launches, so
    that two threads calling on one stream do not interleave their kernels over the same tensors."""

    def __init__(self, program: Program, device, keep: bool) -> None:
        self.program, self.device, self.keep = program, device, keep
        self.tensors: dict[tuple, Any] = {}
        self.lock = threading.Lock()

    def outputs(self, step: int, kinds: tuple) -> list:
        """The output tensors of the kernel of ``step``, each of ``kinds`` a (shape, dtype, internal,
        declared strides): kept where ``internal`` (only the program's kernels read it), else fresh."""
        out = []
        for k, (shape, dtype, internal, strides) in enumerate(kinds):
            tensor = self.tensors.get((step, k)) if self.keep and internal else None
            if tensor is None:
                tensor = self.program._allocate(shape, dtype, self.device, strides)
                if self.keep and internal:
                    self.tensors[(step, k)] = tensor
            out.append(tensor)
        return out


def _raw_stream(device_index: int) -> int:
    """The current torch stream's ``CUstream`` handle on this device."""
    import torch

    return torch._C._cuda_getCurrentRawStream(device_index)


def _current_device() -> int:
    import torch

    return torch.cuda.current_device()


def _warn_on_cluster_waves(fn, launch: KernelLaunch, smem_bytes: int) -> None:
    """A cluster fold or multicast pays only when all its clusters run at once: say so when they cannot."""
    import cupy

    if not dependent_launch.available(cupy.cuda.Device().id):
        return
    active = dependent_launch.max_active_clusters(fn.kernel.ptr, launch.grid, launch.block, smem_bytes,
                                                  launch.cluster)
    clusters = math.prod(launch.grid) // launch.cluster_size
    warn_cluster_waves(launch.name, clusters, launch.cluster_size, active)


_CLUSTER_WAVES_WARNED: set[tuple] = set()


def warn_cluster_waves(name: str, clusters: int, size: int, active: int) -> bool:
    """Warn that kernel ``name``'s ``clusters`` clusters of ``size`` blocks run in waves (the GPU runs
    ``active`` at once), once per process for each distinct case: a selection loads many builds of one
    kernel, which would repeat it.  Whether it warned."""
    key = (name, clusters, size, active)
    if active >= clusters or key in _CLUSTER_WAVES_WARNED:
        return False
    _CLUSTER_WAVES_WARNED.add(key)
    log.warning("%s: %d clusters of %d blocks, but the GPU runs %d at once, so they run in waves; "
                "build without OptimizerOptions.cluster_folds or multicast_cluster",
                name, clusters, size, active)
    return True


@functools.cache
def _device_attributes() -> dict:
    import cupy

    return cupy.cuda.Device().attributes


def _sm_count() -> int:
    return int(_device_attributes()["MultiProcessorCount"])


def _one_block_per_sm_bytes() -> int:
    """Dynamic shared memory that leaves no room for a second block on an SM (with the 1 KiB the
    system reserves per block)."""
    return int(_device_attributes()["MaxSharedMemoryPerMultiprocessor"]) // 2


def _pre_defined(node, graph: KernelGraph, args: list, algebra: TorchAlgebra):
    """A kernel-level pre-defined op through torch.  A matmul runs on its operands' dtype (cuBLAS
    accumulates in fp32); other ops compute in fp32 and round once, as generated kernels do (an fp16
    ``x²`` inside rms_norm would overflow past |x| = 256)."""
    import torch

    row = REGISTRY[node.op]
    out_dtype = node.outputs[0].dtype.torch()
    if node.op is not Op.MATMUL:
        args = [a.float() if a.dtype in (torch.float16, torch.bfloat16) else a for a in args]
    return row.formula(algebra, node.attrs, graph.operand_types(node), *args).to(out_dtype)


def build(cuda: CudaProgram, compile_options: CompileOptions | None = None) -> Program:
    """Compile a generated program (through the cubin cache) into a :class:`Program`."""
    from mirage.codegen.compile import CompileOptions, compile_source

    if not cuda.kernels:
        return Program(cuda, None)
    options = dataclasses.replace(compile_options or CompileOptions(), target=cuda.target)
    return Program(cuda, compile_source(cuda.code, options).cubin_path)


def build_many(
    programs: Sequence[CudaProgram],
    compile_options: CompileOptions | None = None,
    max_workers: int | None = None,
) -> list[Program | MirageError]:
    """Compile several programs in parallel; a failed build yields its error in place of a Program."""
    from mirage.codegen.compile import CompileError, CompileOptions, compile_sources

    out: list[Program | MirageError] = [Program(p, None) for p in programs]
    todo = [k for k, p in enumerate(programs) if p.kernels]
    by_target: dict[Any, list[int]] = {}
    for k in todo:
        by_target.setdefault(programs[k].target, []).append(k)
    for target, indices in by_target.items():
        options = dataclasses.replace(compile_options or CompileOptions(), target=target)
        results = compile_sources(
            [programs[k].code for k in indices], options, max_workers=max_workers, return_exceptions=True
        )
        for k, result in zip(indices, results, strict=True):
            out[k] = result if isinstance(result, CompileError) else Program(programs[k], result.cubin_path)
    return out


def compile_program(
    graph,
    target: Target | None = None,
    *,
    options: OptimizerOptions | None = None,
    compile_options: CompileOptions | None = None,
) -> Program:
    """Optimize, generate and compile ``graph`` for ``target`` (default: the current GPU)."""
    from mirage.codegen.lower_program import generate_cuda_program, target_for

    cuda = generate_cuda_program(graph, target=target_for(None, target), options=options)
    return build(cuda, compile_options)


@dataclass(frozen=True)
class BuildChoice:
    """How a chosen µGraph is built and launched, besides the µGraph itself: what profile-guided
    selection (:mod:`mirage.codegen.select`) picks with it and the search cache keeps."""

    stages: int = 2  # pipeline depth (OptimizerOptions.stages)
    dependent_launch: bool = True  # Program.dependent_launch
    spread_blocks: bool = False  # Program.spread_blocks
    multicast_cluster: int = 0  # OptimizerOptions.multicast_cluster
    warpgroup_softmax: bool = False  # OptimizerOptions.warpgroup_softmax
    defer_values: bool = False  # OptimizerOptions.defer_values
    tma_copies: bool = False  # OptimizerOptions.tma_copies

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> BuildChoice:
        data = data or {}
        return cls(int(data.get("stages", 2)), bool(data.get("dependent_launch", True)),
                   bool(data.get("spread_blocks", False)), int(data.get("multicast_cluster", 0)),
                   bool(data.get("warpgroup_softmax", False)), bool(data.get("defer_values", False)),
                   bool(data.get("tma_copies", False)))

    def options(self):
        """The optimizer options this build takes."""
        from mirage.optimizer import OptimizerOptions

        return dataclasses.replace(OptimizerOptions(), stages=self.stages,
                                   multicast_cluster=self.multicast_cluster,
                                   warpgroup_softmax=self.warpgroup_softmax, defer_values=self.defer_values,
                                   tma_copies=self.tma_copies)


def compile_chosen(graph, build: BuildChoice | dict | None = None) -> Program:
    """``graph`` compiled for the current GPU as ``build`` says (a :class:`BuildChoice` or its
    ``as_dict``; default: its defaults)."""
    build = build if isinstance(build, BuildChoice) else BuildChoice.from_dict(build)
    program = compile_program(graph, options=build.options())
    return dataclasses.replace(program, dependent_launch=build.dependent_launch,
                               spread_blocks=build.spread_blocks)


def compile_graph(graph, build: BuildChoice | dict | None = None):
    """The frontend's entry point: a launcher ``outputs = launch(inputs)`` for the current GPU
    (see :func:`compile_chosen`)."""
    return compile_chosen(graph, build).launch
