"""Cluster folds: a graph-defined op run at the end of the kernel that produces its inputs.

A split kernel (split-KV attention, split-K matmul) writes partial results that a second
graph-defined op combines.  Two kernels cost a launch, a drain and a fill, and the second waits for
every block of the first.  But each block of the combine reads the partials of only a few producer
blocks: in split-KV attention, those of its query rows' key splits.  When those sets are the same
boxes of the producer's grid for every consumer block (a *cluster*: ``(1, kv_splits, 1)`` there),
one kernel can do both:

1. every block runs the producer's block graph and stores its partials to device memory;
2. the blocks of each cluster meet at a cluster barrier (release / acquire: the partials are
   visible to every block of the cluster after it);
3. each block runs some of the consumer blocks whose inputs its cluster wrote (block rank ``r`` of
   a cluster of ``c`` runs the cluster's consumer blocks ``r, r + c, ...``).

The partials still go through device memory (L2, since they were just written), but the second
launch and the wait for the whole first grid are gone: a cluster combines as soon as its own blocks
are done.  A cluster of one block needs only a block barrier.  Clusters of up to 8 blocks are
portable; sm_90 runs up to 16 when the kernel allows it.

:func:`find_folds` decides from the µGraph alone, so the generated kernel is the same for every
input: the dependency sets are computed from the input and output maps, block by block.

*Counter folds* (``counter=True``) keep the groups and the table but not the cluster: the blocks of
a group meet at a counter in device memory (each block adds one and waits until the group's blocks
have all added theirs; ``mirage/fold.cuh``).  No cluster constrains where the blocks run and a group
may have any number of them, but every block must be running while any of them waits: the
producer's grid may have at most as many blocks as the GPU has SMs (one wave, whatever the
occupancy).  The counter counts up across launches, so it never needs a reset.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from mirage.mugraph.graph import BlockGraph, InputIterator, KernelGraph, OutputSaver, Ref
from mirage.mugraph.ops import Op

PORTABLE_CLUSTER = 8  # blocks per cluster every sm_90 launch accepts
MAX_CLUSTER = 16  # with the non-portable cluster size allowed (sm_90)


@dataclass(frozen=True)
class ClusterFold:
    """The consumer graph-defined op runs inside the producer's kernel (module docstring)."""

    producer: int  # kernel-graph node of the first graph-defined op
    consumer: int  # ... and of the one folded into it
    cluster: tuple[int, int, int]  # producer blocks per cluster, per grid axis
    blocks: tuple[tuple[int, ...], ...]  # per cluster (linear index): its consumer blocks (linear)
    counter: bool = False  # the cluster's blocks meet at a counter in device memory, not a cluster barrier

    @property
    def cluster_size(self) -> int:
        return math.prod(self.cluster)

    @property
    def rounds(self) -> int:
        """Consumer blocks each producer block runs at most."""
        return max(-(-len(b) // self.cluster_size) for b in self.blocks)

    def table(self) -> tuple[tuple[int, ...], ...]:
        """Per cluster, ``rounds · cluster_size`` consumer block indices, -1 where none: slot
        ``round · cluster_size + rank`` is what block ``rank`` runs in that round."""
        width = self.rounds * self.cluster_size
        return tuple(b + (-1,) * (width - len(b)) for b in self.blocks)


def _ranges(shape: tuple[int, ...], dim_map: tuple[int, int, int], grid: tuple[int, int, int],
            block: tuple[int, int, int]) -> tuple[range, ...]:
    """The index range of each tensor dim that ``block`` touches over all its iterations."""
    out = []
    for d, extent in enumerate(shape):
        axes = [a for a in range(3) if dim_map[a] == d]
        if not axes:
            out.append(range(0, extent))
            continue
        (a,) = axes
        size = extent // grid[a]
        out.append(range(block[a] * size, (block[a] + 1) * size))
    return tuple(out)


def _overlap(a: tuple[range, ...], b: tuple[range, ...]) -> bool:
    return all(x.start < y.stop and y.start < x.stop for x, y in zip(a, b, strict=True))


def _blocks(grid: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """Blocks in linear order (x fastest), as ``blockIdx`` numbers them."""
    return [(x, y, z) for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0]))]


def _linear(block: tuple[int, ...], grid: tuple[int, ...]) -> int:
    return block[0] + grid[0] * (block[1] + grid[1] * block[2])


def dependencies(graph: KernelGraph, producer: int, consumer: int) -> dict[tuple[int, int, int], frozenset]:
    """For each consumer block, the producer blocks whose saved tiles its input tiles overlap."""
    pg: BlockGraph = graph.nodes[producer].attrs
    cg: BlockGraph = graph.nodes[consumer].attrs
    savers = {Ref(producer, j): pg.nodes[i].attrs for j, i in enumerate(pg.output_nodes)}
    reads = []  # (tensor shape, consumer input map, producer output map)
    for ref, i in zip(graph.nodes[consumer].inputs, cg.input_nodes, strict=True):
        if ref in savers:
            iterator: InputIterator = cg.nodes[i].attrs
            saver: OutputSaver = savers[ref]
            reads.append((graph.type_of(ref).shape, iterator.input_map, saver.output_map))
    producer_blocks = _blocks(pg.grid_dim)
    out = {}
    for block in _blocks(cg.grid_dim):
        needed = set()
        for shape, imap, omap in reads:
            tile = _ranges(shape, imap, cg.grid_dim, block)
            needed.update(p for p in producer_blocks if _overlap(tile, _ranges(shape, omap, pg.grid_dim, p)))
        out[block] = frozenset(needed)
    return out


def _as_cluster(needed: frozenset, grid: tuple[int, int, int]
                ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(first block, extent) when ``needed`` is a full box of the grid, else None."""
    if not needed:
        return None
    low = tuple(min(b[a] for b in needed) for a in range(3))
    high = tuple(max(b[a] for b in needed) for a in range(3))
    extent = tuple(h - lo + 1 for lo, h in zip(low, high, strict=True))
    if len(needed) != math.prod(extent):
        return None
    return low, extent


def fold(graph: KernelGraph, producer: int, consumer: int, max_cluster: int = MAX_CLUSTER,
         max_rounds: int = 2, sm_count: int | None = None) -> ClusterFold | str:
    """The fold of ``consumer`` into ``producer``, or why there is none: a cluster fold, or with
    ``sm_count`` (the GPU's SMs) a counter fold (module docstring)."""
    pnode, cnode = graph.nodes[producer], graph.nodes[consumer]
    pg: BlockGraph = pnode.attrs
    cg: BlockGraph = cnode.attrs
    if pg.block_dim != cg.block_dim:
        return f"block sizes differ ({pg.block_dim[0]} and {cg.block_dim[0]} threads)"
    if any(n.op in (Op.MATMUL, Op.CONCAT_MATMUL) for n in cg.nodes):
        return "the consumer multiplies matrices: it is not light beside the producer"
    if not any(r.node == producer for r in cnode.inputs):
        return "the consumer reads nothing the producer writes"
    late = [r for r in cnode.inputs if r.node != producer and r.node > producer]
    if late:
        return f"the consumer also reads %{late[0].node}, computed after the producer"
    if sm_count is not None and pg.num_blocks > sm_count:
        return (f"the producer's {pg.num_blocks} blocks are more than the {sm_count} SMs: they would not "
                "all run at once, and a counter fold's blocks wait for each other")
    if pg.num_blocks * cg.num_blocks > 1 << 22:
        return f"grids of {pg.num_blocks} and {cg.num_blocks} blocks: too many pairs to check"
    cluster = None
    groups: dict[int, list[int]] = {}
    for block, needed in dependencies(graph, producer, consumer).items():
        box = _as_cluster(needed, pg.grid_dim)
        if box is None:
            return f"consumer block {block} reads producer blocks that do not form a box of the grid"
        low, extent = box
        if cluster is None:
            cluster = extent
        if extent != cluster or any(lo % c for lo, c in zip(low, cluster, strict=True)):
            return "consumer blocks read boxes of different shapes or alignments"
        index = _linear(tuple(lo // c for lo, c in zip(low, cluster, strict=True)),
                        tuple(g // c for g, c in zip(pg.grid_dim, cluster, strict=True)))
        groups.setdefault(index, []).append(_linear(block, cg.grid_dim))
    assert cluster is not None
    if any(g % c for g, c in zip(pg.grid_dim, cluster, strict=True)):
        return f"clusters of {cluster} do not tile the grid {pg.grid_dim}"
    size = math.prod(cluster)
    if sm_count is None and size > max_cluster:
        return f"clusters of {size} blocks (at most {max_cluster})"
    count = math.prod(g // c for g, c in zip(pg.grid_dim, cluster, strict=True))
    blocks = tuple(tuple(groups.get(i, ())) for i in range(count))
    result = ClusterFold(producer, consumer, tuple(cluster), blocks, counter=sm_count is not None)
    if result.rounds > max_rounds:
        return f"each block would run {result.rounds} consumer blocks (at most {max_rounds})"
    return result


def find_folds(graph: KernelGraph, max_cluster: int = MAX_CLUSTER,
               sm_count: int | None = None) -> tuple[ClusterFold, ...]:
    """Folds of light graph-defined ops (no matmul) into the one before them, each op in at most
    one fold, the last pairs first (a combine at the end of a program folds into its producer).
    With ``sm_count``: counter folds, on a GPU of that many SMs."""
    customized = [i for i, n in enumerate(graph.nodes) if n.op is Op.CUSTOMIZED]
    used: set[int] = set()
    out = []
    for producer, consumer in reversed(list(itertools.pairwise(customized))):
        if producer in used or consumer in used:
            continue
        result = fold(graph, producer, consumer, max_cluster, sm_count=sm_count)
        if isinstance(result, ClusterFold):
            out.append(result)
            used.update((producer, consumer))
    return tuple(reversed(out))
