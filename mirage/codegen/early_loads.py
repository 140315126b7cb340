"""Early loads of program inputs across a dependent launch (``OptimizerOptions.early_input_loads``).

Under programmatic dependent launch (:mod:`mirage.codegen.dependent_launch`) a kernel may start while
the kernel before it still runs, and it touches no global memory before ``griddepcontrol.wait``.  A
program's inputs, though, are written by no kernel of the program: a later kernel may copy the first
pipeline stages of such an input (a GEMV's weight behind a normalization kernel) before its wait, so
that the weight stream runs during the kernel before it instead of after it.

That is safe only against the kernels of the program.  A kernel that the *caller* launched before the
program may still be writing that input, and a kernel may launch as soon as the one before it signals
(``launch_dependents``), which every kernel does first thing.  So the kernel before an early reader
signals only after its own wait has returned: by then everything launched before it has completed, the
caller's writes included.

The stages must not share shared memory with any tile of the steps before the loop, which the early
copies would overwrite: only kernels whose memory plan starts the stages' lifetimes at the kernel's
start qualify.  The cp.async copies issued early join the prologue's first commit group,
whose wait then covers them; the prologue still commits one group per stage, so the loop's waits count
as before.
"""

from __future__ import annotations

import dataclasses

from mirage.codegen import lower_context as ctx
from mirage.codegen.lower_ops import vector_copies
from mirage.mugraph.ops import Op
from mirage.optimizer.memory import timeline
from mirage.optimizer.schedule import Phase


def with_early_loads(prepared, contexts: dict[int, ctx.KernelContext]) -> dict[int, ctx.KernelContext]:
    """``contexts`` (kernel node → context, in launch order) with early loads where they apply."""
    kernels = list(prepared.kernels)
    if not prepared.options.early_input_loads or any(prepared.fold_of(k.node) for k in kernels):
        return contexts
    graph = prepared.graph
    out = dict(contexts)
    for before, kernel in zip(kernels, kernels[1:], strict=False):
        program_inputs = {f"input{j}" for j, ref in enumerate(graph.nodes[kernel.node].inputs)
                          if graph.nodes[ref.node].op is Op.INPUT}
        context = out[kernel.node]
        early = tuple(it for it in context.pipelined if it.parameter in program_inputs and _copied(it))
        if not early or context.causal_bound or context.stages < 2 or not _stages_live_from_start(kernel):
            continue
        out[kernel.node] = dataclasses.replace(
            context, early_loads=early,
            pre_loop=_without(context.pre_loop, early), loop=_without(context.loop, early),
            post_loop=_without(context.post_loop, early))
        out[before.node] = dataclasses.replace(out[before.node], signal_after_wait=True)
    return out


def _stages_live_from_start(kernel) -> bool:
    """No tile of the steps before the loop shares shared memory with the pipeline's stages: the
    memory plan starts the stages' lifetimes at the first pre-loop level (``early_prologue``), or the
    kernel has no pre-loop steps. Otherwise a pre-loop tile may sit where an early copy lands."""
    _, _, spans = timeline(kernel.schedule)
    return kernel.memory.early_prologue or Phase.PRE_LOOP not in spans


def _copied(it: ctx.InputIteratorContext) -> bool:
    """The input's stages are filled by cp.async copies alone (16-byte vectors), not by the TMA unit,
    a cluster's multicast, or loads staged through registers and stored at a later call."""
    plain = not (it.tma or it.multicast > 1 or it.direct or it.generated or it.staggered or it.late)
    return plain and vector_copies(it.tile)


def _without(steps: tuple, early: tuple[ctx.InputIteratorContext, ...]) -> tuple:
    """``steps`` with the prologue no longer copying ``early``'s first stages (it still commits one
    group per stage)."""
    return tuple(dataclasses.replace(s, iterators=tuple(i for i in s.iterators if i not in early))
                 if isinstance(s, ctx.PrologueStep) else s for s in steps)
