"""``generate_cuda_program``: a µGraph's CUDA source and its launch description.

>>> import mirage as mi
>>> from mirage.codegen import generate_cuda_program
>>> g = mi.new_kernel_graph("scale")
>>> X = g.new_input(dims=(64, 256), dtype=mi.float16)
>>> tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=2)
>>> x = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
>>> tb.new_output(tb.forloop_accum(tb.exp(x), acc="sum"), output_map=(0, -1, -1))
>>> (O,) = g.customized([X], tb)
>>> g.mark_output(O)
>>> program = generate_cuda_program(g, target_cc=90)
>>> [(k.name, k.grid, k.block) for k in program.kernels]
[('scale_k1', (4, 1, 1), (128, 1, 1))]
>>> 'extern "C" __global__ void __launch_bounds__(128) scale_k1(' in program.code
True
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirage.codegen import column_major, early_loads
from mirage.codegen import lower_context as ctx
from mirage.codegen.lower import KernelLowering
from mirage.codegen.lower_context import FoldedKernel, KernelContext
from mirage.codegen.lower_ops import LoweringError, element_type
from mirage.codegen.tensor_maps import SWIZZLE_BYTES, TensorMapSpec
from mirage.mugraph.graph import KernelGraph, KernelInput, Ref, rank4_split, split_dims, split_view
from mirage.mugraph.target import TARGETS, Target, detect_target
from mirage.optimizer.cluster_fold import ClusterFold
from mirage.optimizer.pipeline import OptimizerOptions, PreparedProgram, prepare

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True)
class KernelLaunch:
    """How to launch one generated kernel: ``name<<<grid, block, smem_bytes>>>(outputs..., inputs...)``."""

    name: str
    node: int  # the graph-defined op it implements, in CudaProgram.graph
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int  # dynamic shared memory
    outputs: tuple[Ref, ...]  # kernel-graph tensors written, in argument order
    inputs: tuple[Ref, ...]  # kernel-graph tensors read, in argument order after the outputs
    consumer: int = -1  # a graph-defined op folded into this kernel (cluster fold), or -1
    cluster: tuple[int, int, int] = (1, 1, 1)  # blocks per cluster (compiled into the kernel)
    counter: bool = False  # a counter fold: every block must run at once (at most one per SM)
    tensor_maps: tuple[TensorMapSpec, ...] = ()  # inputs copied by TMA: by-value parameters after the rest

    @property
    def arguments(self) -> tuple[Ref, ...]:
        return self.outputs + self.inputs

    @property
    def nodes(self) -> tuple[int, ...]:
        """The graph-defined ops this kernel runs."""
        return (self.node,) if self.consumer < 0 else (self.node, self.consumer)

    @property
    def cluster_size(self) -> int:
        return math.prod(self.cluster)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "node": self.node,
            "grid": list(self.grid),
            "block": list(self.block),
            "smem_bytes": self.smem_bytes,
            "outputs": [[r.node, r.index] for r in self.outputs],
            "inputs": [[r.node, r.index] for r in self.inputs],
            "consumer": self.consumer,
            "cluster": list(self.cluster),
            "counter": self.counter,
            "tensor_maps": [m.to_dict() for m in self.tensor_maps],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelLaunch:
        return cls(
            d["name"],
            d["node"],
            tuple(d["grid"]),
            tuple(d["block"]),
            d["smem_bytes"],
            tuple(Ref(*r) for r in d["outputs"]),
            tuple(Ref(*r) for r in d["inputs"]),
            d.get("consumer", -1),
            tuple(d.get("cluster", (1, 1, 1))),
            d.get("counter", False),
            tuple(TensorMapSpec.from_dict(m) for m in d.get("tensor_maps", ())),
        )


@dataclass(frozen=True)
class CudaProgram:
    """The generated CUDA of a µGraph: one module, one kernel per graph-defined op of ``graph``.

    ``graph`` is the prepared graph (after the online-softmax rewrite and fusion); its other
    kernel-level ops run through torch.  ``code`` compiles with :mod:`mirage.codegen.compile`.
    """

    graph: KernelGraph
    code: str
    kernels: tuple[KernelLaunch, ...]
    target: Target
    contexts: tuple[KernelContext, ...] = field(default=(), compare=False, repr=False)
    prepared: PreparedProgram | None = field(default=None, compare=False, repr=False)
    # inputs (positions among the graph's) read in place column-major (mirage.codegen.column_major)
    transposed_inputs: tuple[int, ...] = ()
    # inputs with split dims (KernelInput.split_strides) read in place (column_major.split_reads)
    split_inputs: tuple[int, ...] = ()

    @functools.cached_property
    def input_strides(self) -> dict[int, tuple[int, ...]]:
        """Inputs (positions) read in place through the strides they are declared with (a view such
        as a head split: mirage.codegen.column_major), and those strides."""
        return column_major.strided_reads(self.graph, self.transposed_inputs, self.split_inputs)

    @functools.cached_property
    def declared_views(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """Inputs (positions) declared with split dims, and the shape and strides of the view that
        calls pass for each (the split dims as two: :func:`mirage.mugraph.graph.split_view`)."""
        out = {}
        for p, n in enumerate(self.graph.input_nodes):
            attrs = self.graph.nodes[n].attrs
            if isinstance(attrs, KernelInput) and attrs.split_strides:
                out[p] = split_view(self.graph.nodes[n].outputs[0].shape, attrs.strides, attrs.splits())
        return out

    @functools.cached_property
    def input_views(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """:attr:`declared_views` of the inputs read in place so (the others are copied dense)."""
        return {p: v for p, v in self.declared_views.items() if p in self.split_inputs}

    def kernel(self, node: int) -> KernelLaunch:
        """The launch that runs graph-defined op ``node`` (its own kernel, or a cluster fold's)."""
        for k in self.kernels:
            if node in k.nodes:
                return k
        raise KeyError(f"%{node} has no generated kernel")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (graph, code, launches, target) that :meth:`from_dict` reads back."""
        from dataclasses import asdict

        from mirage.mugraph.serialize import graph_to_dict

        return {
            "graph": graph_to_dict(self.graph),
            "code": self.code,
            "kernels": [k.to_dict() for k in self.kernels],
            "target": asdict(self.target),
            "transposed_inputs": list(self.transposed_inputs),
            **({"split_inputs": list(self.split_inputs)} if self.split_inputs else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CudaProgram:
        from mirage.mugraph.serialize import graph_from_dict

        return cls(
            graph_from_dict(d["graph"]),
            d["code"],
            tuple(KernelLaunch.from_dict(k) for k in d["kernels"]),
            Target(**d["target"]),
            transposed_inputs=tuple(d.get("transposed_inputs", ())),
            split_inputs=tuple(d.get("split_inputs", ())),
        )


def target_for(target_cc: int | None = None, target: Target | None = None) -> Target:
    """The target to build for: ``target``, else the known GPU of compute capability ``target_cc``,
    else the current GPU."""
    if target is not None:
        return target
    if target_cc is None:
        return detect_target()
    detected = detect_target()
    if detected.compute_capability == target_cc:
        return detected
    for row in TARGETS.values():
        if row.compute_capability == target_cc:
            return row
    known = sorted({t.compute_capability for t in TARGETS.values()})
    raise LoweringError(
        f"no known GPU has compute capability {target_cc}; use one of {known} or pass a "
        "mirage.mugraph.target.Target"
    )


def cfloat(value: float) -> str:
    """A C++ float literal for ``value`` (shortest round-trip form)."""
    v = float(value)
    if math.isnan(v):
        return "__int_as_float(0x7fc00000)"
    if math.isinf(v):
        return "mirage::gen::negative_infinity()" if v < 0 else "(-mirage::gen::negative_infinity())"
    text = repr(v)
    if "e" not in text and "." not in text and "n" not in text:
        text += ".0"
    return text + "f"


@functools.lru_cache(maxsize=1)
def environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters["cfloat"] = cfloat
    return env


def kernel_prefix(graph: KernelGraph) -> str:
    name = re.sub(r"[^0-9A-Za-z_]", "_", graph.name or "mirage")
    return name if not name[0].isdigit() else f"g_{name}"


def render(units: tuple[KernelContext | FoldedKernel, ...], graph_name: str, graph_hash: str,
           target: Target) -> str:
    template = environment().get_template("kernel.j2")
    contexts = [c for u in units for c in ((u.producer, u.consumer) if isinstance(u, FoldedKernel) else (u,))]
    return template.render(
        units=units, contexts=contexts, graph_name=graph_name, graph_hash=graph_hash[:16], target=target.arch
    )


def _lower_kernel(prepared: PreparedProgram, kernel, name: str, accumulator: str,
                  transposed: frozenset[int] = frozenset()) -> KernelContext:
    options = prepared.options
    return KernelLowering(kernel, name, accumulator, prepared.target.smem_per_block,
                          options.two_blocks_per_sm, options.l2_prefetch_iterations,
                          options.register_row_sums, options.fold_operand_scale,
                          options.direct_output_stores, options.one_barrier_loops,
                          options.stagger_shared_loads, options.tma_release, options.heavy_first,
                          options.evict_first_streams, options.producer_warp,
                          options.softmax_output_stores, transposed,
                          _output_strides(prepared.graph, kernel.node)).context()


def _output_strides(graph: KernelGraph, node: int) -> tuple[tuple[int, ...] | None, ...]:
    """Per output of graph-defined op ``node``, the rank-4 strides (leading dims of one element added)
    it is written with where it is a program output declared so (``KernelGraph.strided_writes``), else
    None (row-major); where it has split dims, followed by their rank-4 outer strides and inner sizes
    (``dev::Strides``'s ``outer`` and ``inner``, 0 where a dim is not split)."""
    declared = graph.strided_writes()
    out = []
    for j, t in enumerate(graph.nodes[node].outputs):
        entry = declared.get(Ref(node, j), ())
        if not entry:
            out.append(None)
            continue
        rank = len(t.shape)
        strides = (entry[0] * t.shape[0],) * (4 - rank) + tuple(entry[:rank])
        splits = split_dims(entry[rank:])
        out.append(strides + (sum(rank4_split(splits, rank), ()) if splits else ()))
    return tuple(out)


def _folded(graph: KernelGraph, fold: ClusterFold, name: str, producer: KernelContext,
            consumer: KernelContext) -> tuple[FoldedKernel, KernelLaunch]:
    """The kernel and launch of a cluster fold: one argument per tensor, the producer's results that
    the consumer reads passed once and not ``__restrict__``."""
    pnode, cnode = graph.nodes[fold.producer], graph.nodes[fold.consumer]
    produced = tuple(Ref(fold.producer, j) for j in range(len(pnode.outputs)))
    outputs = produced + tuple(Ref(fold.consumer, j) for j in range(len(cnode.outputs)))
    inputs = tuple(dict.fromkeys(r for r in pnode.inputs + cnode.inputs if r not in produced))
    shared = set(produced) & set(cnode.inputs)
    arguments = outputs + inputs
    names = {r: f"arg{n}" for n, r in enumerate(arguments)}
    parameters = tuple(
        ctx.Parameter(names[r], element_type(graph.type_of(r).dtype, "a kernel argument"), r in outputs,
                      restrict=r not in shared)
        for r in arguments
    )
    consumer_refs = tuple(Ref(fold.consumer, j) for j in range(len(cnode.outputs))) + cnode.inputs
    consumer_parameters = tuple(dataclasses.replace(p, restrict=r not in shared)
                                for p, r in zip(consumer.parameters, consumer_refs, strict=True))
    grid = producer.grid
    unit = FoldedKernel(
        name=name, producer=producer, consumer=consumer, consumer_parameters=consumer_parameters,
        parameters=parameters,
        producer_arguments=tuple(names[r] for r in produced + pnode.inputs),
        consumer_arguments=tuple(names[r] for r in consumer_refs),
        cluster=fold.cluster, clusters=tuple(g // c for g, c in zip(grid, fold.cluster, strict=True)),
        rounds=fold.rounds, table=fold.table(), smem_bytes=max(producer.smem_bytes, consumer.smem_bytes),
        counter=fold.counter,
    )
    launch = KernelLaunch(name, fold.producer, grid, (producer.threads, 1, 1), unit.smem_bytes, outputs,
                          inputs, consumer=fold.consumer,
                          cluster=(1, 1, 1) if fold.counter else fold.cluster, counter=fold.counter)
    return unit, launch


def lower_program(prepared: PreparedProgram) -> CudaProgram:
    """The CUDA program of an optimized µGraph (see :func:`generate_cuda_program`)."""
    graph = prepared.graph
    prefix = kernel_prefix(graph)
    accumulator = element_type(prepared.options.accumulator_dtype, "the accumulator dtype")
    transposed_inputs, transposed = column_major.transposed_reads(prepared)
    positions = {n: p for p, n in enumerate(graph.input_nodes)}
    kernel_inputs = {k.node: [positions.get(ref.node, -1) for ref in graph.nodes[k.node].inputs]
                     for k in prepared.kernels}
    lowered = {k.node: _lower_kernel(prepared, k, f"{prefix}_k{k.node}", accumulator,
                                     transposed.get(k.node, frozenset())) for k in prepared.kernels}
    split_inputs = column_major.split_reads(graph, lowered, kernel_inputs)
    strides = column_major.strided_reads(graph, transposed_inputs, split_inputs)
    splits = {p: graph.nodes[graph.input_nodes[p]].attrs.splits() for p in split_inputs}
    contexts = early_loads.with_early_loads(prepared, {
        node: column_major.with_strides(context, kernel_inputs[node], strides, splits)
        for node, context in lowered.items()})
    units: list[KernelContext | FoldedKernel] = []
    launches = []
    for kernel in prepared.kernels:
        context = contexts[kernel.node]
        fold = prepared.fold_of(kernel.node)
        if fold is not None:
            if fold.producer == kernel.node:
                unit, launch = _folded(graph, fold, f"{prefix}_k{fold.producer}_k{fold.consumer}", context,
                                       contexts[fold.consumer])
                units.append(unit)
                launches.append(launch)
            continue
        node = graph.nodes[kernel.node]
        units.append(context)
        launches.append(
            KernelLaunch(
                context.name,
                kernel.node,
                kernel.grid_dim,
                (context.launch_threads, 1, 1),
                context.smem_bytes,
                tuple(Ref(kernel.node, j) for j in range(len(node.outputs))),
                node.inputs,
                cluster=context.cluster_shape,
                tensor_maps=tuple(_tensor_map(kernel, it) for it in context.tma),
            )
        )
    code = render(tuple(units), graph.name or "graph", graph.content_hash(), prepared.target)
    return CudaProgram(graph, code, tuple(launches), prepared.target, tuple(contexts.values()), prepared,
                       transposed_inputs, split_inputs)


def _tensor_map(kernel, it: ctx.InputIteratorContext) -> TensorMapSpec:
    """Input ``it`` of ``kernel`` copied by TMA: boxes of its tile's dims as stored (a tile read in place
    is stored transposed), 64 16-bit columns wide."""
    box = (*it.tile.layout.dims[:3], SWIZZLE_BYTES // 2)
    return TensorMapSpec(int(it.parameter.removeprefix("input")), box, transposed=it.view is not None)


def generate_cuda_program(
    graph,
    target_cc: int | None = 90,
    *,
    target: Target | None = None,
    options: OptimizerOptions | None = None,
) -> CudaProgram:
    """Optimize ``graph`` (a kernel graph or builder) for the GPU of compute capability ``target_cc``
    and generate its CUDA: the source and how to launch each kernel (Mirage's function of that name).

    Raises :class:`~mirage.errors.SharedMemoryError` when a block graph does not fit the target's
    shared memory, and :class:`LoweringError` when some op has no lowering.
    """
    if target_cc is not None:
        if not isinstance(target_cc, numbers.Integral) or isinstance(target_cc, bool):
            known = sorted({t.compute_capability for t in TARGETS.values()})
            raise LoweringError(f"target_cc must be an int such as 90 (for sm_90), got {target_cc!r} "
                                f"({type(target_cc).__name__}); use one of {known}")
        target_cc = int(target_cc)
    if target is not None and not isinstance(target, Target):
        raise LoweringError(f"target must be a mirage.mugraph.target.Target, got {type(target).__name__}")
    if options is not None and not isinstance(options, OptimizerOptions):
        from mirage.optimizer.errors import OptimizerError

        raise OptimizerError(f"options must be a mirage.optimizer.OptimizerOptions, got "
                             f"{type(options).__name__}; pass options=mirage.optimizer.OptimizerOptions("
                             "...), e.g. OptimizerOptions(**settings) for a dict of settings")
    resolved = target_for(target_cc, target)
    prepared = prepare(graph, resolved, options or OptimizerOptions())
    return lower_program(prepared)
