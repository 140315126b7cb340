"""The search space: a frozen, hashable, JSON-serializable record of everything the search may try.

A :class:`SearchSpace` names the op choices at each level (an :class:`OpChoice` is an op with its
typed attributes, e.g. ``accum(kind=rms)``), the candidate grid dims, block dims, input maps, output
maps, for-loop dims and ranges, and the structural budgets.  Its :meth:`~SearchSpace.content_hash`
is part of every cache key (result cache, checkpoints).

Defaults follow Mirage's ``GeneratorConfig::get_default_config`` (mirage-notes §4.2); the named
configs ``"mlp"``, ``"attention"`` and ``"lora"`` adjust them as Mirage's ``config=`` strings do.
Deviations, all documented in ``docs/search.md``:

* Ops of the reference program (with their attributes: scalar values, epsilons, reduction dims)
  are added to the op sets, so that a reference that scales or subtracts can be matched exactly.
* Budgets count input ops as Mirage does (``max_kernel_ops=5`` allows two ops on three inputs).
* Every override *replaces* the default candidates (Mirage adds user grid dims and omaps to its
  defaults); this is what lets a user restrict the space.

>>> space = SearchSpace.named("attention")
>>> space.max_graph_defined, space.imaps[:2]
(2, ((0, -1, 1), (0, 1, -1)))
>>> SearchSpace.from_json(space.to_json()) == space
True
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from mirage.errors import MirageError
from mirage.mugraph.graph import (
    Accum,
    AccumKind,
    BlockGraph,
    Clamp,
    Dim3,
    KernelGraph,
    Level,
    Reduce,
    RmsNorm,
    Scalar,
)
from mirage.mugraph.ops import REGISTRY, Op


class SearchSpaceError(MirageError):
    """A search-space option is unknown or has a value the search cannot use."""


_ATTRS_TYPES = {cls.__name__: cls for cls in (Accum, Clamp, Reduce, RmsNorm, Scalar)}


@dataclass(frozen=True, order=False)
class OpChoice:
    """One op the search may add: an :class:`~mirage.mugraph.ops.Op` and its typed attributes."""

    op: Op
    attrs: Accum | Clamp | Reduce | RmsNorm | Scalar | None = None

    def __str__(self) -> str:
        if self.attrs is None:
            return self.op.value
        fields = ",".join(
            f"{f.name}={_plain(getattr(self.attrs, f.name))}" for f in dataclasses.fields(self.attrs)
        )
        return f"{self.op.value}({fields})"

    def to_json(self) -> dict[str, Any]:
        if self.attrs is None:
            return {"op": self.op.value}
        fields = {f.name: _plain(getattr(self.attrs, f.name)) for f in dataclasses.fields(self.attrs)}
        return {"op": self.op.value, "attrs": {"type": type(self.attrs).__name__, **fields}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OpChoice:
        attrs = data.get("attrs")
        if attrs is None:
            return cls(Op(data["op"]))
        kind = _ATTRS_TYPES[attrs["type"]]
        values = {k: v for k, v in attrs.items() if k != "type"}
        if "kind" in values:
            values["kind"] = AccumKind(values["kind"])
        return cls(Op(data["op"]), kind(**values))


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, AccumKind) else value


def accum(kind: AccumKind, eps: float = 0.0) -> OpChoice:
    return OpChoice(Op.ACCUM, Accum(kind, eps))


def plain(*ops: Op) -> tuple[OpChoice, ...]:
    return tuple(OpChoice(op) for op in ops)


# Mirage's knop_to_explore without CLAMP (its bounds come from the reference) and POW (not an op here).
MIRAGE_KERNEL_OPS = plain(
    Op.MATMUL, Op.EXP, Op.SQUARE, Op.SQRT, Op.SILU, Op.GELU, Op.RELU, Op.ADD, Op.MUL, Op.DIV
)
# Mirage's tbop_to_explore (the rms ops get the reference's epsilon, see ``resolve``).
MIRAGE_BLOCK_OPS = MIRAGE_KERNEL_OPS + (
    OpChoice(Op.RMS_NORM, RmsNorm()),
    accum(AccumKind.NONE),
    accum(AccumKind.SUM),
    accum(AccumKind.RMS),
)
DEFAULT_IMAPS: tuple[Dim3, ...] = (
    (0, -1, 1),
    (0, 1, -1),
    (0, 2, -1),
    (-1, 1, -1),
    (-1, -1, -1),
    (1, -1, -1),
    (0, -1, -1),
)
ATTENTION_IMAPS: tuple[Dim3, ...] = DEFAULT_IMAPS[:4]
DEFAULT_OMAPS: tuple[Dim3, ...] = (
    (0, 1, -1),
    (0, 2, 1),
    (0, 2, -1),
    (0, -1, -1),
    (-1, 2, 1),
    (-1, 1, -1),
    (-1, 2, -1),
    (-1, -1, -1),
    (1, -1, -1),
)


@dataclass(frozen=True)
class SearchSpace:
    """Everything the search may try.  ``None`` for ``grid_dims`` means Mirage's generated grids."""

    config: str = "mlp"
    kernel_ops: tuple[OpChoice, ...] = MIRAGE_KERNEL_OPS
    block_ops: tuple[OpChoice, ...] = MIRAGE_BLOCK_OPS
    grid_dims: tuple[Dim3, ...] | None = None
    # per grid of ``grid_dims``, its spans (BlockGraph.spans: the dim sizes its axes split unevenly);
    # None: every grid divides its dims
    grid_spans: tuple[Dim3, ...] | None = None
    attention_grids: bool = False  # add Mirage's 2-D grids {batch, dim/y, 1} and {batch, 16, 4}
    # also split dims that no split of the lists divides (no multiple of 8: ViT's 197 tokens) into
    # ceil(dim / split) blocks, the last tile overlapping (BlockGraph.spans; dims.uneven_grid_candidates)
    uneven_grids: bool = True
    block_dims: tuple[Dim3, ...] = ((128, 1, 1),)
    imaps: tuple[Dim3, ...] = DEFAULT_IMAPS
    omaps: tuple[Dim3, ...] = DEFAULT_OMAPS
    fmaps: tuple[int, ...] = (-1, 0, 1, 2)
    imap_combos: tuple[tuple[Dim3, ...], ...] | None = None  # fixed per-input combinations (Mirage's
    fmap_combos: tuple[tuple[int, ...], ...] | None = None  # imap_comb_to_explore); None: products
    franges: tuple[int, ...] = (4, 16, 64)
    reduction_dimx: int = 64  # where the space has the strided accumulator, the reference's head dim
    max_kernel_ops: int = 5  # kernel-graph ops, input ops included (Mirage's count)
    max_block_ops: int = 9  # block-graph ops, input iterators included, output savers not
    max_graph_defined: int = 1  # graph-defined kernels per µGraph
    max_block_outputs: int = 2
    min_grid_blocks: int = 32  # Mirage's filter of its generated 1-D grids
    max_grid_blocks: int = 4096
    shared_memory_bytes: int = 96 * 1024  # Mirage's search-time limit (MAX_SMEM_SIZE)
    device_memory_bytes: int = 2 << 30  # Mirage's device-memory accounting limit
    block_matmul_batch_one: bool = True  # block matmuls need leading dims of 1 (as Mirage's)
    add_reference_ops: bool = True  # also explore the reference's own ops (see ``resolve``)
    graph_defined_first: bool = True  # try graph-defined ops before pre-defined ones (same result set)
    guided_order: bool = True  # visit first the children likely to complete a µGraph (same result set)
    complete_first: bool = True  # close bodies that complete the µGraph before those of its header
    # that need more kernels (same result set; see explore.Explorer.run_header)
    order: str = "complete"  # canonical order: "complete", or "mirage" (Mirage's lexicographic Order)

    def __post_init__(self) -> None:
        # accept the same spellings as overrides (lists, op names) when built directly
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list) or (
                f.name in ("kernel_ops", "block_ops") and any(not isinstance(c, OpChoice) for c in value)
            ):
                object.__setattr__(self, f.name, _normalize(f.name, value))

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def named(cls, config: str | None = None, **overrides: Any) -> SearchSpace:
        """The space of a named config (``None`` is ``"mlp"``), with overrides applied."""
        name = config or "mlp"
        if name not in CONFIGS:
            raise SearchSpaceError(f"unknown search config {config!r}; use one of {sorted(CONFIGS)}")
        space = CONFIGS[name]
        return space.with_overrides(**overrides) if overrides else space

    def with_overrides(self, **overrides: Any) -> SearchSpace:
        """A copy with options replaced; Mirage's option names (``griddims``...) are accepted too."""
        values: dict[str, Any] = {}
        fields = {f.name for f in dataclasses.fields(self)}
        for key, value in overrides.items():
            name = ALIASES.get(key, key)
            if name not in fields:
                known = sorted(fields | set(ALIASES))
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise SearchSpaceError(f"unknown search-space option {key!r}{hint}; known options: {known}")
            values[name] = _normalize(name, value)
        return dataclasses.replace(self, **values)

    def resolve(self, reference: KernelGraph) -> SearchSpace:
        """Add the reference's ops (with their attributes), give rms ops the reference's epsilon and,
        where the space has the strided accumulator, the reduction_dimx of the reference's output."""
        space = self._with_head_dim(reference)
        if not space.add_reference_ops:
            return space
        return space._with_reference_ops(reference)

    def _with_head_dim(self, reference: KernelGraph) -> SearchSpace:
        """The strided accumulator (``sum_todimx``) sums a row of partial results, one per key split,
        into ``reduction_dimx`` columns: the combine of split attention, right only where that is the
        head dim. Mirage fixes it at 64 (its benchmarks' head dim); a space left at 64 takes the last
        dim of the reference's first output instead (a head dim of 32 or 128)."""
        strided = any(isinstance(c.attrs, Accum) and c.attrs.kind is AccumKind.SUM_TODIMX
                      for c in self.block_ops)
        if not strided or self.reduction_dimx != 64 or not reference.outputs:
            return self
        head_dim = reference.type_of(reference.outputs[0]).shape[-1]
        return self if head_dim == 64 else dataclasses.replace(self, reduction_dimx=head_dim)

    def _with_reference_ops(self, reference: KernelGraph) -> SearchSpace:
        kernel_ops, block_ops = list(self.kernel_ops), list(self.block_ops)
        epsilons = sorted(
            {
                choice.attrs.eps
                for choice in reference_ops(reference)
                if isinstance(choice.attrs, (RmsNorm, Accum)) and choice.attrs.eps
            }
        )
        if epsilons:
            block_ops = [c for choice in block_ops for c in _with_eps(choice, epsilons)]
        for choice in reference_ops(reference):
            levels = REGISTRY[choice.op].levels
            if Level.KERNEL in levels and choice.op is not Op.RMS_NORM and choice not in kernel_ops:
                kernel_ops.append(choice)  # Mirage never explores kernel-level rms_norm
            if Level.BLOCK in levels and choice not in block_ops:
                block_ops.append(choice)
        return dataclasses.replace(self, kernel_ops=tuple(kernel_ops), block_ops=tuple(block_ops))

    # ---- serialization ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("kernel_ops", "block_ops"):
                value = [c.to_json() for c in value]
            elif f.name in ("imap_combos", "fmap_combos") and value is not None:
                value = [[list(m) if isinstance(m, tuple) else m for m in combo] for combo in value]
            elif isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[f.name] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchSpace:
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                values[f.name] = _normalize(f.name, data[f.name], from_json=True)
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> SearchSpace:
        return cls.from_dict(json.loads(text))

    def content_hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def describe(self) -> str:
        return (
            f"config={self.config} kernel_ops=[{', '.join(map(str, self.kernel_ops))}] "
            f"block_ops=[{', '.join(map(str, self.block_ops))}] grid_dims={self.grid_dims} "
            f"franges={self.franges} budgets=(kernel {self.max_kernel_ops}, block {self.max_block_ops}, "
            f"graph-defined {self.max_graph_defined}, outputs {self.max_block_outputs})"
        )


def _with_eps(choice: OpChoice, epsilons: list[float]) -> list[OpChoice]:
    attrs = choice.attrs
    if isinstance(attrs, RmsNorm) and attrs.eps == 0.0:
        return [OpChoice(choice.op, RmsNorm(eps)) for eps in epsilons]
    if isinstance(attrs, Accum) and attrs.kind is AccumKind.RMS and attrs.eps == 0.0:
        return [accum(AccumKind.RMS, eps) for eps in epsilons]
    return [choice]


def reference_ops(reference: KernelGraph) -> list[OpChoice]:
    """The explorable op choices that occur in ``reference`` (and in its block graphs), in order."""
    found: list[OpChoice] = []

    def visit(graph) -> None:
        for node in graph.nodes:
            if isinstance(node.attrs, BlockGraph):
                visit(node.attrs)
            elif node.op not in (Op.INPUT, Op.OUTPUT, Op.CUSTOMIZED, Op.FUSED):
                choice = OpChoice(node.op, node.attrs)
                if choice not in found:
                    found.append(choice)

    visit(reference)
    return found


# ---- option parsing -------------------------------------------------------------------------------

ALIASES = {
    "griddims": "grid_dims",
    "blockdims": "block_dims",
    "imaps": "imaps",
    "imap_comb_to_explore": "imap_combos",
    "omaps": "omaps",
    "fmaps": "fmaps",
    "franges": "franges",
    "kernel_op_budget": "max_kernel_ops",
    "block_op_budget": "max_block_ops",
    "max_num_kernel_graph_op": "max_kernel_ops",
    "max_num_threadblock_graph_op": "max_block_ops",
    "max_num_threadblock_graphs": "max_graph_defined",
    "max_num_threadblock_graph_outputs": "max_block_outputs",
    "knop_to_explore": "kernel_ops",
    "tbop_to_explore": "block_ops",
}

_NAMED_ACCUMS = {f"accum_{kind.value}": accum(kind) for kind in AccumKind if kind is not AccumKind.MAX}


def parse_op(text: str | OpChoice) -> OpChoice:
    """``"matmul"``, ``"accum_rms"``, ``"accum=sum_todimx"``, ``"mul_scalar=0.125"``, ``"reduction=2"``,
    ``"rms_norm=1e-6"``, ``"clamp=0,6"`` (or an :class:`OpChoice`)."""
    if isinstance(text, OpChoice):
        return text
    name, _, value = str(text).partition("=")
    name = name.strip().lower()
    if name in _NAMED_ACCUMS and not value:
        return _NAMED_ACCUMS[name]
    try:
        op = Op(name)
    except ValueError:
        raise SearchSpaceError(
            f"unknown op {text!r} in an op set; use op names such as 'matmul', 'accum_rms', 'mul_scalar=0.5'"
        ) from None
    attrs_type = REGISTRY[op].attrs_type
    try:
        match op:
            case Op.ACCUM:
                return accum(AccumKind.parse(value or None))
            case Op.MUL_SCALAR | Op.ADD_SCALAR:
                return OpChoice(op, Scalar(float(value)))
            case Op.REDUCTION | Op.REDUCTION_TO_DIMX:
                return OpChoice(op, Reduce(int(value)))
            case Op.RMS_NORM:
                return OpChoice(op, RmsNorm(float(value or 0.0)))
            case Op.CLAMP:
                low, high = (float(v) for v in value.split(","))
                return OpChoice(op, Clamp(low, high))
    except ValueError:
        raise SearchSpaceError(
            f"op {text!r}: {op.value} needs a value, e.g. {op.value}={_EXAMPLES.get(op, '...')}"
        ) from None
    if attrs_type is not None or op in (Op.INPUT, Op.OUTPUT, Op.CUSTOMIZED, Op.FUSED):
        raise SearchSpaceError(f"op {op.value} cannot be in an op set")
    return OpChoice(op)


_EXAMPLES = {
    Op.MUL_SCALAR: "0.125",
    Op.ADD_SCALAR: "1e-6",
    Op.REDUCTION: "2",
    Op.REDUCTION_TO_DIMX: "2",
    Op.CLAMP: "0,6",
    Op.ACCUM: "sum",
}


def _dim3(value: Any) -> Dim3:
    try:
        dims = tuple(int(v) for v in (value if hasattr(value, "__iter__") else (value,)))
    except (TypeError, ValueError):
        raise SearchSpaceError(f"{value!r} is not a 3-tuple of ints") from None
    if len(dims) == 1:
        dims = (dims[0], 1, 1)
    if len(dims) != 3:
        raise SearchSpaceError(f"{value!r} is not a 3-tuple of ints")
    return dims  # type: ignore[return-value]


def _normalize(name: str, value: Any, from_json: bool = False) -> Any:
    match name:
        case "kernel_ops" | "block_ops":
            parse = OpChoice.from_json if from_json else parse_op
            choices = tuple(parse(v) for v in value)
            level = Level.KERNEL if name == "kernel_ops" else Level.BLOCK
            for choice in choices:
                if level not in REGISTRY[choice.op].levels:
                    raise SearchSpaceError(f"op {choice} does not exist at the {level.value} level")
            return choices
        case "grid_dims" | "grid_spans":
            return None if value is None else tuple(_dim3(v) for v in value)
        case "block_dims" | "imaps" | "omaps":
            return tuple(_dim3(v) for v in value)
        case "imap_combos":
            return None if value is None else tuple(tuple(_dim3(m) for m in combo) for combo in value)
        case "fmap_combos":
            return None if value is None else tuple(tuple(int(d) for d in combo) for combo in value)
        case "fmaps" | "franges":
            values = tuple(int(v) for v in value)
            if name == "franges" and any(v < 1 for v in values):
                raise SearchSpaceError(f"franges must be positive, got {values}")
            return values
        case "config":
            return str(value)
        case "order":
            if value not in ("complete", "mirage"):
                raise SearchSpaceError(f"order must be 'complete' or 'mirage', not {value!r}")
            return str(value)
        case (
            "attention_grids"
            | "uneven_grids"
            | "block_matmul_batch_one"
            | "add_reference_ops"
            | "graph_defined_first"
            | "guided_order"
            | "complete_first"
        ):
            return bool(value)
    number = int(value)
    if number < 0:
        raise SearchSpaceError(f"{name} must be non-negative, got {value!r}")
    return number


CONFIGS: dict[str, SearchSpace] = {
    "mlp": SearchSpace(),
    # Mirage's enable_attention_specific_optimization(): two graph-defined kernels, 2-D grids, the
    # strided accumulator, and no replicating/row-splitting input maps.
    "attention": SearchSpace(
        config="attention",
        block_ops=MIRAGE_BLOCK_OPS + (accum(AccumKind.SUM_TODIMX),),
        attention_grids=True,
        imaps=ATTENTION_IMAPS,
        max_graph_defined=2,
    ),
    # Mirage's enable_concat_matmul_transformation().
    "lora": SearchSpace(config="lora", block_ops=MIRAGE_BLOCK_OPS + plain(Op.CONCAT_MATMUL)),
}
