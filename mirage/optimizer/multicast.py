"""Multicast inputs: a pipelined input tile that every block along grid x loads alike (its input map
leaves x unmapped, as a weight-streaming GEMV's X) is read from L2 once per thread-block cluster of
``OptimizerOptions.multicast_cluster`` blocks along x, and lands in every block's shared memory
(``mirage/multicast.cuh``; sm_90 bulk copies with ``.multicast::cluster``).

Each such input keeps one slot more than the pipeline's stages, so that a block refilling a slot
finds the other blocks long done with it (they release it after their end-of-iteration barrier) and
does not wait for them; the slots' barriers (two 8-byte words per slot) follow the memory plan.
"""

from __future__ import annotations

from mirage.mugraph.graph import BlockGraph
from mirage.mugraph.target import Target

MIN_COMPUTE_CAPABILITY = 90  # thread-block clusters and bulk copies
BARRIER_BYTES_PER_SLOT = 16  # a slot's `full` and `empty` barriers


def multicast_inputs(block: BlockGraph, target: Target, cluster: int, one_barrier_loops: bool = False,
                     folds: bool = False) -> frozenset[int]:
    """The input nodes of ``block`` to multicast across clusters of ``cluster`` blocks along grid x:
    none unless ``cluster`` > 1, the target has clusters, the loop ends each iteration with a barrier
    (not ``one_barrier_loops``), no fold may claim the kernel's clusters (``folds``), and grid x is a
    multiple of ``cluster``; then the pipelined inputs whose map leaves grid x unmapped, whose rows
    are whole 16-byte vectors, and that have a row for every block of the cluster to copy (a gain
    vector of one row is not worth a cluster-wide handshake)."""
    grid_x = block.grid_dim[0]
    if (cluster <= 1 or target.compute_capability < MIN_COMPUTE_CAPABILITY or one_barrier_loops or folds
            or grid_x < cluster or grid_x % cluster or block.forloop_range <= 1):
        return frozenset()
    chosen = set()
    for i in block.input_nodes:
        node = block.nodes[i]
        attrs, tile = node.attrs, node.outputs[0]
        if attrs.forloop_dim < 0 or attrs.input_map[0] != -1:
            continue
        rows = tile.numel // tile.shape[-1]
        if tile.shape[-1] * tile.dtype.itemsize % 16 == 0 and rows >= cluster:
            chosen.add(i)
    return frozenset(chosen)
