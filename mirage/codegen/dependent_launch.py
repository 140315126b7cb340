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
unchanged; without the attribute (no ``cuda-bindings``, a GPU older than sm_90,
``Program(dependent_launch=False)``) the same kernels launch the ordinary way through CuPy.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

from mirage.errors import MirageError


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


@functools.lru_cache(maxsize=1024)
def _launch_config(function: int, grid: tuple, block: tuple, smem_bytes: int, overlap: bool):
    """The launch config of a kernel's launches (all but the stream, which each launch sets) and its
    ``CUfunction``: built once, since building them costs more host time than the launch itself."""
    from cuda.bindings import driver

    attribute = driver.CUlaunchAttribute()
    attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value.programmaticStreamSerializationAllowed = int(overlap)
    return _config(grid, block, smem_bytes, attribute), driver.CUfunction(function)


def launch(function: int, grid: Sequence[int], block: Sequence[int], smem_bytes: int, stream: int,
           pointers: Sequence[int], by_value: Sequence[bytes] = (), overlap: bool = True) -> None:
    """Launch the kernel ``function`` (a ``CUfunction`` handle) on ``stream`` (a ``CUstream``
    handle) with pointer arguments ``pointers``, then arguments passed by value from the bytes of
    ``by_value`` (tensor maps), allowed to overlap the previous kernel when ``overlap``."""
    from cuda.bindings import driver

    config, handle = _launch_config(function, tuple(grid), tuple(block), int(smem_bytes), bool(overlap))
    config.hStream = driver.CUstream(stream)
    if by_value:  # kernelParams as the driver takes it: an array of pointers to each argument's bytes
        storage = [ctypes.c_uint64(int(p)) for p in pointers]
        storage += [(ctypes.c_uint8 * len(blob)).from_buffer_copy(blob) for blob in by_value]
        array = (ctypes.c_void_p * len(storage))(*(ctypes.addressof(s) for s in storage))
        arguments = ctypes.addressof(array)
    else:
        arguments = (tuple(int(p) for p in pointers), (ctypes.c_void_p,) * len(pointers))
    result = driver.cuLaunchKernelEx(config, handle, arguments, 0)
    error = result[0] if isinstance(result, tuple) else result
    if error != driver.CUresult.CUDA_SUCCESS:
        raise DependentLaunchError(
            f"cuLaunchKernelEx failed with {error!r} (grid {tuple(grid)}, block {tuple(block)}, "
            f"{smem_bytes} bytes of shared memory); Program(dependent_launch=False) launches without it"
        )


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
