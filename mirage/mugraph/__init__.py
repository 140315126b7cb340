"""The µGraph IR: dtypes, op registry, graphs, builder, checks, text form, JSON, interpreter."""

from mirage.mugraph.builder import (
    DTensor,
    KNGraph,
    STensor,
    TBGraph,
    as_graph,
    new_kernel_graph,
    new_threadblock_graph,
)
from mirage.mugraph.check import check
from mirage.mugraph.dtypes import DType, bfloat16, float16, float32, float64
from mirage.mugraph.graph import (
    Accum,
    AccumKind,
    BlockGraph,
    InputIterator,
    KernelGraph,
    Node,
    OutputSaver,
    Ref,
    TensorType,
    ThreadGraph,
)
from mirage.mugraph.interpret import Interpreter, interpret
from mirage.mugraph.ops import REGISTRY, Op
from mirage.mugraph.serialize import content_hash, load
from mirage.mugraph.text import parse, to_text

__all__ = [
    "Accum", "AccumKind", "BlockGraph", "DTensor", "DType", "InputIterator", "Interpreter", "KNGraph",
    "KernelGraph", "Node", "Op", "OutputSaver", "REGISTRY", "Ref", "STensor", "TBGraph", "TensorType",
    "ThreadGraph", "as_graph", "bfloat16", "check", "content_hash", "float16", "float32", "float64",
    "interpret", "load", "new_kernel_graph", "new_threadblock_graph", "parse", "to_text",
]
