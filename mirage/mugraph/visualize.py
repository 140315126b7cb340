"""Pictures of µGraphs: DOT always, PNG/SVG through Graphviz's ``dot`` when it is installed.

Kernel, block and thread levels are drawn as nested clusters (green, blue, yellow, as Mirage's
visualizer), each node labelled with its op, attributes and output shape.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from mirage.errors import MirageError
from mirage.mugraph.graph import BlockGraph, KernelGraph, ThreadGraph
from mirage.mugraph.ops import Op
from mirage.mugraph.text import attrs_text, type_text

_COLORS = {"kernel": "#e8f5e9", "block": "#e3f2fd", "thread": "#fffde7"}


def _dot_text(text: str) -> str:
    """``text`` inside a quoted DOT string: quotes and backslashes escaped, line breaks as \\n."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _label(node, with_attrs: bool = True) -> str:
    attrs = "" if isinstance(node.attrs, (BlockGraph, ThreadGraph)) else attrs_text(node.attrs).strip()
    attrs = attrs.replace('name=""', "").replace(" eps=0.0", "").strip()
    shapes = ", ".join(type_text(t) for t in node.outputs)
    parts = [node.op.value] + ([attrs] if with_attrs and attrs else []) + [shapes]
    return "\\n".join(p.replace('"', "'") for p in parts)


def _emit(graph, prefix: str, lines: list[str], indent: str) -> dict[tuple[int, int], str]:
    """Emit the nodes of ``graph``; returns the DOT node id of every tensor (node, output)."""
    ids: dict[tuple[int, int], str] = {}
    for i, node in enumerate(graph.nodes):
        nid = f"{prefix}n{i}"
        inner = node.attrs if isinstance(node.attrs, (BlockGraph, ThreadGraph)) else None
        if inner is not None:
            level = inner.level.value
            title = _label(node).replace("\\n", "  ")
            if isinstance(inner, BlockGraph):
                title = (f"{node.op.value} grid={inner.grid_dim} block={inner.block_dim} "
                         f"forloop={inner.forloop_range}"
                         + (f" spans={inner.spans}" if any(inner.spans) else ""))
            lines.append(f'{indent}subgraph cluster_{nid} {{ label="{title}"; style=filled; '
                         f'fillcolor="{_COLORS[level]}";')
            inner_ids = _emit(inner, nid + "_", lines, indent + "  ")
            lines.append(f"{indent}}}")
            if isinstance(inner, BlockGraph):
                for k, j in enumerate(inner.input_nodes):
                    src = node.inputs[k]
                    lines.append(f"{indent}{ids[(src.node, src.index)]} -> {inner_ids[(j, 0)]};")
                for k, j in enumerate(inner.output_nodes):
                    ids[(i, k)] = inner_ids[(j, 0)]
            else:
                for j, inner_node in enumerate(inner.nodes):
                    if inner_node.op is Op.INPUT:
                        src = node.inputs[inner_node.attrs.index]
                        lines.append(f"{indent}{ids[(src.node, src.index)]} -> {inner_ids[(j, 0)]};")
                out = inner.outputs[0]
                ids[(i, 0)] = inner_ids[(out.node, out.index)]
            continue
        shape = "box" if node.op in (Op.INPUT, Op.OUTPUT) else "ellipse"
        lines.append(f'{indent}{nid} [label="{_label(node)}", shape={shape}];')
        for r in node.inputs:
            lines.append(f"{indent}{ids[(r.node, r.index)]} -> {nid};")
        for j in range(len(node.outputs)):
            ids[(i, j)] = nid
    return ids


def to_dot(graph: KernelGraph) -> str:
    lines = ["digraph mugraph {", "  rankdir=TB; node [fontname=Helvetica, fontsize=10];",
             f'  subgraph cluster_kernel {{ label="kernel graph {_dot_text(graph.name)}"; style=filled; '
             f'fillcolor="{_COLORS["kernel"]}";']
    ids = _emit(graph, "", lines, "    ")
    for k, r in enumerate(graph.outputs):
        lines.append(f'    out{k} [label="output {k}\\n{type_text(graph.type_of(r))}", shape=box];')
        lines.append(f"    {ids[(r.node, r.index)]} -> out{k};")
    lines += ["  }", "}"]
    return "\n".join(lines)


def render(graph: KernelGraph, path: str | Path, format: str | None = None) -> str:
    """Write ``graph`` to ``path`` (.dot, .png, .svg or .pdf); returns the path written."""
    return write_dot(to_dot(graph), path, format)


DRAW_FORMATS = ("dot", "png", "svg", "pdf")


def write_dot(dot: str, path: str | Path, format: str | None = None) -> str:
    """Write DOT text to ``path`` (.dot, .png, .svg or .pdf, through Graphviz); returns the path."""
    path = Path(path)
    format = format or (path.suffix.lstrip(".") or "dot")
    if format not in DRAW_FORMATS:
        raise MirageError(f"cannot draw to {path.name}: unknown format {format!r}; name a file ending in "
                          f"{', '.join('.' + f for f in DRAW_FORMATS)}")
    if format == "dot":
        path.write_text(dot)
        return str(path)
    exe = shutil.which("dot")
    if exe is None:
        raise MirageError(f"drawing {format.upper()} needs Graphviz's `dot` (apt-get install graphviz); "
                          "write a .dot file instead")
    result = subprocess.run([exe, f"-T{format}", "-o", str(path)], input=dot, text=True,
                            capture_output=True, check=False)
    if result.returncode:
        raise MirageError(f"dot failed ({result.returncode}): {result.stderr.strip()}")
    return str(path)
