"""The readable text form of graphs, and its parser (``parse(to_text(g)) == g``).

Example (the fused RMSNorm + MatMul µGraph)::

    kernel_graph "rmsnorm" {
      %0 = input() name="X" : f16[2,4096]
      %1 = input() name="W" : f16[4096,6144]
      %2 = customized(%0, %1) grid_dim=(64,1,1) block_dim=(128,1,1) forloop_range=64 reduction_dimx=64 {
        %0 = input() source=f16[2,4096] input_map=(-1,-1,-1) forloop_dim=1 : f16[2,64]
        %1 = input() source=f16[4096,6144] input_map=(1,-1,-1) forloop_dim=0 : f16[64,96]
        %2 = accum(%0) kind=rms eps=0.0 : f16[2,1]!
        ...
      } : f16[2,6144]
      return %2
    }

``%i`` is the first output of node i, ``%i.j`` its j-th; a trailing ``!`` marks a tensor past the
for-loop accumulators; ``/col`` a column-major layout.  Names are written as JSON string literals
(quotes, backslashes and control characters escaped), so that every name reads back unchanged.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from typing import Any

from mirage.errors import ParseError
from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import (
    OMITTED_AT_DEFAULT,
    BlockGraph,
    KernelGraph,
    Layout,
    Node,
    Ref,
    TensorType,
    ThreadGraph,
)
from mirage.mugraph.ops import ATTRS_TYPES, Op, spec

# ---- printing -------------------------------------------------------------------------------------


def type_text(t: TensorType) -> str:
    text = f"{t.dtype.short}[{','.join(map(str, t.shape))}]"
    if t.layout is not Layout.ROW_MAJOR:
        text += f"/{t.layout.value}"
    return text + ("!" if t.after_accum else "")


# characters that str.splitlines() breaks lines at and json.dumps(ensure_ascii=False) leaves as they
# are, and lone surrogates (not encodable as UTF-8): written as \uXXXX escapes too
_UNSAFE = re.compile("[\x85\u2028\u2029\ud800-\udfff]")


def quote(value: str) -> str:
    """``value`` as a one-line JSON string literal (``"a\\"b"``); :func:`unquote` reads it back."""
    text = json.dumps(value, ensure_ascii=False)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def unquote(literal: str) -> str:
    """The string a literal written by :func:`quote` stands for."""
    try:
        value = json.loads(literal)
    except ValueError as error:
        raise ParseError(f"cannot read string {literal}: {error.args[0] if error.args else error}; "
                         'write names as JSON strings, escaping " as \\" and \\ as \\\\') from None
    if not isinstance(value, str):
        raise ParseError(f"cannot read string {literal}")
    return value


def ref_text(r: Ref) -> str:
    return f"%{r.node}" + (f".{r.index}" if r.index else "")


def _value_text(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ",".join(_value_text(v) for v in value) + ")"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, TensorType):
        return type_text(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def attrs_text(attrs: Any) -> str:
    if attrs is None or isinstance(attrs, (BlockGraph, ThreadGraph)):
        if isinstance(attrs, BlockGraph):
            return (f" grid_dim={_value_text(attrs.grid_dim)} block_dim={_value_text(attrs.block_dim)}"
                    f" forloop_range={attrs.forloop_range} reduction_dimx={attrs.reduction_dimx}"
                    + (f" spans={_value_text(attrs.spans)}" if any(attrs.spans) else ""))
        return ""
    parts = [f"{f.name}={_value_text(getattr(attrs, f.name))}" for f in dataclasses.fields(attrs)
             if f.name not in OMITTED_AT_DEFAULT or getattr(attrs, f.name) != f.default]
    return (" " + " ".join(parts)) if parts else ""


def _types_text(types: tuple[TensorType, ...]) -> str:
    if len(types) == 1:
        return type_text(types[0])
    return "(" + ", ".join(type_text(t) for t in types) + ")"


def node_lines(index: int, node: Node, indent: str) -> list[str]:
    args = ", ".join(ref_text(r) for r in node.inputs)
    head = f"{indent}%{index} = {node.op.value}({args}){attrs_text(node.attrs)}"
    if isinstance(node.attrs, (BlockGraph, ThreadGraph)):
        lines = [head + " {"]
        lines += body_lines(node.attrs, indent + "  ")
        lines.append(f"{indent}}} : {_types_text(node.outputs)}")
        return lines
    return [f"{head} : {_types_text(node.outputs)}"]


def body_lines(graph, indent: str) -> list[str]:
    lines: list[str] = []
    for i, node in enumerate(graph.nodes):
        lines += node_lines(i, node, indent)
    if isinstance(graph, KernelGraph) and graph.output_strides:
        lines.append(f"{indent}output_strides " + "; ".join(
            "(" + ",".join(map(str, s)) + ")" for s in graph.output_strides))
    if isinstance(graph, (KernelGraph, ThreadGraph)):
        lines.append(f"{indent}return " + ", ".join(ref_text(r) for r in graph.outputs))
    return lines


def to_text(graph) -> str:
    if isinstance(graph, KernelGraph):
        name = f" {quote(graph.name)}" if graph.name else ""
        return "\n".join([f"kernel_graph{name} {{", *body_lines(graph, "  "), "}"])
    if isinstance(graph, BlockGraph):
        lines = node_lines(0, Node(Op.CUSTOMIZED, (), graph, graph.result_types), "")
        return "\n".join(["block_graph" + lines[0].split("customized()", 1)[1], *lines[1:]])
    return "\n".join(["thread_graph {", *body_lines(graph, "  "), "}"])


def context_lines(graph, node_index: int | None, extra_line: str | None = None, radius: int = 3) -> str:
    """The text-form lines around node ``node_index`` (or the end), marking the culprit."""
    lines = body_lines(graph, "  ")
    if isinstance(graph, (KernelGraph, ThreadGraph)):
        lines = lines[:-1]  # the return line
    starts = []
    for i, line in enumerate(lines):
        if re.match(r"^  %\d+ = ", line):
            starts.append(i)
    if node_index is None or node_index >= len(starts):
        shown = lines[-radius:] + ([extra_line] if extra_line else [])
    else:
        at = starts[node_index]
        lo = max(0, at - radius)
        shown = lines[lo:at] + [lines[at] + "   <-- here"] + lines[at + 1:at + 1 + radius]
    return "\n".join(shown)


# ---- parsing --------------------------------------------------------------------------------------

_TYPE = re.compile(r"^(?P<dtype>[a-z0-9]+)\[(?P<shape>[0-9,]*)\](?:/(?P<layout>row|col))?(?P<acc>!?)$")
_NODE = re.compile(r"^%(?P<index>\d+) = (?P<op>\w+)\((?P<args>[^)]*)\)(?P<attrs>.*?)"
                   r"(?: : (?P<types>.+?))?(?P<open> \{)?$")
_ATTR = re.compile(r'(\w+)=("[^"]*"|\([^)]*\)|\S+)')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _mask_strings(line: str) -> tuple[str, list[str]]:
    """``line`` with each string literal replaced by ``"k"`` (its index), and the strings decoded.

    Names may hold any character (``:``, ``{``, ``)``, ``=``, spaces...), so the line's structure is
    read with them masked out.
    """
    strings: list[str] = []

    def keep(m: re.Match) -> str:
        strings.append(unquote(m[0]))
        return f'"{len(strings) - 1}"'

    masked = _STRING.sub(keep, line)
    return masked, strings


def parse_type(text: str) -> TensorType:
    m = _TYPE.match(text.strip())
    if not m:
        raise ParseError(f"cannot read tensor type {text!r} (expected e.g. f16[2,4096])")
    shape = tuple(int(s) for s in m["shape"].split(",") if s)
    layout = Layout(m["layout"]) if m["layout"] else Layout.ROW_MAJOR
    return TensorType(shape, DType.parse(m["dtype"]), bool(m["acc"]), layout)


def _parse_types(text: str) -> tuple[TensorType, ...]:
    text = text.strip()
    if text.startswith("("):
        return tuple(parse_type(t) for t in text[1:-1].split(", "))
    return (parse_type(text),)


def _parse_ref(text: str) -> Ref:
    m = re.match(r"^%(\d+)(?:\.(\d+))?$", text.strip())
    if not m:
        raise ParseError(f"cannot read tensor reference {text!r} (expected %3 or %3.1)")
    return Ref(int(m[1]), int(m[2] or 0))


def _parse_value(text: str, kind: Any, strings: list[str] | None = None) -> Any:
    if text.startswith('"') and strings is not None:
        if kind not in (str, "str"):
            raise ParseError(f"expected a {getattr(kind, '__name__', kind)}, got a string")
        return strings[int(text[1:-1])]
    if kind in (TensorType, "TensorType"):
        return parse_type(text)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind.parse(text) if hasattr(kind, "parse") else kind(text)
    if text.startswith('"'):
        return text[1:-1]
    if text.startswith("("):
        return tuple(int(v) for v in text[1:-1].split(",") if v)
    if kind in (float, "float"):
        return float(text)
    return int(text)


_ATTRS_BY_FIELDS = {tuple(f.name for f in dataclasses.fields(c)): c for c in ATTRS_TYPES}


def _parse_attrs(op: Op, text: str, strings: list[str] | None = None) -> Any:
    pairs = dict(_ATTR.findall(text))
    row = spec(op)
    cls = row.attrs_type
    if op is Op.INPUT:
        cls = next((c for names, c in _ATTRS_BY_FIELDS.items()
                    if set(names) - OMITTED_AT_DEFAULT <= set(pairs) <= set(names)), None)
        if cls is None and not pairs:
            return None
    if cls is None:
        if pairs:
            raise ParseError(f"op {op.value} takes no attributes, got {sorted(pairs)}")
        return None
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in pairs.items():
        if key not in hints:
            raise ParseError(f"op {op.value} has no attribute {key!r}")
        kind = hints[key]
        kind = {"int": int, "float": float, "str": str, "TensorType": TensorType, "Dim3": tuple,
                "AccumKind": _accum_kind()}.get(kind, kind) if isinstance(kind, str) else kind
        kwargs[key] = _parse_value(value, kind, strings)
    return cls(**kwargs)


def _accum_kind():
    from mirage.mugraph.graph import AccumKind

    return AccumKind


def parse(text: str):
    """Parse the text form of a kernel, block or thread graph."""
    if not isinstance(text, str):
        raise ParseError(f"mi.parse takes a graph's text form (a str, such as str(g)), got "
                         f"{type(text).__name__}; to read a JSON file use mi.load(path)")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    try:
        graph, end = _parse_graph(lines, 0)
    except ParseError:
        raise
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise ParseError(f"malformed graph text: {error}") from None
    if end != len(lines):
        raise ParseError(f"unexpected text after the graph: {lines[end]!r}")
    return graph


def _parse_graph(lines: list[str], at: int):
    header = lines[at]
    if header.startswith("kernel_graph"):
        masked, strings = _mask_strings(header)
        m = re.match(r'^kernel_graph(?: "(\d+)")? \{$', masked)
        if not m:
            raise ParseError(f"bad header {header!r} (expected kernel_graph \"name\" {{)")
        strides: list[tuple[int, ...]] = []
        nodes, outputs, end = _parse_body(lines, at + 1, strides=strides)
        return KernelGraph(tuple(nodes), tuple(outputs), strings[int(m[1])] if m[1] else "",
                           tuple(strides)), end
    if header.startswith("block_graph"):
        block = _block_header(header)
        nodes, _, end = _parse_body(lines, at + 1, closing=True)
        return dataclasses.replace(block, nodes=tuple(nodes)), end
    if header.startswith("thread_graph"):
        nodes, outputs, end = _parse_body(lines, at + 1)
        return ThreadGraph(tuple(nodes), tuple(outputs)), end
    raise ParseError(f"expected kernel_graph, block_graph or thread_graph, got {header!r}")


def _block_header(text: str) -> BlockGraph:
    pairs = dict(_ATTR.findall(text))
    return BlockGraph((), _parse_value(pairs["grid_dim"], tuple), _parse_value(pairs["block_dim"], tuple),
                      int(pairs["forloop_range"]), int(pairs["reduction_dimx"]),
                      _parse_value(pairs["spans"], tuple) if "spans" in pairs else (0, 0, 0))


def _parse_body(lines: list[str], at: int, closing: bool = False, strides: list | None = None):
    """Nodes, outputs and the line after the body; a kernel graph's ``output_strides`` line goes into
    ``strides``."""
    nodes: list[Node] = []
    outputs: list[Ref] = []
    while at < len(lines):
        line = lines[at]
        if line.startswith("output_strides") and strides is not None:
            strides += [tuple(int(v) for v in part.strip().strip("()").split(",") if v.strip())
                        for part in line[len("output_strides"):].split(";")]
            at += 1
            continue
        if line.startswith("return"):
            rest = line[len("return"):].strip()
            outputs = [_parse_ref(r) for r in rest.split(",") if r.strip()]
            at += 1
            if at >= len(lines) or not lines[at].startswith("}"):
                raise ParseError("expected '}' after return")
            return nodes, outputs, at + 1
        if line.startswith("}"):
            if not closing:
                raise ParseError("graph ends without a return line")
            return nodes, outputs, at + 1
        masked, strings = _mask_strings(line)
        m = _NODE.match(masked)
        if not m:
            raise ParseError(f"cannot read line {line!r}")
        if int(m["index"]) != len(nodes):
            raise ParseError(f"node %{m['index']} is out of order (expected %{len(nodes)})")
        op = spec(m["op"]).op
        inputs = tuple(_parse_ref(a) for a in m["args"].split(",") if a.strip())
        if m["open"]:
            inner, end = _parse_nested(op, m["attrs"], lines, at + 1)
            types = _parse_types(lines[end - 1].split(":", 1)[1]) if ":" in lines[end - 1] else ()
            nodes.append(Node(op, inputs, inner, types))
            at = end
            continue
        if m["types"] is None:
            raise ParseError(f"line {line!r} gives no output type (it ends in ' : f16[4,8]' or the like)")
        nodes.append(Node(op, inputs, _parse_attrs(op, m["attrs"], strings), _parse_types(m["types"])))
        at += 1
    raise ParseError("unexpected end of text (missing '}')")


def _parse_nested(op: Op, attrs: str, lines: list[str], at: int):
    if op is Op.CUSTOMIZED:
        block = _block_header(attrs)
        nodes, _, end = _parse_body(lines, at, closing=True)
        return dataclasses.replace(block, nodes=tuple(nodes)), end
    if op is Op.FUSED:
        nodes, outputs, end = _parse_body(lines, at, closing=False)
        # the closing line of a fused node is "} : type"; _parse_body consumed "}" only if bare
        return ThreadGraph(tuple(nodes), tuple(outputs)), end
    raise ParseError(f"op {op.value} has no nested graph")
