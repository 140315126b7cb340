"""Tensor-map inputs: the pipelined input tiles of a warpgroup softmax chain (K and V, stored 128-byte
swizzled for the warpgroup MMAs) copied by the TMA unit instead of by every thread
(``OptimizerOptions.tma_copies``, ``mirage/tma.cuh``). One thread issues a tensor copy per 64 columns
of a tile and the stage's transaction barrier counts its bytes; the threads' copy instructions (a
quarter of the b = 8 attention kernel's instructions) go. The stages' barriers (one 8-byte word per
slot, placed like the multicast slots' two) follow the memory plan; the tensor maps are kernel
parameters that the runtime encodes at each launch (``mirage.codegen.tensor_maps``)."""

from __future__ import annotations

from mirage.mugraph.graph import BlockGraph
from mirage.mugraph.ops import Op
from mirage.mugraph.target import Target
from mirage.optimizer.softmax_chain import SoftmaxChain

MIN_COMPUTE_CAPABILITY = 90
MAX_BOX = 256  # elements along each dim of a TMA box


def tma_inputs(block: BlockGraph, chain: SoftmaxChain | None, target: Target, enabled: bool,
               folds: bool = False) -> frozenset[int]:
    """The inputs of ``block`` copied by tensor maps: none unless ``enabled``, the target is sm_90 and no
    fold turns the kernel into a function of another (``folds``); then the warpgroup chain's swizzled
    tiles that are pipelined over the for-loop, of 16-bit elements, with rows of whole 64-column
    boxes, at most 256 elements along each tile dim and a source whose rows are whole 16 bytes."""
    if (not enabled or folds or chain is None or not chain.warpgroup
            or target.compute_capability < MIN_COMPUTE_CAPABILITY):
        return frozenset()
    return frozenset(i for i in chain.swizzled if _qualifies(block, i))


def _qualifies(block: BlockGraph, i: int) -> bool:
    node = block.nodes[i]
    tile, attrs = node.outputs[0], node.attrs
    if node.op is not Op.INPUT or attrs.forloop_dim < 0 or tile.dtype.itemsize != 2 or tile.shape[-1] % 64:
        return False
    return (all(d <= MAX_BOX for d in tile.shape[:-1])
            and attrs.source.shape[-1] * tile.dtype.itemsize % 16 == 0)
