"""What the GPU guard of a subprogram's choice times (``optimize.choose``): the subprogram's own torch
ops, which run where no build is kept, and the copies a kept build adds around its kernels (inputs
that arrive as views the graph does not declare, outputs laid out again for the PyTorch ops after
them). A build is kept only where its time and its copies' beat the torch ops."""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch
import torch.fx as fx

from mirage.frontend.capture import restore_causal
from mirage.frontend.partition import Subprogram
from mirage.frontend.region import eager_strides
from mirage.mugraph.graph import KernelInput, output_view, same_strides


def sample(value: torch.Tensor, device: str) -> torch.Tensor:
    """A random tensor of ``value``'s shape, dtype and strides (a view, or a broadcast of stride 0)."""
    shape, stride = tuple(value.shape), tuple(value.stride())
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0
    if value.dtype.is_floating_point:
        flat = torch.randn(max(extent, 1), dtype=value.dtype, device=device)
    else:
        flat = torch.zeros(max(extent, 1), dtype=value.dtype, device=device)
    return flat.as_strided(shape, stride)


def torch_ops_runner(gm: fx.GraphModule, subprogram: Subprogram, device: str = "cuda"):
    """A function of no arguments that runs ``subprogram``'s own torch ops (what runs where no µGraph
    is kept) on ``device``: the captured nodes copied into a module of their own, whose outside values
    are random tensors of their shapes, dtypes and traced strides drawn once (a head split's view
    stays a view), parameters read from ``gm``."""
    members = set(subprogram.nodes)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    outside: list[fx.Node] = []
    for node in gm.graph.nodes:
        if node.name not in members:
            continue
        for source in node.all_input_nodes:
            if source.name not in members and source not in env:
                if source.op == "get_attr":
                    env[source] = graph.get_attr(source.target)
                else:
                    env[source] = graph.placeholder(f"outside_{len(outside)}")
                    outside.append(source)
        env[node] = graph.node_copy(node, lambda n: env[n])
    results = [env[n] for n in gm.graph.nodes if n.name in members
               and (not n.users or any(u.name not in members for u in n.users))]
    graph.output(tuple(results))
    restore_causal(graph)
    module = fx.GraphModule(gm, graph).to(device)

    inputs = tuple(sample(n.meta["val"], device) for n in outside)
    return lambda: module(*inputs)


def boundary_runner(gm: fx.GraphModule, subprogram: Subprogram, device: str = "cuda",
                    in_place: Collection[int] | None = None) -> Callable | None:
    """A function of no arguments that makes the copies a kept build adds around ``subprogram``'s
    kernels, or None where it adds none: each input that arrives as a view its graph input does not
    declare (no strides, not column-major) bound by a copy, and each output that the PyTorch ops after
    it need in eager's layout where the graph does not write it so (``runtime.restrided``). Inputs
    declared as views count as read in place where ``in_place`` (positions among the graph's inputs:
    those the build reads so, ``optimize.profile_choice``) has them, or always when it is None; the
    others are charged the copy the build makes of them (a split view the chosen kernels cannot read
    in place, a column-major input read row-major)."""
    from mirage.frontend.runtime import restrided

    nodes = {n.name: n for n in gm.graph.nodes}
    graph = subprogram.graph
    copies: list[Callable[[], torch.Tensor]] = []
    for k, binding in enumerate(subprogram.inputs):
        attrs = graph.nodes[graph.input_nodes[k]].attrs
        source = nodes[binding.source]
        value = source.meta.get("val")
        declared = isinstance(attrs, KernelInput) and (attrs.strides or attrs.layout == "col")
        read = declared and (in_place is None or k in in_place)
        if read or source.op == "get_attr" or not isinstance(value, torch.Tensor):
            continue  # read in place, or a parameter's copy kept from call to call
        t = sample(value, device)
        bound = binding.apply(t)
        if not bound.is_contiguous() or (bound.data_ptr() != t.data_ptr() and bound.numel() > 1):
            copies.append(lambda t=t, b=binding: b.apply(t).contiguous())
    for out in subprogram.outputs:
        wanted = eager_strides(nodes[out.node]) if out.expand is None else None
        if wanted is None:
            continue
        kind = graph.output_types[out.index]
        declared = graph.output_stride(out.index)
        written = torch.empty_strided(*output_view(kind.shape, declared), dtype=kind.dtype.torch(),
                                      device=device)
        if not same_strides(out.shape, out.apply(written).stride(), wanted):
            copies.append(lambda w=written, o=out, s=wanted: restrided(o.apply(w), s))
    if not copies:
        return None
    return lambda: [copy() for copy in copies]

