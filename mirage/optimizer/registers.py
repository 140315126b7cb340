"""Register decisions: epilogues and register-resident matmul accumulators (mirage-notes §5.4).

*Epilogues.*  Mirage runs a chain of element-wise ops on the registers of the op that produced
their input ("epilogue"), and ends a chain with store-and-accumulate.  Here a consumer is applied in
its producer's epilogue, so that the producer's result never goes to shared memory, when

* the consumer is a FUSED thread graph, or an element-wise accumulator (``none`` / ``max`` kind,
  or a ``none`` rescale): each thread can finish the elements it holds;
* the producer is a matmul, a FUSED node, a reduction or rms_norm — not an input iterator, an
  accumulator, a running max or a max reduction (Mirage's exclusions);
* the producer's result has no other reader, is read element for element (a FUSED consumer's
  result has the producer's shape: the value is not broadcast), and both run in the same phase;
* every other operand of the consumer is ready before the producer runs (lower depth or an earlier
  phase), so no barrier is needed inside the chain.

*Prologues.*  A FUSED thread graph of one operand whose only reader is a reduction runs inside the
reduction, on each element it reads (``square`` before a sum of squares): its result never goes to
shared memory, and the reduction reads the FUSED node's operand instead.  Not when the FUSED node
is itself an epilogue (its producer's registers hold it then).

*Register accumulators.*  An element-wise accumulator whose epilogue chain starts at a matmul keeps
its state in registers across the for-loop (``rC += A·B``) and writes it to shared memory once,
after the loop.  Each costs ⌈elements / threads⌉ fp32 registers per thread; they are taken largest
first while the estimate ``base_registers + Σ`` stays within ``register_budget`` (Mirage uses 192).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mirage.mugraph.graph import AccumKind, BlockGraph
from mirage.mugraph.ops import REDUCTIONS, Op
from mirage.optimizer.graphs import single_consumer
from mirage.optimizer.schedule import depth_of, phases

EPILOGUE_PRODUCERS = frozenset({Op.MATMUL, Op.CONCAT_MATMUL, Op.FUSED, Op.RMS_NORM} |
                               (REDUCTIONS - {Op.REDUCTION_MAX}))
MATMULS = frozenset({Op.MATMUL, Op.CONCAT_MATMUL})


@dataclass(frozen=True)
class RegisterOptions:
    epilogues: bool = True  # apply consumers in their producer's epilogue
    prologues: bool = True  # apply one-operand element-wise producers inside the reduction reading them
    register_accumulators: bool = True  # keep matmul accumulators in registers
    register_budget: int = 192  # per-thread registers the estimate may reach
    base_registers: int = 32  # per-thread registers for addresses, loop state and operand fragments


@dataclass(frozen=True)
class RegisterPlan:
    epilogues: tuple[tuple[int, int], ...]  # (consumer, producer)
    accumulators: tuple[int, ...]  # accumulators whose state lives in registers during the loop
    registers_per_thread: int  # the estimate
    budget: int
    prologues: tuple[tuple[int, int], ...] = ()  # (element-wise producer, the reduction it runs in)

    @property
    def register_only(self) -> frozenset[int]:
        """Nodes whose result is never stored to shared memory (it is consumed in registers)."""
        return frozenset(producer for _, producer in self.epilogues) | frozenset(p for p, _ in self.prologues)


def _epilogue_consumer(node) -> bool:
    if node.op is Op.FUSED:
        return True
    if node.op is Op.ACCUM:
        return node.attrs.kind in (AccumKind.NONE, AccumKind.MAX)
    return node.op is Op.ACCUM_RESCALE and node.attrs.kind is AccumKind.NONE


def find_epilogues(graph: BlockGraph, hoist_invariants: bool = True,
                   register_accumulators: frozenset[int] = frozenset(),
                   prologues: frozenset[int] = frozenset()) -> dict[int, int]:
    """consumer → producer for every consumer applied in its producer's epilogue.

    ``register_accumulators`` matter only after the loop (their write-back step shifts depths);
    ``prologues`` run inside their reductions (no epilogue themselves, and they shift depths too).
    """
    phase = phases(graph, hoist_invariants)
    uses = graph.consumers()
    epilogue_of: dict[int, int] = {}
    depth: list[int] = []
    for i, node in enumerate(graph.nodes):
        if _epilogue_consumer(node) and i not in prologues:
            operands = node.inputs if node.op is Op.FUSED else node.inputs[:1]
            for r in operands:
                producer = graph.nodes[r.node]
                if (producer.op in EPILOGUE_PRODUCERS and single_consumer(uses, r) == i
                        and phase[r.node] == phase[i]
                        and producer.outputs[0].shape == node.outputs[0].shape
                        and node.inputs.count(r) == 1
                        and all(o == r or phase[o.node] < phase[i] or depth[o.node] < depth[r.node]
                                for o in node.inputs)):
                    epilogue_of[i] = r.node
                    break
        depth.append(depth_of(graph, i, phase, depth, epilogue_of, register_accumulators, prologues))
    return epilogue_of


PROLOGUE_CONSUMERS = frozenset({Op.REDUCTION, Op.REDUCTION_MAX})


def find_prologues(graph: BlockGraph, epilogue_of: dict[int, int],
                   hoist_invariants: bool = True) -> dict[int, int]:
    """element-wise producer → the reduction it runs in (see the module docstring)."""
    phase = phases(graph, hoist_invariants)
    uses = graph.consumers()
    prologue_of: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.op not in PROLOGUE_CONSUMERS:
            continue
        r = node.inputs[0]
        producer = graph.nodes[r.node]
        if (producer.op is Op.FUSED and len(producer.inputs) == 1 and single_consumer(uses, r) == i
                and phase[r.node] == phase[i] and r.node not in epilogue_of
                and r.node not in epilogue_of.values()):
            prologue_of[r.node] = i
    return prologue_of


def _chain_root(epilogue_of: dict[int, int], i: int) -> int:
    while i in epilogue_of:
        i = epilogue_of[i]
    return i


def plan_registers(graph: BlockGraph, options: RegisterOptions = RegisterOptions(),
                   hoist_invariants: bool = True) -> RegisterPlan:
    """Epilogues and register accumulators of ``graph`` (see the module docstring)."""
    epilogue_of = find_epilogues(graph, hoist_invariants) if options.epilogues else {}
    prologues = find_prologues(graph, epilogue_of, hoist_invariants) if options.prologues else {}
    if prologues and options.epilogues:  # the reductions moved up a level: decide the epilogues again
        epilogue_of = find_epilogues(graph, hoist_invariants, prologues=frozenset(prologues))
    threads = math.prod(graph.block_dim)
    candidates = [i for i, n in enumerate(graph.nodes)
                  if n.op in (Op.ACCUM, Op.ACCUM_RESCALE) and i in epilogue_of
                  and graph.nodes[_chain_root(epilogue_of, i)].op in MATMULS]
    chosen: list[int] = []
    used = options.base_registers
    if options.register_accumulators:
        for i in sorted(candidates, key=lambda i: -graph.nodes[i].outputs[0].numel):
            need = -(-graph.nodes[i].outputs[0].numel // threads)
            if used + need <= options.register_budget:
                chosen.append(i)
                used += need
    if chosen:  # post-loop epilogues must see the write-back steps of the chosen accumulators
        epilogue_of = find_epilogues(graph, hoist_invariants, frozenset(chosen), frozenset(prologues))
    return RegisterPlan(tuple(sorted(epilogue_of.items())), tuple(sorted(chosen)), used,
                        options.register_budget, tuple(sorted(prologues.items())))
