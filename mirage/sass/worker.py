"""The GPU side of candidate evaluation.  Runs only inside a sandbox process (see
:mod:`mirage.sass.evaluate`): a CUDA fault there kills nothing but that process.

It loads cubins with CuPy, fills inputs from seeds, poisons outputs, runs the original kernel once
per input set to keep its outputs as references, and then for each candidate: runs it on the
requested input sets and compares outputs bit for bit (or within tolerances), re-runs the original
on set 0 as a canary (a corrupted process must not judge later candidates), and times candidate and
original in alternating rounds with CUDA events.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from typing import Any

import numpy as np

from mirage.sass.launch import BufferArgument, LaunchSpec, ScalarArgument, TensorMapArgument

_NUMPY_SCALARS = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "int8": np.int8,
                  "uint8": np.uint8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
                  "uint32": np.uint32, "uint64": np.uint64, "pointer": np.uint64}
_STORAGE = {"float16": "float16", "bfloat16": "uint16", "float32": "float32", "float64": "float64",
            "int8": "int8", "uint8": "uint8", "int16": "int16", "int32": "int32", "int64": "int64",
            "uint32": "uint32", "uint64": "uint64"}


class Session:
    """One original kernel, its buffers and reference outputs, inside the sandbox process."""

    def __init__(self, spec: LaunchSpec, original_cubin: bytes, seeds: list[int]) -> None:
        import cupy

        self.cupy = cupy
        self.spec = spec
        self.seeds = seeds
        self.directory = tempfile.mkdtemp(prefix="mirage-sass-worker-")
        self.original_module, self.original = self._load(original_cubin, "original")
        self.buffers = {a.name: cupy.empty(a.elements, dtype=_STORAGE[a.dtype])
                        for a in spec.arguments if isinstance(a, BufferArgument)}
        self.maps = [self._encode(m) for m in spec.tensor_maps]  # the buffers stay put: encoded once
        self.packed: dict[int, Any] = {}  # launches through the driver, by function (tensor maps only)
        self.references: list[list[Any]] = []
        for index in range(len(seeds)):
            self._fill(index)
            self._run(self.original)
            self.references.append([self.buffers[o.name].copy() for o in spec.outputs])
        self.unwritten = self._unwritten()  # NaN outputs of the original: unwritten, or NaN data
        self.launches = 1

    # -- helpers ----------------------------------------------------------------------------------

    def _load(self, cubin: bytes, name: str):
        path = os.path.join(self.directory, f"{name}.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        module = self.cupy.RawModule(path=path)
        function = module.get_function(self.spec.kernel)
        if self.spec.shared_memory_bytes > 0:  # opt in always: dynamic plus static may pass 48 KiB
            function.max_dynamic_shared_size_bytes = self.spec.shared_memory_bytes
        return module, function

    def _fill(self, index: int) -> None:
        cupy = self.cupy
        generator = cupy.random.default_rng(self.seeds[index])
        for argument in self.spec.arguments:
            if not isinstance(argument, BufferArgument):
                continue
            buffer = self.buffers[argument.name]
            if argument.output:
                buffer.view(cupy.uint8).fill(0xFF)  # NaN for floats, -1 for integers
                continue
            if argument.init == "integers":
                values = generator.integers(0, max(1, int(argument.scale)), size=argument.elements)
                buffer[...] = values.astype(buffer.dtype)
                continue
            if argument.init == "uniform":
                values = generator.random(argument.elements, dtype=cupy.float32) * argument.scale
            else:
                values = generator.standard_normal(argument.elements, dtype=cupy.float32) * argument.scale
            if argument.dtype == "bfloat16":
                buffer[...] = (values.view(cupy.uint32) >> 16).astype(cupy.uint16)
            else:
                buffer[...] = values.astype(buffer.dtype)

    def _encode(self, argument: TensorMapArgument) -> bytes:
        from mirage.codegen.tensor_maps import TensorMapSpec, encode_at

        spec = TensorMapSpec(0, argument.box, argument.swizzle, argument.transposed)
        source = self.buffers[argument.source]
        return encode_at(source.data.ptr, argument.shape, argument.strides, source.itemsize, spec)

    def _arguments(self) -> tuple:
        values = []
        for argument in self.spec.arguments:
            if isinstance(argument, BufferArgument):
                values.append(self.buffers[argument.name])
            elif isinstance(argument, ScalarArgument):
                values.append(_NUMPY_SCALARS[argument.dtype](argument.value))
        return tuple(values)

    def _launcher(self, function):
        """One launch of ``function`` on the current stream: by CuPy, or, for a kernel that takes tensor
        maps by value, through the driver with the maps after the pointers (as the runtime launches)."""
        spec, arguments = self.spec, self._arguments()
        if not self.maps:
            return lambda: function(spec.grid, spec.block, arguments, shared_mem=spec.shared_memory_bytes)
        from mirage.codegen.dependent_launch import PackedLaunch

        packed = self.packed.get(id(function))
        if packed is None:
            packed = self.packed[id(function)] = (function, PackedLaunch(
                function.kernel.ptr, spec.grid, spec.block, spec.shared_memory_bytes, len(arguments),
                len(self.maps), overlap=False))
        pointers = [a.data.ptr for a in arguments]
        stream = self.cupy.cuda.get_current_stream().ptr
        return lambda: packed[1](stream, pointers, self.maps)

    def _run(self, function, count: int = 1) -> None:
        launch = self._launcher(function)
        for _ in range(count):
            launch()
        self.cupy.cuda.runtime.deviceSynchronize()

    def _unwritten(self) -> int:
        """Floating-point output elements still holding the poison (NaN) after the original ran."""
        total = 0
        for output in self.spec.outputs:
            values = self.buffers[output.name]
            if output.dtype == "bfloat16":
                values = (values.astype(self.cupy.uint32) << 16).view(self.cupy.float32)
            if output.dtype in ("float16", "float32", "float64", "bfloat16"):
                total += int(self.cupy.isnan(values).sum())
        return total

    def _matches(self, index: int) -> tuple[bool, str]:
        cupy = self.cupy
        for output, reference in zip(self.spec.outputs, self.references[index], strict=True):
            result = self.buffers[output.name]
            if self.spec.exact:
                same = result.view(cupy.uint8) == reference.view(cupy.uint8)
                if not bool(same.all()):
                    bad = int((~same).sum())
                    return False, (f"output {output.name} differs from the original in {bad} bytes "
                                   f"(set {index})")
            else:
                a, b = result.astype(cupy.float64), reference.astype(cupy.float64)
                if not bool(cupy.allclose(a, b, atol=self.spec.atol, rtol=self.spec.rtol, equal_nan=True)):
                    return False, f"output {output.name} is not close to the original (set {index})"
        return True, ""

    def _time(self, function, launches: int) -> float:
        cupy = self.cupy
        launch = self._launcher(function)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(launches):
            launch()
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) * 1000.0 / launches  # microseconds

    # -- requests ---------------------------------------------------------------------------------

    def calibrate(self, target_round_us: float) -> dict:
        self._run(self.original, 3)
        single = min(self._time(self.original, 1) for _ in range(5))
        self.launches = int(max(1, min(1000, round(target_round_us / max(single, 1e-3)))))
        return {"status": "ok", "original_us": single, "launches_per_round": self.launches,
                "unwritten_outputs": self.unwritten}

    def evaluate(self, cubin: bytes, sets: list[int], rounds: int, tag: str, warmup_rounds: int = 2) -> dict:
        module, candidate = self._load(cubin, tag)
        try:
            return self._evaluate(candidate, sets, rounds, warmup_rounds)
        finally:
            self.packed.pop(id(candidate), None)
            del module

    def _evaluate(self, candidate, sets: list[int], rounds: int, warmup_rounds: int) -> dict:
        for index in sets:
            self._fill(index)
            self._run(candidate)
            same, detail = self._matches(index)
            if not same:
                return {"status": "wrong-output", "detail": detail}
        self._fill(0)
        self._run(self.original)
        same, detail = self._matches(0)
        if not same:
            return {"status": "poisoned", "detail": "the original kernel no longer reproduces its outputs "
                                                    "after this candidate ran: " + detail}
        for _ in range(warmup_rounds):  # bring clocks and caches to a steady state; not counted
            self._time(self.original, self.launches)
            self._time(candidate, self.launches)
        original_times, candidate_times = [], []
        for round_index in range(rounds):
            order = ((self.original, original_times), (candidate, candidate_times))
            for function, times in order if round_index % 2 == 0 else order[::-1]:
                times.append(self._time(function, self.launches))
        return {"status": "ok", "original_us": original_times, "candidate_us": candidate_times}

    def verify(self, cubin: bytes, seeds: list[int]) -> dict:
        """Run original and candidate on fresh inputs, one set at a time (no stored references)."""
        module, candidate = self._load(cubin, "verify")
        saved_seeds, saved_references = self.seeds, self.references
        try:
            for seed in seeds:
                self.seeds = [seed]
                self._fill(0)
                self._run(self.original)
                self.references = [[self.buffers[o.name].copy() for o in self.spec.outputs]]
                self._fill(0)
                self._run(candidate)
                same, detail = self._matches(0)
                if not same:
                    return {"status": "wrong-output", "detail": f"seed {seed}: {detail}"}
        finally:
            self.seeds, self.references = saved_seeds, saved_references
            self.packed.pop(id(candidate), None)
        del module
        return {"status": "ok", "sets": len(seeds)}


def serve(connection) -> None:
    """Entry point of the sandbox process: answer requests until told to stop."""
    session: Session | None = None
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        kind, payload = request
        try:
            if kind == "stop":
                return
            if kind == "setup":
                session = Session(payload["spec"], payload["original"], payload["seeds"])
                reply = session.calibrate(payload["target_round_us"])
            elif kind == "evaluate":
                assert session is not None
                reply = session.evaluate(payload["cubin"], payload["sets"], payload["rounds"], payload["tag"],
                                         payload.get("warmup_rounds", 2))
            elif kind == "verify":
                assert session is not None
                reply = session.verify(payload["cubin"], payload["seeds"])
            elif kind == "ping":
                reply = {"status": "ok", "pid": os.getpid()}
            else:
                reply = {"status": "error", "detail": f"unknown request {kind!r}"}
        except Exception as error:  # noqa: BLE001 - every failure is reported to the parent
            reply = {"status": "error", "detail": f"{type(error).__name__}: {error}",
                     "trace": traceback.format_exc(limit=4)}
        connection.send(reply)
