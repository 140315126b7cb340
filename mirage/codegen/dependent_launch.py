"""Kernel launches with programmatic dependent launch (PDL), through the CUDA driver's
``cuLaunchKernelEx`` (the ``cuda-bindings`` package), and the driver calls that thread-block clusters
need (the non-portable cluster size, the occupancy of clusters).

A kernel launched with the programmatic stream serialization attribute may start while the kernel
before it in the stream is still running: its blocks take SM slots as the previous kernel's blocks
finish, and its first global memory access waits (``griddepcontrol.wait``) until the previous kernel
has completed and its writes are visible.  Every generated kernel also lets the next one launch as
soon as all its own blocks have started (``griddepcontrol.launch_dependents``; the device library's
``launch_dependent_grids``).  What this saves is the gap between two kernels of a program (or of two
consecutive calls): the launch of the next grid overlaps the tail of the previous one.  Results are
unchanged.  Launches go through the driver (:class:`PackedLaunch`, with the attribute off for
``Program(dependent_launch=False)``) wherever the device can take it; without ``cuda-bindings`` or on a
GPU older than sm_90 the same kernels launch the ordinary way through CuPy.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Sequence

from mirage.errors import MirageError

MAP_BYTES = 128  # a CUtensorMap


class DependentLaunchError(MirageError):
    """The driver refused a kernel launch."""


@functools.cache
def available(device_index: int) -> bool:
    """Whether launches on this device can carry the attribute (sm_90 or newer, cuda-bindings)."""
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return False
    import torch

    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def _config(grid: Sequence[int], block: Sequence[int], smem_bytes: int, attribute):
    """A ``CUlaunchConfig`` of this grid, block and dynamic shared memory, with one launch attribute."""
    from cuda.bindings import driver

    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = (int(g) for g in grid)
    config.blockDimX, config.blockDimY, config.blockDimZ = (int(b) for b in block)
    config.sharedMemBytes = int(smem_bytes)
    config.attrs = [attribute]
    config.numAttrs = 1
    return config


class PackedLaunch:
    """The launches of one kernel through ``cuLaunchKernelEx``, with the config and the argument array
    built once (building them costs more host time than the launch itself): a launch writes its
    pointers and tensor maps into the array, names the stream and calls the driver.

    ``function`` is the kernel's ``CUfunction`` handle; it takes ``pointers`` pointer arguments, then
    ``maps`` tensor maps by value; ``overlap`` allows each launch to overlap the kernel before it."""

    def __init__(self, function: int, grid: Sequence[int], block: Sequence[int], smem_bytes: int,
                 pointers: int, maps: int = 0, overlap: bool = True) -> None:
        from cuda.bindings import driver

        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = int(overlap)
        self.describe = f"grid {tuple(grid)}, block {tuple(block)}, {smem_bytes} bytes of shared memory"
        self.overlap = overlap
        self._driver = driver
        self._config = _config(grid, block, smem_bytes, attribute)
        self._handle = driver.CUfunction(function)
        self._stream: int | None = None
        self._pointers = (ctypes.c_uint64 * pointers)()
        self._maps = [(ctypes.c_uint8 * MAP_BYTES)() for _ in range(maps)]
        self._last_maps: list[bytes | None] = [None] * maps
        base = ctypes.addressof(self._pointers)
        slots = [base + 8 * k for k in range(pointers)] + [ctypes.addressof(m) for m in self._maps]
        self._array = (ctypes.c_void_p * max(len(slots), 1))(*slots)
        self._arguments = ctypes.addressof(self._array)
        self._lock = threading.Lock()  # the array is shared: one launch at a time writes and reads it

    def __call__(self, stream: int, pointers: Sequence[int], maps: Sequence[bytes] = ()) -> None:
        """Launch on ``stream`` (a ``CUstream`` handle) with these pointers and tensor maps."""
        driver = self._driver
        with self._lock:
            if stream != self._stream:
                self._config.hStream = driver.CUstream(stream)
                self._stream = stream
            self._pointers[:] = pointers
            for k, blob in enumerate(maps):
                if blob is not self._last_maps[k]:  # encodings are cached: the same object, the same map
                    ctypes.memmove(self._maps[k], blob, MAP_BYTES)
                    self._last_maps[k] = blob
            result = driver.cuLaunchKernelEx(self._config, self._handle, self._arguments, 0)
        error = result[0] if isinstance(result, tuple) else result
        if error != driver.CUresult.CUDA_SUCCESS:
            hint = "; Program(dependent_launch=False) launches without the overlap" if self.overlap else ""
            raise DependentLaunchError(f"cuLaunchKernelEx failed with {error!r} ({self.describe}){hint}")


def allow_large_clusters(function: int) -> None:
    """Let the kernel ``function`` (a ``CUfunction`` handle) run clusters of more than 8 blocks
    (sm_90 allows 16 as a non-portable size; the cluster dims are compiled into the kernel)."""
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise DependentLaunchError(
            "clusters of more than 8 blocks need the cuda-bindings package; or build with "
            "OptimizerOptions(max_cluster=8)"
        ) from error
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    result = driver.cuFuncSetAttribute(driver.CUfunction(function), attribute, 1)
    error = result[0] if isinstance(result, tuple) else result
    if error != driver.CUresult.CUDA_SUCCESS:
        raise DependentLaunchError(
            f"cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) failed with {error!r}"
        )


def max_active_clusters(function: int, grid: Sequence[int], block: Sequence[int], smem_bytes: int,
                        cluster: Sequence[int]) -> int:
    """How many clusters of the kernel ``function`` the GPU runs at once (a grid of more runs its
    clusters in waves): the driver's occupancy calculator, given the launch."""
    from cuda.bindings import driver

    attribute = driver.CUlaunchAttribute()
    attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    dims = attribute.value.clusterDim
    dims.x, dims.y, dims.z = (int(c) for c in cluster)
    config = _config(grid, block, smem_bytes, attribute)
    error, active = driver.cuOccupancyMaxActiveClusters(driver.CUfunction(function), config)
    if error != driver.CUresult.CUDA_SUCCESS:
        raise DependentLaunchError(f"cuOccupancyMaxActiveClusters failed with {error!r}")
    return int(active)
