"""The register-resident online-softmax chain: which block graphs run it (``gen/softmax.cuh``).

After the online-softmax rewrite (:mod:`mirage.optimizer.softmax`) the loop body of an attention
block graph is a chain of seven ops::

    %qk   = matmul(Q, K)                       Q [1, R, D], K [1, D, N]; fp16 or bf16
    %s    = fused(%qk)                         optional: element-wise ops of one input (the scale),
          or fused(%qk, %c)                    or of the product and a per-key value c [1, 1, N],
                                               linear in the product (QKNorm's S / rms(K) · 0.125)
    %rmax = reduction_max(%s, last dim)
    %m    = running_max(%rmax)
    %p    = fused(%s, %m) = exp(%s − %m)
    %l    = accum_rescale(%p, %m), kind sum    optional: Σ over the keys, rescaled
    %pv   = matmul(%p, V)                      V [1, N, E]
    %o    = accum_rescale(%pv, %m), kind none
    %max  = accum(%rmax), kind max             optional (split-KV partials save the maximum)

Lowered op by op, S and P make a round trip through shared memory with a barrier between every two
ops; :func:`match` recognises the chain so that the memory plan gives its intermediates no buffer
and the lowering emits one ``mirage::gen::OnlineSoftmax`` step for it instead (S, P, m, l and O in
registers, merged into the shared tiles of ``%m``, ``%l``, ``%o`` and ``%max`` once after the loop).
Anything that does not fit the pattern exactly (another reader of an intermediate, a different
accumulator kind, tile shapes the tensor-core fragments do not cover) returns ``None`` with the
reason logged, and the kernel is lowered op by op as before.

A score ``c · S + M`` with ``M`` an input tile of the scores' shape (an additive mask, causal
attention's) runs the chain of ``c · S`` with ``M / c`` added to each product before the row maxima
(gen/softmax_columns.cuh's ``MaskTile``), each thread reading the mask at its fragments' positions;
``M`` of one value a key ``[1, 1, N]`` (a key-padding mask, which every query row adds) likewise,
each thread reading it at its fragments' keys.
Where the mask is a kernel input of the causal pattern (:mod:`mirage.mugraph.patterns`,
``mask_rows``), the chain computes it from the positions instead (``CausalMask``): no copy, no tile.

A score with a per-key operand ``f(S, c)`` is ``S · f(1, c)`` when ``f`` is linear in ``S``
(:func:`linear_in`): the step that produces ``c`` stores the factors ``f(1, c)`` instead (``c`` has
no other reader), and the chain multiplies each product by its key's factor. The chain step then
runs at the score's place in the schedule, after ``c``'s step and the barrier behind it.  When ``c``
is an input tile (the per-key values computed by an earlier kernel), the chain maps each value it
reads to ``f(1, c)`` itself (gen/softmax_columns.cuh's ``FactorTile``): no step and no barrier.  When
``c = g(Σ_d K[d, n]²)`` of the chain's own K (QKNorm's rms), the chain computes ``c`` itself from
the K fragments it loads anyway (:func:`_key_norm`, ``SoftmaxChain.key_norm``): the square, the sum
and g run in no step of their own, need no tile, and the barrier before the chain goes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import AccumKind, BlockGraph, Node, Ref, ThreadGraph
from mirage.mugraph.ops import UNARY, Op
from mirage.optimizer.graphs import NoMatch, require
from mirage.optimizer.layout import TensorLayout
from mirage.optimizer.schedule import Action, Phase, Schedule, Step

log = logging.getLogger(__name__)

TENSOR_CORE_TYPES = frozenset({DType.FLOAT16, DType.BFLOAT16})


@dataclass(frozen=True)
class SoftmaxChain:
    """Node indices of a matched chain (``None`` for the optional ones)."""

    qk: int
    score: int | None
    row_max: int
    running: int
    prob: int
    pv: int
    out: int
    sum: int | None
    maximum: int | None
    groups: int  # key groups per row tile (gen/softmax.cuh's kGroups)
    scratch_bytes: int  # shared scratch of the key groups' merge after the loop (0 for one group)
    column: int | None = None  # the score's per-key operand c (its step stores f(1, c); an input: read as c)
    qk_argument: int = 0  # the product's position among the score's operands
    key_norm: tuple[int, int] | None = None  # (sum, square) when c = g(Σ_d K[d, n]²): the chain computes c
    column_loaded: bool = False  # c is an input tile (no step of its own; the chain reads it as f(1, c))
    # the score is c · S + M with M an input tile of the scores' shape (an additive mask), c this scale:
    # the chain adds M / c to each product and scales as a plain c · S chain does (gen/softmax.cuh)
    mask_scale: float | None = None
    # > 0: the mask is a kernel input of the causal pattern with this period (mirage.mugraph.patterns),
    # which the chain computes from its fragments' indices: the mask tile is neither copied nor stored
    mask_rows: int = 0
    # the sm_90a form (warpgroup_form): both products as warpgroup MMAs reading K and V (``swizzled``)
    # from shared memory in the 128-byte swizzled form
    warpgroup: bool = False
    swizzled: frozenset[int] = frozenset()
    # pipelined tiles read one iteration late, which keep one ring slot more (the warpgroup form's V
    # when each sub-tile's P·V runs with the next sub-tile's Q·K: gen/softmax.cuh's DeferValues)
    late: frozenset[int] = frozenset()
    # the warpgroup form's Q·K reads Q's fragments from registers (gen/softmax.cuh's QFragments)
    q_fragments: bool = False
    # the warpgroup form's two warpgroups take turns issuing their products (gen/softmax.cuh's PingPong:
    # 1 each Q·K issue, 2 from a Q·K's issue to its P·V's; 0 none, also with one warpgroup)
    pingpong: int = 0

    @property
    def defer_values(self) -> bool:
        return bool(self.late)

    @property
    def anchor(self) -> int:
        """The node at whose step the chain runs: the score when it reads per-key values computed by
        a step of their own (they come first), else the first product (an input's tile is loaded
        before any step)."""
        stepped = self.column is not None and self.key_norm is None and not self.column_loaded
        if stepped and self.score is not None:
            return self.score
        return self.qk

    @property
    def _key_nodes(self) -> tuple[int | None, ...]:
        return (self.column, *self.key_norm) if self.key_norm is not None else ()

    @property
    def computed(self) -> frozenset[int]:
        """Every node the chain step computes (the op-by-op walk skips them)."""
        nodes = (self.qk, self.score, self.row_max, self.running, self.prob, self.pv, self.out, self.sum,
                 self.maximum, *self._key_nodes)
        return frozenset(n for n in nodes if n is not None)

    @property
    def register_only(self) -> frozenset[int]:
        """Intermediates that never reach shared memory (no buffer in the memory plan)."""
        generated = (self.column,) if self.mask_rows else ()
        nodes = (self.qk, self.score, self.row_max, self.prob, self.pv, *self._key_nodes, *generated)
        return frozenset(n for n in nodes if n is not None)

    @property
    def accumulators(self) -> tuple[int, ...]:
        """Nodes whose shared tiles the write-back fills after the loop."""
        return tuple(n for n in (self.maximum, self.running, self.sum, self.out) if n is not None)




def _only(uses: dict[Ref, list[int]], i: int) -> list[int]:
    return sorted(set(uses.get(Ref(i, 0), [])))


# ops that keep a value's degree in one input (unary, not affine: f(a·x) = a·f(x))
_SCALING = frozenset({Op.MUL_SCALAR})


def linear_in(thread: ThreadGraph, argument: int) -> bool:
    """Whether ``thread`` computes ``x · h(others)`` in its input ``argument`` = x: x enters once,
    through products, quotients (as the numerator) and scalar multiples only."""
    degree: list[int | None] = []
    for node in thread.nodes:
        if node.op is Op.INPUT:
            degree.append(1 if node.attrs.index == argument else 0)
            continue
        ins = [degree[r.node] for r in node.inputs]
        if any(d is None for d in ins):
            degree.append(None)
        elif not any(ins):
            degree.append(0)
        elif node.op is Op.MUL and sum(ins) == 1:
            degree.append(1)
        elif node.op is Op.DIV and ins == [1, 0]:
            degree.append(1)
        elif node.op in _SCALING:
            degree.append(1)
        else:
            degree.append(None)
    (out,) = thread.outputs
    return degree[out.node] == 1


def masked_scale(thread: ThreadGraph, argument: int) -> float | None:
    """c when ``thread`` computes ``c · x + m`` of its input ``argument`` = x and its other input m,
    with c > 0: x through scalar products only, then one sum with m (an additive mask); else None."""
    scale, value, added = 1.0, None, False
    for i, node in enumerate(thread.nodes):
        if node.op is Op.INPUT:
            value = i if node.attrs.index == argument and value is None else value
            continue
        operands = [r.node for r in node.inputs]
        if node.op is Op.MUL_SCALAR and operands == [value] and not added:
            scale *= node.attrs.value
        elif node.op is Op.ADD and value in operands and not added and len(set(operands)) == 2:
            other = thread.nodes[operands[1 - operands.index(value)]]
            if other.op is not Op.INPUT or other.attrs.index == argument:
                return None
            added = True
        else:
            return None
        value = i
    (out,) = thread.outputs
    return scale if added and out.node == value and scale > 0 else None


def _column_operand(graph: BlockGraph, uses: dict[Ref, list[int]], s: int,
                    loop: set[int]) -> tuple[int, int, int, float | None]:
    """(qk, column, qk_argument, mask scale) of a two-operand score (see the module docstring); the
    scale c is None unless the other operand is an additive mask of the scores (``c · S + M``)."""
    node = graph.nodes[s]
    products = [k for k, r in enumerate(node.inputs) if graph.nodes[r.node].op is Op.MATMUL]
    require(len(products) == 1 and len(set(node.inputs)) == 2, "the score has no single product operand")
    argument = products[0]
    qk, column = node.inputs[argument].node, node.inputs[1 - argument].node
    s_shape, c_shape = graph.type_of(Ref(s)).shape, graph.type_of(Ref(column)).shape
    per_key = len(c_shape) == len(s_shape) and c_shape[-1] == s_shape[-1] and math.prod(c_shape[:-1]) == 1
    loaded = graph.nodes[column].op is Op.INPUT
    # a mask: c · S + M, M read per score, or one value a key (a key-padding mask) that every row adds
    if loaded and (c_shape == s_shape or (per_key and masked_scale(node.attrs, argument) is not None)):
        scale = masked_scale(node.attrs, argument)
        require(scale is not None, "the score is not c · S plus a mask")
        require(_only(uses, column) == [s], "the mask has other readers")
        return qk, column, argument, scale
    require(per_key, f"the score's other operand {c_shape} is not one value per key")
    require(linear_in(node.attrs, argument), "the score is not linear in the product")
    require(_only(uses, column) == [s], "the per-key values have other readers")
    if graph.nodes[column].op is Op.INPUT:  # loaded: the chain maps each value it reads to f(1, c)
        return qk, column, argument, None
    require(graph.nodes[column].op not in (Op.INPUT, Op.ACCUM, Op.ACCUM_RESCALE, Op.RUNNING_MAX),
            "the per-key values are not computed by a step of their own")
    require(column in loop, "the per-key values are not computed in the loop")
    return qk, column, argument, None


def _is_square_of(graph: BlockGraph, i: int, source: Ref) -> bool:
    """Node ``i`` is x² of ``source``: a square op, or a thread graph of one square (or x · x)."""
    node = graph.nodes[i]
    if node.inputs != (source,):
        return False
    if node.op is Op.SQUARE:
        return True
    if node.op is not Op.FUSED:
        return False
    thread = node.attrs
    computed = [n for n in thread.nodes if n.op is not Op.INPUT]
    if len(computed) != 1 or len(thread.outputs) != 1:
        return False
    (op,) = computed
    return op.op is Op.SQUARE or (op.op is Op.MUL and op.inputs[0] == op.inputs[1])


def _key_norm(graph: BlockGraph, uses: dict[Ref, list[int]], column: int, k_ref: Ref,
              loop: set[int]) -> tuple[int, int] | None:
    """(sum, square) when the per-key values are ``g(Σ_d K[d, n]²)`` of the chain's own K tile (g a
    function of one operand, or none), each read only by the next: the chain then computes them
    from its K fragments (gen/softmax.cuh's KeyNorms) and no step of theirs runs."""
    node = graph.nodes[column]
    total = column
    if node.op is Op.FUSED:
        if len(node.inputs) != 1:
            return None
        total = node.inputs[0].node
        if _only(uses, total) != [column]:
            return None
    reduction = graph.nodes[total]
    k_type = graph.type_of(k_ref)
    if reduction.op is not Op.REDUCTION or reduction.attrs.dim != k_type.rank - 2:
        return None
    square = reduction.inputs[0].node
    if not _is_square_of(graph, square, k_ref) or _only(uses, square) != [total]:
        return None
    if not {total, square} <= loop:
        return None
    return total, square


def _is_exp_of_difference(node: Node, s: int, m: int) -> bool:
    """``node`` is fused(s, m) = exp(s − m) (the thread graph the online-softmax rewrite builds)."""
    if node.op is not Op.FUSED or len(node.inputs) != 2:
        return False
    position = {r.node: k for k, r in enumerate(node.inputs)}
    if set(position) != {s, m}:
        return False
    thread = node.attrs
    computed = [(k, n) for k, n in enumerate(thread.nodes) if n.op is not Op.INPUT]
    if [n.op for _, n in computed] != [Op.SUB, Op.EXP] or len(thread.outputs) != 1:
        return False
    (sub_index, sub), (exp_index, exp) = computed
    inputs = {k: n.attrs.index for k, n in enumerate(thread.nodes) if n.op is Op.INPUT}
    operands = [inputs.get(r.node) for r in sub.inputs]
    return (
        operands == [position[s], position[m]]
        and exp.inputs == (Ref(sub_index),)
        and thread.outputs[0] == Ref(exp_index)
    )


def padded_rows(rows: int, warps: int) -> int:
    """The query rows the chain runs for ``rows`` real ones on ``warps`` warps (as gen/softmax_detail.cuh's
    ``padded_rows``): whole 16-row tiles, as many as the warps divide or a multiple of the warps."""
    tiles = -(-rows // 16)
    if tiles > warps:
        return -(-tiles // warps) * warps * 16
    return next(t for t in range(tiles, warps + 1) if warps % t == 0) * 16


def warp_split(rows: int, keys: int, threads: int) -> int | None:
    """Key groups per 16-row tile for ``threads`` (as gen/softmax.cuh), or None when not covered: keys
    of whole 16-key fragments must split into whole fragments a group; other counts run padded, and so
    do rows (:func:`padded_rows`)."""
    warps = threads // 32
    if threads % 32 or warps == 0 or rows == 0:
        return None
    row_tiles = padded_rows(rows, warps) // 16
    groups = warps // row_tiles if warps >= row_tiles else 1
    # keys of whole fragments split over the groups as they are; others are padded (padded_keys)
    if keys % 16 == 0 and (keys % groups or (keys // groups) % 16):
        return None
    return groups


def padded_keys(keys: int, groups: int) -> int:
    """The keys the warp-form chain runs for ``keys`` real ones over ``groups`` key groups (as
    gen/softmax_detail.cuh's ``padded_keys``): whole 16-key fragments a group, or whole 64-key
    sub-tiles where a group's keys would have no multiple of 16 from 64 to 128 dividing them."""
    whole = -(-keys // (16 * groups)) * 16 * groups
    per_group = whole // groups
    if whole == keys or per_group <= 64 or any(per_group % sub == 0 for sub in range(64, 129, 16)):
        return whole
    return -(-keys // (64 * groups)) * 64 * groups


def _match(graph: BlockGraph, schedule: Schedule, row_bytes: Callable[[int], int],
           key_norms: bool = False) -> SoftmaxChain:
    uses = graph.consumers()
    loop = {item.node for item in schedule.items if isinstance(item, Step) and item.phase is Phase.LOOP
            and item.action is not Action.LOAD}
    maxima = [i for i, n in enumerate(graph.nodes) if n.op is Op.RUNNING_MAX]
    require(len(maxima) == 1, f"{len(maxima)} running maxima")
    running = maxima[0]
    row_max = graph.nodes[running].inputs[0].node
    require(graph.nodes[row_max].op is Op.REDUCTION_MAX, "the running max is not of a reduction_max")
    s = graph.nodes[row_max].inputs[0].node
    s_type = graph.type_of(Ref(s))
    require(graph.nodes[row_max].attrs.dim == s_type.rank - 1, "the row maximum is not over the last dim")
    score: int | None = None
    column: int | None = None
    qk_argument = 0
    mask_scale = None
    qk = s
    if graph.nodes[s].op is Op.FUSED:
        require(len(graph.nodes[s].inputs) <= 2, "the score has more than two operands")
        score, qk = s, graph.nodes[s].inputs[0].node
        if len(graph.nodes[s].inputs) == 2:
            qk, column, qk_argument, mask_scale = _column_operand(graph, uses, s, loop)
        require(_only(uses, qk) == [s], "the product Q·K has other readers")
    require(graph.nodes[qk].op is Op.MATMUL, "the scores are not a matmul")
    q_ref, k_ref = graph.nodes[qk].inputs
    key_norm = (_key_norm(graph, uses, column, k_ref, loop)
                if column is not None and key_norms and mask_scale is None else None)
    probs = [c for c in _only(uses, s) if c != row_max]
    require(len(probs) == 1 and _is_exp_of_difference(graph.nodes[probs[0]], s, running),
             "the scores' other reader is not exp(S − m)")
    prob = probs[0]
    accumulators = [c for c in _only(uses, prob)]
    pvs = [c for c in accumulators if graph.nodes[c].op is Op.MATMUL]
    require(len(pvs) == 1, "P feeds no single matmul")
    pv = pvs[0]
    require(graph.nodes[pv].inputs[0] == Ref(prob), "P is not the left operand of P·V")
    sums = [c for c in accumulators if c != pv]
    require(len(sums) <= 1, "P has several other readers")
    total = sums[0] if sums else None
    if total is not None:
        node = graph.nodes[total]
        require(node.op is Op.ACCUM_RESCALE and node.attrs.kind is AccumKind.SUM
                 and node.inputs == (Ref(prob), Ref(running)), "P's sum is not a rescaled row sum")
    outs = _only(uses, pv)
    require(len(outs) == 1, "P·V has other readers")
    out = outs[0]
    node = graph.nodes[out]
    require(node.op is Op.ACCUM_RESCALE and node.attrs.kind is AccumKind.NONE
             and node.inputs == (Ref(pv), Ref(running)), "P·V is not accumulated with a rescale")
    maximum = None
    for c in _only(uses, row_max):
        if c == running:
            continue
        node = graph.nodes[c]
        require(node.op is Op.ACCUM and node.attrs.kind is AccumKind.MAX and maximum is None,
                 "the row maximum has another reader")
        maximum = c
    allowed = {prob, out} | ({total} if total is not None else set())
    require(set(_only(uses, running)) <= allowed, "the running max has other readers")
    chain_nodes = [qk, score, row_max, running, prob, pv, out, total, maximum]
    require(all(n in loop for n in chain_nodes if n is not None), "part of the chain is not in the loop")
    # shapes and element types the fragments cover
    q, k, v = graph.type_of(q_ref), graph.type_of(k_ref), graph.type_of(graph.nodes[pv].inputs[1])
    require(q.dtype in TENSOR_CORE_TYPES and k.dtype == q.dtype and v.dtype == q.dtype,
             f"operands {q.dtype.value}/{k.dtype.value}/{v.dtype.value}, not one 16-bit type")
    require(all(math.prod(t.shape[:-2]) == 1 for t in (q, k, v)), "batched tiles")
    rows, depth, keys, width = q.shape[-2], q.shape[-1], k.shape[-1], v.shape[-1]
    require(k.shape[-2] == depth and v.shape[-2] == keys, "operand shapes")
    # head dims of whole 8-element chunks (Stable Diffusion 1.5's 40): the warp form pads Q·K's depth to
    # whole k-steps with zeroed fragments and takes V's last 8 columns alone (gen/softmax.cuh)
    require(depth % 8 == 0 and width % 8 == 0, f"head dims {depth}, {width} not multiples of 8")
    require(all(row_bytes(r.node) % 16 == 0 for r in (q_ref, k_ref, graph.nodes[pv].inputs[1])),
             "operand rows not 16-byte aligned")
    groups = warp_split(rows, keys, math.prod(graph.block_dim))
    require(groups is not None, f"{rows} rows × {keys} keys do not split over the warps")
    # padded keys (gen/softmax.cuh): plain or masked scores (the padded keys hidden), no per-key values
    require(padded_keys(keys, groups) == keys or column is None or mask_scale is not None,
            f"{keys} keys (padded) with per-key values")
    warps = math.prod(graph.block_dim) // 32
    scratch = 4 * groups * padded_rows(rows, warps) * (width + 2) if groups > 1 else 0
    loaded = column is not None and graph.nodes[column].op is Op.INPUT
    return SoftmaxChain(qk, score, row_max, running, prob, pv, out, total, maximum, groups, scratch, column,
                        qk_argument, key_norm, column_loaded=loaded, mask_scale=mask_scale)


def warpgroup_form(graph: BlockGraph, chain: SoftmaxChain, defer_values: bool = False,
                   q_fragments: bool = False, pingpong: int = 0) -> SoftmaxChain:
    """``chain`` in the warpgroup form when it qualifies, else unchanged (the reason logged): K and V
    are input tiles that only the chain and column reductions read (its copies write them swizzled;
    :func:`_offset_readers`), the warps form whole warpgroups of whole 64-row tiles (one key group),
    and the keys and V's width come in blocks of 64 (wgmma m64n64k16; the chain's sub-tiles are then
    64 keys).  Key norms (``key_norm``) are summed by each warp for a quarter of a sub-tile's keys and
    traded through the scratch (``scratch_bytes``).  Q is swizzled too, and read by the wgmmas from
    shared memory, when it is an input tile or an rms_norm (QKNorm's) that only the chain reads, with
    D a multiple of 64; else the chain loads its fragments into registers.  ``defer_values``:
    each sub-tile's P·V is issued with the next sub-tile's Q·K (V then keeps one ring slot more:
    ``late``).  ``q_fragments``: the Q·K products read Q's fragments from registers (loaded from its
    tile at each sub-tile) instead of Q's tile through descriptors.  ``pingpong``: with two warpgroups,
    their product issues take turns (kept only then).  The caller checks the target (sm_90a)."""
    try:
        uses = graph.consumers()
        require(chain.groups == 1, "key groups")
        q_ref, k_ref = graph.nodes[chain.qk].inputs
        v_ref = graph.nodes[chain.pv].inputs[1]
        require(k_ref.node != v_ref.node, "K and V are one tile")
        for ref, user in ((k_ref, chain.qk), (v_ref, chain.pv)):
            require(graph.nodes[ref.node].op is Op.INPUT and _offset_readers(graph, uses, ref.node, user),
                    f"%{ref.node}: not an input that only the chain and column reductions read")
        q, keys = graph.type_of(q_ref).shape, graph.type_of(k_ref).shape[-1]
        width = graph.type_of(v_ref).shape[-1]
        warps, row_tiles = math.prod(graph.block_dim) // 32, q[-2] // 16
        require(q[-2] % 16 == 0 and warps % 4 == 0 and row_tiles % warps == 0,
                f"{warps} warps over {q[-2]} rows")
        require(keys % 64 == 0 and width % 64 == 0, f"{keys} keys, V width {width}: not in blocks of 64")
        require(q[-1] % 16 == 0, f"head dim {q[-1]}: no whole k-steps of 16")
    except NoMatch as reason:
        log.debug("online-softmax chain kept on warp MMAs: %s", reason)
        return chain
    swizzled = {k_ref.node, v_ref.node}
    if chain.column_loaded and not chain.mask_rows and graph.type_of(Ref(chain.column)).shape[-1] == 64:
        swizzled.add(chain.column)  # read only through its layout's offsets (and copied like K)
    only_chain = (_only_input_of(graph, uses, q_ref.node, chain.qk)
                  or _normalized_for(graph, uses, q_ref.node, chain.qk))
    if q[-1] % 64 == 0 and q_ref.node not in swizzled and only_chain:
        swizzled.add(q_ref.node)
    # key norms: each warpgroup trades its sub-tiles' key factors through two buffers of up to 128 floats
    scratch = 2 * (warps // 4) * 128 * 4 if chain.key_norm is not None else chain.scratch_bytes
    return dataclasses.replace(chain, warpgroup=True, swizzled=frozenset(swizzled), scratch_bytes=scratch,
                               late=frozenset({v_ref.node}) if defer_values else frozenset(),
                               q_fragments=q_fragments, pingpong=pingpong if warps == 8 else 0)


def _offset_readers(graph: BlockGraph, uses: dict[Ref, list[int]], node: int, user: int) -> bool:
    """Whether every reader of ``node`` but ``user`` addresses its tile element by element through the
    layout's offsets, so that it may be swizzled: reductions over a dim other than the last (QKNorm's
    sum of squares of each key), directly or through one element-wise op that only they read (their
    prologue). Readers that take rows by their pitch (matmuls, row reductions, savers) disqualify it."""
    rank = graph.nodes[node].outputs[0].rank

    def column_reduction(i: int) -> bool:
        n = graph.nodes[i]
        return n.op in (Op.REDUCTION, Op.REDUCTION_MAX) and n.attrs.dim != rank - 1

    for reader in _only(uses, node):
        if reader == user or column_reduction(reader):
            continue
        n = graph.nodes[reader]
        readers = _only(uses, reader)
        if not ((n.op is Op.FUSED or n.op in UNARY) and len(n.inputs) == 1 and readers
                and all(column_reduction(r) for r in readers)):
            return False
    return True


def _only_input_of(graph: BlockGraph, uses: dict[Ref, list[int]], node: int, user: int) -> bool:
    return graph.nodes[node].op is Op.INPUT and _only(uses, node) == [user]


def _normalized_for(graph: BlockGraph, uses: dict[Ref, list[int]], node: int, user: int) -> bool:
    """``node`` is an rms_norm (QKNorm's Q) that only ``user`` reads: its pass writes chunks of at most
    8 consecutive elements through the layout's offsets, which the 128-byte swizzle keeps together."""
    return graph.nodes[node].op is Op.RMS_NORM and _only(uses, node) == [user]


def row_bytes_of(graph: BlockGraph, layouts: dict[int, TensorLayout] | None) -> Callable[[int], int]:
    """Bytes per row of node ``i``'s shared tile under ``layouts`` (1 when not row-major)."""

    def row_bytes(i: int) -> int:
        t = graph.nodes[i].outputs[0]
        layout = (layouts or {}).get(i)
        if layout is None:
            return t.shape[-1] * t.dtype.itemsize
        if layout.innermost_dim != t.rank - 1:
            return 1
        pitch = next((layout.strides[d] for d in range(t.rank - 2, -1, -1) if t.shape[d] > 1), t.shape[-1])
        return pitch * t.dtype.itemsize

    return row_bytes


def match(graph: BlockGraph, schedule: Schedule, layouts: dict[int, TensorLayout] | None = None,
          key_norms: bool = False) -> SoftmaxChain | None:
    """The online-softmax chain of ``graph`` (see the module docstring), or None.

    ``layouts``: the shared tiles' planned layouts (operand rows must be 16-byte aligned);
    ``key_norms``: per-key values that are a function of each key's sum of squares are computed by
    the chain from its K fragments (else by a step of their own)."""
    if not any(n.op is Op.RUNNING_MAX for n in graph.nodes):
        return None
    try:
        return _match(graph, schedule, row_bytes_of(graph, layouts), key_norms)
    except NoMatch as reason:
        log.debug("online-softmax chain lowered op by op: %s", reason)
        return None
