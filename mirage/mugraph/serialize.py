"""JSON save/load and the stable content hash of graphs.

The JSON form is the canonical one: the content hash is the SHA-256 of it, so equal graphs hash
equally in every process and on every machine (Python's own ``hash`` is salted per process).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from pathlib import Path
from typing import Any

from mirage.errors import MirageError, SerializationError
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
from mirage.mugraph.ops import ATTRS_TYPES, Op

FORMAT = "mirage.mugraph"
VERSION = 1
_ATTRS = {c.__name__: c for c in ATTRS_TYPES}


def _type(t: TensorType) -> dict:
    return {"shape": list(t.shape), "dtype": t.dtype.value, "after_accum": t.after_accum,
            "layout": t.layout.value}


def _untype(d: dict) -> TensorType:
    shape = d["shape"]
    if not isinstance(shape, list) or not shape or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise SerializationError(f"a tensor's shape must be a list of positive integers, got {shape!r}")
    return TensorType(tuple(shape), DType(d["dtype"]), bool(d["after_accum"]), Layout(d["layout"]))


def _value(v: Any) -> Any:
    if isinstance(v, TensorType):
        return {"tensor": _type(v)}
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, tuple):
        return list(v)
    return v


def _attrs(a: Any) -> Any:
    if a is None:
        return None
    if isinstance(a, (KernelGraph, BlockGraph, ThreadGraph)):
        return graph_to_dict(a)
    fields = {f.name: _value(getattr(a, f.name)) for f in dataclasses.fields(a)
              if f.name not in OMITTED_AT_DEFAULT or getattr(a, f.name) != f.default}
    return {"type": type(a).__name__, **fields}



def _unattrs(d: Any) -> Any:
    if d is None:
        return None
    if "level" in d:
        return graph_from_dict(d)
    cls = _ATTRS[d["type"]]
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in d and f.default is not dataclasses.MISSING:
            continue  # a field newer than the file: its default
        v = d[f.name]
        if isinstance(v, dict) and "tensor" in v:
            v = _untype(v["tensor"])
        elif isinstance(v, list):
            v = tuple(v)
        elif f.name == "kind":
            from mirage.mugraph.graph import AccumKind

            v = AccumKind(v)
        kwargs[f.name] = v
    return cls(**kwargs)


def graph_to_dict(g) -> dict:
    out: dict[str, Any] = {"level": g.level.value}
    if isinstance(g, BlockGraph):
        out.update(grid_dim=list(g.grid_dim), block_dim=list(g.block_dim),
                   forloop_range=g.forloop_range, reduction_dimx=g.reduction_dimx)
        if any(g.spans):  # absent on even grids: those graphs hash as before
            out["spans"] = list(g.spans)
    out["nodes"] = [{"op": n.op.value, "inputs": [[r.node, r.index] for r in n.inputs],
                     "attrs": _attrs(n.attrs), "outputs": [_type(t) for t in n.outputs]} for n in g.nodes]
    if isinstance(g, (KernelGraph, ThreadGraph)):
        out["outputs"] = [[r.node, r.index] for r in g.outputs]
    if isinstance(g, KernelGraph):
        out["name"] = g.name
        if g.output_strides:  # absent where every output is row-major: those graphs hash as before
            out["output_strides"] = [list(s) for s in g.output_strides]
    return out


def graph_from_dict(d: dict):
    nodes = tuple(Node(Op(n["op"]), tuple(Ref(*r) for r in n["inputs"]), _unattrs(n["attrs"]),
                       tuple(_untype(t) for t in n["outputs"])) for n in d["nodes"])
    level = d["level"]
    if level == "kernel":
        return KernelGraph(nodes, tuple(Ref(*r) for r in d["outputs"]), d.get("name", ""),
                           tuple(tuple(s) for s in d.get("output_strides", ())))
    if level == "block":
        return BlockGraph(nodes, tuple(d["grid_dim"]), tuple(d["block_dim"]), d["forloop_range"],
                          d["reduction_dimx"], tuple(d.get("spans", (0, 0, 0))))
    return ThreadGraph(nodes, tuple(Ref(*r) for r in d["outputs"]))


def dumps(graph) -> str:
    return json.dumps({"format": FORMAT, "version": VERSION, "graph": graph_to_dict(graph)},
                      sort_keys=True, separators=(",", ":"))


def loads(text: str):
    """Parse and check a saved graph; corrupt input raises SerializationError."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise SerializationError(f"not a mirage graph file (a JSON {type(doc).__name__}, not an object); "
                                     "pass a file written by g.to_json(path)")
        if doc.get("format") != FORMAT:
            raise SerializationError(f"not a mirage graph file (format {doc.get('format')!r})")
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise SerializationError(f"the graph file's version must be the integer {VERSION}, got "
                                     f"{version!r} ({type(version).__name__}); write \"version\": "
                                     f"{VERSION} or re-save the graph")
        if version != VERSION:
            raise SerializationError(f"graph file version {version} is not supported "
                                     f"(this mirage reads version {VERSION}); re-save it")
        graph = graph_from_dict(doc["graph"])
    except SerializationError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise SerializationError(f"corrupt graph file: {type(error).__name__}: {error}") from None
    from mirage.errors import GraphError
    from mirage.mugraph.check import check

    try:
        check(graph)
    except GraphError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:  # edited by hand
        raise SerializationError(f"corrupt graph file: {type(error).__name__}: {error}") from None
    return graph


def save(graph, path: str | Path | None = None) -> str:
    text = dumps(graph)
    if path is not None:
        Path(path).write_text(text)
    return text


def load(path: str | Path):
    """Load a graph saved with ``g.to_json(path)``."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise MirageError(f"cannot read graph file {path}: {error.strerror}") from None
    try:
        return loads(text)
    except SerializationError as error:
        raise SerializationError(f"{path}: {error}") from None


def content_hash(graph) -> str:
    return hashlib.sha256(dumps(graph).encode()).hexdigest()
