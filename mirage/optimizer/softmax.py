"""The online-softmax rewrite: make ``exp`` in LAX µGraphs numerically safe (mirage-notes §5.6).

The search works in the LAX fragment, which has no ``max``: attention comes out as
``Σ_r exp(S_r) @ V_r / Σ_r Σ_j exp(S_r)``, whose ``exp`` overflows in fp16/fp32 for scores past ~11
or ~88.  This pass rewrites each ``exp`` of a block graph whose uses can absorb a per-row factor
(see :mod:`mirage.optimizer.scale`):

* an ``exp(x)`` inside the for-loop becomes ``exp(x − m)`` with ``m = running_max(reduction_max(x))``
  (the row maximum over the iterations so far), and every accumulator that sums values of degree 1
  becomes an ``accum_rescale`` that multiplies its state by ``exp(m_prev − m)`` before adding
  (FlashAttention's rule).  After the loop each such accumulator holds ``exp(−M)·(original)``, M the
  row maximum over all iterations;
* an ``exp(x)`` after the loop becomes ``exp(x − reduction_max(x))``;
* a ``log`` of a value of degree p (``log Σ exp(x)``, a logsumexp) is ``log(value) + p·m``: the rewrite
  adds the maxima back (after the loop the row maximum over all iterations, ``accum(…, kind=max)``),
  so its result has degree 0;
* results of degree 0 (``Σ e·v / Σ e``) need nothing more.  Results of degree 1 are *partials* of a
  split-KV kernel: the block graph also saves M (``accum(reduction_max(x), kind=max)``) with the
  same output map, and every graph-defined op that reads the partials is rewritten into a stable
  combine (:mod:`mirage.optimizer.combine`).

The rewrite is all-or-nothing per graph-defined op and its combines: when any part does not fit,
those kernels stay as they were and the result record says why.  Semantics are preserved exactly
(in exact arithmetic); tests compare with the interpreter in float64 and check float32 stays finite.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction

from mirage.mugraph import build
from mirage.mugraph.graph import Accum, AccumKind, BlockGraph, Clamp, KernelGraph, Node, Reduce, Ref, Scalar
from mirage.mugraph.ops import RUNNING_MAX_FLOOR, Op
from mirage.optimizer.graphs import BlockRewriter
from mirage.optimizer.scale import Degree, keeps_rows, propagate

# accumulators that sum (so that a per-row factor can be rescaled out of them)
SUMMING = frozenset({AccumKind.NONE, AccumKind.SUM, AccumKind.MEAN, AccumKind.SUM_TODIMX})


@dataclass(frozen=True)
class BlockAnalysis:
    """Which exps of a block graph can be rewritten, and the scale degree of every tensor."""

    sites: tuple[int, ...]  # node indices of the rewritable exps
    degrees: tuple[Degree, ...]  # per node (block nodes have one output)
    dropped: tuple[tuple[int, str], ...]  # (exp, reason) for exps left alone
    logged: frozenset[int] = frozenset()  # sites whose values reach a log (_logged)

    def partial_outputs(self, graph: BlockGraph) -> list[int]:
        """Output savers whose value has degree 1: partial results for a combine kernel."""
        return [i for i in graph.output_nodes if self.degrees[i]]


class _Blocked(Exception):
    def __init__(self, sites: set[int], reason: str) -> None:
        super().__init__(reason)
        self.sites, self.reason = sites, reason


def _exp_candidates(graph: BlockGraph) -> list[int]:
    """The exps to rewrite: all but those already of ``x − reduction_max(x)`` (stable as written: the
    split-row µGraphs of mirage.generator.split_rows, or a block the rewrite has made)."""
    return [i for i, n in enumerate(graph.nodes) if n.op is Op.EXP and not _less_its_maximum(graph, n)]


def _rows(graph: BlockGraph, site: int) -> tuple[int, ...]:
    x = graph.type_of(graph.nodes[site].inputs[0])
    return (*x.shape[:-1], 1)


def _degrees(graph: BlockGraph, sites: set[int]) -> list[Degree]:
    degrees: list[Degree] = []
    for i, node in enumerate(graph.nodes):
        ins = [degrees[r.node] for r in node.inputs]
        involved = {s for d in ins for s in d}
        if i in sites:
            if any(ins):
                raise _Blocked(involved | {i}, f"%{i}: exp of a value that already carries a scale")
            degree: Degree | None = {i: 1}
        elif node.op is Op.LOG and ins[0]:
            degree = {}  # log(s^p·v) = log v + p·m: the rewrite adds p·m back (_log_of_scaled)
        elif node.op is Op.ACCUM and ins[0]:
            ok = node.attrs.kind in SUMMING and list(ins[0].values()) == [1] and len(ins[0]) == 1
            degree = ins[0] if ok else None
        elif node.op is Op.OUTPUT:
            degree = ins[0]
            in_loop = all(not graph.nodes[s].outputs[0].after_accum for s in degree)
            if degree and not (len(degree) == 1 and list(degree.values()) == [1] and in_loop):
                raise _Blocked(involved, f"%{i}: saves a value of scale degree {degree}; only degree 0, "
                                         "or degree 1 of an exp inside the for-loop, can be saved")
        else:
            degree = propagate(node, graph.operand_types(node), ins)
        if degree is None:
            raise _Blocked(involved, f"%{i}: {node.op.value} does not commute with the per-row factor "
                                     f"of exp %{sorted(involved)}")
        for s in degree if node.op is not Op.OUTPUT else ():
            if not keeps_rows(node.outputs[0], _rows(graph, s)):
                raise _Blocked({s}, f"%{i}: shape {list(node.outputs[0].shape)} does not keep the rows "
                                    f"of exp %{s}")
        degrees.append(degree)
    return degrees


def analyse_block(graph: BlockGraph) -> BlockAnalysis:
    """Find the exps of ``graph`` that the rewrite can stabilise (dropping the others one by one)."""
    sites = set(_exp_candidates(graph))
    dropped: list[tuple[int, str]] = []
    while True:
        try:
            degrees = _degrees(graph, sites)
            return BlockAnalysis(tuple(sorted(sites)), tuple(degrees), tuple(dropped),
                                 _logged(graph, degrees))
        except _Blocked as blocked:
            culprits = blocked.sites & sites
            if not culprits:  # a failure that no remaining site causes cannot happen; be safe
                return BlockAnalysis((), tuple({} for _ in graph.nodes), tuple(dropped))
            dropped += [(s, blocked.reason) for s in sorted(culprits)]
            sites -= culprits


@dataclass(frozen=True)
class PartialOutput:
    """An output of a rewritten block graph that holds ``exp(−M)·(original)`` per block and row."""

    output: int  # index among the graph-defined op's outputs
    site: int  # the exp (node index in the original block graph)
    maxima: int  # index of the output that holds M for this output's output map


@dataclass(frozen=True)
class BlockRewrite:
    graph: BlockGraph
    partials: tuple[PartialOutput, ...] = field(default=())


def rewrite_block(graph: BlockGraph, analysis: BlockAnalysis) -> BlockRewrite:
    """Apply the rewrite to every site of ``analysis`` (see the module docstring)."""
    rw = BlockRewriter(graph)
    running: dict[int, tuple[Ref, Ref]] = {}  # site -> (tile row max, running max)
    row_max: dict[int, Ref] = {}  # site after the loop -> its row max
    accumulated: dict[int, Ref] = {}  # site in the loop -> the row max over all iterations

    def final_max(site: int) -> Ref:
        if site not in accumulated:
            accumulated[site] = rw.emit(Op.ACCUM, (running[site][0],), Accum(AccumKind.MAX))
        return accumulated[site]

    saved: list[tuple[int, int, tuple[int, int, int]]] = []  # (output index, site, output map)
    for i, node in enumerate(graph.nodes):
        degree = analysis.degrees[i]
        if i in analysis.sites:
            x = rw.ref(node.inputs[0])
            rank = graph.type_of(node.inputs[0]).rank
            tile_max = rw.emit(Op.REDUCTION_MAX, (x,), Reduce(rank - 1))
            if node.outputs[0].after_accum:
                m = row_max[i] = _floored(rw.emit, tile_max) if i in analysis.logged else tile_max
            else:
                m = rw.emit(Op.RUNNING_MAX, (tile_max,))
                running[i] = (tile_max, m)
            rw.alias(Ref(i, 0), rw.emit(Op.EXP, (rw.emit(Op.SUB, (x, m)),)))
        elif node.op is Op.LOG and analysis.degrees[node.inputs[0].node]:
            scaled = analysis.degrees[node.inputs[0].node]
            after = node.outputs[0].after_accum
            maxima = {s: row_max[s] if s in row_max else final_max(s) if after else running[s][1]
                      for s in scaled}
            rw.alias(Ref(i, 0), _log_of_scaled(rw.emit, rw.ref(node.inputs[0]), scaled, maxima))
        elif node.op is Op.ACCUM and degree:
            (site,) = degree
            rw.alias(Ref(i, 0), _rescaled(rw, graph, node, running[site][1]))
        elif node.op is Op.OUTPUT and degree:
            (site,) = degree
            saved.append((graph.output_nodes.index(i), site, node.attrs.output_map))
            rw.copy(i)
        else:
            rw.copy(i)
    partials: list[PartialOutput] = []
    maxima: dict[tuple[int, tuple[int, int, int]], int] = {}
    for output, site, output_map in saved:
        if (site, output_map) not in maxima:
            rw.emit_output(final_max(site), output_map)
            maxima[(site, output_map)] = len(rw.graph.output_nodes) - 1
        partials.append(PartialOutput(output, site, maxima[(site, output_map)]))
    return BlockRewrite(rw.graph, tuple(partials))


def _logged(graph, degrees: list[Degree]) -> frozenset[int]:
    """The sites whose scaled values a ``log`` reads."""
    return frozenset(s for n in graph.nodes if n.op is Op.LOG for s in degrees[n.inputs[0].node])


def _floored(emit, maximum: Ref) -> Ref:
    """A row maximum no lower than the running maxima's floor: a row all −inf keeps exp(x − m) = 0, so
    its ``log Σ exp`` is −inf, as PyTorch's logsumexp (``x − m`` would be NaN)."""
    return emit(Op.CLAMP, (maximum,), Clamp(RUNNING_MAX_FLOOR, math.inf))


def _log_of_scaled(emit, value: Ref, degree: Degree, maxima: dict[int, Ref]) -> Ref:
    """``log`` of ``value``, a value of ``degree`` (``s^-p·v`` per site, ``s = exp(m)``), as the log of
    the original: ``log(value) + Σ p·m``.  ``emit(op, inputs, attrs=None)`` appends a node."""
    out = emit(Op.LOG, (value,))
    for site, power in sorted(degree.items()):
        m = maxima[site] if power == 1 else emit(Op.MUL_SCALAR, (maxima[site],), Scalar(float(power)))
        out = emit(Op.ADD, (out, m))
    return out


def _rescaled(rw: BlockRewriter, graph: BlockGraph, node, m: Ref) -> Ref:
    term_type = graph.type_of(node.inputs[0])
    return rescaled_accumulator(rw, node.attrs.kind, rw.ref(node.inputs[0]), m, term_type.shape[-1],
                                graph.forloop_range * term_type.shape[-1], graph.reduction_dimx)


def rescaled_accumulator(rw: BlockRewriter, kind: AccumKind, term: Ref, m: Ref, width: int, count: int,
                         dimx: int) -> Ref:
    """The rescaling accumulator that replaces a summing accumulator (``kind``) of degree-1 terms.

    ``width`` is the last dim of ``term``; ``count`` the number of values a MEAN divides by.
    """
    match kind:
        case AccumKind.NONE | AccumKind.SUM:
            return rw.emit(Op.ACCUM_RESCALE, (term, m), Accum(kind))
        case AccumKind.MEAN:  # mean = (Σ_r Σ_j x) / count
            total = rw.emit(Op.ACCUM_RESCALE, (term, m), Accum(AccumKind.SUM))
            return rw.emit(Op.MUL_SCALAR, (total,), Scalar(float(Fraction(1, count))))
        case AccumKind.SUM_TODIMX:  # Σ_r reduction_to_dimx(x_r), the reduction done per iteration
            if width != dimx:
                rank = len(rw.graph.type_of(term).shape)
                term = rw.emit(Op.REDUCTION_TO_DIMX, (term,), Reduce(rank - 1))
            return rw.emit(Op.ACCUM_RESCALE, (term, m), Accum(AccumKind.NONE))
    raise AssertionError(f"not a summing accumulator: {kind}")


# ---- the pass ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxSite:
    """One rewritten exp."""

    kernel: int  # node index of the graph-defined op holding the exp (-1: a kernel-level exp)
    exp: int  # node index of the exp in that op's block graph (before the rewrite)
    online: bool  # inside the for-loop (running max) or after it (one row max)
    combine_kernels: tuple[int, ...] = ()  # graph-defined ops rewritten into stable combines


@dataclass(frozen=True)
class SoftmaxSkip:
    kernel: int
    exp: int | None
    reason: str


@dataclass(frozen=True)
class SoftmaxResult:
    rewritten: tuple[SoftmaxSite, ...] = ()
    skipped: tuple[SoftmaxSkip, ...] = ()

    @property
    def applied(self) -> bool:
        return bool(self.rewritten)


def online_softmax(graph: KernelGraph) -> tuple[KernelGraph, SoftmaxResult]:
    """Rewrite every stabilisable exp of ``graph``'s block graphs, and of its kernel level (a pass;
    see the module docstring)."""
    from mirage.optimizer.combine import CombineError, combine_kernel

    graph, kernel_sites, kernel_skips = stabilise_kernel_exps(graph)
    nodes = list(graph.nodes)
    done: set[int] = set()
    rewritten: list[SoftmaxSite] = []
    skipped: list[SoftmaxSkip] = []
    for k, node in enumerate(graph.nodes):
        if node.op is not Op.CUSTOMIZED or k in done:
            continue
        analysis = analyse_block(node.attrs)
        skipped += [SoftmaxSkip(k, e, reason) for e, reason in analysis.dropped]
        if not analysis.sites:
            continue
        result = rewrite_block(node.attrs, analysis)
        changes = {k: dataclasses.replace(node, attrs=result.graph, outputs=result.graph.result_types)}
        combines: list[int] = []
        try:
            if result.partials:
                combines = _partial_readers(graph, k, result.partials)
                for c in combines:
                    changes[c] = combine_kernel(graph, c, k, result.graph, result.partials)
        except CombineError as error:
            skipped.append(SoftmaxSkip(k, None, str(error)))
            continue
        for index, new in changes.items():
            nodes[index] = new
        done.update(changes)
        rewritten += [SoftmaxSite(k, e, not node.attrs.nodes[e].outputs[0].after_accum, tuple(combines))
                      for e in analysis.sites]
    return dataclasses.replace(graph, nodes=tuple(nodes)), SoftmaxResult(
        tuple(kernel_sites + rewritten), tuple(kernel_skips + skipped))


def stabilise_kernel_exps(graph: KernelGraph) -> tuple[KernelGraph, list[SoftmaxSite], list[SoftmaxSkip]]:
    """Each kernel-level ``exp(x)`` whose uses cancel a per-row factor (``exp(x) / Σ exp(x)``, a
    softmax that the search left as pre-defined ops) becomes ``exp(x − reduction_max(x))``, as
    PyTorch's softmax computes it: without, logits past ~88 (float32) overflow and rows whose logits
    are all far below zero (a padded row under an additive mask) give 0 / 0.  Exps whose factor
    reaches a graph output or an op that does not commute with it stay as they are."""
    sites = {i for i, n in enumerate(graph.nodes) if n.op is Op.EXP and not _less_its_maximum(graph, n)}
    skipped: list[SoftmaxSkip] = []
    while sites:
        try:
            degrees = _degrees(graph, sites)
            carried = {s for r in graph.outputs for s in degrees[r.node]}
            if carried:
                raise _Blocked(carried, "a graph output carries the exp's row factor")
            break
        except _Blocked as blocked:
            culprits = (blocked.sites & sites) or set(sites)
            skipped += [SoftmaxSkip(-1, s, blocked.reason) for s in sorted(culprits)]
            sites -= culprits
    if not sites:
        return graph, [], skipped
    nodes: list[Node] = []
    remap: dict[Ref, Ref] = {}
    maxima: dict[int, Ref] = {}  # site -> its row max

    def emit(op: Op, inputs: tuple[Ref, ...], attrs=None) -> Ref:
        so_far = dataclasses.replace(graph, nodes=tuple(nodes))
        nodes.append(Node(op, inputs, attrs, build.infer(so_far, op, inputs, attrs)))
        return Ref(len(nodes) - 1, 0)

    logged = _logged(graph, degrees)
    for i, node in enumerate(graph.nodes):
        inputs = tuple(remap[r] for r in node.inputs)
        if i in sites:
            (x,) = inputs
            x_type = graph.type_of(node.inputs[0])
            rows = dataclasses.replace(x_type, shape=(*x_type.shape[:-1], 1))
            nodes.append(Node(Op.REDUCTION_MAX, (x,), Reduce(x_type.rank - 1), (rows,)))
            maxima[i] = Ref(len(nodes) - 1, 0)
            if i in logged:
                maxima[i] = _floored(emit, maxima[i])
            nodes.append(Node(Op.SUB, (x, maxima[i]), None, (x_type,)))
            inputs = (Ref(len(nodes) - 1, 0),)
        elif node.op is Op.LOG and degrees[node.inputs[0].node]:
            remap[Ref(i, 0)] = _log_of_scaled(emit, inputs[0], degrees[node.inputs[0].node], maxima)
            continue
        nodes.append(dataclasses.replace(node, inputs=inputs))
        for k in range(len(node.outputs)):
            remap[Ref(i, k)] = Ref(len(nodes) - 1, k)
    stable = dataclasses.replace(graph, nodes=tuple(nodes), outputs=tuple(remap[r] for r in graph.outputs))
    return stable, [SoftmaxSite(-1, e, False) for e in sorted(sites)], skipped


def _partial_readers(graph: KernelGraph, kernel: int, partials: tuple[PartialOutput, ...]) -> list[int]:
    from mirage.optimizer.combine import CombineError

    refs = {Ref(kernel, p.output) for p in partials}
    if refs & set(graph.outputs):
        raise CombineError("a partial result (degree 1) is a graph output; nothing can combine it")
    readers = sorted({i for i, n in enumerate(graph.nodes) if refs & set(n.inputs)})
    for i in readers:
        if graph.nodes[i].op is not Op.CUSTOMIZED:
            raise CombineError(f"partial results are read by the pre-defined op %{i} "
                               f"({graph.nodes[i].op.value}); only graph-defined combines are rewritten")
    return readers


def _less_its_maximum(graph: KernelGraph | BlockGraph, exp: Node) -> bool:
    """Whether ``exp`` already reads ``x − reduction_max(x)`` (the rewrite is idempotent)."""
    sub = graph.nodes[exp.inputs[0].node]
    if sub.op is not Op.SUB:
        return False
    maximum = graph.nodes[sub.inputs[1].node]
    if maximum.op is Op.CLAMP:  # _floored
        maximum = graph.nodes[maximum.inputs[0].node]
    return maximum.op is Op.REDUCTION_MAX and maximum.inputs[0] == sub.inputs[0]


# ---- the search's stability filter (picklable and torch-free: search workers unpickle it) ------------


def unstable_exps(graph: KernelGraph) -> int:
    """How many exps of ``graph`` the online-softmax rewrite leaves as they are (a LAX softmax that
    overflows where PyTorch's does not: exp(x) / Σ exp(x) with the two exps computed apart, say)."""
    return len(online_softmax(graph)[1].skipped)


def exp_count(graph) -> int:
    """Exps of a kernel graph, its block graphs' included."""
    return sum(1 if n.op is Op.EXP else exp_count(n.attrs) if hasattr(n.attrs, "nodes") else 0
               for n in graph.nodes)


@dataclass(frozen=True)
class StableExps:
    """A search's filter of complete candidates (``keep_when``): at most ``allowed`` exps that the
    online-softmax rewrite leaves unstable. The rewrite's analysis costs about what a verification
    does, so it runs only on candidates with more exps than the reference's ``exps`` (a search's
    unstable forms recompute an exp apart from its sum); others, and those the analysis cannot take,
    are verified (the caller has the last word: ``mirage.frontend.optimize``)."""

    allowed: int
    exps: int

    @classmethod
    def of(cls, reference: KernelGraph) -> StableExps:
        """The filter that keeps what ``reference`` allows: no more unstable exps than its own."""
        return cls(unstable_exps(reference), exp_count(reference))

    def __call__(self, graph: KernelGraph) -> bool:
        if exp_count(graph) <= self.exps:
            return True
        try:
            return unstable_exps(graph) <= self.allowed
        except Exception:  # noqa: BLE001 - the filter only saves verifications; the verifier decides
            return True
