"""Pictures of partitions: the captured torch graph with each subprogram as a coloured cluster.

Ops left in PyTorch are grey (compute ops with a notice have a red border); inputs and parameters
are boxes.  ``render`` writes DOT, or PNG/SVG/PDF through Graphviz's ``dot`` when it is installed.
"""

from __future__ import annotations

from pathlib import Path

import torch.fx as fx

from mirage.frontend.partition import Partition

_PALETTE = ["#c8e6c9", "#bbdefb", "#ffe0b2", "#e1bee7", "#fff9c4", "#b2dfdb", "#f8bbd0", "#d7ccc8"]


def _label(node: fx.Node) -> str:
    target = node.target
    if not isinstance(target, str):
        target = getattr(target, "__name__", str(target))
    shape = ""
    dims = getattr(node.meta.get("val"), "shape", None)
    if dims is not None:
        shape = "\\n" + str(list(dims))
    return f"{node.name}\\n{target}{shape}".replace('"', "'")


def partition_dot(graph: fx.Graph, part: Partition) -> str:
    """DOT text of ``graph`` (the captured graph) with the subprograms of ``part`` as clusters."""
    members = {name: s for s in part.subprograms for name in s.nodes}
    left = {op.node for op in part.pytorch_ops}
    lines = ["digraph partition {", "  rankdir=TB; node [fontname=Helvetica, fontsize=10];"]
    drawn: set[str] = set()
    for k, s in enumerate(part.subprograms):
        colour = _PALETTE[k % len(_PALETTE)]
        softmax = " (online softmax)" if s.online_softmax else ""
        title = f"{s.name}: {s.num_ops} kernel-graph ops{softmax}"
        lines.append(f'  subgraph cluster_{s.name} {{ label="{title}"; style=filled; fillcolor="{colour}";')
        for node in graph.nodes:
            if node.name in s.nodes:
                lines.append(f'    "{node.name}" [label="{_label(node)}", style=filled, fillcolor=white];')
                drawn.add(node.name)
        lines.append("  }")
    for node in graph.nodes:
        if node.name in drawn or node.op == "call_module":
            continue
        if node.op in ("placeholder", "get_attr", "output"):
            lines.append(f'  "{node.name}" [label="{_label(node)}", shape=box];')
        elif node.name in left:
            lines.append(f'  "{node.name}" [label="{_label(node)}", style=filled, fillcolor="#eeeeee", '
                         'color=red, penwidth=2];')
        else:
            lines.append(f'  "{node.name}" [label="{_label(node)}", style=filled, fillcolor="#eeeeee"];')
        drawn.add(node.name)
    for node in graph.nodes:
        for source in node.all_input_nodes:
            if source.name in drawn and node.name in drawn:
                owner = members.get(source.name)
                inside = owner is not None and owner is members.get(node.name)
                style = "" if inside else " [style=dashed]"
                lines.append(f'  "{source.name}" -> "{node.name}"{style};')
    lines.append("}")
    return "\n".join(lines)


def render(dot: str, path: str | Path, format: str | None = None) -> str:
    """Write DOT text to ``path`` (.dot, .png, .svg or .pdf); returns the path written."""
    from mirage.mugraph.visualize import write_dot

    return write_dot(dot, path, format)
