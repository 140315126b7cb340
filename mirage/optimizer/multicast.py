"""Multicast inputs: a pipelined input tile that every block along a grid axis loads alike (its input
map leaves the axis unmapped, as a weight-streaming GEMV's X along x, or attention's K and V along the
query splits) is read from L2 once per thread-block cluster of ``OptimizerOptions.multicast_cluster``
blocks along that axis, and lands in every block's shared memory (``mirage/multicast.cuh``; sm_90 bulk
copies with ``.multicast::cluster``).

Each such input keeps one slot more than the pipeline's stages, so that a block refilling a slot
finds the other blocks long done with it (they release it after their end-of-iteration barrier) and
does not wait for them; the slots' barriers (two 8-byte words per slot) follow the memory plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from mirage.mugraph.graph import BlockGraph
from mirage.mugraph.target import Target
from mirage.optimizer.cluster_fold import MAX_CLUSTER

MIN_COMPUTE_CAPABILITY = 90  # thread-block clusters and bulk copies


@dataclass(frozen=True)
class Multicast:
    """The inputs of a block graph read once per cluster of ``size`` blocks along grid ``axis``."""

    inputs: frozenset[int] = frozenset()
    axis: int = 0
    size: int = 1

    def __bool__(self) -> bool:
        return bool(self.inputs)

    @property
    def shape(self) -> tuple[int, int, int]:
        """Blocks per cluster along each grid axis (``__cluster_dims__``)."""
        return tuple(self.size if a == self.axis and self.inputs else 1 for a in range(3))  # type: ignore[return-value]


def multicast_inputs(block: BlockGraph, target: Target, cluster: int, one_barrier_loops: bool = False,
                     folds: bool = False, axes: tuple[int, ...] = (0,)) -> Multicast:
    """The inputs of ``block`` to multicast across clusters of ``cluster`` blocks along one grid axis:
    none unless ``cluster`` > 1, the target has clusters, the block graph has a for-loop that ends
    each iteration with a barrier (not ``one_barrier_loops``), and no fold may claim the kernel's
    clusters (``folds``). Along an axis of ``axes`` whose grid size is a multiple of ``cluster``, an input
    qualifies when it is pipelined, its map leaves that axis unmapped (every block along it loads the
    same tile), its rows are whole 16-byte vectors, and it has a row for every block of the cluster
    to copy (a gain vector of one row is not worth a cluster-wide handshake). The axis whose inputs
    have the most bytes per iteration wins (the first on ties): grid x for a GEMV's X, the query
    splits for attention's K and V."""
    if cluster > MAX_CLUSTER:
        raise ValueError(f"multicast_cluster={cluster}: a thread-block cluster has at most {MAX_CLUSTER} "
                         "blocks (2 is what measured fastest; 0 turns multicast off)")
    if (cluster <= 1 or target.compute_capability < MIN_COMPUTE_CAPABILITY or one_barrier_loops or folds
            or block.forloop_range <= 1):
        return Multicast()
    best = Multicast()
    best_bytes = 0
    for axis, grid in enumerate(block.grid_dim):
        if axis not in axes or grid < cluster or grid % cluster:
            continue
        chosen = [i for i in block.input_nodes if _qualifies(block, i, axis, cluster)]
        size = sum(block.nodes[i].outputs[0].nbytes for i in chosen)
        if size > best_bytes:
            best, best_bytes = Multicast(frozenset(chosen), axis, cluster), size
    return best


def _qualifies(block: BlockGraph, i: int, axis: int, cluster: int) -> bool:
    node = block.nodes[i]
    attrs, tile = node.attrs, node.outputs[0]
    if attrs.forloop_dim < 0 or attrs.input_map[axis] != -1:
        return False
    rows = tile.numel // tile.shape[-1]
    return tile.shape[-1] * tile.dtype.itemsize % 16 == 0 and rows >= cluster
